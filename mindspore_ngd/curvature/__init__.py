"""Factor statistics, damped inverses and preconditioning."""
from . import blocks, factors, inverse

__all__ = ["blocks", "factors", "inverse"]
