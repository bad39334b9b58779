"""The divergence rules: when a run has diverged, and the message that stops it.

The run stops with ``RuntimeError("<Optimizer> diverged at step ...")`` naming the evidence and what
to change when ``patience`` consecutive steps had a non-finite gradient (the weights or the
curvature can no longer produce a usable step; non-finite weights give non-finite gradients too).
It stops the same way when ``patience`` consecutive finite steps *explode* (a divergence that
stays finite: the loss rises by orders of magnitude while every value is a number): a finite step
explodes when its gradient norm is more than ``divergence_growth`` (default 1e3) times the norm of
the first finite step, or when the damping multiplier is pinned at ``max_boost`` (> 1) while the
reduction ratio still asks for more damping (below ``RAISE_BELOW``, 1/4). A multiplier that sits at
its maximum with a normal ratio belongs to a run that the largest damping has tamed, and it does not
count (SP-NGD on Fashion-MNIST 2c2d at damping 1e-3: stopped there before, it recovers from an
infinite loss to 86% test accuracy within 100 steps; docs/algorithms.md, "Fault handling"). A healthy
finite step resets that count, a skipped step leaves it. The gradients it sees are already unscaled
(loss scale), and single spikes of the norm on healthy runs (up to ~190x the first step's on the
digits CNN, measured) stay below the threshold and never last ``patience`` steps.
MindSpore's graph-mode ``raise`` accepts only built-in exception types, hence ``RuntimeError``;
:func:`mindspore_ngd.is_divergence` recognises it.

The counts are :class:`Divergence`'s (a mixin of :class:`mindspore_ngd.NGDOptimizer`), the message is
:func:`stop_message`'s; where the stop is raised or recorded is :mod:`mindspore_ngd.optim.status`'s.
"""
import numpy as np

import mindspore as ms
from mindspore import ops, Parameter, Tensor

from .. import _validate
from .damping import RAISE_BELOW

__all__ = ["Divergence", "DIVERGED", "ADVICE", "is_divergence", "check_divergence_growth", "stop_message"]

DIVERGED = "diverged at step"
ADVICE = ("Raise the damping, clip the update (kl_clip=1e-3, the default; smaller if it is set already) or lower "
          "the learning rate.")


def check_divergence_growth(value):
    """``divergence_growth`` validated: None, or a finite float > 1 (TypeError/ValueError naming it)."""
    return _validate.growth_factor("divergence_growth", value, "how many times the first gradient norm counts as "
                                   "exploding", none_allowed=True)


def is_divergence(error):
    """Whether ``error`` (an exception from training) is the divergence stop of an optimizer."""
    return isinstance(error, RuntimeError) and DIVERGED in str(error)


def stop_message(name, step, run, total, patience, finite_run, norm, reference, growth, pinned, boost, max_boost,
                 rho):
    """The message of the divergence stop at ``step`` ("" when none is due): ``run`` consecutive
    non-finite steps (``total`` skipped in all), or ``finite_run`` consecutive finite steps that explode,
    with the evidence of :meth:`Divergence._exploding`. Built on the host, by the host call of the step
    (``host_calls=True``) or by :meth:`~mindspore_ngd.optim.status.DeviceStatus.check_status` from the
    recorded status."""
    step, run, patience = int(step), int(run), int(patience)
    if run >= patience:
        return (f"{name} {DIVERGED} {step}: {run} consecutive steps with a non-finite gradient ({int(total)} skipped "
                f"in total; damping multiplier {boost:g}). {ADVICE}")
    if int(finite_run) >= patience:
        reasons = []
        if reference > 0 and growth > 0 and norm > growth * reference:
            reasons.append(f"the gradient norm {norm:.3g} is {norm / reference:.3g}x its reference {reference:.3g} "
                           f"(the first finite step's; divergence_growth={growth:g})")
        if pinned:
            reasons.append(f"adaptive damping's multiplier is pinned at its maximum {max_boost:g} "
                           f"(max_damping_boost) and the steps still overshoot (reduction ratio {rho:.3g} < "
                           f"{RAISE_BELOW:g})")
        return (f"{name} {DIVERGED} {step}: {int(finite_run)} consecutive finite steps that explode: "
                f"{'; '.join(reasons) or 'see the previous steps'} (damping multiplier {boost:g}). {ADVICE}")
    return ""


class Divergence:
    """Graph-mode divergence counts of :class:`mindspore_ngd.NGDOptimizer` (a mixin; see the module
    docstring). ``_build_divergence`` creates its state Parameters; :meth:`_exploding` reads the
    damping controller (``self.damping_controller``) for the pinned multiplier."""

    def _build_divergence(self, prefix, patience, growth):
        self.divergence_patience = int(patience)
        self.divergence_growth = None if growth is None else float(growth)

        def scalar(value, name, dtype):
            return Parameter(Tensor(np.asarray(value, dtype)), name=f"{prefix}.{name}", requires_grad=False)

        self.nonfinite_run = scalar(0, "nonfinite_run", np.int32)
        # finite divergence: the gradient norm of the first finite step (0: none yet), and the run of
        # consecutive finite steps that explode (see the module docstring)
        self.grad_reference = scalar(0.0, "divergence.grad_reference", np.float32)
        self.finite_run = scalar(0, "divergence.finite_run", np.int32)

    def _nonfinite_run(self, finite):
        """Count the consecutive steps with a non-finite gradient: the new count (0 on a finite step)."""
        run = ops.where(finite, ops.zeros((), ms.int32), self.nonfinite_run + 1)
        ops.assign(self.nonfinite_run, run)
        return run

    def _exploding(self, flat, finite):
        """Count the consecutive finite steps that explode: (the new count, the evidence for the
        message). A finite step explodes when its gradient norm exceeds ``divergence_growth`` times the
        reference (the norm of the first finite step), or when adaptive damping's multiplier is pinned
        at ``max_damping_boost`` (> 1) and the reduction ratio is still below ``RAISE_BELOW``: the rule
        would raise it further and cannot, so the steps still overshoot. Non-finite steps leave the count as it is, a healthy finite step resets
        it. Only reads values the step computes anyway: the weights and updates are unchanged."""
        norm = ops.sqrt(ops.reduce_sum(flat * flat))
        reference = self.grad_reference * 1.0
        first = ops.logical_and(ops.logical_and(finite, reference <= 0),
                                ops.logical_and(ops.isfinite(norm), norm > 0))
        reference = ops.where(first, norm, reference)
        ops.assign(self.grad_reference, reference)
        zero = ops.zeros((), ms.float32)
        growth = zero if self.divergence_growth is None else ops.fill(ms.float32, (), self.divergence_growth)
        exploded = ops.zeros((), ms.bool_)
        if self.divergence_growth is not None:
            exploded = ops.logical_and(reference > 0, norm > growth * reference)
        pinned = ops.zeros((), ms.bool_)
        boost, rho = ops.ones((), ms.float32), zero
        if self.adaptive_damping:
            boost, rho = self.damping_controller.ratio()
            if self.max_boost > 1:
                pinned = ops.logical_and(boost >= self.max_boost, rho < RAISE_BELOW)
        bad = ops.logical_and(finite, ops.logical_or(exploded, pinned))
        old = self.finite_run * 1
        count = ops.where(bad, old + 1, ops.where(finite, ops.zeros((), ms.int32), old))
        ops.assign(self.finite_run, count)
        return count, (count, norm, reference, growth, pinned, boost, ops.fill(ms.float32, (), self.max_boost), rho)
