"""Per-step learning-rate and damping tables built from an optimizer section of the config.

A section names its schedules (``lr_schedule``, ``damping_schedule``) and gives their keys; each
builder returns a float32 array with one value per training step (``steps_per_epoch * epochs``),
passed to the optimizer as ``learning_rate`` / ``damping``. Step ``i`` is in epoch ``i /
steps_per_epoch`` (0-based, fractional) unless a schedule says otherwise.

Learning rate (``lr_schedule``):

* ``constant``  -- ``lr_init``.
* ``thor``      -- MindSpore model zoo THOR: :func:`mindspore_ngd.schedule.thor.thor_lr`,
  ``lr_init * (1 - e / lr_end_epoch) ** lr_decay`` with ``e = (i + 1) / steps_per_epoch``; the zoo's
  ``train.py`` passes ``decay_epochs=39``, which halves the rate from epoch 39 on and halves it
  again from epoch 40 on: ``lr_halve_epoch`` (optional) reproduces it.
* ``linear``    -- MindSpore model zoo ResNet ``lr_decay_mode: linear``: warm-up from ``lr_init`` to
  ``lr_max`` over ``warmup_epochs`` (``lr_init + (lr_max - lr_init) * i / W``), then linear decay
  ``lr_max - (lr_max - lr_end) * (i - W) / (T - W)``; ``W``, ``T`` in steps.
* ``cosine``    -- linear warm-up as above, then ``lr_end + (lr_max - lr_end) (1 + cos(pi (i - W) /
  (T - W))) / 2``.
* ``step``      -- KAISA / kfac-pytorch ImageNet recipe: linear warm-up from ``lr_init`` (default
  ``lr_max``) to ``lr_max`` over ``warmup_epochs``, then ``lr_max * lr_gamma ** n`` with ``n`` the
  number of ``lr_milestones`` <= the (integer, 0-based) epoch.
* ``polynomial``-- SP-NGD (chainerkfac, Osawa et al. CVPR'19): ``lr_max`` until
  ``lr_decay_start_epoch``, then ``lr_max * (1 - (e - s) / (E - s)) ** lr_power`` with ``e = i /
  steps_per_epoch`` and ``E = max(lr_end_epoch, epochs)``.

Damping (``damping_schedule``, only for optimizers that take a damping):

* ``constant`` -- ``damping``.
* ``thor``     -- :func:`mindspore_ngd.schedule.thor.thor_damping`, ``damping_init * damping_decay **
  (e / 10)`` with ``e = (i + 1) / steps_per_epoch``.
* ``step``     -- ``damping * damping_gamma ** n``, ``n`` milestones of ``damping_milestones`` passed
  (kfac-pytorch's damping decay).

Which of these are MindSpore's own: the step decays (``step`` learning rate and damping) are
``mindspore.nn.piecewise_constant_lr``. MindSpore's ``nn.warmup_lr``, ``nn.cosine_decay_lr`` and
``nn.polynomial_decay_lr`` do not serve the others: they hold the rate for a whole epoch (their
position is ``floor(i / step_per_epoch)``), while the published recipes these configs reproduce
(the models repository's ``lr_generator.py``, chainerkfac's polynomial decay) change it every step,
and ``nn.warmup_lr`` starts at 0 rather than at ``lr_init``. The ``thor`` tables come from
:mod:`mindspore_ngd.schedule.thor`, which reproduces the models repository's THOR functions.
"""
import math
from dataclasses import dataclass, field

import numpy as np
from mindspore import nn

from mindspore_ngd.schedule.thor import thor_damping, thor_lr

__all__ = ["Schedule", "LR_SCHEDULES", "DAMPING_SCHEDULES", "build_schedule"]


@dataclass(frozen=True)
class Schedule:
    builder: object
    required: tuple
    optional: dict = field(default_factory=dict)

    @property
    def keys(self):
        return tuple(self.required) + tuple(self.optional)


def _step_epochs(steps_per_epoch, epochs):
    return np.arange(steps_per_epoch * epochs, dtype=np.float64) / steps_per_epoch


def _warmup_then_decay(spe, epochs, lr_max, lr_init, lr_end, warmup_epochs, fraction):
    """Linear warm-up ``lr_init -> lr_max`` over ``warmup_epochs`` (``lr_init + (lr_max - lr_init) i / W``),
    then ``lr_end + (lr_max - lr_end) * fraction(p)`` with ``p = (i - W) / (T - W)`` in [0, 1)."""
    total = spe * epochs
    warmup = int(round(warmup_epochs * spe))
    i = np.arange(total, dtype=np.float64)
    ramp = lr_init + (lr_max - lr_init) * i / max(warmup, 1)
    decay = lr_end + (lr_max - lr_end) * fraction((i - warmup) / max(total - warmup, 1))
    return np.where(i < warmup, ramp, decay)


def _constant(spe, epochs, lr_init):
    return np.full(spe * epochs, lr_init, np.float64)


def _thor(spe, epochs, lr_init, lr_decay, lr_end_epoch, lr_halve_epoch=None):
    values = thor_lr(lr_init, lr_decay, lr_end_epoch, spe, epochs).astype(np.float64)
    if lr_halve_epoch is not None:
        epoch = (np.arange(spe * epochs, dtype=np.float64) + 1) / spe   # thor_lr's epoch convention
        values = values * np.where(epoch >= lr_halve_epoch, 0.5, 1.0) * np.where(epoch >= lr_halve_epoch + 1, 0.5, 1.0)
    return values


def _linear(spe, epochs, lr_max, lr_init=0.0, lr_end=0.0, warmup_epochs=0):
    return _warmup_then_decay(spe, epochs, lr_max, lr_init, lr_end, warmup_epochs, lambda p: 1.0 - p)


def _cosine(spe, epochs, lr_max, lr_init=0.0, lr_end=0.0, warmup_epochs=0):
    return _warmup_then_decay(spe, epochs, lr_max, lr_init, lr_end, warmup_epochs,
                              lambda p: 0.5 * (1.0 + np.cos(math.pi * p)))


def _decays(spe, epochs, milestones, gamma):
    """``gamma ** n`` per step, ``n`` the milestones passed (epoch index >= milestone):
    ``nn.piecewise_constant_lr`` over the first step of each milestone's epoch."""
    total = spe * epochs
    starts = sorted(min(max(math.ceil(m), 0) * spe, total) for m in milestones)
    bounds = [b for b in starts if b > 0] + [total]
    passed_at_start = len(starts) - len(bounds) + 1
    rates = [float(gamma ** (passed_at_start + k)) for k in range(len(bounds))]
    return np.asarray(nn.piecewise_constant_lr(bounds, rates), np.float64)


def _step(spe, epochs, lr_max, lr_milestones, lr_init=None, lr_gamma=0.1, warmup_epochs=0):
    decays = _decays(spe, epochs, lr_milestones, lr_gamma)
    return _warmup_then_decay(spe, epochs, lr_max, lr_max if lr_init is None else lr_init, 0.0, warmup_epochs,
                              lambda p: decays)


def _polynomial(spe, epochs, lr_max, lr_power, lr_end_epoch, lr_decay_start_epoch=0.0):
    epoch = _step_epochs(spe, epochs)
    end = max(float(lr_end_epoch), float(epochs))
    if end <= lr_decay_start_epoch:
        raise ValueError(f"lr_end_epoch ({lr_end_epoch}) must exceed lr_decay_start_epoch ({lr_decay_start_epoch})")
    rate = np.clip(1.0 - (epoch - lr_decay_start_epoch) / (end - lr_decay_start_epoch), 0.0, 1.0) ** lr_power
    return lr_max * np.where(epoch < lr_decay_start_epoch, 1.0, rate)


def _damping_constant(spe, epochs, damping):
    return np.full(spe * epochs, damping, np.float64)


def _damping_thor(spe, epochs, damping_init, damping_decay):
    return thor_damping(damping_init, damping_decay, spe, epochs).astype(np.float64)


def _damping_step(spe, epochs, damping, damping_milestones, damping_gamma=0.5):
    return damping * _decays(spe, epochs, damping_milestones, damping_gamma)


LR_SCHEDULES = {
    "constant": Schedule(_constant, ("lr_init",)),
    "thor": Schedule(_thor, ("lr_init", "lr_decay", "lr_end_epoch"), {"lr_halve_epoch": None}),
    "linear": Schedule(_linear, ("lr_max",), {"lr_init": 0.0, "lr_end": 0.0, "warmup_epochs": 0}),
    "cosine": Schedule(_cosine, ("lr_max",), {"lr_init": 0.0, "lr_end": 0.0, "warmup_epochs": 0}),
    "step": Schedule(_step, ("lr_max", "lr_milestones"), {"lr_init": None, "lr_gamma": 0.1, "warmup_epochs": 0}),
    "polynomial": Schedule(_polynomial, ("lr_max", "lr_power", "lr_end_epoch"), {"lr_decay_start_epoch": 0.0}),
}

DAMPING_SCHEDULES = {
    "constant": Schedule(_damping_constant, ("damping",)),
    "thor": Schedule(_damping_thor, ("damping_init", "damping_decay")),
    "step": Schedule(_damping_step, ("damping", "damping_milestones"), {"damping_gamma": 0.5}),
}

_LIST_KEYS = ("lr_milestones", "damping_milestones")


def _check_value(kind, key, value):
    if key in _LIST_KEYS:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                           for v in value):
            raise ValueError(f"{kind} key {key!r} must be a list of epochs, got {value!r}")
        return [float(v) for v in value]
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{kind} key {key!r} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{kind} key {key!r} must be >= 0, got {value!r}")
    return float(value)


def build_schedule(kind, name, params, steps_per_epoch, epochs):
    """Per-step float32 table of schedule ``name`` of ``kind`` ("lr" or "damping") from ``params``.

    ``params`` holds exactly the schedule's keys (required and optional). Every value of the result
    must be finite and >= 0 (the natural-gradient optimizers also reject zeros, with their own error).
    """
    table = LR_SCHEDULES if kind == "lr" else DAMPING_SCHEDULES
    if name not in table:
        raise ValueError(f"unknown {kind}_schedule {name!r}; choose one of {sorted(table)}")
    schedule = table[name]
    missing = [k for k in schedule.required if k not in params]
    if missing:
        raise ValueError(f"{kind}_schedule {name!r} needs the keys {missing} (keys: {list(schedule.keys)})")
    unknown = sorted(set(params) - set(schedule.keys))
    if unknown:
        raise ValueError(f"keys {unknown} are not keys of {kind}_schedule {name!r} (keys: {list(schedule.keys)})")
    kwargs = {k: _check_value(f"{kind}_schedule {name!r}", k, v) for k, v in params.items()}
    values = np.asarray(schedule.builder(int(steps_per_epoch), int(epochs), **kwargs), np.float32)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        bad = int(np.argmax(~np.isfinite(values) | (values < 0)))
        raise ValueError(f"{kind}_schedule {name!r} with {params} gives {values[bad]!r} at step {bad}: "
                         "every value must be finite and >= 0")
    return values
