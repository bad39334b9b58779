"""The update step of the engine: preconditioned parts put back in place, weight decay, optional
gradient clipping and gradient centralization, and ``nn.Momentum``'s update (``ApplyMomentum``) for
every parameter, each with its group's learning rate."""
import mindspore as ms
from mindspore import ops

__all__ = ["Update"]


class Update:
    """Graph-mode update methods of :class:`mindspore_ngd.NGDOptimizer` (a mixin; uses its
    parameters, moments, blocks and policy)."""

    def _assemble(self, gradients, preconditioned):
        """Gradient tuple with each preconditioned layer's weight/bias replaced, dtypes kept."""
        matrices, pairs = preconditioned
        out = ()
        for i in range(self.num_params):
            layer, is_bias = self._roles[i]
            norm, which = self._norm_roles[i]
            grad = gradients[i]
            if norm >= 0:
                grad = ops.cast(pairs[norm][which].reshape(grad.shape), grad.dtype)
            if layer >= 0:
                grad = self.blocks[layer].part(matrices[layer], is_bias, grad.shape, grad.dtype)
            out += (grad,)
        return out

    def _lr_of(self, lr, i):
        """Learning rate of parameter ``i``: ``get_lr()`` is one value per parameter with group lrs."""
        return lr[i] if self.is_group_lr else lr

    def _update(self, gradients, lr, finite):
        """Weight decay (each parameter's own coefficient), optional clipping, optional gradient
        centralization and the momentum update with each parameter's learning rate; a non-finite step
        leaves weights and moments untouched (lr 0, momentum 1, gradient 0) and is counted."""
        zero = ops.zeros((), ms.float32)
        lr_eff = zero if self.is_group_lr else ops.select(finite, ops.cast(lr, ms.float32), zero)
        momentum = self.momentum if self.momentum_schedule is None else self.momentum_schedule(self.global_step)
        momentum_eff = ops.select(finite, momentum, ops.ones((), ms.float32))
        success = ()
        for i in range(self.num_params):
            param = self._parameters[i]
            grad = gradients[i]
            if self._decay[i]:
                grad = grad + ops.cast(self.weight_decay_values[i], grad.dtype) * param
            if self.policy.clip_norm is not None:
                norm = ops.sqrt(ops.reduce_sum(ops.cast(grad, ms.float32) ** 2))
                scale = ops.minimum(self.policy.clip_norm / ops.maximum(norm, 1e-30), 1.0)
                grad = grad * ops.cast(scale, grad.dtype)
            if self._centralize[i]:
                grad = grad - grad.mean(axis=tuple(range(1, grad.ndim)), keep_dims=True)
            grad = ops.select(ops.broadcast_to(finite, grad.shape), grad, ops.zeros_like(grad))
            if self.is_group_lr:
                lr_eff = ops.select(finite, ops.cast(self._lr_of(lr, i), ms.float32), zero)
            success += (self.apply_momentum(param, self.moments[i], ops.cast(lr_eff, param.dtype), grad,
                                            ops.cast(momentum_eff, param.dtype)),)
        ops.assign_add(self.skipped_steps, ops.cast(ops.logical_not(finite), ms.int32))
        return success

    @staticmethod
    def _flat(gradients):
        """Every gradient as one float32 vector: one Concat for the finiteness check and the adaptive
        damping's dot products, instead of kernels per parameter."""
        flat = ()
        for grad in gradients:
            flat += (ops.cast(grad, ms.float32).reshape(-1),)
        return ops.concat(flat)
