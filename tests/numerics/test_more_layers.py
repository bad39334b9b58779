"""nn.Linear (= mint.nn.Linear) and mint.nn.Conv2d are preconditioned like nn.Dense and nn.Conv2d:
their factors and one K-FAC step against the independent NumPy reference, and their parameter names
and checkpoint keys unchanged by the capture.

MindSpore 2.10 has no CPU kernel for mint.nn.Conv2d (Conv2DExt / Conv2DPadding are Ascend kernels):
on CPU the tests give each mint convolution a stand-in for its ``conv2d`` kernel attribute,
:class:`CpuConvKernel`, which computes the same convolution with ``ops.conv2d``. The capture
(``_CapturedMintConv2d``) calls that attribute exactly as mint's own ``construct`` does, so the
capture's A, G and geometry (padding ints, "same", "valid", stride, dilation) are what is checked.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import mint, nn, ops, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.capture import find_layers
from nets import set_weights
from reference import numpy_kfac as ref
from training import one_step_update

TOL = 1e-5          # norm-wise relative error, as tests/numerics/test_factors.py
CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class CpuConvKernel(nn.Cell):
    """Stand-in for mint.nn.Conv2d's kernel call ``conv2d(x, w, b, stride, padding, dilation, groups)``."""

    def __init__(self, padding):
        super().__init__()
        if isinstance(padding, str):
            self.pad_mode, self.pads = padding, 0
        else:
            self.pad_mode, self.pads = "pad", tuple(padding)

    def construct(self, x, weight, bias, stride, padding, dilation, groups):
        out = ops.conv2d(x, weight, None, stride, self.pad_mode, self.pads, dilation, groups)
        if bias is not None:
            out = out + bias.reshape(1, -1, 1, 1)
        return out


def cpu_mint_conv(*args, **kwargs):
    conv = mint.nn.Conv2d(*args, **kwargs)
    object.__setattr__(conv, "conv2d", CpuConvKernel(conv.padding))
    return conv


class MintNet(nn.Cell):
    """mint conv -> ReLU -> flatten -> mint Linear."""

    def __init__(self, conv, flat_dim, classes=4):
        super().__init__()
        self.conv = conv
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = mint.nn.Linear(flat_dim, classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


class SequenceNet(nn.Cell):
    """nn.Linear on a (B, T, d) sequence (every row an example) -> ReLU -> flatten -> nn.Linear."""

    def __init__(self, bias):
        super().__init__()
        self.fc1 = nn.Linear(5, 4, bias=bias)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(3 * 4, 3)

    def construct(self, x):
        h = self.relu(self.fc1(x))
        return self.fc2(h.reshape(h.shape[0], -1))


def w(param):
    return param.asnumpy().astype(np.float64)


def with_bias(grad, dy_sum, has_bias):
    return np.concatenate([grad, dy_sum[:, None]], axis=1) if has_bias else grad


def sequence_reference(net, x, y):
    """(A, G, gradient matrix) of fc1 and fc2 by hand-derived backprop."""
    rows = x.reshape(-1, 5).astype(np.float64)
    bias1 = net.fc1.bias is not None
    h = rows @ w(net.fc1.weight).T + (w(net.fc1.bias) if bias1 else 0)
    z = np.maximum(h, 0).reshape(x.shape[0], -1)
    logits = z @ w(net.fc2.weight).T + w(net.fc2.bias)
    _, dlogits = ref.softmax_ce(logits, y)
    dh = (dlogits @ w(net.fc2.weight)).reshape(-1, 4) * (h > 0)
    # every row of the sequence is an example of fc1: A over R = B*T rows, G = R * sum dy dy^T
    a1, g1 = ref.dense_factors(rows, dh, bias1)
    a2, g2 = ref.dense_factors(z, dlogits, True)
    return {"fc1": (a1, g1, with_bias(dh.T @ rows, dh.sum(0), bias1)),
            "fc2": (a2, g2, with_bias(dlogits.T @ z, dlogits.sum(0), True))}


# mint geometries: kernel, stride, padding (int / (h, w) / "same" / "valid"), dilation, bias
MINT_CASES = [
    ((3, 3), (1, 1), "same", (1, 1), True),
    ((3, 2), (1, 1), "same", (2, 1), False),
    ((3, 3), (2, 2), 1, (1, 1), True),
    ((3, 2), (1, 2), (2, 1), (1, 2), False),
    ((2, 2), (1, 1), "valid", (1, 1), True),
]


def mint_reference(net, x, y, kernel, stride, padding, dilation):
    pad_mode, pads = (padding, (0,) * 4) if isinstance(padding, str) else \
        ("pad", (padding, padding, padding, padding) if isinstance(padding, int)
         else (padding[0], padding[0], padding[1], padding[1]))
    patches, (oh, ow) = ref.im2col(x.astype(np.float64), kernel, stride, dilation, pad_mode, pads)
    wc = w(net.conv.weight)
    cout = wc.shape[0]
    has_bias = net.conv.bias is not None
    conv = patches @ wc.reshape(cout, -1).T + (w(net.conv.bias) if has_bias else 0)
    conv_nchw = conv.transpose(0, 2, 1).reshape(x.shape[0], cout, oh, ow)
    flat = np.maximum(conv_nchw, 0).reshape(x.shape[0], -1)
    logits = flat @ w(net.fc.weight).T + w(net.fc.bias)
    _, dlogits = ref.softmax_ce(logits, y)
    dconv = (dlogits @ w(net.fc.weight)).reshape(conv_nchw.shape) * (conv_nchw > 0)
    a_conv, g_conv = ref.conv_factors(patches, dconv, has_bias)
    dy_rows = dconv.reshape(x.shape[0], cout, -1)
    grad_conv = with_bias(np.einsum("bot,btd->od", dy_rows, patches), dy_rows.sum((0, 2)), has_bias)
    a_fc, g_fc = ref.dense_factors(flat, dlogits, True)
    grad_fc = with_bias(dlogits.T @ flat, dlogits.sum(0), True)
    return conv_nchw, {"conv": (a_conv, g_conv, grad_conv), "fc": (a_fc, g_fc, grad_fc)}


def make_mint_net(case, seed):
    kernel, stride, padding, dilation, bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 2, 7, 7)).astype(np.float32)
    y = rng.integers(0, 4, 4).astype(np.int32)
    pads = (0,) * 4 if isinstance(padding, str) else \
        ((padding,) * 4 if isinstance(padding, int) else (padding[0], padding[0], padding[1], padding[1]))
    _, (oh, ow) = ref.conv_geometry(x.shape, kernel, stride, dilation, "pad" if not isinstance(padding, str)
                                    else padding, pads)
    conv = cpu_mint_conv(2, 3, kernel, stride=stride, padding=padding, dilation=dilation, bias=bias)
    net = MintNet(conv, 3 * oh * ow)
    set_weights(net, rng)
    return net, x, y


def assert_factors(got, expected):
    assert set(got) == set(expected)
    for name, (big_a, big_g, _) in expected.items():
        assert got[name][0].shape == big_a.shape, name
        assert ref.rel_err(got[name][0], big_a) < TOL, name
        assert ref.rel_err(got[name][1], big_g) < TOL, name


def assert_one_step(delta, expected, damping, split="pi", jitter=1e-6):
    for name, (big_a, big_g, grad) in expected.items():
        p = ref.preconditioned(big_a, big_g, grad, damping, split, jitter=jitter)
        dw = delta[f"{name}.weight"].reshape(grad.shape[0], -1)
        if f"{name}.bias" in delta:
            dw = np.concatenate([dw, delta[f"{name}.bias"][:, None]], axis=1)
        assert ref.rel_err(dw, -p) < TOL, (name, ref.rel_err(dw, -p))


def test_linear_on_sequences_matches_reference():
    rng = np.random.default_rng(4)
    net = SequenceNet(bias=False)               # fc1 without a bias, fc2 with one
    set_weights(net, rng)
    x = rng.standard_normal((6, 3, 5)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    expected = sequence_reference(net, x, y)
    assert_factors(ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y)), expected)
    assert_one_step(one_step_update(net, x, y, "pi", damping=0.05), expected, 0.05)


@pytest.mark.parametrize("case", MINT_CASES, ids=[f"{c[2]}-s{c[1][0]}{c[1][1]}-d{c[3][0]}{c[3][1]}-k{c[0][0]}{c[0][1]}"
                                                  f"-{'b' if c[4] else 'nob'}" for c in MINT_CASES])
def test_mint_conv_and_linear_factors_match_reference(case):
    kernel, stride, padding, dilation, _ = case
    net, x, y = make_mint_net(case, 5)
    conv_out, expected = mint_reference(net, x, y, kernel, stride, padding, dilation)
    # the reference convolution (explicit patches) reproduces the layer, padding included
    assert ref.rel_err(net.conv(Tensor(x)).asnumpy(), conv_out) < TOL
    assert_factors(ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y)), expected)


def test_one_mint_step_moves_weights_by_minus_p():
    kernel, stride, padding, dilation, _ = case = MINT_CASES[0]
    net, x, y = make_mint_net(case, 6)
    _, expected = mint_reference(net, x, y, kernel, stride, padding, dilation)
    # as test_factors.py's convolution step: the convolution, sqrt split, no jitter (the head's A is
    # 148 wide with rank 5: its float32 inverse is off by ~8e-5, the Linear step is checked above)
    delta = one_step_update(net, x, y, "sqrt", damping=0.05, jitter=0.0)
    assert_one_step(delta, {"conv": expected["conv"]}, 0.05, "sqrt", 0.0)


def test_names_and_checkpoint_keys_are_unchanged(tmp_path):
    net, _, _ = make_mint_net(MINT_CASES[2], 7)
    seq = SequenceNet(True)
    for network in (net, seq):
        path = str(tmp_path / "plain.ckpt")
        ms.save_checkpoint(network, path)
        names = [p.name for p in network.get_parameters()]
        opt = ngd.KFAC(network, learning_rate=0.1, verbose=False)
        assert [s.kind for s in opt.layer_specs] == (["conv2d", "dense"] if network is net else ["dense", "dense"])
        assert [p.name for p in network.get_parameters()] == names
        captured = str(tmp_path / "captured.ckpt")
        ms.save_checkpoint(network, captured)
        assert set(ms.load_checkpoint(path)) == set(ms.load_checkpoint(captured))


def test_mint_geometry_and_unsupported_mint_convolutions():
    class Zoo(nn.Cell):
        def __init__(self):
            super().__init__()
            self.same = mint.nn.Conv2d(2, 4, 3, padding="same", dilation=2)
            self.hw = mint.nn.Conv2d(2, 4, (3, 1), stride=(2, 1), padding=(1, 2), bias=False)
            self.grouped = mint.nn.Conv2d(4, 4, 3, groups=2)
            self.reflect = mint.nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect")
            self.linear = mint.nn.Linear(3, 2, bias=False)

    specs, _, skipped = find_layers(Zoo())
    same, hw, linear = specs
    assert (same.pad_mode, same.padding, same.dilation, same.a_dim, same.bias_name) == \
        ("same", (0, 0, 0, 0), (2, 2), 2 * 9 + 1, "same.bias")
    assert (hw.pad_mode, hw.padding, hw.stride, hw.kernel_size, hw.a_dim, hw.bias_name) == \
        ("pad", (1, 1, 2, 2), (2, 1), (3, 1), 2 * 3, None)
    assert (linear.kind, linear.a_dim, linear.g_dim, linear.has_bias) == ("dense", 3, 2, False)
    assert skipped == [("grouped", "groups=2 convolution"),
                       ("reflect", "padding_mode='reflect' (only zero padding is captured)")]
