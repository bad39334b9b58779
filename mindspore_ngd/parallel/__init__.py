"""Distributed natural-gradient training: layer ownership plans and buffer packing.

:mod:`.plan` is pure Python (no MindSpore import) and identical on every rank.
"""
from .plan import (OwnershipPlan, PackLayout, WorkItem, lpt_assign, pack_layout, plan_ownership,
                   tri_size)

__all__ = ["OwnershipPlan", "PackLayout", "WorkItem", "lpt_assign", "pack_layout", "plan_ownership",
           "tri_size"]
