"""Layer discovery and in-place capture (mindspore_ngd.capture) through its public functions: which
Dense / Conv2d / BatchNorm cells find_layers and find_batchnorms take, what they record about them,
which they skip and why; attach / detach change a cell's class only, never its parameters or names.

The factors the capturing cells compute are checked against NumPy in tests/numerics/test_factors.py.
"""
import numpy as np
import pytest

from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.capture import LayerCapture, attach, current_capture, detach, find_batchnorms, find_layers


class DoubledDense(nn.Dense):
    """Its own construct: capture would replace it, so the layer must be skipped."""

    def construct(self, x):
        return super().construct(x) * 2


class NamedDense(nn.Dense):
    """A subclass that keeps nn.Dense's construct: as good as an nn.Dense."""


class ScaledBatchNorm(nn.BatchNorm2d):
    def construct(self, x):
        return super().construct(x) * 0.5


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = NamedDense(5, 4)

    def construct(self, x):
        return self.fc(x)


class Zoo(nn.Cell):
    """One cell of every kind find_layers / find_batchnorms must tell apart (never run)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2, pad_mode="pad", padding=(1, 0, 2, 1), has_bias=True)
        self.gconv = nn.Conv2d(4, 4, 3, pad_mode="same", group=2)
        self.frozen = nn.Dense(6, 5)
        self.frozen.weight.requires_grad = False
        self.frozen_bias = nn.Dense(6, 5)
        self.frozen_bias.bias.requires_grad = False
        self.doubled = DoubledDense(5, 4)
        self.block = Block()
        self.fc = nn.Dense(4, 3, has_bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.bn1d = nn.BatchNorm1d(5, eps=1e-3)
        self.bn_fixed = nn.BatchNorm2d(4, affine=False)
        self.bn_batch = nn.BatchNorm2d(4, use_batch_statistics=True)
        self.bn_scaled = ScaledBatchNorm(4)


def test_find_layers_takes_plain_dense_and_conv_cells_in_network_order():
    specs, cells, _ = find_layers(Zoo())
    assert [s.name for s in specs] == ["conv", "block.fc", "fc"]
    assert [type(c) for c in cells] == [nn.Conv2d, NamedDense, nn.Dense]
    conv, nested, fc = specs
    # conv: A over (in x kh x kw) patches plus the bias column, G over the output channels
    assert (conv.kind, conv.a_dim, conv.g_dim, conv.weight_shape) == ("conv2d", 2 * 3 * 3 + 1, 4, (4, 2, 3, 3))
    assert (conv.kernel_size, conv.stride, conv.dilation) == ((3, 3), (2, 2), (1, 1))
    assert (conv.pad_mode, conv.padding) == ("pad", (1, 0, 2, 1))
    assert (conv.weight_name, conv.bias_name, conv.has_bias) == ("conv.weight", "conv.bias", True)
    # names are the parameters' own, nested cells included
    assert (nested.kind, nested.a_dim, nested.g_dim) == ("dense", 5 + 1, 4)
    assert (nested.weight_name, nested.bias_name) == ("block.fc.weight", "block.fc.bias")
    assert (fc.a_dim, fc.g_dim, fc.bias_name, fc.has_bias) == (4, 3, None, False)


def test_find_layers_skips_what_it_cannot_precondition_and_says_why():
    _, _, skipped = find_layers(Zoo())
    assert skipped == [("gconv", "group=2 convolution"), ("frozen", "weight is not trainable"),
                       ("frozen_bias", "bias is not trainable"), ("doubled", "custom construct")]


def test_a_network_that_is_a_single_layer_is_skipped_with_advice():
    assert find_layers(nn.Dense(3, 2)) == ([], [], [("<root>", "the network itself is a single layer; "
                                                              "wrap it in a Cell")])


def test_find_batchnorms_takes_affine_batch_norms_and_skips_the_rest_with_reasons():
    specs, cells, skipped = find_batchnorms(Zoo())
    assert [(s.name, s.gamma_name, s.beta_name, s.channels) for s in specs] == [
        ("bn", "bn.gamma", "bn.beta", 4), ("bn1d", "bn1d.gamma", "bn1d.beta", 5)]
    assert [s.eps for s in specs] == [pytest.approx(1e-5), pytest.approx(1e-3)]
    assert [type(c) for c in cells] == [nn.BatchNorm2d, nn.BatchNorm1d]
    assert skipped == [("bn_fixed", "gamma/beta not trainable (affine=False?)"),
                       ("bn_batch", "use_batch_statistics=True"), ("bn_scaled", "custom construct")]


class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = NamedDense(3 * 4 * 4, 2)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def test_attach_and_detach_change_the_class_only(pynative):
    net = Small()
    net.set_train(False)
    x = Tensor(np.random.default_rng(0).standard_normal((3, 2, 4, 4)).astype(np.float32))
    plain = net(x).asnumpy()
    names = [p.name for p in net.get_parameters()]
    specs, cells, _ = find_layers(net)
    captures = [LayerCapture(spec, "t") for spec in specs]
    attach(cells, captures)
    assert [type(c).__name__ for c in cells] == ["NGDConv2d", "NGDNamedDense"]
    assert isinstance(cells[0], nn.Conv2d) and isinstance(cells[1], NamedDense)
    assert [current_capture(c) for c in cells] == captures
    # the network's parameters and checkpoint keys stay; the capture buffers are not the network's
    assert [p.name for p in net.get_parameters()] == names
    assert not any(name.startswith("t.") for name in net.parameters_dict())
    np.testing.assert_array_equal(net(x).asnumpy(), plain)      # evaluation runs the layers as before
    # attaching again replaces the capture and does not wrap the captured class again
    again = [LayerCapture(spec, "u") for spec in specs]
    attach(cells, again)
    assert [type(c).__name__ for c in cells] == ["NGDConv2d", "NGDNamedDense"]
    assert [current_capture(c) for c in cells] == again
    detach(cells)
    assert [type(c) for c in cells] == [nn.Conv2d, NamedDense]
    assert [current_capture(c) for c in cells] == [None, None]
    assert [p.name for p in net.get_parameters()] == names
    np.testing.assert_array_equal(net(x).asnumpy(), plain)


def _two_dense():
    return nn.SequentialCell([nn.Dense(5, 4), nn.ReLU(), nn.Dense(4, 3)])


@pytest.mark.parametrize("make, every_step", [
    (lambda net: ngd.KFAC(net, learning_rate=0.1, verbose=False), True),                   # factors every step
    (lambda net: ngd.KFAC(net, learning_rate=0.1, factor_update_interval=2, verbose=False), False),
    (lambda net: ngd.KFAC(net, learning_rate=0.1, fisher="mc", verbose=False), False),      # its own step captures
    (lambda net: ngd.SPNGD(net, learning_rate=0.1, verbose=False), False),                  # per-statistic intervals
    (lambda net: ngd.SPNGD(net, learning_rate=0.1, stale=False, verbose=False), True),
    (lambda net: ngd.THOR(net, 0.1, 1e-2, verbose=False), False),                           # refresh points only
], ids=["kfac", "kfac-interval-2", "kfac-mc", "spngd", "spngd-not-stale", "thor"])
def test_a_rule_that_captures_every_statistic_on_every_step_compiles_the_capture_without_its_branch(make, every_step):
    opt = make(_two_dense())
    assert [block.capture.every_step for block in opt.blocks] == [every_step, every_step]


@pytest.mark.parametrize("make, records", [
    (lambda net: ngd.KFAC(net, learning_rate=0.1, verbose=False), False),
    (lambda net: ngd.SPNGD(net, learning_rate=0.1, verbose=False), False),
    (lambda net: ngd.KFAC(net, learning_rate=0.1, damping_split="positions", verbose=False), True),
    (lambda net: ngd.THOR(net, 0.1, 1e-2, verbose=False), True),                 # damping_split="positions"
], ids=["kfac", "spngd", "kfac-positions", "thor"])
def test_only_the_positions_damping_split_has_the_capture_record_a_convolutions_output_positions(make, records):
    """T (a Conv2d's output positions) is written with A only where the damping split reads it: each write
    is a side effect in the forward pass, which costs compile time. Where it is written it is T."""
    from nets import ConvNet

    net = ConvNet(2, 3, 3, 1, "valid", 0, 1, True, 3 * 5 * 5)          # 7x7 input -> 5x5 output: T = 25
    opt = make(net)
    conv, fc = opt.blocks
    assert (conv.capture.records_positions, fc.capture.records_positions) == (records, False)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    step(Tensor(rng.standard_normal((4, 2, 7, 7)).astype(np.float32)), Tensor(np.array([0, 1, 2, 3], np.int32)))
    assert float(conv.capture.positions.asnumpy()) == (25.0 if records else 1.0)
    assert float(fc.capture.positions.asnumpy()) == 1.0
