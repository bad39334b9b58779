"""Adaptive damping and divergence detection: training either works or stops with a reason.

Adaptive damping (in the spirit of the Levenberg-Marquardt rule of Martens & Grosse 2015, sec. 6.5)
---------------------------------------------------------------------------------------------------
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

Divergence
----------
The run stops with ``RuntimeError("<Optimizer> diverged at step ...")`` naming the evidence and what
to change when ``patience`` consecutive steps had a non-finite gradient (the weights or the
curvature can no longer produce a usable step; non-finite weights give non-finite gradients too).
It stops the same way when ``patience`` consecutive finite steps *explode* (a divergence that
stays finite: the loss rises by orders of magnitude while every value is a number): a finite step
explodes when its gradient norm is more than ``divergence_growth`` (default 1e3) times the norm of
the first finite step, or when the damping multiplier is pinned at ``max_boost`` (> 1). A healthy
finite step resets that count, a skipped step leaves it. The gradients it sees are already unscaled
(loss scale), and single spikes of the norm on healthy runs (up to ~190x the first step's on the
digits CNN, measured) stay below the threshold and never last ``patience`` steps.
MindSpore's graph-mode ``raise`` accepts only built-in exception types, hence ``RuntimeError``;
:func:`mindspore_ngd.is_divergence` recognises it.
Every skipped (non-finite) step is reported as it happens through the ``mindspore_ngd`` logger at
WARNING level. The stop's message is built on the host, in the one reporting call of the step (:func:`_alert`).
Both are host calls from the compiled graph (MindSpore's graph-mode ``raise`` and
Python calls in a run-time branch). MindSpore 2.10 cannot save a graph with host calls in its
compile cache, so :func:`refuse_compile_cache` stops an optimizer built while the cache is on.

Without host calls (``host_calls=False``; "auto" picks it on Ascend and GPU, whose graphs -- GE's
whole-graph sink on Ascend -- run without a host round trip inside a step) the step computes the same
counts and stop conditions but records the stop in Parameters: ``{prefix}.status`` (int32: reason code
of :data:`STOP_REASONS`, step, non-finite run, skipped steps, finite run; all 0 while running) and
``{prefix}.divergence.evidence`` (float32: gradient norm, reference, growth, pinned, multiplier, max
multiplier, rho). From the stop on every step is frozen (treated as a skipped step: no weight, moment or
factor changes). Skipped steps, demotions and the stop are printed by ``ops.Print`` (documented for
Ascend, GPU and CPU). :meth:`Guard.check_status` raises on the host the message the host-call graph
raises (:func:`stop_message` builds both); :class:`mindspore_ngd.TrainingGuard` calls it from
``Model.train``. Healthy steps are bit-identical in both graphs (tests/optimizers/test_device_reporting.py).
"""
import functools
import logging
import os

import numpy as np

import mindspore as ms
from mindspore import ops, Parameter, Tensor

from .. import _validate
from .._graph import first
from .update import dots_after, flat_after, parameter_rates

__all__ = ["Guard", "DIVERGED", "BOOST_UP", "BOOST_DOWN", "DEVICE_HOST_CALLS", "STOP_REASONS", "is_divergence",
           "check_divergence_growth", "resolve_host_calls", "refuse_compile_cache", "stop_message",
           "accumulation_message"]

logger = logging.getLogger("mindspore_ngd")

DIVERGED = "diverged at step"
BOOST_UP = 1.5
BOOST_DOWN = 1.2
REINVERT_RATIO = 2.0

# host_calls="auto": whether the step may call back into Python, per device target. GE (Ascend's
# default back-end) and GPU graphs run whole-graph on the device: no host callback inside the step
DEVICE_HOST_CALLS = {"CPU": True, "GPU": False, "Ascend": False}
# the reason codes of ``{prefix}.status[0]`` (host_calls=False)
STOP_REASONS = {0: "running", 1: "non-finite gradients", 2: "finite steps that explode",
                3: "a layer captured nothing (strict=True)",
                4: "several backward passes summed into one step (gradient accumulation)"}


def resolve_host_calls(value, device_target=None):
    """``host_calls`` resolved to a bool: "auto" is :data:`DEVICE_HOST_CALLS` of ``device_target``
    (default: the context's, read now); TypeError for anything but "auto" or a bool."""
    if isinstance(value, bool):
        return value
    if value != "auto":
        raise TypeError(f'host_calls must be "auto", True or False, got {value!r}')
    target = device_target or ms.get_context("device_target")
    return DEVICE_HOST_CALLS.get(target, False)


def refuse_compile_cache(owner):
    """Raise a RuntimeError naming the switch when MindSpore's compile cache is on
    (``MS_COMPILER_CACHE_ENABLE=1``, or the deprecated ``set_context(enable_compile_cache=True)``).

    The step's host calls (the divergence stop and the skipped-step and demoted-layer reports) are
    JIT-fallback ``PyExecute`` nodes, and MindSpore 2.10 fails at the first call of such a graph with
    "Cannot export a PyExecute CNode in MindIR" (measured). Refused here, before any compilation."""
    by_env = os.environ.get("MS_COMPILER_CACHE_ENABLE", "0").strip() not in ("", "0")
    if by_env or ms.get_context("enable_compile_cache"):
        switch = "MS_COMPILER_CACHE_ENABLE=1" if by_env else "set_context(enable_compile_cache=True)"
        raise RuntimeError(f"{owner} cannot be compiled with MindSpore's compile cache on ({switch}): its step "
                           "calls back into Python (divergence stop, skipped-step and demoted-layer reports), "
                           "and MindSpore 2.10 cannot save such a graph (\"Cannot export a PyExecute CNode in "
                           "MindIR\"). Unset the cache for runs that use this optimizer.")


def check_divergence_growth(value):
    """``divergence_growth`` validated: None, or a finite float > 1 (TypeError/ValueError naming it)."""
    return _validate.growth_factor("divergence_growth", value, "how many times the first gradient norm counts as "
                                   "exploding", none_allowed=True)


def is_divergence(error):
    """Whether ``error`` (an exception from training) is the divergence stop of an optimizer."""
    return isinstance(error, RuntimeError) and DIVERGED in str(error)


ADVICE = "Raise the damping, enable kl_clip (e.g. kl_clip=1e-3) or lower the learning rate."


def accumulation_message(name, step, passes):
    """The error of a step that received the gradients of several backward passes (gradient
    accumulation, :meth:`Guard._accumulated`)."""
    return (f"{name} received at step {int(step)} the gradients of {int(passes)} backward passes: gradient "
            "accumulation (micro-batch gradients summed, then one optimizer call) is not supported. Each "
            "backward pass overwrites the layers' curvature statistics, so the step would precondition the "
            "summed gradient with the statistics of the last micro-batch only. Call the optimizer once per "
            "forward/backward pass: `loss, grads = grad_fn(x, y); opt(grads)` on the whole batch you would have "
            "accumulated (stat_fraction= and stat_stride= cut the cost of its statistics), or more steps on "
            "the micro-batches. No weight was changed by this step.")


def _alert(name, finite, step, run, total, demoted, report_demoted, patience, evidence, passes=0):
    """Host side of :meth:`Guard._watch` (called from the compiled step through MindSpore's JIT
    fallback): a WARNING for a skipped step; the report of layers demoted in the previous step; the
    message of the stop when one is due (else ""): gradient accumulation (``passes`` > 0, the backward
    passes counted), or divergence. ``evidence`` holds the finite-divergence values ``(run, gradient
    norm, reference, growth, pinned, multiplier, max multiplier, rho)``."""
    step, run, patience = int(step), int(run), int(patience)
    if int(passes) > 0:
        return accumulation_message(name, step, passes)
    if not bool(finite):
        logger.warning("%s: step %d skipped: non-finite gradient (%d in a row, %d in total); weights and "
                       "moments unchanged", name, step, run, int(total))
    if np.asarray(demoted).any():
        report_demoted(demoted)
    return stop_message(name, step, run, total, patience, *(np.asarray(v).item() for v in evidence))


def stop_message(name, step, run, total, patience, finite_run, norm, reference, growth, pinned, boost, max_boost,
                 rho):
    """The message of the divergence stop at ``step`` ("" when none is due): ``run`` consecutive
    non-finite steps (``total`` skipped in all), or ``finite_run`` consecutive finite steps that explode,
    with the evidence of :meth:`Guard._exploding`. Built on the host, by the host call of the step
    (``host_calls=True``) or by :meth:`Guard.check_status` from the recorded status."""
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
                           f"(max_damping_boost; reduction ratio {rho:.3g})")
        return (f"{name} {DIVERGED} {step}: {int(finite_run)} consecutive finite steps that explode: "
                f"{'; '.join(reasons) or 'see the previous steps'} (damping multiplier {boost:g}). {ADVICE}")
    return ""


class Guard:
    """Graph-mode methods of :class:`mindspore_ngd.NGDOptimizer` for adaptive damping and divergence
    (a mixin; see the module docstring). ``_build_guard`` creates its state Parameters."""

    def _build_guard(self, prefix, adaptive, patience, max_boost, ratio_decay, growth, host_calls=True):
        self.host_calls = bool(host_calls)
        self.adaptive_damping = bool(adaptive)
        self.divergence_patience = int(patience)
        self.divergence_growth = None if growth is None else float(growth)
        # called from the compiled step as one host call (a partial is not parsed into the graph: the
        # whole function runs in Python, f-string formats and list operations included)
        self._alert = functools.partial(_alert, self._guard_name)
        self.max_boost = float(max_boost)
        self.ratio_decay = float(ratio_decay)

        def scalar(value, name, dtype=np.float32):
            return Parameter(Tensor(np.asarray(value, dtype)), name=f"{prefix}.{name}", requires_grad=False)

        self.damping_boost = scalar(1.0, "damping.boost")
        self.boost_inverted = scalar(1.0, "damping.boost_inverted")
        self.step_slope = scalar(0.0, "damping.step_slope")          # g_t' delta_t (0: no usable step)
        # each parameter's lr_t (parameter groups may differ), to rebuild delta_t = -lr_t v_{t+1}
        self.step_lr = scalar(np.zeros(self.num_params), "damping.step_lr")
        self.ratio_num = scalar(0.0, "damping.ratio_num")
        self.ratio_den = scalar(0.0, "damping.ratio_den")
        self.nonfinite_run = scalar(0, "nonfinite_run", np.int32)
        # finite divergence: the gradient norm of the first finite step (0: none yet), and the run of
        # consecutive finite steps that explode (see the module docstring)
        self.grad_reference = scalar(0.0, "divergence.grad_reference")
        self.finite_run = scalar(0, "divergence.finite_run", np.int32)
        # without host calls: the stop, recorded where the host reads it (check_status) -- status: (reason
        # code of STOP_REASONS, step, non-finite run, skipped steps, finite run) at the stop, 0 while
        # running; evidence: (gradient norm, reference, growth, pinned, multiplier, max multiplier, rho)
        self.run_status = self.stop_evidence = None
        if not self.host_calls:
            self.run_status = scalar(np.zeros(5), "status", np.int32)
            self.stop_evidence = scalar(np.zeros(7), "divergence.evidence")
            name = self._guard_name
            self._print = ops.Print()
            self._print_texts = (
                f"{name}: step", "skipped: non-finite gradient; weights and moments unchanged. In a row:",
                f"{name}: layers demoted to the plain update (captured nothing; flags in layer order, names "
                "from opt.check_status()):",
                f"{name} stopped at step", "-- the weights are frozen from this step on; opt.check_status() (or "
                "the mindspore_ngd.TrainingGuard callback) raises the reason. Reason code (1 non-finite "
                "gradients, 2 finite steps that explode, 3 a layer captured nothing with strict=True, 4 "
                "gradient accumulation):")
        self._reported_skips = 0
        self._reported_demoted = np.zeros(self.num_layers, np.bool_)
        # v_{t+1}, concatenated after the update of step t (see the module docstring)
        self.kept_moments = None
        if self.adaptive_damping and not self.is_group_lr:
            size = sum(int(np.prod(p.shape)) for p in self._parameters)
            self.kept_moments = scalar(np.zeros(size), "damping.moments")

    def _upgrade_guard(self, param_dict):
        """``param_dict`` with ``damping.moments`` added (the momentum buffers it holds, concatenated)
        when a checkpoint written before it existed has the buffers; otherwise ``param_dict`` itself."""
        if self.kept_moments is None or self.kept_moments.name in param_dict:
            return param_dict
        keys = [moment.name for moment in self.moments]
        if not all(key in param_dict for key in keys):
            return param_dict
        out = dict(param_dict)
        flat = np.concatenate([np.asarray(out[key].asnumpy(), np.float32).reshape(-1) for key in keys])
        out[self.kept_moments.name] = Parameter(Tensor(flat), name=self.kept_moments.name, requires_grad=False)
        return out

    # ------------------------------------------------------------------ before the update
    def _accumulated(self, gradients, token):
        """``(refused, passes)``: whether this step's gradients are the sum of several backward passes
        (gradient accumulation), and the passes counted since the last step (a float32 scalar; the
        counter is cleared here). Read after ``token`` (a value of every gradient).

        One layer counts the finite backward passes through it (:meth:`LayerCapture.count_passes`). More
        than one is refused, unless the gradient the optimizer received is the last pass's alone: a
        training cell that discards the gradients of a pass and runs another (``TrainOneStepWithLossScaleCell``
        skips the optimizer on a loss-scale overflow) leaves the statistics of the pass it keeps, which
        are right. That is told, on one device, by the loss-scale probe: the bias gradient received is
        parallel to the last pass's (:meth:`LossScaleProbe.measure`); a sum over micro-batches is not.
        Without that test (no preconditioned layer with a bias, or distributed: the probe would need a
        collective) the count alone decides; a pass counts only when its output gradient at the counting
        layer is finite (an overflow seldom stays finite down to the first layer, which counts when no
        layer has a bias). A step driven by the Monte-Carlo Fisher step, which runs its own backward
        passes, is not checked."""
        capture = None if self._pass_layer is None else self.blocks[self._pass_layer].capture
        if capture is None or self.capture_control.driver is not None:
            return ops.zeros((), ms.bool_), ops.zeros((), ms.float32)
        # a value computed now (a cast: ``* 1`` is folded away, and the counter would be read after its clear)
        passes = ops.cast(ops.depend(capture.passes, token), ms.float32)
        ops.assign(capture.passes, ops.depend(ops.zeros((), ms.int32), passes))
        refused = passes > 1.5
        probe = self.capture_control.scale_probe
        if probe is not None and not self.exchange.distributed:
            _, last_alone = probe.measure(probe.probe(token), gradients)
            refused = ops.logical_and(refused, ops.logical_not(last_alone))
        return refused, passes

    def _watch(self, flat, finite, step, demoted, accumulated):
        """The watch of the step before the update: :meth:`_watch_host` with host calls,
        :meth:`_watch_device` without. ``accumulated`` is :meth:`_accumulated`'s pair. Returns whether
        the step may change the weights."""
        if self.host_calls:
            return self._watch_host(flat, finite, step, demoted, accumulated)
        return self._watch_device(flat, finite, step, demoted, accumulated)

    def _watch_host(self, flat, finite, step, demoted, accumulated):
        """Refuse gradient accumulation (``accumulated``), report a skipped step and the layers demoted in
        the previous step (``demoted``, a bool vector), stop a diverged run (non-finite, or finite and
        exploding: :meth:`_exploding`); returns
        ``finite`` (for ordering). One run-time branch holds every host call of the step: more than
        one, or one after the fold, broke the reload of a checkpoint into the compiled graph
        (measured, MindSpore 2.10); its message is built on the host, raised from the graph."""
        run = ops.where(finite, ops.zeros((), ms.int32), self.nonfinite_run + 1)
        ops.assign(self.nonfinite_run, run)
        finite_run, evidence = self._exploding(flat, finite)
        patience = self.divergence_patience
        refused = accumulated[0]
        if ops.logical_or(ops.logical_or(ops.logical_or(ops.logical_not(finite), ops.any(demoted)),
                                         finite_run >= patience), refused):
            passes = ops.where(refused, accumulated[1], ops.zeros((), ms.float32))
            message = self._alert(finite, step, run, self.skipped_steps + 1, demoted, self._report_invisible,
                                  patience, evidence, passes)
            if ops.logical_or(ops.logical_or(run >= patience, finite_run >= patience), refused):
                raise RuntimeError(message)
        return finite

    def _watch_device(self, flat, finite, step, demoted, accumulated):
        """:meth:`_watch_host` without a host call (``host_calls=False``, Ascend and GPU by default):
        the same counts and the same stop conditions, but the stop is recorded in ``{prefix}.status``
        and ``{prefix}.divergence.evidence`` (read by :meth:`check_status`), the reports are
        ``ops.Print`` lines, and from the stop on every step is frozen: it changes no weight, moment or
        factor (it is skipped, as a non-finite step). With ``strict``, a demoted layer stops the run the
        same way, and so does gradient accumulation (``accumulated``; reason 4, the passes counted in the
        status's third entry). Returns ``finite`` and-ed with "not stopped"."""
        run = ops.where(finite, ops.zeros((), ms.int32), self.nonfinite_run + 1)
        ops.assign(self.nonfinite_run, run)
        finite_run, evidence = self._exploding(flat, finite)
        patience = self.divergence_patience
        status = self.run_status * 1
        live = status[0] <= 0
        zero = ops.zeros((), ms.int32)
        reason = ops.where(run >= patience, ops.fill(ms.int32, (), 1),
                           ops.where(finite_run >= patience, ops.fill(ms.int32, (), 2), zero))
        any_demoted = ops.any(demoted)
        if self.strict:
            reason = ops.where(ops.logical_and(reason <= 0, any_demoted), ops.fill(ms.int32, (), 3), reason)
        refused = accumulated[0]
        reason = ops.where(refused, ops.fill(ms.int32, (), 4), reason)
        stops = ops.logical_and(live, reason > 0)
        total = self.skipped_steps + 1
        counted = ops.where(refused, ops.cast(accumulated[1], ms.int32), run)
        record = ops.stack((reason, ops.cast(step, ms.int32), counted, ops.cast(total, ms.int32), finite_run))
        ops.assign(self.run_status, ops.where(stops, record, status))
        # (indexed, not unpacked: an unused element of the tuple is an isolated node MindSpore warns about)
        values = ops.stack((evidence[1], evidence[2], evidence[3], ops.cast(evidence[4], ms.float32), evidence[5],
                            evidence[6], evidence[7]))
        ops.assign(self.stop_evidence, ops.where(stops, values, self.stop_evidence * 1))
        texts = self._print_texts
        if ops.logical_and(live, ops.logical_not(finite)):
            self._print(texts[0], step, texts[1], run)
        if ops.logical_and(live, any_demoted):
            self._print(texts[2], demoted)
        if stops:
            self._print(texts[3], step, texts[4], reason)
        return ops.logical_and(finite, ops.logical_not(ops.logical_or(stops, ops.logical_not(live))))

    # ------------------------------------------------------------------ host side
    def check_status(self):
        """Read the optimizer's status on the host; raise the reason of a stop.

        Without host calls (``host_calls=False``; the default on Ascend and GPU) the compiled step
        cannot raise: it records a stop in ``{prefix}.status`` and freezes the weights, and this method
        raises the ``RuntimeError`` the step would have raised with host calls (the same message:
        :func:`mindspore_ngd.is_divergence` recognises it; with ``strict``, the error naming the layers
        that captured nothing; for gradient accumulation, the error naming the working form). It
        also logs, on the "mindspore_ngd" logger, the WARNINGs of the steps skipped and the layers
        demoted since the last call. Call it between training calls, or let
        :class:`mindspore_ngd.TrainingGuard` call it from ``Model.train``.

        With host calls the step raises itself; this method raises nothing and reports ``stopped`` when
        the divergence counts reached ``divergence_patience`` (the step of the stop is then None).

        Returns:
            dict: ``stopped`` (bool), ``reason`` (a :data:`STOP_REASONS` text), ``step`` (the step of the
            stop, or None), ``skipped_steps``, ``demoted_layers`` (names).
        """
        name = self._guard_name
        skipped = int(self.skipped_steps.asnumpy())
        demoted = np.asarray(self.counters.demoted.asnumpy(), np.bool_).reshape(-1)
        out = {"stopped": False, "reason": STOP_REASONS[0], "step": None, "skipped_steps": skipped,
               "demoted_layers": [s.name for s, flag in zip(self.layer_specs, demoted) if flag]}
        if self.host_calls:                          # the step raised itself; report what the counts say
            run, finite_run = int(self.nonfinite_run.asnumpy()), int(self.finite_run.asnumpy())
            if max(run, finite_run) >= self.divergence_patience:
                out.update(stopped=True, reason=STOP_REASONS[1 if run >= self.divergence_patience else 2])
            return out
        status = np.asarray(self.run_status.asnumpy()).reshape(-1)
        code, step, run, total, finite_run = (int(v) for v in status)
        new = np.logical_and(demoted, np.logical_not(self._reported_demoted))
        if skipped > self._reported_skips and code == 0:
            logger.warning("%s: %d step(s) skipped since the last check: non-finite gradient (%d in total, %d in a "
                           "row now); weights and moments unchanged", name, skipped - self._reported_skips, skipped,
                           int(self.nonfinite_run.asnumpy()))
        self._reported_skips = skipped
        if new.any() and code != 3:
            self._reported_demoted = demoted.copy()
            self._report_invisible(new)
        if code == 0:
            return out
        out.update(stopped=True, reason=STOP_REASONS.get(code, str(code)), step=step)
        if code == 3:
            self._report_invisible(demoted)          # strict: raises the error naming the layers
        if code == 4:
            raise RuntimeError(accumulation_message(name, step, run))
        evidence = np.asarray(self.stop_evidence.asnumpy(), np.float64).reshape(-1).tolist()
        message = stop_message(name, step, run, total, self.divergence_patience, finite_run, *evidence)
        raise RuntimeError(message or f"{name} stopped at step {step}: {out['reason']}")

    def clear_status(self):
        """Clear a recorded stop (``host_calls=False``) and the divergence counts, so that training can go
        on, e.g. after a checkpoint of the frozen run was loaded and the damping or learning rate
        changed. The weights are as they were before the stop."""
        for param in (self.nonfinite_run, self.finite_run, self.run_status):
            if param is not None:
                param.set_data(Tensor(np.zeros(param.shape, np.int32)))

    def _exploding(self, flat, finite):
        """Count the consecutive finite steps that explode: (the new count, the evidence for the
        message). A finite step explodes when its gradient norm exceeds ``divergence_growth`` times the
        reference (the norm of the first finite step), or when adaptive damping's multiplier is pinned
        at ``max_damping_boost`` (> 1; a multiplier that the rule could not raise far enough, and that no
        undershooting step has lowered since). Non-finite steps leave the count as it is, a healthy finite step resets
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
            boost = self.damping_boost * 1.0
            den = self.ratio_den * 1.0
            rho = self.ratio_num / ops.where(den < 0, den, -ops.ones_like(den))
            if self.max_boost > 1:
                pinned = boost >= self.max_boost
        bad = ops.logical_and(finite, ops.logical_or(exploded, pinned))
        old = self.finite_run * 1
        count = ops.where(bad, old + 1, ops.where(finite, ops.zeros((), ms.int32), old))
        ops.assign(self.finite_run, count)
        return count, (count, norm, reference, growth, pinned, boost, ops.fill(ms.float32, (), self.max_boost), rho)

    # Each multiplier is read once per step and passed on (a Parameter read twice in one graph is
    # copied at every read, MindSpore 2.10): ``boost`` is the value _adapt wrote, ``inverted`` the
    # value _reinvert read.
    def _damping(self, schedule_value, boost):
        """The damping of this step: the user's value (its floor) times the adaptive multiplier."""
        if not self.adaptive_damping:
            return schedule_value
        return schedule_value * boost

    def _reinvert(self, boost):
        """(whether the multiplier moved by more than 2x since the inverses were computed, the
        multiplier they were computed with)."""
        if not self.adaptive_damping:
            return ops.zeros((), ms.bool_), None
        inverted = self.boost_inverted * 1.0     # a value: passing the Parameter on would read it again
        ratio = boost / inverted
        return ops.logical_or(ratio > REINVERT_RATIO, ratio < 1.0 / REINVERT_RATIO), inverted

    def _inverted_at(self, due, boost, inverted):
        if self.adaptive_damping:
            ops.assign(self.boost_inverted, ops.where(due, boost, inverted))

    def _adapt(self, gradients, flat, finite):
        """Fold ``g_{t+1}' delta_t`` into the reduction ratio and adapt the multiplier: returns (a token
        for ordering, the multiplier of this step; None without adaptive damping). Call before the
        momentum update (the buffers still hold ``v_{t+1}`` of the previous step). ``flat`` is the
        gradients concatenated as float32 (shared with the finiteness check)."""
        if not self.adaptive_damping:
            return finite, None
        if self.is_group_lr:                                                          # g_{t+1}' delta_t
            slope_next = -self._group_dot(gradients, self.step_lr, finite)
        else:
            slope_next = -ops.reduce_sum(flat * self.kept_moments) * first(self.step_lr)
        slope = self.step_slope
        usable = ops.logical_and(ops.logical_and(finite, slope < 0), ops.isfinite(slope_next))
        decay = self.ratio_decay
        num = ops.where(usable, decay * self.ratio_num + (1 - decay) * 0.5 * (slope + slope_next), self.ratio_num)
        den = ops.where(usable, decay * self.ratio_den + (1 - decay) * slope, self.ratio_den)
        ops.assign(self.ratio_num, num)
        ops.assign(self.ratio_den, den)
        rho = num / ops.where(den < 0, den, -ops.ones_like(den))
        boost = self.damping_boost
        overshoot = ops.maximum(2.0 * (1.0 - rho), BOOST_UP)
        factor = ops.where(rho < 0.25, overshoot,
                            ops.where(rho > 0.75, ops.fill(ms.float32, (), 1.0 / BOOST_DOWN), ops.ones((), ms.float32)))
        factor = ops.where(ops.logical_and(usable, den < 0), factor, ops.ones((), ms.float32))
        boost = ops.clip_by_value(boost * factor, 1.0, self.max_boost)
        ops.assign(self.damping_boost, boost)
        return usable, boost

    # ------------------------------------------------------------------ after the update
    def _remember_step(self, gradients, flat, lr, finite, token):
        """Store ``g_t' delta_t`` of the step just taken (after the update ``token``)."""
        if self.adaptive_damping:
            if self.is_group_lr:
                rates = parameter_rates(lr)
                slope = -self._group_dot(gradients, rates, token)
            else:
                rates = ops.broadcast_to(ops.cast(lr, ms.float32).reshape(()), (self.num_params,))
                # v_{t+1}, read once after the update and kept for the next step's _adapt
                moments = flat_after(self.moments, token)
                ops.assign(self.kept_moments, moments)
                slope = -ops.reduce_sum(flat * moments) * first(rates)
            ops.assign(self.step_slope, ops.where(finite, slope, ops.zeros_like(slope)))
            ops.assign(self.step_lr, rates)
        return token

    def _group_dot(self, gradients, rates, token):
        """``sum_i rates_i <g_i, v_i>`` over the parameters, the momentum buffers ``v`` read after
        ``token``: one dot product per parameter, for parameter groups (one learning rate per
        parameter). With one learning rate it is one dot product of the concatenated vectors, in
        :meth:`_adapt` and :meth:`_remember_step`."""
        return ops.reduce_sum(rates * dots_after(gradients, self.moments, token))
