"""Refresh rules shared by the policies: when statistics and inverses are recomputed.

Each rule has a plain-Python planner (used by tests and printable for users) and graph-mode helpers
with the same arithmetic (used inside the optimizers' ``construct``).
"""
import math

import mindspore as ms
from mindspore import ops

__all__ = ["growing_refresh_steps", "next_interval", "relative_change", "trace_changed"]


def next_interval(interval, growth, max_interval):
    """The refresh interval after a refresh: ``min(ceil(interval * growth), max_interval)``, >= 1."""
    grown = int(math.ceil(interval * growth - 1e-9))
    if max_interval is not None:
        grown = min(grown, max_interval)
    return max(grown, 1)


def growing_refresh_steps(frequency, growth, max_frequency, total_steps):
    """Steps at which THOR refreshes: 0, f0, f0 + f1, ... with f_{i+1} = next_interval(f_i)."""
    steps, step, interval = [], 0, frequency
    while step < total_steps:
        steps.append(step)
        step += interval
        interval = next_interval(interval, growth, max_frequency)
    return steps


def relative_change(new, old):
    """``|new - old| / old`` for scalar tensors; +inf when ``old <= 0`` (nothing to compare with)."""
    positive = old > 0
    safe_old = ops.select(positive, old, ops.ones_like(old))
    return ops.select(positive, ops.abs(new - old) / safe_old, ops.fill(ms.float32, (), float("inf")))


def trace_changed(new_trace, old_trace, threshold):
    """THOR's trace test: the statistic changed by more than ``threshold`` (relative)."""
    return relative_change(new_trace, old_trace) > threshold
