"""Distributed natural-gradient training: layer ownership plans, buffer packing, collectives.

:mod:`.plan`, :mod:`.packing` and :mod:`.checkpoint` are pure Python (no MindSpore import) and
identical on every rank; :mod:`.comm` (imported by the optimizers, not here) is the only module that
touches ``mindspore.communication``.
"""
from .checkpoint import check_checkpoint, checkpoint_layout, optimizer_layout
from .packing import PackLayout, pack_layout, tri_size
from .plan import OwnershipPlan, WorkItem, lpt_assign, plan_ownership

__all__ = ["OwnershipPlan", "PackLayout", "WorkItem", "lpt_assign", "pack_layout", "plan_ownership",
           "tri_size", "check_checkpoint", "checkpoint_layout", "optimizer_layout"]
