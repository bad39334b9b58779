"""The unit-wise curvature block of one BatchNorm layer (SP-NGD, Osawa et al. 2020, sec. 4.3).

Each channel c is a unit with its own 2x2 Fisher of (gamma_c, beta_c), stored as the three distinct
entries per channel in a (C, 3) Parameter ``{prefix}.{layer}.F``; its update count is stacked with
the other BatchNorm layers' in :class:`~mindspore_ngd.curvature.counters.LayerCounters`. The capture
cell probes the per-example gradients inside the network (see
:class:`mindspore_ngd.capture.NormCapture`). The natural gradient is the closed-form
``(F_c + damping I)^-1 [g_gamma, g_beta]``, computed for every BatchNorm layer at once by
:class:`UnitWiseGroup`, which also folds and writes every BatchNorm layer's Fisher.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from ..capture import NormCapture
from .factors import unit_natural_gradient
from .statistics import blend, change_of_norms

__all__ = ["UnitBatchNormBlock", "UnitWiseGroup", "unit_damped_square_norms"]

_DIAGONAL = Tensor(np.array([1.0, 0.0, 1.0], np.float32))      # F00, F01, F11: the 2x2 blocks' diagonal


def unit_damped_square_norms(fisher, damping, layer_of_row, layers):
    """Per layer, the squared norm of the (C, 3) entries of ``F_c + damping I`` over its channels (each
    entry counted once, as :func:`~mindspore_ngd.curvature.statistics.relative_change` counts
    ``fisher``'s). ``fisher``: every layer's channels stacked, (channels, 3); ``layer_of_row``: the
    layer of each channel (int32); ``layers``: how many. A (layers,) vector."""
    ones = ops.ones((fisher.shape[0],), ms.float32)
    entries = ops.stack(((fisher * fisher).sum(1), (fisher * _DIAGONAL).sum(1), ones), 1)
    square, diagonal, channels = ops.unstack(ops.unsorted_segment_sum(entries, layer_of_row, layers), 1)
    return square + 2.0 * damping * diagonal + 2.0 * damping * damping * channels


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

    def write_factors(self, fisher):
        ops.assign(self.fisher, fisher)


class UnitWiseGroup(nn.Cell):
    """Every unit-wise BatchNorm block of one optimizer, run as one group.

    The estimator (:class:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature`) and the
    preconditioning (:mod:`mindspore_ngd.optim.precondition`) hand the unit-wise layers to this group
    whole: it reads and writes their Fishers, folds their batches, and computes their natural gradient.
    It keeps no state of its own; the Fishers are its blocks' Parameters, and the update counts, the
    capture flags and the loss scale are passed in (their owners are
    :class:`~mindspore_ngd.curvature.counters.LayerCounters`, :class:`~mindspore_ngd.capture.CaptureControl`
    and the loss-scale probe).

    Every BatchNorm channel is its own 2x2 problem, so the layers' channels are concatenated and the
    fold, the solves and the never-captured selection run once over all of them, not once per layer;
    only gathering the gradients, the KL clip's dot products, the Fishers' writes and the cut back into
    layers stay per layer. The results, and those dot products, are bit-identical to the per-layer
    computation; the relative changes the refresh rule reads sum in another order (last-bit
    differences).

    Args:
        blocks (list of UnitBatchNormBlock): the optimizer's BatchNorm blocks, in order (at least one).
        factor_decay (float): moving-average decay of the Fishers.
        track_changes (bool): the fold measures each Fisher's relative change (the refresh rule reads it).
        change_damping (float): measure those changes against the damped 2x2 blocks ``F_c + damping I``
            (SP-NGD's default, :class:`~mindspore_ngd.schedule.rules.StaleIntervals`); None: against
            ``F_c``.
    """

    def __init__(self, blocks, factor_decay=0.0, track_changes=False, change_damping=None):
        super().__init__(auto_prefix=False)
        blocks = list(blocks)
        if not blocks:
            raise ValueError("UnitWiseGroup needs at least one BatchNorm block")
        self.blocks = nn.CellList(blocks, auto_prefix=False)
        self.factor_decay = float(factor_decay)
        self.track_changes = bool(track_changes)
        self.change_damping = change_damping
        self.sizes = tuple(int(b.spec.channels) for b in blocks)
        self.count = len(self.sizes)
        self.gamma_indices = tuple(b.gamma_index for b in blocks)
        self.beta_indices = tuple(b.beta_index for b in blocks)
        # layer of every stacked channel: picks each channel's has-a-Fisher flag from the per-layer vector
        self.layer_of_row = Tensor(np.repeat(np.arange(self.count, dtype=np.int32), self.sizes))

    # ------------------------------------------------------------------ the Fishers
    def fishers(self):
        """Every layer's (C, 3) Fisher as stored, a tuple."""
        out = ()
        for block in self.blocks:
            out += (block.factors(),)
        return out

    def write(self, fishers):
        """Write every layer's Fisher (in the main graph)."""
        for j in range(self.count):
            self.blocks[j].write_factors(fishers[j])

    def batches(self, token, correction=None):
        """Every layer's captured batch Fisher (read after ``token``), multiplied by the loss scale's
        ``correction`` when given."""
        out = ()
        for block in self.blocks:
            batch = block.batch(token)
            out += (batch if correction is None else batch * correction,)
        return out

    def folded(self, fishers, counts, batches, flags, finite):
        """Every layer's fold of its (unscaled) batch in ``batches`` into ``fishers`` (``counts``: their
        update counts, a vector), each taken when its capture flag in ``flags`` is set, the step is
        ``finite`` and the layer's batch is finite: (new Fishers, new counts as a vector, rejected count,
        changes as a vector or -1s).

        One fold over the channels of every layer at once (:func:`~mindspore_ngd.curvature.statistics.blend`
        with one flag per channel), the per-layer sums of the rejection and the change taken by segment:
        the same arithmetic as :func:`~mindspore_ngd.curvature.statistics.fold_statistic` per layer, with
        the change's sums in another order, and no per-layer copy of it in the step's graph."""
        average, batch = ops.concat(fishers), ops.concat(batches)
        bad = ops.cast(ops.logical_not(ops.isfinite(batch)), ms.float32).sum(1)
        layer_finite = self._per_layer(bad) == 0
        captured = ops.logical_and(ops.stack(flags), finite)
        take = ops.logical_and(captured, layer_finite)
        rejected = ops.reduce_sum(ops.cast(ops.logical_and(captured, ops.logical_not(layer_finite)), ms.int32))
        new = blend(average, batch, self._per_row(counts == 0), self._per_row(take), self.factor_decay)
        changes = -ops.ones((self.count,), ms.float32)
        if self.track_changes:
            diff = new - average
            old_norm = self._per_layer((average * average).sum(1))
            reference = None
            if self.change_damping is not None:
                reference = unit_damped_square_norms(average, self.change_damping, self.layer_of_row, self.count)
            changes = ops.where(take, change_of_norms(self._per_layer((diff * diff).sum(1)), old_norm, reference),
                                changes)
        return self.split(new), counts + ops.cast(take, ms.int32), rejected, changes

    def _per_layer(self, values):
        """Sums of a per-channel vector over each layer's channels, a (layers,) vector."""
        return ops.unsorted_segment_sum(values, self.layer_of_row, self.count)

    def _per_row(self, flags):
        """A per-layer flag vector as one flag per stacked channel, shape (channels, 1)."""
        return (ops.gather(ops.cast(flags, ms.float32), self.layer_of_row, 0) > 0.5).reshape(-1, 1)

    def unchanged(self):
        """(rejected count, changes) of a step that folds nothing: zero, -1s."""
        return ops.zeros((), ms.int32), -ops.ones((self.count,), ms.float32)

    # ------------------------------------------------------------------ the natural gradient
    def gradients(self, gradients):
        """(gamma, beta) gradients of every layer, float32, concatenated over the layers."""
        gammas, betas = (), ()
        for j in range(self.count):
            gammas += (ops.cast(gradients[self.gamma_indices[j]], ms.float32),)
            betas += (ops.cast(gradients[self.beta_indices[j]], ms.float32),)
        return ops.concat(gammas), ops.concat(betas)

    def precondition(self, fishers, counts, grads, damping):
        """Stacked unit-wise natural gradients (gamma, beta) of ``grads`` (from :meth:`gradients`), with
        ``fishers`` the layers' (C, 3) Fishers and ``counts`` their update counts; a layer whose Fisher
        was never captured keeps its plain gradient."""
        grad_gamma, grad_beta = grads
        pre_gamma, pre_beta = unit_natural_gradient(ops.concat(fishers), grad_gamma, grad_beta, damping)
        known = ops.gather(ops.cast(counts > 0, ms.float32), self.layer_of_row, 0) > 0.5
        return ops.where(known, pre_gamma, grad_gamma), ops.where(known, pre_beta, grad_beta)

    def split(self, stacked):
        """Per-layer parts of a stacked vector, as a tuple."""
        if self.count == 1:
            return (stacked,)
        return ops.split(stacked, self.sizes)

    def dots(self, pairs, grads):
        """Per layer ``<P_gamma, g_gamma> + <P_beta, g_beta>``, as a tuple."""
        gamma_parts = self.split(pairs[0] * grads[0])
        beta_parts = self.split(pairs[1] * grads[1])
        out = ()
        for j in range(self.count):
            out += (ops.reduce_sum(gamma_parts[j]) + ops.reduce_sum(beta_parts[j]),)
        return out

    def layer_pairs(self, pairs):
        """The stacked (gamma, beta) pair cut into per-layer pairs."""
        gammas, betas = self.split(pairs[0]), self.split(pairs[1])
        out = ()
        for j in range(self.count):
            out += ((gammas[j], betas[j]),)
        return out
