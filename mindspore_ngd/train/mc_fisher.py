"""Monte-Carlo Fisher: G from a backward pass with labels sampled from the model itself.

The empirical Fisher (G from the training labels) is what :class:`mindspore_ngd.KFAC` captures in
the ordinary training step. The true Fisher of a model with a predictive distribution
``p(t | x, w)`` is ``E_{t ~ p}[g g^T]``; K-FAC (Martens & Grosse 2015, sec. 5) estimates it with one
sampled target per example. :class:`MCFisherTrainStep` is a training-step cell, used as
``Model(MCFisherTrainStep(net, loss_fn, opt))``, that on every step

1. runs forward and backward on :func:`sampled_label_loss` (targets drawn from the model's own
   output, no gradient through the sampling): the captures record A and the Monte-Carlo G (and
   the unit-wise BatchNorm Fisher); the gradients are discarded and BatchNorm moving statistics
   are restored so that the extra pass leaves no trace;
2. with capture switched off, runs forward and backward on the user's loss with the real labels
   and hands these gradients to the optimizer, with the capture flags restored for its fold.

Cost: one extra forward and backward pass on the steps that capture a statistic (every step for
K-FAC with ``factor_update_interval=1``, a fraction of them for SP-NGD and THOR), none on others.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Tensor

from ..optim.engine import NGDOptimizer
from .. import _validate

__all__ = ["MCFisherTrainStep", "sampled_label_loss", "DISTRIBUTIONS"]

DISTRIBUTIONS = ("categorical", "gaussian")


def sampled_label_loss(outputs, distribution, uniform, normal):
    """Loss whose output gradient is one Monte-Carlo sample of the Fisher's ``g``.

    * ``"categorical"``: ``outputs`` are logits (B, K); ``t ~ softmax(outputs)`` by inverse CDF from
      ``uniform`` (B, 1) in [0, 1); loss = mean softmax cross-entropy with ``t``, so
      ``g = softmax - onehot(t)``.
    * ``"gaussian"``: squared error with unit variance; ``t = outputs + normal`` (``normal`` has the
      outputs' shape); loss = ``0.5 * sum_b |outputs_b - t_b|^2 / B``, so ``g = -normal``.
    """
    outputs = ops.cast(outputs, ms.float32)
    batch = outputs.shape[0]
    if distribution == "gaussian":
        target = ops.stop_gradient(outputs) + normal
        diff = outputs - target
        return 0.5 * (diff * diff).sum() / batch
    log_probs = ops.log_softmax(outputs, 1)
    cdf = ops.cumsum(ops.stop_gradient(ops.exp(log_probs)), 1)
    classes = outputs.shape[1]
    sampled = ops.minimum(ops.cast(cdf < uniform, ms.int32).sum(1), classes - 1)
    onehot = ops.one_hot(sampled, classes, ops.ones((), ms.float32), ops.zeros((), ms.float32))
    return -(onehot * log_probs).sum() / batch


class _SampledLoss(nn.Cell):
    def __init__(self, network, distribution, seed):
        super().__init__(auto_prefix=False)
        self.network = network
        self.distribution = distribution
        self.uniform = ops.UniformReal(seed=seed, seed2=1)
        self.normal = ops.StandardNormal(seed=seed, seed2=2)

    def construct(self, *inputs):
        outputs = self.network(*inputs)
        if self.distribution == "gaussian":
            return sampled_label_loss(outputs, self.distribution, None, self.normal(outputs.shape))
        return sampled_label_loss(outputs, self.distribution, self.uniform((outputs.shape[0], 1)), None)


class _MonteCarloPass(nn.Cell):
    """Graph 1: forward/backward on the sampled-label loss (captures run), gradients discarded;
    BatchNorm moving statistics restored; capture flags parked in ``saved`` and switched off."""

    def __init__(self, sampled_network, weights, control, saved, moving):
        super().__init__(auto_prefix=False)
        self.sampled_network = sampled_network
        self.weights = weights
        self.control = control
        self.saved = saved
        self.moving = moving
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, data):
        kept = ()
        for i in range(len(self.moving)):
            kept += (self.moving[i] * 1.0,)
        grads = self.grad(self.sampled_network, self.weights)(data)
        for i in range(len(self.moving)):
            ops.assign(self.moving[i], ops.depend(kept[i], grads))
        parked = self.control.park(self.saved, grads)
        return ops.depend(ops.zeros((), ms.float32), parked)


class _TrueStep(nn.Cell):
    """Graph 2: forward/backward on the user's loss with capture off, flags restored, optimizer."""

    def __init__(self, loss_network, optimizer, control, saved, pending, sens, grad_reducer):
        super().__init__(auto_prefix=False)
        self.loss_network = loss_network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.control = control
        self.saved = saved
        self.pending = pending
        self.sens = sens
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.grad_reducer = grad_reducer

    def construct(self, data, label):
        loss = self.loss_network(data, label)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.loss_network, self.weights)(data, label, sens)
        grads = self.grad_reducer(grads)
        restore = ops.depend(self.saved, grads)
        grads = ops.depend(grads, self.control.restore(restore))
        loss = ops.depend(loss, self.optimizer(grads))
        cleared = ops.assign(self.saved, ops.depend(ops.zeros_like(restore), loss))
        ops.assign(self.pending, self.control.any(cleared))
        return loss


class MCFisherTrainStep(nn.Cell):
    """Training step with Monte-Carlo Fisher statistics, for ``Model(MCFisherTrainStep(...))``.

    Each call runs up to two compiled graphs: the Monte-Carlo pass (only when the optimizer will
    take a statistic this step) and the training step proper. MindSpore 2.10 cannot compile two
    backward passes through the same capturing network into one graph ("Invalid exit actor"), so
    the step is driven from Python: use it with ``dataset_sink_mode=False``.

    Args:
        network (nn.Cell): the backbone (the network given to the optimizer), ``network(data)`` ->
            logits (categorical) or predictions (gaussian).
        loss_fn (nn.Cell): the training loss ``loss_fn(network(data), label)``.
        optimizer (NGDOptimizer): a natural-gradient optimizer built with ``fisher="mc"`` on
            ``network``.
        distribution (str): "categorical" (softmax outputs; classification) or "gaussian" (squared
            error with unit variance; regression). Default "categorical".
        seed (int): seed of the label sampling (>= 0). Default 0.

    Inputs: ``data, label`` as for ``nn.WithLossCell``. Outputs: the training loss.
    """

    def __init__(self, network, loss_fn, optimizer, distribution="categorical", seed=0):
        super().__init__(auto_prefix=False)
        if not isinstance(optimizer, NGDOptimizer):
            raise TypeError(f"optimizer must be a mindspore_ngd optimizer, got {type(optimizer).__name__}")
        if optimizer.policy.fisher != "mc":
            raise ValueError("MCFisherTrainStep needs an optimizer built with fisher='mc', got "
                             f"fisher={optimizer.policy.fisher!r}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(loss_fn, nn.Cell):
            raise TypeError(f"loss_fn must be a mindspore.nn.Cell, got {type(loss_fn).__name__}")
        _validate.check_mean_loss(loss_fn, type(self).__name__)
        self.network = network
        control = optimizer.capture_control
        control.claim(type(self).__name__)
        prefix = optimizer.policy.name
        saved = ms.Parameter(Tensor(np.zeros(control.statistics, np.bool_)), name=f"{prefix}.mc.saved_flags",
                             requires_grad=False)
        pending = ms.Parameter(Tensor(True), name=f"{prefix}.mc.pending", requires_grad=False)
        moving = []
        for _, cell in network.cells_and_names():
            if isinstance(cell, (nn.BatchNorm1d, nn.BatchNorm2d)):
                moving += [cell.moving_mean, cell.moving_variance]
        grad_reducer = nn.Identity()
        if ms.get_auto_parallel_context("parallel_mode") in ("data_parallel", "hybrid_parallel"):
            grad_reducer = nn.DistributedGradReducer(optimizer.parameters)
        self.pending = pending
        self.monte_carlo = _MonteCarloPass(_SampledLoss(network, distribution, seed), optimizer.parameters,
                                           control, saved, ms.ParameterTuple(moving))
        self.train_step = _TrueStep(nn.WithLossCell(network, loss_fn), optimizer, control, saved, pending,
                                    float(optimizer.loss_scale), grad_reducer)
        self.optimizer = optimizer

    def __call__(self, data, label):
        if bool(self.pending.asnumpy()):
            self.monte_carlo(data)
        return self.train_step(data, label)

    def construct(self, data, label):
        # reached only in PyNative mode or when called inside another graph; same order as __call__
        self.monte_carlo(data)
        return self.train_step(data, label)
