"""The loss scale a training cell actually used in a step, measured from the backward pass.

With mixed precision, MindSpore's ``TrainOneStepWithLossScaleCell`` (what ``Model(...,
amp_level="O2")`` builds with the default ``DynamicLossScaleManager`` on Ascend and GPU) back-propagates
with ``sens = scale`` and divides the gradients by ``scale`` before calling the optimizer; the scale
changes during training (down on an overflow, up after a run of good steps) and lives in the train
cell, which the optimizer never sees. The capture hooks, however, see the *scaled* output gradients,
so G (quadratic in them) is ``scale**2`` too large unless it is divided by the scale of that step.

:class:`LossScaleProbe` recovers that scale without knowing the train cell: one preconditioned layer
with a bias also records, every step, the batch sum of its output gradient -- the bias gradient as
the backward pass computed it, ``scale * b`` -- and the optimizer receives the unscaled bias gradient
``b / loss_scale`` (``loss_scale``: the optimizer's own fixed argument, for cells that do not unscale).
When no preconditioned layer has a bias (the model zoo's THOR ResNet-50: convolutions without bias
and a classifier without bias), the probe reads a BatchNorm layer instead (:class:`BatchNormScaleCapture`):
the batch-and-position sum of the gradient reaching its output is its beta's gradient, ``scale * beta``
as the backward pass computed it, against the unscaled beta gradient the optimizer receives.
Their least-squares ratio ``<p, b> / <b, b>`` is the scale; it is snapped to ``loss_scale`` times the
nearest power of two when within 1e-3 of it (every MindSpore loss-scale manager uses powers of two,
and with no scaling the correction is then exactly 1, bit for bit). Distributed, the probe is averaged
over the ranks like the statistics (the optimizer's gradients are the ranks' mean).
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .layer_types import layer_type_of

__all__ = ["LossScaleProbe", "BatchNormScaleCapture", "reference_layer", "reference_batchnorm"]

_SNAP_TOLERANCE = 1e-3
_PARALLEL_TOLERANCE = 1e-2


def reference_layer(specs):
    """Index of the layer the probe reads, or None when no preconditioned layer has a bias.

    Dense layers first (a convolution's bias is often followed by BatchNorm, which makes its gradient
    vanish up to rounding; the order is ``LayerType.probe_rank``), then the fewest outputs (the
    cheapest sum; usually the classifier)."""
    biased = [(layer_type_of(s).probe_rank, s.g_dim, k) for k, s in enumerate(specs) if s.has_bias]
    return min(biased)[2] if biased else None


def reference_batchnorm(specs, index):
    """Position in ``specs`` (BatchNorm :class:`~mindspore_ngd.capture.discover.NormSpec`) of the layer the
    probe reads when no preconditioned layer has a bias: the fewest channels (the cheapest sum), the first
    of those; only a layer whose beta is among the optimizer's parameters (``index``: name -> position).
    None when there is none."""
    usable = [(s.channels, j) for j, s in enumerate(specs) if s.beta_name in index]
    return min(usable)[1] if usable else None


class BatchNormScaleCapture(nn.Cell):
    """The loss-scale probe's record at a BatchNorm layer (see the module docstring): every training step,
    the batch (and position) sum of the gradient reaching the layer's output, in ``grad_sum`` (C,).

    Attached to the BatchNorm cell like a unit-wise capture (:func:`mindspore_ngd.capture.cells.attach`):
    the captured class's training path calls :meth:`probe`, which returns the output unchanged with the
    hook on it. ``grad_sum`` is scratch (not a Parameter of any cell, so not in checkpoints), written before
    it is read in the same step, as the layers' batch buffers are.
    """

    def __init__(self, spec, prefix):
        super().__init__(auto_prefix=False)
        self.spec = spec
        object.__setattr__(self, "grad_sum", Parameter(Tensor(np.zeros((spec.channels,), np.float32)),
                                                       name=f"{prefix}.{spec.name}.grad_sum", requires_grad=False))
        self.grad_hook = ops.InsertGradientOf(self.save_sum)

    def save_sum(self, dy):
        # every axis but the channels' (1): (B, C), (B, C, L) and (B, C, H, W) outputs alike
        axes = tuple(axis for axis in range(dy.ndim) if axis != 1)
        return ops.depend(dy, ops.assign(self.grad_sum, ops.cast(dy, ms.float32).sum(axis=axes)))

    def probe(self, x, y, gamma):
        """The BatchNorm's training output ``y``, with the hook that records its gradient's sum."""
        return self.grad_hook(y)


class LossScaleProbe(nn.Cell):
    """Measures the loss scale of a step (see the module docstring).

    The engine measures it in the fold's run-time branch, on the steps that capture statistics and
    so use it; with THOR's trace probes, which unscale their G traces between captures, on every step.

    Args:
        capture (LayerCapture or BatchNormScaleCapture): the reference layer's capture (a LayerCapture built
            with ``sums_gradient=True``), whose ``grad_sum`` the backward pass writes.
        bias_index (int): position among the optimizer's gradients of that layer's bias (a BatchNorm's beta).
        loss_scale (float): the optimizer's fixed ``loss_scale`` argument.
        prefix (str): the optimizer's Parameter prefix.
    """

    def __init__(self, capture, bias_index, loss_scale, prefix):
        super().__init__(auto_prefix=False)
        self.capture = capture
        self.bias_index = bias_index
        self.size = int(capture.grad_sum.shape[0])          # the length of the recorded vector
        self.loss_scale = float(loss_scale)
        self.scale_seen = Parameter(Tensor(np.float32(loss_scale)), name=f"{prefix}.loss_scale_seen",
                                    requires_grad=False)

    def probe(self, token):
        """The recorded scaled bias gradient, read after ``token`` (written by a late hook)."""
        return ops.depend(self.capture.grad_sum, token)

    def measure(self, probe, gradients):
        """``(scale, valid)``: the scale of this step. ``valid`` is False when the bias gradient is zero,
        the two vectors are not parallel to 1e-2 (a gradient that is rounding noise, e.g. a bias
        followed by BatchNorm) or the ratio is not a positive finite number; the caller then keeps the
        last measured scale."""
        bias = ops.cast(gradients[self.bias_index], ms.float32).reshape(-1)
        power = ops.reduce_sum(bias * bias)
        cross = ops.reduce_sum(probe * bias)
        usable = ops.logical_and(power > 0, ops.isfinite(power))
        scale = cross / ops.where(usable, power, ops.ones_like(power))
        residual = probe - scale * bias
        parallel = ops.reduce_sum(residual * residual) <= _PARALLEL_TOLERANCE ** 2 * ops.reduce_sum(probe * probe)
        usable = ops.logical_and(usable, parallel)
        ratio = scale / self.loss_scale
        positive = ratio > 0
        exponent = ops.round(ops.log(ops.where(positive, ratio, ops.ones_like(ratio))) / float(np.log(2.0)))
        nearest = ops.pow(2.0, exponent)
        snapped = ops.abs(ratio / nearest - 1.0) < _SNAP_TOLERANCE
        scale = ops.where(snapped, nearest * self.loss_scale, scale)
        valid = ops.logical_and(ops.logical_and(usable, positive), ops.isfinite(scale))
        return scale, valid

    def scale_after(self, probe, gradients, finite, scale):
        """The scale to use after this step: the one measured from ``probe`` (this rank's, or distributed
        the ranks' mean) when the step is finite and the measurement valid, else ``scale`` (the last)."""
        measured, valid = self.measure(probe, gradients)
        return ops.where(ops.logical_and(finite, valid), measured, scale)

    def correction(self, scale):
        """Factor that takes a statistic quadratic in the output gradient, captured at ``scale`` and
        divided by ``loss_scale**2``, to the unscaled value."""
        ratio = self.loss_scale / scale
        return ratio * ratio

    def last_correction(self):
        """The correction of the last folded step (THOR's trace probes, between captures)."""
        return self.correction(self.scale_seen)
