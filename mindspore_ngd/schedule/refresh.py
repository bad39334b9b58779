"""Refresh rules shared by the policies: when statistics and inverses are recomputed.

Each rule has a plain-Python planner (used by tests and printable for users) and graph-mode helpers
with the same arithmetic (used inside the optimizers' ``construct``).
"""
import math

import mindspore as ms
from mindspore import ops

__all__ = ["growing_refresh_steps", "next_interval", "relative_change", "trace_changed", "stale_update", "stale_plan"]


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


# ---------------------------------------------------------------- SP-NGD stale statistics
# Osawa et al. (2020, "Scalable and Practical Natural Gradient for Large-Scale Deep Learning",
# sec. 4.1) reuse a statistic X for an interval that adapts to how fast X moves. The rule here:
#
#   every statistic s keeps an interval D_s (starts at 1) and its next refresh step t_s (starts at 0);
#   at step t >= t_s, s is recomputed and compared with the value it replaces,
#       r = |X_new - X_old|_F / |X_old|_F;
#   r < threshold:  D_s <- min(2 D_s, max_interval)      (stable: look again twice as late)
#   r >= threshold: D_s <- max(floor(D_s / 2), 1)         (moving: look again twice as soon)
#   the first capture of s (no X_old) keeps D_s; then t_s <- t + D_s.
#   A rejected (non-finite) capture changes nothing, so s is retried on the next step.
#
# Doubling/halving is our choice of the multiplicative-increase/decrease the paper describes; the
# default threshold and cap are the values measured to keep refresh ratios low without losing
# accuracy on this project's benchmarks (README, "SP-NGD").

def stale_update(intervals, next_refresh, changes, step, threshold, max_interval):
    """Graph-mode rule above on int32 vectors ``intervals``, ``next_refresh`` and the float vector
    ``changes`` (-1: not recomputed this step; +inf: first capture). Returns the new pair."""
    taken = changes >= 0
    first = ops.isinf(changes)
    stable = changes < threshold
    grown = ops.minimum(intervals * 2, max_interval)
    shrunk = ops.maximum(ops.floor_divide(intervals, 2), 1)
    adjusted = ops.select(stable, grown, shrunk)
    adjusted = ops.select(first, intervals, adjusted)
    new_intervals = ops.select(taken, adjusted, intervals)
    new_next = ops.select(taken, step + new_intervals, next_refresh)
    return new_intervals, new_next


def stale_plan(changes_at, total_steps, threshold, max_interval):
    """Plain-Python twin of :func:`stale_update` for one statistic.

    ``changes_at(step, refresh_index)`` gives the relative change measured at a refresh (it is not
    called for the first capture). Returns ``[(step, interval after the refresh), ...]``.
    """
    plan, interval, step, index = [], 1, 0, 0
    while step < total_steps:
        if index > 0:
            if changes_at(step, index) < threshold:
                interval = min(interval * 2, max_interval)
            else:
                interval = max(interval // 2, 1)
        plan.append((step, interval))
        step += interval
        index += 1
    return plan
