"""The update step of the engine: preconditioned parts put back in place, weight decay, optional
gradient clipping and gradient centralization, and ``nn.Momentum``'s update (``ApplyMomentum``) for
every parameter, each with its group's learning rate.

Every per-parameter pass is one ``HyperMap`` over the parameter tuples, as ``nn.Momentum`` does it,
not a Python loop that grows a tuple element by element: in MindSpore 2.10 such a loop compiles
several times slower, and its cost grows faster than its length (``python -m
benchmarks.compile_patterns``: 160 tensors, 2.1 s for the loop against 0.6 s for the map; 40 tensors,
0.43 s against 0.31 s; ``docs/performance.md``, "Compile time")."""
import mindspore as ms
from mindspore import ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from .._graph import choose
from ..curvature.kronecker import matrix_part

__all__ = ["Update", "flat_gradients", "flat_after", "parameter_rates", "dots_after"]

_HYPER_MAP = C.HyperMap()

_as_flat = C.MultitypeFuncGraph("ngd_as_flat")


@_as_flat.register("Tensor")
def _as_flat_tensor(value):
    return ops.cast(value, ms.float32).reshape(-1)


_as_flat_after = C.MultitypeFuncGraph("ngd_as_flat_after")


@_as_flat_after.register("Tensor", "Tensor")
def _as_flat_after_tensor(token, value):
    return ops.cast(ops.depend(value, token), ms.float32).reshape(-1)


def flat_gradients(values):
    """Every tensor of ``values`` as one float32 vector: one Concat for the finiteness check and the
    adaptive damping's dot products, instead of kernels per parameter."""
    return ops.concat(_HYPER_MAP(_as_flat, values))


def _token(after):
    """A scalar tensor computed after ``after`` (a tensor or a tuple, e.g. the update's outcomes), to
    order the reads of a map after it."""
    return ops.depend(ops.zeros((), ms.float32), after)


def flat_after(values, after):
    """:func:`flat_gradients` of ``values`` (e.g. the momentum buffers) read after ``after``."""
    return ops.concat(_HYPER_MAP(F.partial(_as_flat_after, _token(after)), values))


_as_rate = C.MultitypeFuncGraph("ngd_as_rate")


@_as_rate.register("Tensor")
def _as_rate_tensor(lr):
    return ops.cast(lr, ms.float32).reshape(())


def parameter_rates(lr):
    """The per-parameter learning rates of ``get_lr()`` with parameter groups, as one float32 vector."""
    return ops.stack(_HYPER_MAP(_as_rate, lr))


_dot_after = C.MultitypeFuncGraph("ngd_dot_after")


@_dot_after.register("Tensor", "Tensor", "Tensor")
def _dot_after_tensor(token, grad, moment):
    return ops.reduce_sum(ops.cast(grad, ms.float32) * ops.cast(ops.depend(moment, token), ms.float32))


def dots_after(gradients, moments, after):
    """``<g_i, v_i>`` per parameter as one vector, the momentum buffers ``v`` read after ``after``."""
    return ops.stack(_HYPER_MAP(F.partial(_dot_after, _token(after)), gradients, moments))


_assembled = C.MultitypeFuncGraph("ngd_assembled")


@_assembled.register("Tuple", "Tuple", "Tensor", "Tuple")
def _assembled_one(matrices, pairs, grad, role):
    """One parameter's gradient, or its preconditioned replacement: ``role`` is the static
    ``(layer, is_bias, layer_has_bias, norm, gamma 0 / beta 1)`` of
    :func:`~mindspore_ngd.optim.layers.parameter_roles`, -1 where no block owns it. The gradients come
    first: in PyNative mode ``HyperMap`` descends into its first argument while it is a tuple, and a
    role is one."""
    layer, is_bias, has_bias, norm, which = role
    if norm >= 0:
        return ops.cast(pairs[norm][which].reshape(grad.shape), grad.dtype)
    if layer >= 0:
        return matrix_part(matrices[layer], is_bias, has_bias, grad.shape, grad.dtype)
    return grad


_lr_when = C.MultitypeFuncGraph("ngd_lr_when")


@_lr_when.register("Tensor", "Tensor")
def _lr_when_tensor(finite, lr):
    return ops.where(finite, ops.cast(lr, ms.float32), ops.zeros((), ms.float32))


_param_update = C.MultitypeFuncGraph("ngd_param_update")


@_param_update.register("Function", "Tensor", "Tensor", "Number", "Tensor", "Tensor", "Bool", "Bool", "Tensor",
                        "Tensor", "Tensor")
def _param_update_one(opt, momentum, finite, clip_norm, lr, decay_value, decay, centralize, param, moment, grad):
    """Weight decay, clipping (``clip_norm`` > 0), centralization, the non-finite guard and
    ``ApplyMomentum`` of one parameter."""
    if decay:
        grad = grad + ops.cast(decay_value, grad.dtype) * param
    if clip_norm > 0:
        norm = ops.sqrt(ops.reduce_sum(ops.cast(grad, ms.float32) ** 2))
        scale = ops.minimum(clip_norm / ops.maximum(norm, 1e-30), 1.0)
        grad = grad * ops.cast(scale, grad.dtype)
    if centralize:
        grad = grad - grad.mean(axis=tuple(range(1, grad.ndim)), keep_dims=True)
    grad = choose(finite, grad, ops.zeros_like(grad))
    return opt(param, moment, ops.cast(lr, param.dtype), grad, ops.cast(momentum, param.dtype))


class Update:
    """Graph-mode update methods of :class:`mindspore_ngd.NGDOptimizer` (a mixin; uses its
    parameters, moments, blocks and policy)."""

    def _assemble(self, gradients, preconditioned):
        """Gradient tuple with each preconditioned layer's weight/bias replaced, dtypes kept."""
        matrices, pairs = preconditioned
        return _HYPER_MAP(F.partial(_assembled, matrices, pairs), gradients, self._roles)

    def _lr_of(self, lr, i):
        """Learning rate of parameter ``i``: ``get_lr()`` is one value per parameter with group lrs."""
        return lr[i] if self.is_group_lr else lr

    def _update(self, gradients, lr, finite):
        """Weight decay (each parameter's own coefficient), optional clipping, optional gradient
        centralization and the momentum update with each parameter's learning rate; a non-finite step
        leaves weights and moments untouched (lr 0, momentum 1, gradient 0) and is counted."""
        momentum = self.momentum if self.momentum_schedule is None else self.momentum_schedule(self.global_step)
        momentum_eff = ops.where(finite, momentum, ops.ones((), ms.float32))
        clip_norm = 0.0 if self.policy.clip_norm is None else self.policy.clip_norm
        if self.is_group_lr:
            rates = _HYPER_MAP(F.partial(_lr_when, finite), lr)
            success = _HYPER_MAP(F.partial(_param_update, self.apply_momentum, momentum_eff, finite, clip_norm),
                                 rates, self.weight_decay_values, self._decay, self._centralize,
                                 self._parameters, self.moments, gradients)
        else:
            lr_eff = _lr_when_tensor(finite, lr)
            success = _HYPER_MAP(F.partial(_param_update, self.apply_momentum, momentum_eff, finite, clip_norm,
                                           lr_eff),
                                 self.weight_decay_values, self._decay, self._centralize, self._parameters,
                                 self.moments, gradients)
        ops.assign_add(self.skipped_steps, ops.cast(ops.logical_not(finite), ms.int32))
        return success
