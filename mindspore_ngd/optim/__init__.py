"""Optimizers: the shared engine and the policies that make K-FAC, SP-NGD and THOR."""
from .engine import NGDOptimizer
from .policy import Policy, default_decay_filter
from .kfac import KFAC
from .thor import THOR
from .spngd import SPNGD

__all__ = ["NGDOptimizer", "Policy", "default_decay_filter", "KFAC", "THOR", "SPNGD"]
