"""Adaptive damping: the damping controller, a small Cell the optimizer owns and calls.

In the spirit of the Levenberg-Marquardt rule of Martens & Grosse 2015, sec. 6.5
---------------------------------------------------------------------------------
The LM rule compares the loss reduction a step achieved with the reduction its model predicted,
``rho = (h(theta + delta) - h(theta)) / (M(delta) - M(0))``, and raises the damping when ``rho`` is
small, lowers it when ``rho`` is large. An ``nn.Optimizer`` inside stock ``Model.train`` never sees
the loss, but it sees consecutive gradients, and for the step ``delta_t`` it took

    h(theta_t + delta_t) - h(theta_t)  ~=  (g_t + g_{t+1})' delta_t / 2      (trapezoid rule: exact
                                                                             for a quadratic)

so against the first-order prediction ``g_t' delta_t`` the reduction ratio is

    rho_t = (1 + g_{t+1}' delta_t / g_t' delta_t) / 2.

``rho = 1``: the gradient along the step did not change (the step could be longer); ``rho = 1/2``:
the step ended at the minimum along its direction; ``rho = 0``: it overshot to a point as high as
the start; ``rho < 0``: the loss rose. ``delta_t = -lr_t v_{t+1}`` comes from the momentum buffers:
after each update the rule keeps them concatenated in one float32 vector (``damping.moments``, one
value per weight), so that the next step reads one Parameter instead of every buffer a second time
(MindSpore 2.10 copies every read of a Parameter that a graph reads twice: two copies of every
buffer per step, measured). With parameter groups (one learning rate per parameter) it reads the
buffers instead and keeps no copy. ``g_{t+1}`` comes from a new
mini-batch, so the numerator and denominator are exponential averages (``ratio_decay``) before the
ratio is taken, and only steps whose two gradients are finite and whose step descends
(``g_t' delta_t < 0``) enter them.

Every step the damping multiplier ``boost`` (>= 1: the user's damping is the start and the floor) is

* multiplied by ``max(2 (1 - rho), BOOST_UP)`` when ``rho < 1/4`` and divided by ``BOOST_DOWN`` when
  ``rho > 3/4`` (Martens & Grosse's thresholds). On a quadratic, a step ``k`` times longer than the
  minimiser along its direction gives ``rho = 1 - k/2``, so ``2 (1 - rho) = k`` is the factor by which
  the step was too long, and the damping -- which sets the step length in the directions of low
  curvature, where K-FAC overshoots -- is raised by that much at once. Martens & Grosse's gentle
  factor ``(19/20)^T`` is too slow here: a mis-damped run dies within a few steps;
* clipped to ``[1, max_boost]``;
* a change of the multiplier by more than 2x since the last inversion makes the inverses due at
  once (a stale inverse would keep the old damping until the next scheduled refresh).

The rule itself is :meth:`DampingController.adapt` (fold ``s'_t = g_{t+1}' delta_t`` into the ratio and
move the multiplier) and :meth:`DampingController.remember` (store ``s_t = g_t' delta_t`` and the rates
of the step just taken). Called as a Cell, the controller runs both for one step from scalars, so the
rule can be driven step by step without a network (tests/optimizers/test_damping_controller.py, against
a NumPy replay). Its Parameters are named ``{prefix}.damping.*``, as they were when the optimizer held
them itself: checkpoints load unchanged.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .._graph import first
from .update import dots_after, flat_after, parameter_rates

__all__ = ["DampingController", "BOOST_UP", "BOOST_DOWN", "RAISE_BELOW", "LOWER_ABOVE", "REINVERT_RATIO"]

BOOST_UP = 1.5
BOOST_DOWN = 1.2
RAISE_BELOW = 0.25      # the reduction ratio below which the multiplier rises (Martens & Grosse's 1/4)
LOWER_ABOVE = 0.75      # ... and above which it falls (their 3/4)
REINVERT_RATIO = 2.0


class DampingController(nn.Cell):
    """The adaptive damping multiplier and the state of its reduction ratio (see the module docstring).

    Args:
        prefix (str): the optimizer's Parameter prefix (its ``policy.name``).
        num_params (int): how many parameters the optimizer updates (the length of ``damping.step_lr``).
        max_boost (float): the multiplier's ceiling (``Policy.max_damping_boost``).
        ratio_decay (float): the decay of the reduction ratio's exponential averages.
        moments_size (int): with one learning rate, the number of weights: the momentum buffers are
            kept concatenated in ``{prefix}.damping.moments``; 0 keeps no copy (parameter groups, or
            adaptive damping off).
        per_parameter (bool): parameter groups: one learning rate per parameter, and the momentum
            buffers are read per parameter instead of from the kept copy.

    Parameters (float32): ``{prefix}.damping.boost`` (the multiplier), ``.boost_inverted`` (its value
    when the inverses were computed), ``.step_slope`` (``g_t' delta_t``; 0: no usable step),
    ``.step_lr`` (each parameter's ``lr_t``), ``.ratio_num`` and ``.ratio_den`` (the averages), and
    ``.moments`` when ``moments_size`` > 0.

    Called as a Cell, ``controller(slope_next, finite, slope, rates)`` runs one step of the rule from
    scalars: :meth:`adapt` with ``s'_t = slope_next``, then :meth:`remember` of ``s_{t+1} = slope``
    and ``rates``; it returns the new multiplier.
    """

    def __init__(self, prefix, num_params, max_boost=1e4, ratio_decay=0.9, moments_size=0, per_parameter=False):
        super().__init__(auto_prefix=False)
        self.max_boost = float(max_boost)
        self.ratio_decay = float(ratio_decay)
        self.num_params = int(num_params)
        self.per_parameter = bool(per_parameter)

        def scalar(value, name):
            return Parameter(Tensor(np.asarray(value, np.float32)), name=f"{prefix}.{name}", requires_grad=False)

        self.boost = scalar(1.0, "damping.boost")
        self.boost_inverted = scalar(1.0, "damping.boost_inverted")
        self.step_slope = scalar(0.0, "damping.step_slope")          # g_t' delta_t (0: no usable step)
        # each parameter's lr_t (parameter groups may differ), to rebuild delta_t = -lr_t v_{t+1}
        self.step_lr = scalar(np.zeros(self.num_params), "damping.step_lr")
        self.ratio_num = scalar(0.0, "damping.ratio_num")
        self.ratio_den = scalar(0.0, "damping.ratio_den")
        # v_{t+1}, concatenated after the update of step t (see the module docstring)
        self.moments = scalar(np.zeros(int(moments_size)), "damping.moments") if moments_size else None

    def construct(self, slope_next, finite, slope, rates):
        adapted = self.adapt(slope_next, finite)      # (indexed, not unpacked: no isolated node)
        self.remember(slope, rates, finite)
        return adapted[1]

    # ------------------------------------------------------------------ the rule
    def adapt(self, slope_next, finite):
        """Fold ``s'_t = g_{t+1}' delta_t`` (``slope_next``) into the reduction ratio and move the
        multiplier: returns (whether the step entered the ratio, the new multiplier). Only a step with
        ``finite`` gradients, a finite ``slope_next`` and a descending stored step (``s_t < 0``) counts."""
        slope = self.step_slope
        usable = ops.logical_and(ops.logical_and(finite, slope < 0), ops.isfinite(slope_next))
        decay = self.ratio_decay
        num = ops.where(usable, decay * self.ratio_num + (1 - decay) * 0.5 * (slope + slope_next), self.ratio_num)
        den = ops.where(usable, decay * self.ratio_den + (1 - decay) * slope, self.ratio_den)
        ops.assign(self.ratio_num, num)
        ops.assign(self.ratio_den, den)
        rho = num / ops.where(den < 0, den, -ops.ones_like(den))
        boost = self.boost
        overshoot = ops.maximum(2.0 * (1.0 - rho), BOOST_UP)
        factor = ops.where(rho < RAISE_BELOW, overshoot,
                           ops.where(rho > LOWER_ABOVE, ops.fill(ms.float32, (), 1.0 / BOOST_DOWN), ops.ones((), ms.float32)))
        factor = ops.where(ops.logical_and(usable, den < 0), factor, ops.ones((), ms.float32))
        boost = ops.clip_by_value(boost * factor, 1.0, self.max_boost)
        ops.assign(self.boost, boost)
        return usable, boost

    def remember(self, slope, rates, finite):
        """Store ``s_t = g_t' delta_t`` of the step just taken (0 unless ``finite``) and its per-parameter
        learning rates ``rates``."""
        ops.assign(self.step_slope, ops.where(finite, slope, ops.zeros_like(slope)))
        ops.assign(self.step_lr, rates)

    def ratio(self):
        """(the multiplier, the reduction ratio ``rho``) as stored, read as values (for the divergence
        evidence; -1 is the denominator while no step has entered the ratio)."""
        boost = self.boost * 1.0
        den = self.ratio_den * 1.0
        return boost, self.ratio_num / ops.where(den < 0, den, -ops.ones_like(den))

    # ------------------------------------------------------------------ in the optimizer's step
    def next_slope(self, gradients, flat, finite, moments):
        """``s'_t = g_{t+1}' delta_t``: this step's gradients (``flat``: concatenated as float32) against
        the step stored by :meth:`remember_step`; ``moments`` are the optimizer's momentum buffers, read
        (after ``finite``) only with parameter groups. Call before the momentum update."""
        if self.per_parameter:
            return -self._group_dot(gradients, self.step_lr, finite, moments)
        return -ops.reduce_sum(flat * self.moments) * first(self.step_lr)

    def remember_step(self, gradients, flat, lr, finite, token, moments):
        """:meth:`remember` the step just taken (after the update ``token``): ``g_t' delta_t`` from the
        gradients and the momentum buffers ``moments`` read after it, with the learning rate ``lr``
        (``get_lr()``: one per parameter with parameter groups)."""
        if self.per_parameter:
            rates = parameter_rates(lr)
            slope = -self._group_dot(gradients, rates, token, moments)
        else:
            rates = ops.broadcast_to(ops.cast(lr, ms.float32).reshape(()), (self.num_params,))
            # v_{t+1}, read once after the update and kept for the next step's next_slope
            kept = flat_after(moments, token)
            ops.assign(self.moments, kept)
            slope = -ops.reduce_sum(flat * kept) * first(rates)
        self.remember(slope, rates, finite)

    @staticmethod
    def _group_dot(gradients, rates, token, moments):
        """``sum_i rates_i <g_i, v_i>`` over the parameters, the momentum buffers ``v`` read after
        ``token``: one dot product per parameter, for parameter groups (one learning rate per
        parameter). With one learning rate it is one dot product of the concatenated vectors."""
        return ops.reduce_sum(rates * dots_after(gradients, moments, token))

    def reinvert(self, boost):
        """(whether the multiplier ``boost`` moved by more than 2x since the inverses were computed, the
        multiplier they were computed with)."""
        inverted = self.boost_inverted * 1.0     # a value: passing the Parameter on would read it again
        ratio = boost / inverted
        return ops.logical_or(ratio > REINVERT_RATIO, ratio < 1.0 / REINVERT_RATIO), inverted

    def inverted_at(self, due, boost, inverted):
        """Record the multiplier the inverses were computed with (``boost`` when ``due``)."""
        ops.assign(self.boost_inverted, ops.where(due, boost, inverted))

    # ------------------------------------------------------------------ host side
    def upgrade(self, param_dict, moment_names):
        """``param_dict`` with ``damping.moments`` added (the momentum buffers ``moment_names``,
        concatenated) when a checkpoint written before it existed has the buffers; otherwise
        ``param_dict`` itself."""
        if self.moments is None or self.moments.name in param_dict:
            return param_dict
        if not all(key in param_dict for key in moment_names):
            return param_dict
        out = dict(param_dict)
        flat = np.concatenate([np.asarray(out[key].asnumpy(), np.float32).reshape(-1) for key in moment_names])
        out[self.moments.name] = Parameter(Tensor(flat), name=self.moments.name, requires_grad=False)
        return out
