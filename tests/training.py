"""Short training runs shared by the tests: synthetic batches, a training step, a few steps of an
optimizer from a fixed seed."""
import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import BNNet

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def batch(seed, n=8, shape=(2, 5, 5), classes=3):
    """A reproducible batch of ``n`` standard-normal inputs (BNNet's shape by default) and labels."""
    rng = np.random.default_rng(seed)
    return (Tensor(rng.standard_normal((n,) + shape).astype(np.float32)),
            Tensor(rng.integers(0, classes, n).astype(np.int32)))


def template_images(size=256, classes=10, hw=16, seed=0):
    """The model zoo's kind of synthetic images: a fixed random template per class plus 0.5 noise."""
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((classes, 3, hw, hw)).astype(np.float32)
    y = (np.arange(size) % classes).astype(np.int32)
    return templates[y] + 0.5 * rng.standard_normal((size, 3, hw, hw)).astype(np.float32), y


class StepLosses(ms.train.Callback):
    """Every training step's loss in ``values``, read from the step's output (a loss, or a loss-scale
    cell's (loss, overflow, scale) tuple)."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_step_end(self, run_context):
        loss = run_context.original_args().net_outputs
        loss = loss[0] if isinstance(loss, (tuple, list)) else loss
        self.values.append(float(np.asarray(loss.asnumpy()).reshape(-1)[0]))


def train_step(net, opt, loss=CE):
    """``nn.TrainOneStepCell`` of ``net`` under ``loss``, in training mode."""
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    return step


def weights_after(make_opt, steps=7, seed=0):
    """Train a fresh BNNet (initial weights from ``seed``) with ``make_opt(net)`` on ``steps`` fixed
    batches; return its weights by name and the optimizer. Two optimizers that should be the same
    update compare bit-for-bit this way."""
    ms.set_seed(seed)
    net = BNNet()
    opt = make_opt(net)
    step = train_step(net, opt)
    for i in range(steps):
        step(*batch(i))
    return {p.name: p.asnumpy() for p in net.trainable_params()}, opt


def one_step_update(net, x, y, split, damping, **kwargs):
    """Weights before/after one K-FAC step with lr 1 and no momentum, decay or clipping."""
    before = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
    opt = ngd.KFAC(net, learning_rate=1.0, damping=damping, momentum=0.0, weight_decay=0.0,
                   factor_decay=0.0, damping_split=split, kl_clip=None, verbose=False, **kwargs)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    step(Tensor(x), Tensor(y))
    after = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
    return {name: after[name] - before[name] for name in before}



def training_state(net, opt):
    """Every weight and every optimizer Parameter (moments, factors, inverses, counters) by name, copied."""
    state = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    state.update({p.name: p.asnumpy().copy() for p in opt.get_parameters()})
    return state


def assert_same_state(state, expected, what="the reference"):
    """The same names and bit-identical values in two :func:`training_state` dicts."""
    assert sorted(state) == sorted(expected)
    different = [name for name in expected if not np.array_equal(state[name], expected[name])]
    assert not different, f"not bit-identical to {what}: {different}"


def functional_step(net, opt, loss_fn=CE, jit=False):
    """MindSpore's functional training step, ``ms.value_and_grad`` over ``opt.parameters`` then
    ``opt(grads)``, under ``ms.jit`` or as it is; it returns the loss. ``net.set_train()`` is the caller's."""
    def forward_fn(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return ms.jit(step) if jit else step


def train_by(how, net, opt, batches, loss_fn=CE):
    """Train ``net`` with ``opt`` on ``batches`` ((x, y) NumPy pairs) as a user would write it: "model"
    (``Model.train``, one dataset element per batch, no sink), or the :func:`functional_step` loop under
    ``ms.jit`` ("jit") or as it is ("loop"). Returns :func:`training_state`."""
    from mindspore.train import Model
    if how == "model":
        data = ms.dataset.NumpySlicesDataset({"x": np.stack([b[0] for b in batches]),
                                              "y": np.stack([b[1] for b in batches])}, shuffle=False)
        Model(net, loss_fn, opt).train(1, data, dataset_sink_mode=False)
    else:
        net.set_train()
        step = functional_step(net, opt, loss_fn, jit=how == "jit")
        for x, y in batches:
            step(Tensor(x), Tensor(y))
    return training_state(net, opt)
