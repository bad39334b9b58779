"""Dense layers on sequences, (B, R, features): K-FAC-expand (every position an example, the default)
and K-FAC-reduce (``sequence_approx="reduce"``, one example per sequence; Eschenhagen et al. 2023),
each against a float64 NumPy reference, and the identity that makes reduce exact for one sequence
whose input does not change along it."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.curvature import factors
from training import train_step

B, R, F, H, C = 3, 4, 5, 3, 4
TOL = 2e-5


class SequenceNet(nn.Cell):
    """nn.Dense then nn.Linear, each applied to every position of a (B, R, F) input; the logits of
    every position flattened to rows, for a loss averaged over all B R positions."""

    def __init__(self, rng):
        super().__init__()
        self.fc1 = nn.Dense(F, H)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(H, C)
        for cell in (self.fc1, self.fc2):
            for p in (cell.weight, cell.bias):
                p.set_data(Tensor((0.7 * rng.standard_normal(p.shape)).astype(np.float32)))

    def construct(self, x):
        logits = self.fc2(self.act(self.fc1(x)))
        return logits.reshape(-1, C)


def _bias_column(a):
    return np.concatenate([a, np.ones(a.shape[:-1] + (1,))], axis=-1)


def reference_factors(net, x, y, approx):
    """Every layer's (A, G) in float64, for the mean softmax cross-entropy over the B R positions."""
    w1, b1 = (p.asnumpy().astype(np.float64) for p in (net.fc1.weight, net.fc1.bias))
    w2, b2 = (p.asnumpy().astype(np.float64) for p in (net.fc2.weight, net.fc2.bias))
    x = x.astype(np.float64)
    z1 = x @ w1.T + b1
    h = np.maximum(z1, 0.0)
    z2 = h @ w2.T + b2
    p = np.exp(z2 - z2.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rows = B * R
    dz2 = (p - np.eye(C)[y.reshape(B, R)]) / rows
    dz1 = (dz2 @ w2) * (z1 > 0)
    out = []
    for a, dz in ((x, dz1), (h, dz2)):
        if approx == "expand":
            abar = _bias_column(a.reshape(rows, -1))
            dz = dz.reshape(rows, -1)
            out.append((abar.T @ abar / rows, rows * dz.T @ dz))
        else:
            abar = _bias_column(a.mean(axis=1))
            sums = dz.sum(axis=1)
            out.append((abar.T @ abar / B, rows * sums.T @ sums))
    return out


def _data(seed):
    rng = np.random.default_rng(seed)
    return rng, rng.standard_normal((B, R, F)).astype(np.float32), rng.integers(0, C, B * R).astype(np.int32)


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_factors_of_dense_layers_on_sequences_match_the_float64_reference(approx):
    rng, x, y = _data(0)
    net = SequenceNet(rng)
    expected = reference_factors(net, x, y, approx)
    kwargs = {} if approx == "expand" else {"sequence_approx": "reduce"}
    opt = ngd.KFAC(net, 0.05, damping=1e-2, verbose=False, **kwargs)
    train_step(net, opt)(Tensor(x), Tensor(y))
    for block, (a, g) in zip(opt.blocks, expected):
        assert _rel(block.a_factor.asnumpy(), a) < TOL, (approx, block.spec.name)
        assert _rel(block.g_factor.asnumpy(), g) < TOL, (approx, block.spec.name)
    if approx == "reduce":     # not the expand factors under another name
        expand = reference_factors(net, x, y, "expand")
        assert _rel(expected[0][1], expand[0][1]) > 0.1


def test_reduce_is_exact_for_one_sequence_whose_input_does_not_change_along_it():
    """B = 1, the same input row at every position: the per-example gradient is (sum_r dy_r) a^T, so
    A (x) G = R vec(M) vec(M)^T for M = [dW | db], column-major vec (module docstring of
    mindspore_ngd.curvature.factors). K-FAC-expand is not exact here."""
    rng = np.random.default_rng(3)
    x = np.repeat(rng.standard_normal((1, 1, F)), R, axis=1).astype(np.float32)
    y = rng.integers(0, C, R).astype(np.int32)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    products = {}
    for approx in ("expand", "reduce"):
        layer = nn.Dense(F, C)
        layer.weight.set_data(Tensor((0.7 * np.random.default_rng(4).standard_normal((C, F))).astype(np.float32)))
        net = _Rows(layer)
        grad_fn = ms.grad(nn.WithLossCell(net, loss), grad_position=None, weights=net.trainable_params())
        d_w, d_b = (g.asnumpy().astype(np.float64) for g in grad_fn(Tensor(x), Tensor(y)))
        m = np.concatenate([d_w, d_b[:, None]], axis=1)
        fisher = R * np.outer(m.flatten("F"), m.flatten("F"))
        opt = ngd.KFAC(net, 0.0, damping=1e-2, verbose=False, sequence_approx=approx)
        train_step(net, opt, loss)(Tensor(x), Tensor(y))
        a, g = (f.asnumpy().astype(np.float64) for f in (opt.blocks[0].a_factor, opt.blocks[0].g_factor))
        products[approx] = _rel(np.kron(a, g), fisher)
    assert products["reduce"] < TOL
    assert products["expand"] > 0.1


class _Rows(nn.Cell):
    """One Dense layer on a (1, R, F) sequence, its logits as R rows."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def construct(self, x):
        return self.layer(x).reshape(-1, C)


def test_reduce_traces_and_probe_sum_are_those_of_the_reduce_factors():
    """THOR's trace probes and the loss-scale probe under reduce: trace(A) and trace(G) without forming
    them, and the output-gradient sum over batch and positions (the bias gradient)."""
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((B, R, F)).astype(np.float32))
    dy = Tensor(rng.standard_normal((B, R, C)).astype(np.float32))
    a = factors.dense_reduce_input_factor(x, True).asnumpy()
    g = factors.dense_reduce_output_factor(dy, 0.25).asnumpy()
    assert abs(float(factors.dense_reduce_input_trace(x, True).asnumpy()) - np.trace(a)) < 1e-4 * np.trace(a)
    assert abs(float(factors.dense_reduce_output_trace(dy, 0.25).asnumpy()) - np.trace(g)) < 1e-4 * np.trace(g)
    np.testing.assert_allclose(factors.output_sum(dy, False).asnumpy(), dy.asnumpy().sum(axis=(0, 1)), rtol=1e-5)
    # a 2-D input is the same either way (R = 1)
    rows = Tensor(rng.standard_normal((B, F)).astype(np.float32))
    np.testing.assert_array_equal(factors.dense_reduce_input_factor(rows, True).asnumpy(),
                                  factors.dense_input_factor(rows, True).asnumpy())
    grads = Tensor(rng.standard_normal((B, C)).astype(np.float32))
    np.testing.assert_allclose(factors.dense_reduce_output_factor(grads, 0.5).asnumpy(),
                               factors.dense_output_factor(grads, 0.5).asnumpy(), rtol=1e-6)


def test_sequence_approx_is_checked_before_compilation():
    rng, _, _ = _data(0)
    with pytest.raises(ValueError, match="sequence_approx must be one of \\['expand', 'reduce'\\], got 'sum'"):
        ngd.KFAC(SequenceNet(rng), 0.1, verbose=False, sequence_approx="sum")


@pytest.mark.parametrize("make", [
    lambda net: ngd.KFAC(net, 0.05, damping=1e-2, verbose=False, sequence_approx="reduce"),
    lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, verbose=False, sequence_approx="reduce"),
    lambda net: ngd.THOR(net, learning_rate=0.05, damping=1e-2, momentum=0.9, frequency=2, trace_threshold=0.05, verbose=False,
                         sequence_approx="reduce"),
], ids=["kfac", "spngd", "thor-traces"])
def test_every_optimizer_trains_dense_layers_on_sequences_with_reduce(make):
    rng, x, y = _data(1)
    net = SequenceNet(rng)
    opt = make(net)
    step = train_step(net, opt)
    losses = [float(step(Tensor(x), Tensor(y)).asnumpy()) for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert not opt.counters.demoted.asnumpy().any()
    assert int(opt.inverse_refreshes.asnumpy()) >= 1 and int(opt.factor_faults.asnumpy()) == 0
