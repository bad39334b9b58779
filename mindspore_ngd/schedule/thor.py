"""THOR's learning-rate and damping schedules (MindSpore model zoo, ResNet-50 THOR configs).

With ``epoch = (step + 1) / steps_per_epoch`` (the model zoo counts a step as finished):

* learning rate ``lr_init * (1 - epoch / lr_end_epoch) ** lr_decay``
* damping ``damping_init * damping_decay ** (epoch / 10)``

Both are available as per-step NumPy arrays (what ``mindspore.nn.thor`` users pass as Tensors) and
as ``LearningRateSchedule`` cells computed from the step counter in the graph.
"""
import numpy as np

import mindspore as ms
from mindspore import ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from .. import _validate

__all__ = ["thor_lr", "thor_damping", "ThorLR", "ThorDamping"]


def _epochs(steps_per_epoch, total_epochs):
    steps_per_epoch = _validate.positive_int("steps_per_epoch", steps_per_epoch)
    total_epochs = _validate.positive_int("total_epochs", total_epochs)
    return (np.arange(steps_per_epoch * total_epochs, dtype=np.float64) + 1) / steps_per_epoch


def thor_lr(lr_init, lr_decay, lr_end_epoch, steps_per_epoch, total_epochs):
    """Per-step learning rates ``lr_init * (1 - epoch / lr_end_epoch) ** lr_decay`` (float32)."""
    _validate.positive_float("lr_init", lr_init)
    _validate.positive_float("lr_decay", lr_decay)
    _validate.positive_float("lr_end_epoch", lr_end_epoch)
    epoch = _epochs(steps_per_epoch, total_epochs)
    if epoch[-1] >= lr_end_epoch:
        raise ValueError(f"lr_end_epoch must exceed total_epochs ({total_epochs}) or the learning rate "
                         f"reaches 0, got {lr_end_epoch}")
    return (lr_init * (1.0 - epoch / lr_end_epoch) ** lr_decay).astype(np.float32)


def thor_damping(damping_init, damping_decay, steps_per_epoch, total_epochs):
    """Per-step damping ``damping_init * damping_decay ** (epoch / 10)`` (float32)."""
    _validate.positive_float("damping_init", damping_init)
    _validate.positive_float("damping_decay", damping_decay)
    epoch = _epochs(steps_per_epoch, total_epochs)
    return (damping_init * damping_decay ** (epoch / 10.0)).astype(np.float32)


class ThorLR(LearningRateSchedule):
    """:func:`thor_lr` as a schedule cell (no per-step table in memory)."""

    def __init__(self, lr_init, lr_decay, lr_end_epoch, steps_per_epoch):
        super().__init__()
        self.lr_init = _validate.positive_float("lr_init", lr_init)
        self.lr_decay = _validate.positive_float("lr_decay", lr_decay)
        self.lr_end_epoch = _validate.positive_float("lr_end_epoch", lr_end_epoch)
        self.steps_per_epoch = float(_validate.positive_int("steps_per_epoch", steps_per_epoch))

    def construct(self, global_step):
        epoch = (ops.cast(global_step, ms.float32) + 1.0) / self.steps_per_epoch
        base = ops.relu(1.0 - epoch / self.lr_end_epoch)
        return self.lr_init * ops.pow(base, self.lr_decay)


class ThorDamping(LearningRateSchedule):
    """:func:`thor_damping` as a schedule cell."""

    def __init__(self, damping_init, damping_decay, steps_per_epoch):
        super().__init__()
        self.damping_init = _validate.positive_float("damping_init", damping_init)
        self.damping_decay = _validate.positive_float("damping_decay", damping_decay)
        self.steps_per_epoch = float(_validate.positive_int("steps_per_epoch", steps_per_epoch))

    def construct(self, global_step):
        epoch = (ops.cast(global_step, ms.float32) + 1.0) / self.steps_per_epoch
        return self.damping_init * ops.pow(ops.fill(ms.float32, (), self.damping_decay), epoch / 10.0)
