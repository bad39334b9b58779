"""SP-NGD's learning-rate and momentum schedules (Osawa et al., CVPR 2019, sec. 5; TPAMI 2020).

* learning rate: linear warmup from ``lr_init / warmup_steps`` to ``lr_init`` over ``warmup_steps``,
  then polynomial decay ``lr_t = (lr_init - end_lr) * (1 - s / S)^power + end_lr`` over the
  remaining ``S`` steps (``s`` counts from the end of the warmup);
* momentum rescaled with the learning rate, ``m_t = m_0 * lr_t / max_t lr_t``, so that the momentum
  term shrinks together with the step size.

Both return per-step float32 arrays that every optimizer of the package (and ``nn.Momentum``)
accepts as ``learning_rate`` / ``momentum``.
"""
import numpy as np

from .. import _validate

__all__ = ["polynomial_lr", "rescaled_momentum"]


def polynomial_lr(lr_init, total_steps, power=2.0, warmup_steps=0, end_lr=0.0):
    """Per-step learning rates (length ``total_steps``): warmup, then polynomial decay to ``end_lr``.

    The last step's value is ``(lr_init - end_lr) / S^power + end_lr`` (never exactly the end value
    unless ``end_lr > 0``), so every value stays > 0.
    """
    lr_init = _validate.positive_float("lr_init", lr_init)
    total_steps = _validate.positive_int("total_steps", total_steps)
    power = _validate.positive_float("power", power)
    warmup_steps = int(warmup_steps)
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps must be in [0, total_steps), got {warmup_steps}")
    end_lr = _validate.non_negative_float("end_lr", end_lr)
    if end_lr >= lr_init:
        raise ValueError(f"end_lr must be < lr_init ({lr_init}), got {end_lr}")
    warm = lr_init * np.arange(1, warmup_steps + 1, dtype=np.float64) / max(warmup_steps, 1)
    decay_steps = total_steps - warmup_steps
    progress = np.arange(decay_steps, dtype=np.float64) / decay_steps
    decay = (lr_init - end_lr) * (1.0 - progress) ** power + end_lr
    return np.concatenate([warm, decay]).astype(np.float32)


def rescaled_momentum(momentum, learning_rates):
    """Per-step momentum ``momentum * lr_t / max(lr)`` for the given per-step learning rates (>= 0, as
    ``nn.Momentum`` accepts them; a warm-up step at lr 0 gets momentum 0)."""
    momentum = _validate.float_in_range("momentum", momentum, 0.0, 1.0, high_inclusive=True)
    lrs = np.asarray(learning_rates, np.float64).reshape(-1)
    if lrs.size == 0 or not np.all(np.isfinite(lrs)) or np.any(lrs < 0) or lrs.max() <= 0:
        raise ValueError("learning_rates must be a non-empty sequence of finite values >= 0, not all 0")
    return (momentum * lrs / lrs.max()).astype(np.float32)
