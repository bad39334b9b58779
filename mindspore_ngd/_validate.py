"""Small argument validators with messages that name the argument and the allowed range.

They run in constructors, before any graph is compiled.
"""
import numbers

import numpy as np


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_float(name, value):
    if not _is_number(value):
        raise TypeError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def non_negative_float(name, value):
    if not _is_number(value):
        raise TypeError(f"{name} must be a float >= 0, got {type(value).__name__} {value!r}")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def float_in_range(name, value, low, high, high_inclusive=False):
    """A float in [low, high) (or [low, high] when high_inclusive)."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    upper_ok = value <= high if high_inclusive else value < high
    if not np.isfinite(value) or value < low or not upper_ok:
        bracket = "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be in [{low}, {high}{bracket}, got {value!r}")
    return float(value)


def growth_factor(name, value, meaning, none_allowed=False):
    """A finite float > 1, a factor of growth over a reference; ``meaning`` says what it counts (it is
    named in the error); ``none_allowed``: None passes through (the test switched off)."""
    if none_allowed and value is None:
        return None
    value = positive_float(name, value)
    if value <= 1:
        raise ValueError(f"{name} must be {'None or ' if none_allowed else ''}a finite number > 1 ({meaning}), "
                         f"got {value!r}")
    return value


def fraction(name, value):
    """A float in (0, 1]."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a float in (0, 1], got {type(value).__name__} {value!r}")
    if not np.isfinite(value) or value <= 0 or value > 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def int_at_least(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def positive_int(name, value):
    return int_at_least(name, value, 1)


def one_of(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def optional_positive_float(name, value):
    return None if value is None else positive_float(name, value)


def loss_reduction(loss_fn):
    """``"mean"``, ``"sum"`` or ``"none"`` for a MindSpore loss cell (``nn.LossBase``: its ``reduce`` and
    ``average`` flags, set from ``reduction``); None when it cannot be told (another kind of cell)."""
    reduce, average = getattr(loss_fn, "reduce", None), getattr(loss_fn, "average", None)
    if not isinstance(reduce, bool) or not isinstance(average, bool):
        return None
    if not reduce:
        return "none"
    return "mean" if average else "sum"


def mean_loss_message(loss_fn, where):
    """The error for a ``loss_fn`` that does not reduce to the batch mean ("" when it does, or when its
    reduction cannot be told). The curvature statistics are defined for a mean loss: a sum (or the
    per-example vector of ``reduction="none"``, which a training cell back-propagates as a sum: its
    ``sens`` is filled to the loss's shape) makes G ``B**2`` too large."""
    reduction = loss_reduction(loss_fn)
    if reduction in (None, "mean"):
        return ""
    vector = (" Its per-example vector reaches the training cell's sens, which back-propagates the sum."
              if reduction == "none" else "")
    return (
        f"{where}: the loss {type(loss_fn).__name__} reduces with {reduction!r}, but the natural-gradient "
        "optimizers need the batch mean (their curvature statistics would be mis-scaled by the batch size)."
        f"{vector} Build it with reduction=\"mean\", e.g. nn.{type(loss_fn).__name__}(..., reduction=\"mean\")"
        + (" (SoftmaxCrossEntropyWithLogits defaults to 'none')." if reduction == "none" else "."))


def check_mean_loss(loss_fn, where):
    """ValueError (:func:`mean_loss_message`) unless ``loss_fn`` reduces to the batch mean (a loss whose
    reduction cannot be told passes)."""
    message = mean_loss_message(loss_fn, where)
    if message:
        raise ValueError(message)
