"""The unit-wise curvature block of one BatchNorm layer (SP-NGD, Osawa et al. 2020, sec. 4.3).

Each channel c is a unit with its own 2x2 Fisher of (gamma_c, beta_c), stored as the three distinct
entries per channel in a (C, 3) Parameter ``{prefix}.{layer}.F``; its update count is stacked with
the other BatchNorm layers' in :class:`~mindspore_ngd.curvature.counters.LayerCounters`. The capture
cell probes the per-example gradients inside the network (see :class:`mindspore_ngd.capture.NormCapture`). The natural gradient is the closed-form
``(F_c + damping I)^-1 [g_gamma, g_beta]``.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from ..capture import NormCapture
from .factors import unit_natural_gradient
from .statistics import fold_statistic

__all__ = ["UnitBatchNormBlock", "unit_damped_square_norm"]

_DIAGONAL = Tensor(np.array([1.0, 0.0, 1.0], np.float32))      # F00, F01, F11: the 2x2 blocks' diagonal


def unit_damped_square_norm(fisher, damping):
    """The squared norm of the (C, 3) entries of ``F_c + damping I`` over every channel (each entry
    counted once, as :func:`~mindspore_ngd.curvature.statistics.relative_change` counts ``fisher``'s)."""
    diagonal = ops.reduce_sum(fisher * _DIAGONAL)
    return ops.reduce_sum(fisher * fisher) + 2.0 * damping * diagonal + 2.0 * damping * damping * fisher.shape[0]


class UnitBatchNormBlock(nn.Cell):
    """Unit-wise Fisher block of one BatchNorm layer.

    Args:
        spec (NormSpec): the layer.
        prefix (str): the optimizer's Parameter prefix.
        gamma_index, beta_index (int): positions of gamma and beta among the optimizer's parameters.
        loss_scale (float): fixed loss scale of the training cell.
    """

    def __init__(self, spec, prefix, gamma_index, beta_index, loss_scale=1.0):
        super().__init__(auto_prefix=False)
        self.spec = spec
        self.gamma_index = gamma_index
        self.beta_index = beta_index
        base = f"{prefix}.{spec.name}"
        self.fisher = Parameter(Tensor(np.zeros((spec.channels, 3), np.float32)), name=f"{base}.F",
                                requires_grad=False)
        self.capture = NormCapture(spec, prefix, loss_scale)

    def factors(self):
        return self.fisher

    def batch(self, token):
        return ops.depend(self.capture.f_batch, token)

    def fold(self, fisher, count, batch, flag, decay, track_changes, damping=None):
        """``(new F, new count, rejected, change)`` of the Fisher ``fisher`` that has taken ``count``
        batches, as :func:`mindspore_ngd.curvature.statistics.fold_statistic`; with ``damping`` (the
        BatchNorm damping) the change is measured against the damped 2x2 blocks ``F_c + damping I``."""
        reference = None
        if track_changes and damping is not None:
            reference = unit_damped_square_norm(fisher, damping)
        return fold_statistic(fisher, count, batch, flag, decay, track_changes, reference)

    def write_factors(self, fisher):
        ops.assign(self.fisher, fisher)

    def gradients(self, gradients):
        return (ops.cast(gradients[self.gamma_index], ms.float32), ops.cast(gradients[self.beta_index], ms.float32))

    def precondition(self, fisher, known, grads, damping):
        """Unit-wise natural gradients (gamma, beta), float32; a layer whose Fisher was never captured
        (``known`` False) keeps its plain gradient."""
        grad_gamma, grad_beta = grads
        pre_gamma, pre_beta = unit_natural_gradient(fisher, grad_gamma, grad_beta, damping)
        known = ops.broadcast_to(known, grad_gamma.shape)
        return ops.select(known, pre_gamma, grad_gamma), ops.select(known, pre_beta, grad_beta)
