"""Optimizers: the shared engine and its policies."""
from .engine import NGDOptimizer, Policy, default_decay_filter
from .kfac import KFAC
from .thor import THOR
from .spngd import SPNGD

__all__ = ["NGDOptimizer", "Policy", "default_decay_filter", "KFAC", "THOR", "SPNGD"]
