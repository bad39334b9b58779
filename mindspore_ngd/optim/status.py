"""The step's watch and its reports: where a skipped step, a demoted layer and the divergence stop are
told, in the graph (with host calls) or recorded on the device and read on the host (without).

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
Ascend, GPU and CPU). :meth:`DeviceStatus.check_status` raises on the host the message the host-call
graph raises (:func:`~mindspore_ngd.optim.divergence.stop_message` builds both);
:class:`mindspore_ngd.TrainingGuard` calls it from ``Model.train``. Healthy steps are bit-identical in
both graphs (tests/optimizers/test_device_reporting.py).

The stop conditions themselves are :mod:`mindspore_ngd.optim.divergence`'s.
"""
import functools
import logging
import os

import numpy as np

import mindspore as ms
from mindspore import ops, Parameter, Tensor

from .divergence import stop_message

__all__ = ["DeviceStatus", "DEVICE_HOST_CALLS", "STOP_REASONS", "resolve_host_calls", "refuse_compile_cache",
           "accumulation_message"]

logger = logging.getLogger("mindspore_ngd")

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


def accumulation_message(name, step, passes):
    """The error of a step that received the gradients of several backward passes (gradient
    accumulation, :meth:`DeviceStatus._accumulated`)."""
    return (f"{name} received at step {int(step)} the gradients of {int(passes)} backward passes: gradient "
            "accumulation (micro-batch gradients summed, then one optimizer call) is not supported. Each "
            "backward pass overwrites the layers' curvature statistics, so the step would precondition the "
            "summed gradient with the statistics of the last micro-batch only. Call the optimizer once per "
            "forward/backward pass: `loss, grads = grad_fn(x, y); opt(grads)` on the whole batch you would have "
            "accumulated (stat_fraction= and stat_stride= cut the cost of its statistics), or more steps on "
            "the micro-batches. No weight was changed by this step.")


def _alert(name, finite, step, run, total, demoted, report_demoted, patience, evidence, passes=0):
    """Host side of :meth:`DeviceStatus._watch` (called from the compiled step through MindSpore's JIT
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


class DeviceStatus:
    """The watch of the step and the status read on the host, of :class:`mindspore_ngd.NGDOptimizer` (a
    mixin; see the module docstring). ``_build_status`` creates its state Parameters; the counts come
    from :class:`~mindspore_ngd.optim.divergence.Divergence` (``_nonfinite_run``, ``_exploding``)."""

    def _build_status(self, prefix, host_calls):
        self.host_calls = bool(host_calls)
        # called from the compiled step as one host call (a partial is not parsed into the graph: the
        # whole function runs in Python, f-string formats and list operations included)
        self._alert = functools.partial(_alert, self._guard_name)
        # without host calls: the stop, recorded where the host reads it (check_status) -- status: (reason
        # code of STOP_REASONS, step, non-finite run, skipped steps, finite run) at the stop, 0 while
        # running; evidence: (gradient norm, reference, growth, pinned, multiplier, max multiplier, rho)
        self.run_status = self.stop_evidence = None
        if not self.host_calls:
            self.run_status = Parameter(Tensor(np.zeros(5, np.int32)), name=f"{prefix}.status", requires_grad=False)
            self.stop_evidence = Parameter(Tensor(np.zeros(7, np.float32)), name=f"{prefix}.divergence.evidence",
                                           requires_grad=False)
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
        Without that test (no probe: no preconditioned layer with a bias and no BatchNorm layer; or
        distributed: the probe would need a collective) the count alone decides; a pass counts only when
        its output gradient at the counting layer is finite (an overflow seldom stays finite down to the
        first layer, which counts when no layer has a bias). A step driven by the Monte-Carlo Fisher step,
        which runs its own backward passes, is not checked."""
        capture = None if self._pass_layer is None else self.curvature.blocks[self._pass_layer].capture
        if capture is None or self.curvature.capture_control.driver is not None:
            return ops.zeros((), ms.bool_), ops.zeros((), ms.float32)
        # a value computed now (a cast: ``* 1`` is folded away, and the counter would be read after its clear)
        passes = ops.cast(ops.depend(capture.passes, token), ms.float32)
        ops.assign(capture.passes, ops.depend(ops.zeros((), ms.int32), passes))
        refused = passes > 1.5
        probe = self.curvature.capture_control.scale_probe
        if probe is not None and not self.curvature.exchange.distributed:
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
        run = self._nonfinite_run(finite)
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
        run = self._nonfinite_run(finite)
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
