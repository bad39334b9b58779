"""Per-step hyper-parameter schedules (damping, and validation of learning rates) and refresh rules.

MindSpore users pass a learning rate as a float, a per-step list / NumPy array / 1-D Tensor, or a
``nn.LearningRateSchedule`` cell. :func:`check_learning_rate` accepts what ``nn.Momentum`` accepts
(values >= 0, so warm-up schedules that start at 0 work). :func:`as_schedule` accepts the same forms
for any other hyper-parameter (the damping, > 0) and returns a cell that maps the step counter to a
float32 scalar. A per-step sequence holds its last value once the step runs past its end.
"""
import collections.abc
import numbers

import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .. import _validate

__all__ = ["as_schedule", "as_unit_schedule", "check_learning_rate", "check_positive_schedule", "ConstantSchedule", "PerStepSchedule",
           "polynomial_lr", "rescaled_momentum", "FixedInterval", "StaleIntervals", "GrowingInterval"]


class ConstantSchedule(nn.Cell):
    """A constant value, stored as a Parameter so that it is checkpointed with the optimizer."""

    def __init__(self, value, name):
        super().__init__()
        self.value = Parameter(Tensor(np.float32(value)), name=name, requires_grad=False)

    def construct(self, step):
        return self.value


class PerStepSchedule(nn.Cell):
    """Value ``values[min(step, len - 1)]`` of a per-step sequence."""

    def __init__(self, values, name):
        super().__init__()
        values = np.asarray(values, np.float32).reshape(-1)
        self.values = Parameter(Tensor(values), name=name, requires_grad=False)
        self.last = len(values) - 1

    def construct(self, step):
        index = ops.minimum(step.reshape(()), self.last)
        return self.values[index]


class _CellSchedule(nn.Cell):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, step):
        return ops.cast(self.cell(step), ms.float32).reshape(())


def _sequence_values(value):
    if isinstance(value, Tensor):
        return value.asnumpy()
    return np.asarray(value)


def check_positive_schedule(name, value):
    """Validate a float / sequence / Tensor hyper-parameter: every value finite and > 0.

    ``nn.LearningRateSchedule`` (or any other Cell) is accepted as is: its values are only known
    at run time.
    """
    if isinstance(value, nn.Cell):
        return value
    if isinstance(value, (list, tuple, np.ndarray, Tensor)):
        values = _sequence_values(value)
        if values.ndim > 1 or values.size == 0:
            raise ValueError(f"{name} as a sequence must be a non-empty 1-D list/array/Tensor, "
                             f"got shape {values.shape}")
        if values.ndim == 0:
            return _validate.positive_float(name, float(values))
        if not np.issubdtype(values.dtype, np.number) or not np.all(np.isfinite(values)) \
                or np.any(values <= 0):
            raise ValueError(f"every value of {name} must be a finite number > 0, "
                             f"got min {np.min(values)!r}")
        return value
    return _validate.positive_float(name, value)


def check_learning_rate(name, value):
    """Validate a learning rate by ``nn.Momentum``'s rules; returns it in a form ``nn.Optimizer`` takes.

    Accepted, as ``nn.Optimizer`` accepts them: a finite float or int >= 0 (returned as float); a
    scalar Tensor >= 0; a non-empty 1-D list, tuple, NumPy array, Tensor or other iterable of finite
    values >= 0 (a list, ``nn.warmup_lr`` / ``nn.cosine_decay_lr`` output, a model-zoo table starting at
    ``lr_init=0``); a ``nn.LearningRateSchedule`` (any Cell: its values are only known at run time). A
    step whose learning rate is 0 changes no weight, as with ``nn.Momentum``. Negative or non-finite
    values, which ``nn.Optimizer`` lets through for sequences, raise ValueError here; other types
    raise TypeError.
    """
    if isinstance(value, nn.Cell):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return _validate.non_negative_float(name, value)
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (Tensor, np.ndarray, collections.abc.Iterable)):
        raise TypeError(f"{name} must be a float >= 0, a per-step list/array/1-D Tensor of values >= 0 or a "
                        f"LearningRateSchedule, got {type(value).__name__} {value!r}")
    if not isinstance(value, (Tensor, np.ndarray, list, tuple)):
        value = list(value)                                   # a generator or another iterable, once
    values = _sequence_values(value)
    if values.ndim > 1 or values.size == 0 or not np.issubdtype(values.dtype, np.number) \
            or np.issubdtype(values.dtype, np.bool_):
        raise ValueError(f"{name} as a sequence must be a non-empty 1-D list/array/Tensor of numbers, "
                         f"got shape {values.shape} dtype {values.dtype}")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        bad = int(np.argmax(~np.isfinite(values) | (values < 0))) if values.ndim else 0
        raise ValueError(f"every value of {name} must be a finite number >= 0, got {values.reshape(-1)[bad]!r} "
                         f"at step {bad}")
    if values.ndim == 0:
        return float(values) if not isinstance(value, Tensor) else value
    return value


def as_schedule(value, name):
    """Return a cell ``step -> float32 scalar`` for a float, per-step sequence or Cell."""
    value = check_positive_schedule(name, value)
    if isinstance(value, nn.Cell):
        return _CellSchedule(value)
    if isinstance(value, float):
        return ConstantSchedule(value, name)
    values = _sequence_values(value)
    if values.ndim == 0:
        return ConstantSchedule(float(values), name)
    return PerStepSchedule(values, name)


def as_unit_schedule(value, name, label):
    """Like :func:`as_schedule` for a per-step sequence or Cell whose values lie in [0, 1] (momentum)."""
    if isinstance(value, nn.Cell):
        return _CellSchedule(value)
    if not isinstance(value, (list, tuple, np.ndarray, Tensor)):
        raise TypeError(f"{label} must be a float in [0, 1], a per-step list/array/Tensor or a "
                        f"LearningRateSchedule cell, got {type(value).__name__}")
    values = _sequence_values(value)
    if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.number):
        raise ValueError(f"{label} as a sequence must be a non-empty 1-D list/array/Tensor of numbers, "
                         f"got shape {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
        raise ValueError(f"every value of {label} must be in [0, 1], got min {np.min(values)!r}, "
                         f"max {np.max(values)!r}")
    return PerStepSchedule(values, name)


from .spngd import polynomial_lr, rescaled_momentum  # noqa: E402  (uses _validate only)
from .rules import FixedInterval, GrowingInterval, StaleIntervals  # noqa: E402
