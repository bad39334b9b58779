"""MindSpore's functional training loop (``ms.value_and_grad`` over ``opt.parameters``, then
``opt(grads)``), with and without ``@ms.jit`` and in PyNative mode, trains with natural gradient: the
same weights and optimizer state as ``Model.train`` and a custom ``nn.TrainOneStepCell`` on the same
batches. A network left in inference mode (``nn.Cell`` starts with ``training=False``; ``Model.train``
sets it, a hand-written loop must) is refused on the first step, before any weight moves, with an
error naming ``set_train``: its layers would capture nothing and fall back to plain momentum.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset
from nets import BNNet
from training import CE, assert_same_state, batch, functional_step, training_state

STEPS = 4
# frequency=2 makes THOR refresh twice in four steps (its default, 100, would refresh only once)
OPTIMIZERS = {
    "kfac": lambda net: ngd.KFAC(net, learning_rate=0.1, damping=1e-2, verbose=False),
    "spngd": lambda net: ngd.SPNGD(net, learning_rate=0.1, damping=1e-2, verbose=False),
    "thor": lambda net: ngd.THOR(net, learning_rate=0.1, damping=1e-2, frequency=2, verbose=False),
}


def _batches():
    return [batch(i) for i in range(STEPS)]


def _fresh(kind):
    ms.set_seed(0)
    net = BNNet()
    return net, OPTIMIZERS[kind](net)


def _model_train(kind):
    net, opt = _fresh(kind)
    x = np.concatenate([b[0].asnumpy() for b in _batches()])
    y = np.concatenate([b[1].asnumpy() for b in _batches()])
    Model(net, CE, opt).train(1, array_dataset(x, y, len(y) // STEPS, shuffle=False), dataset_sink_mode=False)
    return training_state(net, opt)


def _train_one_step_cell(kind):
    net, opt = _fresh(kind)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    for x, y in _batches():
        step(x, y)
    return training_state(net, opt)


def _functional(kind, jit, set_train=True):
    """MindSpore's tutorial loop; returns the state, the losses and the optimizer."""
    net, opt = _fresh(kind)
    if set_train:
        net.set_train()

    def forward_fn(x, y):
        logits = net(x)
        return CE(logits, y), logits

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters, has_aux=True)

    def train_step(x, y):
        (loss, _), grads = grad_fn(x, y)
        opt(grads)
        return loss

    if jit:
        train_step = ms.jit(train_step)
    losses = [float(train_step(x, y).asnumpy()) for x, y in _batches()]
    return training_state(net, opt), losses, opt


_REFERENCE = {}


def _reference(kind):
    """Model.train in the current mode (graph or PyNative: their kernels may order sums differently),
    computed once per optimizer and mode."""
    key = (kind, ms.get_context("mode"))
    if key not in _REFERENCE:
        _REFERENCE[key] = _model_train(kind)
    return _REFERENCE[key]


def _assert_same_training(kind, state):
    """Every weight and every optimizer Parameter (moments, factors, inverses, counters) bit-identical
    to Model.train's."""
    assert_same_state(state, _reference(kind), "Model.train")


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_functional_loop_under_jit_trains_as_model_train(kind):
    state, losses, opt = _functional(kind, jit=True)
    _assert_same_training(kind, state)
    assert opt.demoted_layers() == []            # every preconditioned layer took its statistics
    assert all(a > 0 and g > 0 for a, g in opt.factor_updates().values())
    assert np.all(np.isfinite(losses))


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_functional_loop_in_pynative_trains_as_model_train(kind, pynative):
    state, _, opt = _functional(kind, jit=False)
    _assert_same_training(kind, state)
    assert opt.demoted_layers() == []


@pytest.mark.parametrize("kind", ["kfac"])
def test_custom_train_one_step_cell_trains_as_model_train(kind):
    _assert_same_training(kind, _train_one_step_cell(kind))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "pynative"])
def test_a_network_in_inference_mode_is_refused_before_any_update(jit, request):
    if not jit:
        request.getfixturevalue("pynative")
    net, opt = _fresh("kfac")
    start = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    train_step = functional_step(net, opt, jit=jit)          # no net.set_train(): the mistake under test
    with pytest.raises(RuntimeError, match=r"not in training mode.*net\.set_train\(\)"):
        train_step(*batch(0))
    for p in net.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), start[p.name], err_msg=p.name)
    assert opt.state_counters()["step"] == 0


def test_a_layer_left_in_inference_mode_is_named():
    net, opt = _fresh("kfac")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    net.fc.set_train(False)
    with pytest.raises(RuntimeError, match=r"1 of its 2 preconditioned layers are not in training mode: fc.*skip_layers"):
        step(*batch(0))
