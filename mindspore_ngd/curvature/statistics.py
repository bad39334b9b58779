"""Moving averages of captured statistics, and how much a statistic moved.

One home for the arithmetic every curvature block applies to what the capture produced: a Kronecker
factor, a unit-wise BatchNorm Fisher, or (THOR's trace rule) a trace.
"""
import mindspore as ms
from mindspore import ops

__all__ = ["relative_change", "fold_statistic"]


def relative_change(new, old):
    """``|new - old|_F / |old|_F`` (for scalars ``|new - old| / |old|``); +inf when ``old`` is zero,
    i.e. there is nothing to compare with (a first capture)."""
    old_norm = ops.reduce_sum(old * old)
    diff = new - old
    has_old = old_norm > 0
    change = ops.sqrt(ops.reduce_sum(diff * diff) / ops.select(has_old, old_norm, ops.ones_like(old_norm)))
    return ops.select(has_old, change, ops.fill(ms.float32, (), float("inf")))


def fold_statistic(average, updates, batch, captured, decay, track_changes):
    """One statistic's moving average ``X <- decay X + (1 - decay) X_batch``.

    The first accepted batch initialises the average (``updates == 0``); a batch that was not
    captured, or is not finite, leaves it unchanged. Returns ``(new average, new update count,
    rejected (int32 1 if a captured batch was not finite), change)``, where ``change`` is
    :func:`relative_change` of the new value against the old one if the batch was taken and -1 if not
    (None unless ``track_changes``).
    """
    finite = ops.all(ops.isfinite(batch))
    take = ops.logical_and(captured, finite)
    blended = decay * average + (1.0 - decay) * batch
    blended = ops.select(ops.broadcast_to(updates == 0, average.shape), batch, blended)
    new = ops.select(ops.broadcast_to(take, average.shape), blended, average)
    rejected = ops.cast(ops.logical_and(captured, ops.logical_not(finite)), ms.int32)
    change = None
    if track_changes:
        change = ops.select(take, relative_change(new, average), -ops.ones((), ms.float32))
    return new, updates + ops.cast(take, ms.int32), rejected, change
