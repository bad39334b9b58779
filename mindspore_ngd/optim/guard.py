"""Training either works or stops with a reason: the optimizer's guard, the wiring of three parts.

* adaptive damping: :class:`~mindspore_ngd.optim.damping.DampingController`, a Cell the optimizer owns
  (``opt.damping_controller``) and calls; its rule is documented in :mod:`mindspore_ngd.optim.damping`
  and can be run on its own;
* the divergence rules (when a run has diverged, and the message): :mod:`mindspore_ngd.optim.divergence`;
* the step's watch, the device status and its reading on the host (``check_status``,
  ``clear_status``): :mod:`mindspore_ngd.optim.status`.

:class:`Guard` (a mixin of :class:`mindspore_ngd.NGDOptimizer`) builds them, calls the controller from
the step, and keeps the names the optimizer had before they were parted: ``opt.damping_boost``,
``opt.step_slope`` ... are the controller's Parameters, with the same Parameter names
(``{prefix}.damping.*``), so checkpoints load unchanged. The names this module exported are still
importable from it.
"""
import numpy as np

from .damping import BOOST_DOWN, BOOST_UP, REINVERT_RATIO, DampingController  # noqa: F401
from .divergence import (ADVICE, DIVERGED, Divergence, check_divergence_growth, is_divergence,  # noqa: F401
                         stop_message)
from .status import (DEVICE_HOST_CALLS, STOP_REASONS, DeviceStatus, accumulation_message,  # noqa: F401
                     refuse_compile_cache, resolve_host_calls)

__all__ = ["Guard", "DIVERGED", "BOOST_UP", "BOOST_DOWN", "DEVICE_HOST_CALLS", "STOP_REASONS", "is_divergence",
           "check_divergence_growth", "resolve_host_calls", "refuse_compile_cache", "stop_message",
           "accumulation_message"]

# (the optimizer's attribute, the controller's): ``opt.damping_boost`` is ``opt.damping_controller.boost``
_FORMER_NAMES = (("damping_boost", "boost"), ("boost_inverted", "boost_inverted"), ("step_slope", "step_slope"),
                 ("step_lr", "step_lr"), ("ratio_num", "ratio_num"), ("ratio_den", "ratio_den"),
                 ("kept_moments", "moments"))


class Guard(DeviceStatus, Divergence):
    """Adaptive damping, the divergence stop and the status of :class:`mindspore_ngd.NGDOptimizer` (a
    mixin; see the module docstring). ``_build_guard`` creates the damping controller and the state
    Parameters of the other two parts."""

    def _build_guard(self, prefix, adaptive, patience, max_boost, ratio_decay, growth, host_calls=True):
        self.adaptive_damping = bool(adaptive)
        self.max_boost = float(max_boost)
        self.ratio_decay = float(ratio_decay)
        size = 0
        if self.adaptive_damping and not self.is_group_lr:
            size = sum(int(np.prod(p.shape)) for p in self._parameters)
        self.damping_controller = DampingController(prefix, self.num_params, max_boost, ratio_decay, size,
                                                    self.is_group_lr)
        # the controller's Parameters under the optimizer's former attribute names, for host-side reads
        # (plain attributes: not registered a second time as the optimizer's own Parameters)
        for name, attr in _FORMER_NAMES:
            object.__setattr__(self, name, getattr(self.damping_controller, attr))
        self._build_divergence(prefix, patience, growth)
        self._build_status(prefix, host_calls)

    def _upgrade_guard(self, param_dict):
        """``param_dict`` with ``damping.moments`` added (the momentum buffers it holds, concatenated)
        when a checkpoint written before it existed has the buffers; otherwise ``param_dict`` itself."""
        return self.damping_controller.upgrade(param_dict, [moment.name for moment in self.moments])

    # Each multiplier is read once per step and passed on (a Parameter read twice in one graph is
    # copied at every read, MindSpore 2.10): ``boost`` is the value _adapt wrote, ``inverted`` the
    # value the controller's reinvert read (engine.py).
    def _damping(self, schedule_value, boost):
        """The damping of this step: the user's value (its floor) times the adaptive multiplier."""
        if not self.adaptive_damping:
            return schedule_value
        return schedule_value * boost

    def _adapt(self, gradients, flat, finite):
        """Fold ``g_{t+1}' delta_t`` into the reduction ratio and adapt the multiplier: returns (a token
        for ordering, the multiplier of this step; None without adaptive damping). Call before the
        momentum update (the buffers still hold ``v_{t+1}`` of the previous step). ``flat`` is the
        gradients concatenated as float32 (shared with the finiteness check)."""
        if not self.adaptive_damping:
            return finite, None
        controller = self.damping_controller
        return controller.adapt(controller.next_slope(gradients, flat, finite, self.moments), finite)

    # ------------------------------------------------------------------ after the update
    def _remember_step(self, gradients, flat, lr, finite, token):
        """Store ``g_t' delta_t`` of the step just taken (after the update ``token``)."""
        if self.adaptive_damping:
            self.damping_controller.remember_step(gradients, flat, lr, finite, token, self.moments)
        return token
