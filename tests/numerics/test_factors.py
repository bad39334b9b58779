"""Kronecker factors and preconditioned gradients against the independent NumPy reference."""
import numpy as np
import pytest

from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import CONV_CASES, conv_net_reference, make_conv_net, make_dense_net
from reference import numpy_kfac as ref
from training import one_step_update

TOL = 1e-5          # norm-wise relative error for A, G and the preconditioned gradient
CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def w(param):
    return param.asnumpy().astype(np.float64)


def dense_reference(net, x, y):
    """Per-layer (A, G, gradient matrix) of DenseNet by hand-derived backprop."""
    a = x.astype(np.float64)
    w1, w2, b2 = w(net.fc1.weight), w(net.fc2.weight), w(net.fc2.bias)
    h = a @ w1.T + (w(net.fc1.bias) if net.fc1.has_bias else 0)
    z = np.maximum(h, 0)
    logits = z @ w2.T + b2
    _, dlogits = ref.softmax_ce(logits, y)
    dh = (dlogits @ w2) * (h > 0)
    out = {}
    for name, inp, dy, bias in (("fc1", a, dh, net.fc1.has_bias), ("fc2", z, dlogits, True)):
        big_a, big_g = ref.dense_factors(inp, dy, bias)
        grad = dy.T @ inp
        if bias:
            grad = np.concatenate([grad, dy.sum(0)[:, None]], axis=1)
        out[name] = (big_a, big_g, grad)
    return out


def conv_reference(net, x, y, geometry):
    patches, conv_nchw, dconv = conv_net_reference(net, x, y, geometry)
    cout = conv_nchw.shape[1]
    big_a, big_g = ref.conv_factors(patches, dconv, net.conv.has_bias)
    dy_rows = dconv.reshape(x.shape[0], cout, -1)                   # (B, out, T)
    grad = np.einsum("bot,btd->od", dy_rows, patches)
    if net.conv.has_bias:
        grad = np.concatenate([grad, dy_rows.sum((0, 2))[:, None]], axis=1)
    return conv_nchw, big_a, big_g, grad


@pytest.mark.parametrize("bias", [True, False])
def test_dense_factors_match_reference(bias):
    net, x, y = make_dense_net(0, bias, 6)
    got = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    expected = dense_reference(net, x, y)
    assert set(got) == {"fc1", "fc2"}
    for name, (big_a, big_g, _) in expected.items():
        assert got[name][0].shape == big_a.shape
        assert ref.rel_err(got[name][0], big_a) < TOL, name
        assert ref.rel_err(got[name][1], big_g) < TOL, name


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{c[2]}-s{c[1][0]}{c[1][1]}-d{c[4][0]}{c[4][1]}-k{c[0][0]}{c[0][1]}"
                                                  f"-{'b' if c[5] else 'nob'}" for c in CONV_CASES])
def test_conv_factors_match_reference(case):
    rng = np.random.default_rng(1)
    net, x, y, geometry = make_conv_net(case, rng)
    conv_out, big_a, big_g, _ = conv_reference(net, x, y, geometry)
    # the reference convolution (explicit patches) reproduces MindSpore's layer, padding included
    assert ref.rel_err(net.conv(Tensor(x)).asnumpy(), conv_out) < TOL
    got = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    assert ref.rel_err(got["conv"][0], big_a) < TOL
    assert ref.rel_err(got["conv"][1], big_g) < TOL


@pytest.mark.parametrize("case", CONV_CASES[:3], ids=["same-b", "strided", "valid-b"])
def test_conv_factors_summed_per_example_match_reference(case, monkeypatch):
    """The per-example route of large conv layers (``factors.BATCHED_GRAM_MIN``), forced on a small one."""
    from mindspore_ngd.curvature import factors
    monkeypatch.setattr(factors, "BATCHED_GRAM_MIN", 1)
    rng = np.random.default_rng(2)
    net, x, y, geometry = make_conv_net(case, rng)
    _, big_a, big_g, _ = conv_reference(net, x, y, geometry)
    got = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    assert ref.rel_err(got["conv"][0], big_a) < TOL
    assert ref.rel_err(got["conv"][1], big_g) < TOL


def split_expected(delta, name, matrix, bias):
    dw = delta[f"{name}.weight"].reshape(matrix.shape[0], -1)
    return np.concatenate([dw, delta[f"{name}.bias"][:, None]], axis=1) if bias else dw


@pytest.mark.parametrize("split", ["sqrt", "pi"])
def test_one_dense_step_moves_weights_by_minus_p(split):
    net, x, y = make_dense_net(2, True, 8)
    expected = dense_reference(net, x, y)
    delta = one_step_update(net, x, y, split, damping=0.05)
    for name, (big_a, big_g, grad) in expected.items():
        p = ref.preconditioned(big_a, big_g, grad, 0.05, split, jitter=1e-6)
        got = split_expected(delta, name, grad, True)
        assert ref.rel_err(got, -p) < TOL, (name, ref.rel_err(got, -p))


@pytest.mark.parametrize("case", [CONV_CASES[0], CONV_CASES[3], CONV_CASES[4]], ids=["same", "pad-s2", "dil2-nob"])
def test_one_conv_step_moves_weights_by_minus_p(case):
    rng = np.random.default_rng(3)
    net, x, y, geometry = make_conv_net(case, rng)
    _, big_a, big_g, grad = conv_reference(net, x, y, geometry)
    delta = one_step_update(net, x, y, "sqrt", damping=0.05, jitter=0.0)
    p = ref.preconditioned(big_a, big_g, grad, 0.05, "sqrt", jitter=0.0)
    got = split_expected(delta, "conv", grad, net.conv.has_bias)
    assert ref.rel_err(got, -p) < TOL, ref.rel_err(got, -p)
