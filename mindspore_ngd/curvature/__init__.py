"""Factor statistics, damped inverses and preconditioning."""
from . import factors, inverse

__all__ = ["factors", "inverse"]
