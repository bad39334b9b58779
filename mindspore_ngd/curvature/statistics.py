"""Moving averages of captured statistics, and how much a statistic moved.

One home for the arithmetic every curvature block applies to what the capture produced: a Kronecker
factor, a unit-wise BatchNorm Fisher, or (THOR's trace rule) a trace.
"""
import mindspore as ms
from mindspore import ops

from .._graph import choose

__all__ = ["relative_change", "change_of_norms", "relative_changes", "damped_square_norm", "fold_statistic",
           "blend"]


def relative_change(new, old, reference=None):
    """``|new - old|_F / |old|_F`` (for scalars ``|new - old| / |old|``); +inf when ``old`` is zero,
    i.e. there is nothing to compare with (a first capture).

    ``reference``: the squared norm to measure against instead of ``|old|_F^2``, e.g. that of the
    damped statistic the inverse is taken of (:func:`damped_square_norm`)."""
    diff = new - old
    return change_of_norms(ops.reduce_sum(diff * diff), ops.reduce_sum(old * old), reference)


def change_of_norms(diff_norm, old_norm, reference=None):
    """:func:`relative_change` from its squared norms ``|new - old|_F^2`` and ``|old|_F^2`` (and
    ``reference``), scalars or vectors with one entry per statistic."""
    has_old = old_norm > 0
    base = old_norm if reference is None else reference
    change = ops.sqrt(diff_norm / ops.where(has_old, base, ops.ones_like(base)))
    return ops.where(has_old, change, ops.fill(ms.float32, change.shape, float("inf")))


def relative_changes(new, old):
    """Elementwise ``|new - old| / |old|`` of two vectors (each entry as :func:`relative_change` of
    scalars); +inf where ``old`` is zero."""
    scale = ops.abs(old)
    has_old = scale > 0
    change = ops.abs(new - old) / ops.where(has_old, scale, ops.ones_like(scale))
    return choose(has_old, change, ops.fill(ms.float32, old.shape, float("inf")))


def damped_square_norm(matrix, shift):
    """``|M + shift I|_F^2`` of a square matrix, without forming it: ``|M|_F^2 + 2 shift tr(M) +
    shift^2 dim``; of a diagonal factor kept as its (D,) diagonal ``d``: ``sum (d + shift)^2``."""
    if matrix.ndim == 1:
        shifted = matrix + shift
        return ops.reduce_sum(shifted * shifted)
    return ops.reduce_sum(matrix * matrix) + 2.0 * shift * ops.trace(matrix) + shift * shift * matrix.shape[0]


def fold_statistic(average, updates, batch, captured, decay, track_changes, reference=None):
    """One statistic's moving average ``X <- decay X + (1 - decay) X_batch``.

    The first accepted batch initialises the average (``updates == 0``); a batch that was not
    captured, or is not finite, leaves it unchanged. Returns ``(new average, new update count,
    rejected (int32 1 if a captured batch was not finite), change)``, where ``change`` is
    :func:`relative_change` of the new value against the old one (against ``reference``, a squared
    norm, when given) if the batch was taken and -1 if not (None unless ``track_changes``).
    """
    finite = ops.all(ops.isfinite(batch))
    take = ops.logical_and(captured, finite)
    new = blend(average, batch, updates == 0, take, decay)
    rejected = ops.cast(ops.logical_and(captured, ops.logical_not(finite)), ms.int32)
    change = None
    if track_changes:
        change = ops.where(take, relative_change(new, average, reference), -ops.ones((), ms.float32))
    return new, updates + ops.cast(take, ms.int32), rejected, change


def blend(average, batch, first, take, decay):
    """The moving average's elementwise step: ``decay average + (1 - decay) batch``, ``batch`` itself
    where ``first``, and ``average`` unchanged where not ``take``. ``first`` and ``take`` are 0-d, or
    one flag per row of stacked statistics (shape (rows, 1))."""
    blended = decay * average + (1.0 - decay) * batch
    blended = choose(first, batch, blended)
    return choose(take, blended, average)
