"""Step 4 of the engine, the preconditioning: ``G^-1 dW A^-1`` of every owned layer and the unit-wise
natural gradient of the BatchNorm layers, gathered to every rank, then the optional KL clipping of Ba
et al. 2017 (a mixin of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`)."""
import mindspore as ms
from mindspore import ops

from .._graph import columns as matrix_columns
from ..curvature.state import FactorState, InverseState, LayerCounts

__all__ = ["Precondition"]


class Precondition:
    """Graph-mode preconditioning of :class:`~mindspore_ngd.optim.engine.NGDOptimizer` (see the module docstring)."""

    def _preconditioned(self, gradients, lr, inverses, factors):
        """Preconditioned gradient matrices of all layers and BatchNorm (gamma, beta) pairs, KL-clipped.

        Distributed, every rank ends with the same matrices, so the KL factor is identical on every
        rank; the gather waits for the fault count of the fold (collective 3 after 2)."""
        own, layer_inverses = (), inverses[InverseState.LAYERS]
        for k in range(self.num_layers):
            block = self.curvature.blocks[k]
            if block.owned:
                own += (block.precondition(layer_inverses[k], block.gradient(gradients)),)
        matrices = self.curvature.exchange.gather(own, factors[FactorState.FAULTS])
        # a demoted layer's update is the plain one: outside the KL budget and never rescaled
        demoted = factors[FactorState.COUNTS][LayerCounts.DEMOTED]
        stacked, norm_grads = None, None
        if self.num_norms:      # every BatchNorm layer's channels at once, cut into layers where needed
            norm_grads = self.curvature.norm_group.gradients(gradients)
            stacked = self.curvature.norm_group.precondition(factors[FactorState.NORM_FISHERS],
                                                              factors[FactorState.NORM_COUNTS], norm_grads,
                                                              self.policy.batchnorm_damping)
        if self.policy.kl_clip is None:
            return matrices, self._norm_pairs(stacked)
        if self.is_group_lr:
            vg = self._group_vg(matrices, self._norm_pairs(stacked), self._norm_pairs(norm_grads), gradients, lr)
        else:
            dots, norm_dots = (), ()
            for k in range(self.num_layers):
                dots += (ops.reduce_sum(matrices[k] * self.curvature.blocks[k].gradient(gradients)),)
            if self.num_norms:
                norm_dots = self.curvature.norm_group.dots(stacked, norm_grads)
            kept = ops.unstack(ops.where(demoted, ops.zeros((self.num_layers,), ms.float32), ops.stack(dots)))
            vg = ops.addn(kept + norm_dots) * lr * lr
        usable = ops.logical_and(vg > 0, ops.isfinite(vg))
        nu = ops.minimum(ops.sqrt(self.policy.kl_clip / ops.where(usable, vg, ops.ones_like(vg))), 1.0)
        nu = ops.where(usable, nu, ops.ones_like(nu))
        factor = ops.unstack(ops.where(demoted, ops.ones((self.num_layers,), ms.float32), nu))
        scaled, scaled_pairs = (), ()
        for k in range(self.num_layers):
            scaled += (matrices[k] * factor[k],)
        if self.num_norms:
            scaled_pairs = self._norm_pairs((stacked[0] * nu, stacked[1] * nu))
        return scaled, scaled_pairs

    def _norm_pairs(self, stacked):
        """A stacked BatchNorm (gamma, beta) pair cut into per-layer pairs; () without BatchNorm layers."""
        if self.num_norms:
            return self.curvature.norm_group.layer_pairs(stacked)
        return ()

    def _group_vg(self, matrices, pairs, norm_grads, gradients, lr):
        """``sum_i lr_i^2 <P_i, g_i>`` over the preconditioned parameters, each with its own learning
        rate (parameter groups): a layer's weight and bias columns may belong to different groups.
        ``pairs`` and ``norm_grads`` are the BatchNorm layers' preconditioned and plain (gamma, beta)."""
        terms = ()
        for k in range(self.num_layers):
            block = self.curvature.blocks[k]
            product = matrices[k] * block.gradient(gradients)
            lr_w = self._lr_of(lr, block.weight_index)
            if block.bias_index >= 0:
                columns = product.shape[1]
                lr_b = self._lr_of(lr, block.bias_index)
                terms += (ops.reduce_sum(matrix_columns(product, 0, columns - 1)) * lr_w * lr_w,
                          ops.reduce_sum(matrix_columns(product, columns - 1, 1)) * lr_b * lr_b)
            else:
                terms += (ops.reduce_sum(product) * lr_w * lr_w,)
        group = self.curvature.norm_group
        for j in range(self.num_norms):
            grads = norm_grads[j]
            lr_g, lr_b = self._lr_of(lr, group.gamma_indices[j]), self._lr_of(lr, group.beta_indices[j])
            terms += (ops.reduce_sum(pairs[j][0] * grads[0]) * lr_g * lr_g,
                      ops.reduce_sum(pairs[j][1] * grads[1]) * lr_b * lr_b)
        return ops.addn(terms)
