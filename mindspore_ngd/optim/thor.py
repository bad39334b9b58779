"""THOR-style optimizer (Chen et al., AAAI 2021) as a policy of the shared engine.

What makes it THOR rather than K-FAC, all in the policy:

* statistics and inverses are refreshed together at refresh points: steps 0, f0, f0 + f1, ... with
  ``f0 = frequency`` and ``f_{i+1} = min(ceil(f_i * frequency_growth), max_frequency)`` (growth 1 is
  MindSpore's fixed ``frequency``); other steps only precondition with the stored inverses;
* trace-based refresh (``trace_threshold`` set): the first step captures every factor; after that
  a refresh point only computes the traces of the batch's A and G, *without forming them* (a sum of
  squares; for a convolution a one-output-channel convolution of the squared input), and the next
  step captures just the statistics whose trace moved by more than ``trace_threshold`` (relative)
  from the trace of the factor in use. Layers with a recaptured statistic get new inverses; the
  others keep theirs and pay no im2col, covariance or inversion. ``trace_threshold=None`` captures
  and inverts everything at every refresh point;
* hardware-driven block splitting: factors larger than ``split_dim`` are inverted as block-diagonal
  matrices of ``split_dim`` blocks (128 matches the Ascend cube unit); ``split_dim=None`` disables;
* damping split as MindSpore's THOR, ``A + sqrt(damping) I`` and ``G + sqrt(damping) I``, no moving
  average of the factors and no KL clipping by default.
"""
import numpy as np

import mindspore as ms
from mindspore import ops, Parameter, Tensor

from .. import _validate
from ..schedule.refresh import trace_changed
from .engine import NGDOptimizer, Policy

__all__ = ["THOR"]


def _decay_all(param):
    return True


class THOR(NGDOptimizer):
    r"""THOR: trace-based, hardware-driven, layer-oriented natural gradient, for ``Model.train``.

    Accepts the argument set of ``mindspore.nn.thor`` so that switching is a change of import:

    ============================  ==============================================================
    ``mindspore.nn.thor``          here
    ============================  ==============================================================
    ``net``                        ``network`` (same object; trained in place)
    ``learning_rate`` (Tensor)     float, per-step list/array/Tensor or LearningRateSchedule
    ``damping`` (Tensor)           same forms; ``A + sqrt(damping) I``, ``G + sqrt(damping) I``
    ``momentum``                   same
    ``weight_decay``               same, after preconditioning (as the built-in)
    ``loss_scale``                 same (fixed loss scale; G is divided by its square)
    ``batch_size``                 accepted and not needed: factors use the actual batch size
    ``use_nesterov``               same
    ``decay_filter``               same callable; default decays every parameter, as the built-in
    ``split_indices``              accepted, no effect: gradient all-reduce fusion is MindSpore's
    ``enable_clip_grad``           clip every final gradient tensor to L2 norm 1, as the built-in
    ``frequency``                  first refresh interval (steps); need not divide an epoch
    ============================  ==============================================================

    Extra arguments: ``split_dim`` (int >= 1 or None, default 128), ``trace_threshold`` (float > 0 or
    None, default None), ``frequency_growth`` (float >= 1, default 1), ``max_frequency`` (int or
    None), ``damping_split`` ("sqrt"), ``factor_decay`` (0: each refresh uses its own batch),
    ``kl_clip`` (None), ``inverse_method`` ("cholesky" or "lu"), ``jitter`` (1e-6), ``verbose``, and the
    distributed knobs ``distributed`` ("auto"), ``grad_worker_fraction`` (None: 1/N) and ``balance``
    ("compute"; ownership balanced on the block-split inversion cost), as
    :class:`mindspore_ngd.NGDOptimizer`. Distributed with ``trace_threshold``, the batch traces are
    averaged over the ranks and the owners of a layer decide whether its statistics moved; the
    decisions are shared so that every rank captures the same statistics.

    Raises:
        TypeError, ValueError: for a bad argument, naming it and its allowed range.
    """

    def __init__(self, network, learning_rate, damping, momentum=0.9, weight_decay=0.0, loss_scale=1.0,
                 batch_size=None, use_nesterov=False, decay_filter=_decay_all, split_indices=None,
                 enable_clip_grad=False, frequency=100, split_dim=128, trace_threshold=None,
                 frequency_growth=1.0, max_frequency=None, damping_split="sqrt", factor_decay=0.0,
                 kl_clip=None, inverse_method="cholesky", jitter=1e-6, verbose=True, distributed="auto",
                 grad_worker_fraction=None, balance="compute"):
        frequency = _validate.positive_int("frequency", frequency)
        if batch_size is not None:
            _validate.positive_int("batch_size", batch_size)
        if split_indices is not None and not isinstance(split_indices, (list, tuple)):
            raise TypeError(f"split_indices must be a list of ints or None, got {type(split_indices).__name__}")
        if not isinstance(enable_clip_grad, bool):
            raise TypeError(f"enable_clip_grad must be a bool, got {type(enable_clip_grad).__name__}")
        self._trace_threshold = _validate.optional_positive_float("trace_threshold", trace_threshold)
        self._growth = _validate.float_in_range("frequency_growth", frequency_growth, 1.0, float("inf"))
        if max_frequency is not None:
            max_frequency = _validate.positive_int("max_frequency", max_frequency)
            if max_frequency < frequency:
                raise ValueError(f"max_frequency must be >= frequency ({frequency}), got {max_frequency}")
        self._max_frequency = max_frequency
        policy = Policy(name="thor", factor_update_interval=frequency, inverse_update_interval=frequency,
                        damping_split=damping_split, inverse_method=inverse_method, kl_clip=kl_clip,
                        jitter=jitter, split_dim=split_dim, clip_norm=1.0 if enable_clip_grad else None)
        super().__init__(network, learning_rate, damping=damping, momentum=momentum,
                         weight_decay=weight_decay, factor_decay=factor_decay, loss_scale=loss_scale,
                         policy=policy, nesterov=use_nesterov, decay_filter=decay_filter, verbose=verbose,
                         distributed=distributed, grad_worker_fraction=grad_worker_fraction, balance=balance)
        self.interval = Parameter(Tensor(np.int32(frequency)), name="thor.interval", requires_grad=False)
        self.next_refresh = Parameter(Tensor(np.int32(0)), name="thor.next_refresh", requires_grad=False)
        self.layer_refreshes = Parameter(Tensor(np.zeros(self.num_layers, np.int32)),
                                         name="thor.layer_refreshes", requires_grad=False)
        if self._trace_threshold is not None:
            # the trace rule refreshes a subset of layers: invert only those
            self.per_layer_inverses = True
            for capture in self.captures:
                capture.enable_traces()

    # ---------------------------------------------------------------- policy hooks
    def _inverse_due(self, step, refreshed):
        return ops.stack(refreshed).any()

    def _inverse_layers(self, step, refreshed):
        return refreshed

    def _capture_next(self, next_step):
        due = next_step >= self.next_refresh
        if self._trace_threshold is None:
            for capture in self.captures:
                ops.assign(capture.capture_a, due)
                ops.assign(capture.capture_g, due)
            return due
        # trace rule: a refresh point only probes traces; the next step captures the statistics whose
        # trace moved (every statistic before its first capture)
        probed = self.captures[0].trace_a
        moved = None
        if self._parallel is not None:
            moved = ops.zeros((2 * self.num_layers,), ms.bool_)
            if probed:                      # identical on every rank (set from the step)
                moved = self._shared_trace_moves(next_step)
        flags = ()
        for k in range(self.num_layers):
            capture = self.captures[k]
            if self._parallel is None:
                a_moved = ops.logical_or(self.a_updates[k] == 0, trace_changed(
                    ops.depend(capture.a_trace, next_step), ops.trace(self.a_factors[k]), self._trace_threshold))
                g_moved = ops.logical_or(self.g_updates[k] == 0, trace_changed(
                    ops.depend(capture.g_trace, next_step), ops.trace(self.g_factors[k]), self._trace_threshold))
            else:
                a_moved, g_moved = moved[k], moved[self.num_layers + k]
            flags += (ops.logical_and(probed, a_moved), ops.logical_and(probed, g_moved))
        # the probe flags are overwritten only after every capture flag has used ``probed``: the read
        # of ``trace_a`` is not a snapshot (measured: without this, layers after the first read the
        # flag already set for the next step and captured on the probe step itself)
        settled = ops.stack(flags)
        for k in range(self.num_layers):
            capture = self.captures[k]
            ops.assign(capture.capture_a, flags[2 * k])
            ops.assign(capture.capture_g, flags[2 * k + 1])
            ops.assign(capture.trace_a, ops.depend(due, settled))
            ops.assign(capture.trace_g, ops.depend(due, settled))
        return due

    def _shared_trace_moves(self, token):
        """Distributed trace test, identical on every rank: the batch traces are averaged over the
        ranks and compared with the trace of the factor in use, which only the layer's owners hold
        (one AllReduce of [batch traces, owners' factor traces or 0]). Returns a bool vector over
        (A of every layer, G of every layer)."""
        layers = self.num_layers
        zero = ops.zeros((), ms.float32)
        batch, stored = (), ()
        for k in range(layers):
            batch += (self.captures[k].a_trace,)
            stored += (ops.trace(self.a_factors[k]) if self._owned[k] else zero,)
        for k in range(layers):
            batch += (self.captures[k].g_trace,)
            stored += (ops.trace(self.g_factors[k]) if self._owned[k] else zero,)
        vector = ops.depend(ops.stack(batch + stored), token)
        par = self._parallel
        total = par.share(vector)
        moved = ()
        for i in range(2 * layers):
            updates = self.a_updates[i] if i < layers else self.g_updates[i - layers]
            changed = trace_changed(total[i] / par.world_size, total[2 * layers + i] / par.grad_workers,
                                    self._trace_threshold)
            moved += (ops.logical_or(updates == 0, changed),)
        return ops.stack(moved)

    def _after_step(self, step, refreshed, changes):
        captured = step >= self.next_refresh
        interval = self.interval
        grown = ops.ceil(ops.cast(interval, ms.float32) * self._growth - 1e-6)
        grown = ops.cast(grown, ms.int32)
        if self._max_frequency is not None:
            grown = ops.minimum(grown, self._max_frequency)
        ops.assign(self.next_refresh, ops.select(captured, step + interval, self.next_refresh))
        ops.assign(self.interval, ops.select(captured, ops.maximum(grown, 1), interval))
        ops.assign_add(self.layer_refreshes, ops.cast(ops.stack(refreshed), ms.int32))
        return step

    def state_counters(self):
        counters = super().state_counters()
        counters.update(interval=int(self.interval.asnumpy()), next_refresh=int(self.next_refresh.asnumpy()),
                        layer_refreshes=self.layer_refreshes.asnumpy().tolist())
        return counters
