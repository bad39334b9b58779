"""Gradient accumulation (k micro-batch backward passes whose gradients are summed, then one
``opt(grads)``) is refused on its first step, before any weight moves, with an error naming the working
form -- under ``@ms.jit`` and in PyNative, with host calls (the step raises) and without (the step
freezes and ``check_status`` raises). Each backward pass overwrites the layers' batch statistics, so
the step would otherwise precondition the summed gradient with the last micro-batch's factors.

A pass whose gradients the loop discards (what ``TrainOneStepWithLossScaleCell`` does on a loss-scale
overflow, skipping the optimizer) is not refused: its statistics are overwritten by the pass that is
kept, and the training is bit-identical to the loop without the discarded pass.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor

import mindspore_ngd as ngd
from nets import BNNet, ConvNet
from training import CE, batch

ACCUMULATION = r"gradients of 2 backward passes: gradient accumulation .* not supported.*once per forward/backward pass"


class _NoBiasNet(nn.Cell):
    """conv -> ReLU -> flatten -> Dense, no bias anywhere: no layer can measure the loss scale, so the
    pass count alone decides."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="same", has_bias=False)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 5 * 5, 3, has_bias=False)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def _setup(net_class=BNNet, host_calls=True):
    ms.set_seed(0)
    net = net_class()
    net.set_train()
    opt = ngd.KFAC(net, learning_rate=0.1, damping=1e-2, verbose=False, host_calls=host_calls)

    def forward_fn(x, y):
        return CE(net(x), y)

    return net, opt, ms.value_and_grad(forward_fn, None, opt.parameters)


def _weights(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def _state(net, opt):
    state = _weights(net)
    state.update({p.name: p.asnumpy().copy() for p in opt.get_parameters()})
    return state


def _accumulating_step(grad_fn, opt, jit):
    """Two micro-batch gradients summed, then one optimizer call."""

    def train_step(x1, y1, x2, y2):
        loss1, grads1 = grad_fn(x1, y1)
        loss2, grads2 = grad_fn(x2, y2)
        grads = tuple(g1 + g2 for g1, g2 in zip(grads1, grads2))
        opt(grads)
        return loss1 + loss2

    return ms.jit(train_step) if jit else train_step


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "pynative"])
@pytest.mark.parametrize("host_calls", [True, False], ids=["host_calls", "device_status"])
def test_gradient_accumulation_is_refused_on_the_first_step(jit, host_calls, request):
    if not jit:
        request.getfixturevalue("pynative")
    net, opt, grad_fn = _setup(host_calls=host_calls)
    start = _weights(net)
    step = _accumulating_step(grad_fn, opt, jit)
    if host_calls:
        with pytest.raises(RuntimeError, match=ACCUMULATION):
            step(*batch(0), *batch(1))
    else:
        step(*batch(0), *batch(1))         # the device graph cannot raise: it records the stop
        with pytest.raises(RuntimeError, match=ACCUMULATION):
            opt.check_status()
        assert int(opt.run_status.asnumpy()[0]) == 4
        step(*batch(2), *batch(3))         # a stopped run stays frozen
    for name, value in start.items():
        np.testing.assert_array_equal(_weights(net)[name], value, err_msg=name)
    assert all(a == 0 and g == 0 for a, g in opt.factor_updates().values())


def test_gradient_accumulation_is_refused_without_a_loss_scale_probe():
    """No preconditioned layer with a bias: the pass count alone refuses."""
    net, opt, grad_fn = _setup(_NoBiasNet)
    assert opt.capture_control.scale_probe is None
    start = _weights(net)
    with pytest.raises(RuntimeError, match=ACCUMULATION):
        _accumulating_step(grad_fn, opt, jit=True)(*batch(0), *batch(1))
    for name, value in start.items():
        np.testing.assert_array_equal(_weights(net)[name], value, err_msg=name)


def _loop(net_class, discard, steps=3):
    """The functional loop under jit; with ``discard``, every step first runs a backward pass on another
    batch whose gradients are thrown away (a loss-scale cell's overflow step)."""
    net, opt, grad_fn = _setup(net_class)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    @ms.jit
    def discarded(x, y):
        loss, _ = grad_fn(x, y)
        return loss

    for i in range(steps):
        if discard is not None:
            discarded(*discard(i))
        train_step(*batch(i))
    return _state(net, opt), opt


@pytest.mark.parametrize("net_class", [BNNet, _NoBiasNet], ids=["probe", "no_probe"])
def test_a_discarded_backward_pass_is_not_refused_and_changes_nothing(net_class):
    """With the loss-scale probe, any discarded pass (the gradient received is the last pass's); without
    it, a discarded pass with a non-finite output gradient, as an overflow has (a NaN input here)."""
    if net_class is BNNet:
        discard = lambda i: batch(100 + i)                                      # noqa: E731
    else:
        discard = lambda i: (Tensor(np.full((8, 2, 5, 5), np.nan, np.float32)), batch(i)[1])  # noqa: E731
    expected, _ = _loop(net_class, None)
    state, opt = _loop(net_class, discard)
    # BatchNorm's moving statistics saw the extra forward passes; nothing else may differ
    different = [name for name in expected if "moving_" not in name
                 and not np.array_equal(state[name], expected[name])]
    assert not different, different
    assert opt.state_counters()["step"] == 3 and opt.state_counters()["skipped_steps"] == 0
    assert all(a > 0 and g > 0 for a, g in opt.factor_updates().values())


class _BiasedConvNet(ConvNet):
    """conv (bias) -> ReLU -> flatten -> Dense on BNNet's inputs: the probe reads the Dense layer."""

    def __init__(self):
        super().__init__(2, 3, (3, 3), (1, 1), "same", 0, (1, 1), True, 3 * 5 * 5, classes=3)


def test_the_pass_counter_is_cleared_by_every_step():
    """One pass per step, many steps: never refused (the counter does not carry over)."""
    _, opt = _loop(_BiasedConvNet, None, steps=4)
    assert opt.state_counters()["step"] == 4
    assert int(opt.blocks[opt._pass_layer].capture.passes.asnumpy()) == 0
