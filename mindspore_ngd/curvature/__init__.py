"""Curvature: factor statistics, their moving averages, damped inverses and the per-layer blocks.

The blocks (:mod:`.kronecker`, :mod:`.unitwise`), their registry by layer kind (:mod:`.registry`) and
the estimator (:mod:`.estimator`) import the capture cells; import them by module.
"""
from . import blocks, factors, inverse, statistics

__all__ = ["blocks", "factors", "inverse", "statistics"]
