"""Statistics from a subsample (``stat_fraction``, ``stat_stride``) against an independent NumPy
reference written from the formulas of :mod:`mindspore_ngd.curvature.factors`: with m of the B
examples (set S, the first m) and T' of the T output positions (set S', rows and columns 0, s, 2s, ...)

    A = (T/T') (1/m) sum_{b in S, t in S'} abar abar^T,   G = (1/(m T')) sum_{b in S, t in S'} g g^T,

with ``g = B dy`` the per-example output gradient (Dense: T = T' = 1). The factors are read from the
optimizer after one step with ``factor_decay=0`` (the first capture initialises the average). Cases
that repeat a default one on another geometry or layer kind are marked slow."""
import math

import numpy as np
import pytest

from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.curvature import factors
from nets import CONV_CASES, DenseNet, conv_net_reference, make_conv_net, make_dense_net, set_weights
from reference import numpy_kfac as ref

TOL = 1e-5          # norm-wise relative error of A and G (float32 against float64)
CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def w(param):
    return param.asnumpy().astype(np.float64)


# ------------------------------------------------------------------ reference (explicit sums, float64)
def kept(batch, fraction):
    return max(1, math.ceil(fraction * batch))


@pytest.mark.parametrize("rows, fraction, expected", [
    (6, 0.5, 3), (7, 0.5, 4), (5, 0.1, 1), (3, 0.01, 1), (8, 1.0, 8), (100, 0.07, 7), (10, 0.7, 7), (50, 0.14, 7)])
def test_kept_rows_is_the_ceiling_of_the_exact_product(rows, fraction, expected):
    assert factors.kept_rows(rows, fraction) == expected     # 0.07 * 100 = 7.000000000000001 in float


def dense_subsampled(a, dy, has_bias, fraction):
    """A, G of a Dense layer from the first m rows of its input a (B, in) and mean-loss gradient dy."""
    batch = a.shape[0]
    m = kept(batch, fraction)
    abar = ref.append_one(a) if has_bias else a
    g = batch * dy
    big_a = sum(np.outer(abar[b], abar[b]) for b in range(m)) / m
    big_g = sum(np.outer(g[b], g[b]) for b in range(m)) / m
    return big_a, big_g


def conv_subsampled(patches, dy, has_bias, fraction, stride):
    """A, G of a Conv2d from patches (B, T, D) (T in row-major (oh, ow) order) and the mean-loss
    output gradient dy (B, out, Ho, Wo), over the first m examples and the positions (i, j) with
    i % stride == 0 and j % stride == 0."""
    batch, positions, _ = patches.shape
    out_h, out_w = dy.shape[2:]
    m = kept(batch, fraction)
    abar = ref.append_one(patches) if has_bias else patches
    g = batch * dy.reshape(batch, dy.shape[1], positions).transpose(0, 2, 1)       # (B, T, out)
    chosen = [i * out_w + j for i in range(0, out_h, stride) for j in range(0, out_w, stride)]
    big_a = sum(np.outer(abar[b, t], abar[b, t]) for b in range(m) for t in chosen) * (positions / len(chosen)) / m
    big_g = sum(np.outer(g[b, t], g[b, t]) for b in range(m) for t in chosen) / (m * len(chosen))
    return big_a, big_g


def dense_layers(net, x, y):
    """{layer: (input rows, mean-loss output gradient)} of DenseNet by hand-derived backprop."""
    a = x.astype(np.float64)
    w1, w2, b2 = w(net.fc1.weight), w(net.fc2.weight), w(net.fc2.bias)
    h = a @ w1.T + w(net.fc1.bias)
    z = np.maximum(h, 0)
    _, dlogits = ref.softmax_ce(z @ w2.T + b2, y)
    dh = (dlogits @ w2) * (h > 0)
    return {"fc1": (a, dh), "fc2": (z, dlogits)}


def conv_layer(net, x, y, geometry):
    """(patches (B, T, D), mean-loss output gradient (B, out, Ho, Wo)) of the ConvNet's conv."""
    patches, _, dconv = conv_net_reference(net, x, y, geometry)
    return patches, dconv


# ------------------------------------------------------------------ the optimizer's factors
def make_kfac(net, **kwargs):
    return ngd.KFAC(net, learning_rate=0.0, momentum=0.0, factor_decay=0.0, kl_clip=None, verbose=False,
                    **kwargs)


def step(net, opt):
    train = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    train.set_train()
    return train


def stored_factors(opt):
    return {spec.name: (block.a_factor.asnumpy().astype(np.float64), block.g_factor.asnumpy().astype(np.float64))
            for spec, block in zip(opt.layer_specs, opt.blocks)}


def factors_after_one_step(net, x, y, **kwargs):
    opt = make_kfac(net, **kwargs)
    step(net, opt)(Tensor(x), Tensor(y))
    return stored_factors(opt)


# ------------------------------------------------------------------ Dense
@pytest.mark.parametrize("batch, fraction", [
    pytest.param(6, 0.5, marks=pytest.mark.slow), (7, 0.5), pytest.param(5, 0.1, marks=pytest.mark.slow)],
    ids=["m3of6", "m4of7", "m1of5"])
def test_dense_factors_from_first_rows_match_reference(batch, fraction):
    net, x, y = make_dense_net(0, True, batch)
    layers = dense_layers(net, x, y)
    got = factors_after_one_step(net, x, y, stat_fraction=fraction, stat_stride=3)   # Dense ignores the stride
    for name, (a, dy) in layers.items():
        big_a, big_g = dense_subsampled(a, dy, True, fraction)
        assert ref.rel_err(got[name][0], big_a) < TOL, name
        assert ref.rel_err(got[name][1], big_g) < TOL, name
        full_a, _ = ref.dense_factors(a, dy, True)
        assert ref.rel_err(got[name][0], full_a) > 1e-3, name     # it did subsample


class SequenceNet(nn.Cell):
    """Dense on a (B, L, in) input (flattened to B*L rows by nn.Dense), then a Dense on (B, L*hidden)."""

    def __init__(self, length=3, din=5, hidden=4, dout=3):
        super().__init__()
        self.fc1 = nn.Dense(din, hidden)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc2 = nn.Dense(length * hidden, dout)

    def construct(self, x):
        return self.fc2(self.flatten(self.relu(self.fc1(x))))


def test_dense_on_sequences_subsamples_rows():
    rng = np.random.default_rng(4)
    net = SequenceNet()
    set_weights(net, rng)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    y = rng.integers(0, 3, 4).astype(np.int32)
    rows = x.reshape(12, 5).astype(np.float64)
    h = rows @ w(net.fc1.weight).T + w(net.fc1.bias)
    z = np.maximum(h, 0).reshape(4, 12)
    _, dlogits = ref.softmax_ce(z @ w(net.fc2.weight).T + w(net.fc2.bias), y)
    dh = ((dlogits @ w(net.fc2.weight)).reshape(12, 4)) * (h > 0)
    got = factors_after_one_step(net, x, y, stat_fraction=0.4)
    # fc1 sees 12 rows and keeps ceil(0.4 * 12) = 5 of them; fc2 keeps ceil(0.4 * 4) = 2 examples
    for name, (a, dy) in (("fc1", (rows, dh)), ("fc2", (z, dlogits))):
        big_a, big_g = dense_subsampled(a, dy, True, 0.4)
        assert ref.rel_err(got[name][0], big_a) < TOL, name
        assert ref.rel_err(got[name][1], big_g) < TOL, name


# ------------------------------------------------------------------ Conv2d
# CONV_CASES[0]: 3x3 'same' stride 1 (7x7 out); [1]: 'same' stride 2 (4x4 out, no bias);
# [3]: 'pad' (1, 0, 2, 1) stride 2 (3x4 out); [4]: 'pad' 1, stride (1, 2), dilation (2, 1) (5x4 out)
@pytest.mark.parametrize("case, fraction, stride", [
    (CONV_CASES[0], 1.0, 2), pytest.param(CONV_CASES[0], 0.5, 1, marks=pytest.mark.slow), (CONV_CASES[1], 0.6, 3),
    (CONV_CASES[3], 1.0, 2), (CONV_CASES[3], 0.5, 1), (CONV_CASES[4], 0.5, 2)],
    ids=["same-s1-stride2", "same-s1-half", "same-s2-f06-stride3", "pad-s2-stride2", "pad-s2-half",
         "pad-dil-half-stride2"])
def test_conv_factors_from_subsample_match_reference(case, fraction, stride):
    rng = np.random.default_rng(1)
    net, x, y, geometry = make_conv_net(case, rng)
    patches, dconv = conv_layer(net, x, y, geometry)
    # the reference convolution reproduces MindSpore's layer (padding included)
    got = factors_after_one_step(net, x, y, stat_fraction=fraction, stat_stride=stride)
    big_a, big_g = conv_subsampled(patches, dconv, net.conv.has_bias, fraction, stride)
    assert got["conv"][0].shape == big_a.shape
    assert ref.rel_err(got["conv"][0], big_a) < TOL
    assert ref.rel_err(got["conv"][1], big_g) < TOL
    full_a, _ = ref.conv_factors(patches, dconv, net.conv.has_bias)
    assert ref.rel_err(got["conv"][0], full_a) > 1e-3                 # it did subsample
    if net.conv.has_bias:                                             # the corner stays T
        assert got["conv"][0][-1, -1] == patches.shape[1]


@pytest.mark.slow
def test_conv_stride_as_large_as_the_output_keeps_one_position():
    rng = np.random.default_rng(2)
    net, x, y, geometry = make_conv_net(CONV_CASES[3], rng)      # 3x4 output
    patches, dconv = conv_layer(net, x, y, geometry)
    got = factors_after_one_step(net, x, y, stat_stride=5)
    big_a, big_g = conv_subsampled(patches, dconv, True, 1.0, 5)
    assert ref.rel_err(got["conv"][0], big_a) < TOL
    assert ref.rel_err(got["conv"][1], big_g) < TOL


# ------------------------------------------------------------------ the full statistics when nothing is dropped
def test_defaults_are_the_full_statistics():
    assert ngd.Policy().stat_fraction == 1.0 and ngd.Policy().stat_stride == 1
    net, x, y = make_dense_net(5, True, 6)
    opt = make_kfac(net)
    assert opt.policy.stat_fraction == 1.0 and opt.policy.stat_stride == 1
    for block in opt.blocks:
        assert block.capture.stat_fraction == 1.0 and block.capture.stat_stride == 1


@pytest.mark.parametrize("kind", [pytest.param("dense", marks=pytest.mark.slow), "conv"])
def test_fraction_keeping_every_example_is_bit_identical_to_the_full_batch(kind):
    """ceil(0.8 * 4) = 4 = B (conv), ceil(0.9 * 6) = 6 = B (Dense): the same factors, bit for bit."""
    def run(**kwargs):
        if kind == "dense":
            net, x, y = make_dense_net(6, True, 6)
        else:
            net, x, y, _ = make_conv_net(CONV_CASES[0], np.random.default_rng(6))
        return factors_after_one_step(net, x, y, **kwargs)

    full, same = run(), run(stat_fraction=0.9 if kind == "dense" else 0.8)
    for name in full:
        np.testing.assert_array_equal(same[name][0], full[name][0])
        np.testing.assert_array_equal(same[name][1], full[name][1])


@pytest.mark.parametrize("kind", ["dense", pytest.param("conv", marks=pytest.mark.slow)])
def test_fraction_is_unbiased_over_rotations_of_the_batch(kind):
    """Over the B rotations of a batch every example is among the first m exactly m times, so the
    mean of the subsampled A and G equals the full-batch A and G (learning rate 0: the weights do
    not move; per-example gradients do not depend on the order)."""
    if kind == "dense":
        net, x, y = make_dense_net(7, True, 4)
        layers = {name: ref.dense_factors(a, dy, True) for name, (a, dy) in dense_layers(net, x, y).items()}
    else:
        net, x, y, geometry = make_conv_net(CONV_CASES[3], np.random.default_rng(7))
        layers = {"conv": ref.conv_factors(*conv_layer(net, x, y, geometry), True)}
    opt = make_kfac(net, stat_fraction=0.5)
    train = step(net, opt)
    total = None
    for shift in range(x.shape[0]):
        train(Tensor(np.roll(x, shift, 0)), Tensor(np.roll(y, shift, 0)))
        got = stored_factors(opt)
        total = got if total is None else {k: (total[k][0] + got[k][0], total[k][1] + got[k][1]) for k in got}
    for name, (big_a, big_g) in layers.items():
        assert ref.rel_err(total[name][0] / x.shape[0], big_a) < TOL, name
        assert ref.rel_err(total[name][1] / x.shape[0], big_g) < TOL, name


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(stat_fraction=0), ValueError, r"stat_fraction must be in \(0, 1\], got 0"),
    (dict(stat_fraction=1.5), ValueError, r"stat_fraction must be in \(0, 1\], got 1.5"),
    (dict(stat_fraction=float("nan")), ValueError, r"stat_fraction must be in \(0, 1\]"),
    (dict(stat_fraction="x"), TypeError, r"stat_fraction must be a float in \(0, 1\], got str 'x'"),
    (dict(stat_fraction=True), TypeError, r"stat_fraction must be a float in \(0, 1\]"),
    (dict(stat_stride=0), ValueError, r"stat_stride must be an int >= 1, got 0"),
    (dict(stat_stride=1.5), TypeError, r"stat_stride must be an int >= 1, got float 1.5"),
])
@pytest.mark.parametrize("optimizer", ["KFAC", "SPNGD", "THOR"])
def test_bad_subsample_arguments_raise_before_compilation(optimizer, kwargs, error, match):
    net = DenseNet()
    with pytest.raises(error, match=match):
        getattr(ngd, optimizer)(net, 0.1, damping=1e-3, verbose=False, **kwargs)
    with pytest.raises(error, match=match):
        ngd.Policy(**kwargs).validated()
