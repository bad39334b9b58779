"""The capture cells: batch-statistic buffers and flags, and the capturing ``construct`` of each layer
class (see :mod:`mindspore_ngd.capture` for how they fit together)."""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .._graph import corner, first
from ..curvature import factors
from .discover import _ATTR
from .layer_types import layer_type_of, layer_type_of_class

__all__ = ["LayerCapture", "NormCapture", "attach", "detach", "current_capture", "never_captured", "UNSEEN"]

# a batch buffer whose [0, 0] entry (a vector's [0]) is negative was never written by a capture: a real
# A or G is a Gram matrix, its diagonal is >= 0 (an Embedding's A is the diagonal of one; NaN compares
# False and is left to the fold's finiteness check)
UNSEEN = -1.0


def _scratch(cell, attr, param):
    """Hold a per-step scratch buffer on ``cell`` without registering it as the cell's Parameter.

    The batch buffers are written and read only inside run-time branches, always written before
    they are read in the same step, so they carry no state between steps. Kept out of the cell's
    parameters they stay out of checkpoints, and ``load_param_into_net`` never replaces their data:
    replacing the data of a Parameter that a compiled graph uses only inside run-time branches
    disconnects it from its host value in MindSpore 2.10 (measured), while the graph keeps using
    the old buffer."""
    object.__setattr__(cell, attr, param)


def _unseen(shape):
    buffer = np.zeros(shape, np.float32)
    buffer.flat[0] = UNSEEN
    return buffer


def never_captured(batch):
    """Whether a batch buffer still holds its initial ``UNSEEN`` mark (a graph-mode bool scalar): at
    ``[0, 0]`` of a matrix, at ``[0]`` of a vector (an Embedding's diagonal A, whose entries are >= 0)."""
    if batch.ndim == 1:
        return first(batch) < 0
    return corner(batch) < 0


class LayerCapture(nn.Cell):
    """Batch A and G buffers of one layer, the flags that enable capture, and the G hook.

    The buffers start as zeros with ``UNSEEN`` at ``[0, 0]``: a capture always overwrites that entry
    with a squared norm (>= 0), so :func:`never_captured` tells a layer whose construct never ran (or
    whose output never reached the loss) from one that captured zeros.

    ``capture_a`` / ``capture_g`` are set for the *next* step, only through the optimizer's
    :class:`CaptureControl`. Parameter names are ``{prefix}.{layer}.a_batch`` etc., deterministic and
    unique per optimizer prefix.

    ``stat_fraction`` and ``stat_stride`` (validated by :class:`mindspore_ngd.Policy`) subsample the
    batch A and G: the first ``max(1, ceil(stat_fraction * B))`` examples (rows) and, for a Conv2d,
    every ``stat_stride``-th output position per spatial axis, rescaled as in
    :mod:`mindspore_ngd.curvature.factors`. The trace probes and the output-gradient sum always use
    the whole batch.

    ``sequence_approx="reduce"`` captures a Dense layer's input and output gradient of more than two
    dimensions per example (K-FAC-reduce, :mod:`mindspore_ngd.curvature.factors`); "expand" (default)
    flattens them to rows.

    ``records_positions`` also writes ``positions`` (T, the output positions a Conv2d's A sums over)
    with every captured A; only the "positions" damping split reads it.

    The formulas are those of the layer's :class:`~mindspore_ngd.capture.layer_types.LayerType`
    (``layer_type_of(spec)``), held as attributes so that the compiled graph calls them directly.
    """

    def __init__(self, spec, prefix, loss_scale=1.0, traces=False, sums_gradient=False, stat_fraction=1.0,
                 stat_stride=1, sequence_approx="expand", records_positions=False):
        super().__init__(auto_prefix=False)
        self.spec = spec
        base = f"{prefix}.{spec.name}"
        layer_type = layer_type_of(spec)
        _scratch(self, "a_batch", Parameter(Tensor(_unseen(layer_type.input_buffer_shape(spec.a_dim))),
                                            name=f"{base}.a_batch", requires_grad=False))
        _scratch(self, "g_batch", Parameter(Tensor(_unseen((spec.g_dim, spec.g_dim))), name=f"{base}.g_batch",
                                            requires_grad=False))
        self.capture_a = Parameter(Tensor(True), name=f"{base}.capture_a", requires_grad=False)
        # T, the output positions a Conv2d's A sums over (1 for a Dense), written with every captured A
        # when ``records_positions``: only the "positions" damping split (MindSpore's THOR) reads it; a
        # shape, so the same every step. Each write is one more side effect in the forward pass, and on
        # ResNet-50 the 53 writes cost a third of the every-step capture's compile (docs/performance.md), so a block
        # that never reads T does not ask for it.
        _scratch(self, "positions", Parameter(Tensor(np.float32(1)), name=f"{base}.positions", requires_grad=False))
        self.capture_g = Parameter(Tensor(True), name=f"{base}.capture_g", requires_grad=False)
        self.has_positions = layer_type.has_positions
        self.records_positions = bool(records_positions) and self.has_positions
        self._input_factor, self._output_factor = layer_type.input_factor, layer_type.output_factor
        self._input_trace, self._positions = layer_type.input_trace, layer_type.positions
        self._output_trace = factors.output_trace
        # K-FAC-reduce on inputs with more than two dimensions (the capturing construct picks the path
        # by the input's rank; a 2-D input is the same either way)
        self.reduces = sequence_approx == "reduce" and layer_type.reduce_formulas is not None
        if self.reduces:
            self._input_factor, self._output_factor, self._input_trace, self._output_trace = \
                layer_type.reduce_formulas
        self.geometry = layer_type.geometry(spec)
        self.has_bias = spec.has_bias
        self.g_scale = 1.0 / float(loss_scale) ** 2
        self.stat_fraction = float(stat_fraction)
        self.stat_stride = int(stat_stride) if self.has_positions else 1     # Dense layers have no positions
        self.grad_hook = ops.InsertGradientOf(self.save_output_factor)
        # a compile-time switch (set only while NGDTrainOneStepCell compiles or runs its lean graph): the
        # capture branches are left out of the graph, for steps on which no flag is set
        self.bypass = False
        # a compile-time switch (set by the curvature estimator when its refresh rule captures every statistic on
        # every step, as K-FAC's factor_update_interval=1): the batch statistics are taken without the run-time
        # branch on their flags, which would always be taken (the branches cost compile time and a dispatch)
        self.every_step = False
        # trace probes (THOR's trace rule): trace(A) / trace(G) of the batch, without forming the
        # factors, on steps whose trace_a / trace_g flag is set; the buffers exist only when asked for
        self.traces_enabled = bool(traces)
        if self.traces_enabled:
            self.trace_a = Parameter(Tensor(False), name=f"{base}.trace_a", requires_grad=False)
            self.trace_g = Parameter(Tensor(False), name=f"{base}.trace_g", requires_grad=False)
            self.a_trace = Parameter(Tensor(np.float32(0)), name=f"{base}.a_trace", requires_grad=False)
            self.g_trace = Parameter(Tensor(np.float32(0)), name=f"{base}.g_trace", requires_grad=False)
        # loss-scale probe (one layer with a bias per optimizer, :class:`LossScaleProbe`): the batch sum
        # of the output gradient, i.e. the bias gradient as the backward pass saw it (scaled), every step
        self.sums_gradient = bool(sums_gradient)
        if self.sums_gradient:
            _scratch(self, "grad_sum", Parameter(Tensor(np.zeros((spec.g_dim,), np.float32)),
                                                 name=f"{base}.grad_sum", requires_grad=False))
        self.counts_passes = False
        self._base = base

    def count_passes(self):
        """Count the backward passes through this layer (one layer per optimizer): the scratch int32
        ``passes`` is raised by one in every backward pass whose output gradient here is finite, and the
        optimizer reads and clears it in its step. More than one pass between two optimizer steps is
        gradient accumulation (see :meth:`mindspore_ngd.optim.status.DeviceStatus._accumulated`); a pass with a
        non-finite output gradient (a loss-scale overflow, whose step the training cell skips) is not
        counted."""
        self.counts_passes = True
        _scratch(self, "passes", Parameter(Tensor(0, ms.int32), name=f"{self._base}.passes", requires_grad=False))

    def input_trace(self, x):
        return self._input_trace(x, self.geometry, self.has_bias)

    def input_factor(self, x):
        return self._input_factor(x, self.geometry, self.has_bias, self.stat_fraction, self.stat_stride)

    def output_factor(self, dy):
        return self._output_factor(dy, self.g_scale, self.stat_fraction, self.stat_stride)

    def _take_input(self, x):
        ops.assign(self.a_batch, self.input_factor(x))
        if self.records_positions:
            ops.assign(self.positions, ops.fill(ms.float32, (), float(self._positions(x, self.geometry))))

    def capture_input(self, x):
        if self.bypass:                   # the lean graph of NGDTrainOneStepCell: no capture compiled in
            return x
        if self.every_step:
            self._take_input(x)
        elif self.capture_a:
            self._take_input(x)
        if self.traces_enabled:
            if self.trace_a:
                ops.assign(self.a_trace, self.input_trace(x))
        return x

    def _summed(self, dy):
        if self.sums_gradient:
            total = factors.output_sum(dy, self.has_positions)
            dy = ops.depend(dy, ops.assign(self.grad_sum, total))
            return self._counted(dy, ops.reduce_sum(total))
        return self._counted(dy, None)

    def _counted(self, dy, total):
        """``dy``, after the pass counter (when this layer counts passes) was raised for a finite pass."""
        if not self.counts_passes:
            return dy
        if total is None:
            total = ops.reduce_sum(ops.cast(dy, ms.float32))
        seen = ops.cast(ops.isfinite(total), ms.int32)
        return ops.depend(dy, ops.assign_add(self.passes, seen))

    def save_output_factor(self, dy):
        if self.bypass:
            return self._summed(dy)
        if self.every_step:
            ops.assign(self.g_batch, self.output_factor(dy))
        elif self.capture_g:
            ops.assign(self.g_batch, self.output_factor(dy))
        if self.traces_enabled:
            if self.trace_g:
                ops.assign(self.g_trace, self._output_trace(dy, self.g_scale, self.has_positions))
            dy = ops.depend(dy, self.g_trace)
        dy = self._summed(dy)
        # the gradient flowing on waits for the buffer write: without this the optimizer could read
        # the first layer's G (the last hook of the backward pass) before it is written (measured)
        return ops.depend(dy, self.g_batch)


class NormCapture(nn.Cell):
    """Per-channel (gamma, beta) Fisher buffer of one BatchNorm or LayerNorm layer, its flag and its hook.

    On a capture step the layer's output becomes ``y + xhat * p_gamma + p_beta`` with a zero probe
    ``p`` of shape (2, B, C, 1, 1) (a LayerNorm's, whose units are the features of the last axis:
    (2, B, 1, ..., C), so that the per-example gradients sum over the positions): the value is
    unchanged, and the gradient reaching ``p`` is the per-example (g_gamma, g_beta) that
    :func:`factors.unit_fisher` turns into the Fisher entries. On other steps the probe is not added
    (a single-level run-time branch) and costs nothing.
    """

    def __init__(self, spec, prefix, loss_scale=1.0):
        super().__init__(auto_prefix=False)
        self.spec = spec
        base = f"{prefix}.{spec.name}"
        _scratch(self, "f_batch", Parameter(Tensor(np.zeros((spec.channels, 3), np.float32)),
                                            name=f"{base}.f_batch", requires_grad=False))
        self.capture_f = Parameter(Tensor(True), name=f"{base}.capture_f", requires_grad=False)
        self.eps = spec.eps
        # where the units sit: a BatchNorm's channels on axis 1, a LayerNorm's features on the last axis
        if spec.kind == "layernorm":
            self._unit_probe, self._normalized = factors.unit_probe_last, factors.layer_normalized_input
        else:
            self._unit_probe, self._normalized = factors.unit_probe, factors.normalized_input
        self.g_scale = 1.0 / float(loss_scale)
        self.grad_hook = ops.InsertGradientOf(self.save_fisher)
        self.bypass = False         # as LayerCapture.bypass

    def save_fisher(self, probe_grad):
        if self.capture_f:
            ops.assign(self.f_batch, factors.unit_fisher(probe_grad, self.g_scale))
        return ops.depend(probe_grad, self.f_batch)     # ordered before the optimizer's read (as G)

    def probe(self, x, y, gamma):
        if self.bypass:
            return y
        # the hook sits outside the branch: a hook inside a value-returning branch fails to compile
        probe = self.grad_hook(self._unit_probe(gamma, x.shape[0], x.ndim))
        if self.capture_f:
            # the probe is zero, so no gradient reaches x through xhat: without its backward pass
            # the step keeps no activation-sized tensors of it and compiles fewer nodes
            xhat = ops.stop_gradient(self._normalized(x, self.eps))
            # the probe spread to the activations' shape first: a broadcasting Mul or Add keeps 16 bytes
            # per output element in MindSpore 2.10's CPU kernel (factors.spread)
            shape = xhat.shape
            y = y + ops.cast(xhat * factors.spread(probe[0], shape) + factors.spread(probe[1], shape), y.dtype)
        return y


class _CapturedBatchNorm:
    """construct of a capturing BatchNorm: the training path with the Fisher probe, else as before."""

    def construct(self, x):
        if self.training:
            y = self.bn_train(x, self.gamma, self.beta, self.moving_mean, self.moving_variance)[0]
            return self._ngd_capture.probe(x, y, self.gamma)
        x_shape = x.shape
        reshaped = x
        if len(x_shape) == 2:
            reshaped = x.reshape(x_shape[0], x_shape[1], 1, 1)
        elif len(x_shape) == 3:
            reshaped = x.reshape(x_shape[0], x_shape[1], x_shape[2], 1)
        out = self.bn_infer(reshaped, self.gamma, self.beta, self.moving_mean, self.moving_variance)[0]
        if len(x_shape) < 4:
            out = out.reshape(x_shape)
        return out


class _CapturedLayerNorm:
    """construct of a capturing LayerNorm: nn.LayerNorm's, with the Fisher probe in training mode."""

    def construct(self, input_x):
        y, _, _ = self.layer_norm(input_x, self.gamma.astype(input_x.dtype), self.beta.astype(input_x.dtype))
        if self.training:
            return self._ngd_capture.probe(input_x, y, self.gamma)
        return y


_CLASSES = {}


def _captured_class(cls):
    layer_type, _ = layer_type_of_class(cls)
    if layer_type is not None:
        mixin = layer_type.mixin(cls)
    else:
        mixin = _CapturedLayerNorm if issubclass(cls, nn.LayerNorm) else _CapturedBatchNorm
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"NGD{cls.__name__}", (mixin, cls), {"_ngd_original_class": cls})
    return _CLASSES[cls]


def attach(cells, captures):
    """Make each cell capture into its LayerCapture (in place; replaces an earlier attachment)."""
    for cell, capture in zip(cells, captures):
        original = getattr(type(cell), "_ngd_original_class", type(cell))
        object.__setattr__(cell, _ATTR, capture)
        cell.__class__ = _captured_class(original)


def detach(cells):
    """Undo :func:`attach`: restore the original classes."""
    for cell in cells:
        original = getattr(type(cell), "_ngd_original_class", None)
        if original is not None:
            cell.__class__ = original
            object.__delattr__(cell, _ATTR)


def current_capture(cell):
    return getattr(cell, _ATTR, None)
