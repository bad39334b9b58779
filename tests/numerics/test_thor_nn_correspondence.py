"""ngd.THOR's update is ``mindspore.nn.thor``'s, written from nn.thor's own terms (MindSpore 2.10,
``nn/optim/thor.py`` ThorAscend and ``nn/layer/thor_layer.py``) in float64 NumPy:

* Dense: ``A = x'x / B``, ``G = dout'dout / B * B^2 / S^2`` (dout: gradient of the S-scaled mean loss),
  ``A + sqrt(l) I``, ``G + sqrt(l) I``, update ``G^-1 dW A^-1``;
* Conv2d: ``A = P'P / (B T)`` over the B*T im2col rows, ``G = D'D / (B T) * B^2 / S^2`` over the B*T
  output positions, both damped by ``sqrt(l B / (B T))``, update ``G^-1 dW A^-1 * B / (B T)``.

This package keeps A summed over positions (docs/algorithms.md); THOR's default damping split
"positions" must give the same step. (nn.thor's Dense leaves the bias out of A and gives it the plain
gradient; this package preconditions it with the weight, so the checks use layers without bias.)
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import CONV_CASES, SeedNet, conv_net_reference, make_conv_net, set_weights
from reference import numpy_kfac as ref

LAMBDA = 0.03
SCALE = 128.0


def _one_thor_step(net, x, y, damping_split="positions"):
    before = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
    opt = ngd.THOR(net, 1.0, LAMBDA, 0.0, 0.0, SCALE, x.shape[0], frequency=4, split_dim=None, jitter=0.0,
                   adaptive_damping=False, kl_clip=None, damping_split=damping_split, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, _loss()), opt, sens=SCALE)
    step.set_train()
    step(Tensor(x), Tensor(y))
    return {p.name: before[p.name] - p.asnumpy().astype(np.float64) for p in net.trainable_params()}


def _loss():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _nn_thor_update(a_ms, g_scaled, dw, batch, normalizer):
    """nn.thor's preconditioned gradient from its own statistics: ``normalizer`` is B for a Dense and
    B*T (its a_normalizer = g_normalizer) for a Conv2d."""
    damping = np.sqrt(LAMBDA * batch / normalizer)
    g_ms = g_scaled / SCALE ** 2 * batch ** 2
    a_inv = np.linalg.inv(a_ms + damping * np.eye(len(a_ms)))
    g_inv = np.linalg.inv(g_ms + damping * np.eye(len(g_ms)))
    return g_inv @ dw @ a_inv * (batch / normalizer)


@pytest.mark.parametrize("case", [c for c in CONV_CASES if not c[-1]], ids=str)
def test_conv_step_equals_nn_thor(case):
    rng = np.random.default_rng(3)
    net, x, y, geometry = make_conv_net(case, rng, hw=8)
    patches, conv, dconv = conv_net_reference(net, x, y, geometry)
    batch, positions, _ = patches.shape
    rows = patches.reshape(batch * positions, -1)
    dout = (SCALE * dconv).transpose(0, 2, 3, 1).reshape(batch * positions, -1)   # NHWC rows, as ThorAscend
    a_ms = rows.T @ rows / (batch * positions)
    g_scaled = dout.T @ dout / (batch * positions)
    dw = dout.T @ rows / SCALE                       # the unscaled gradient of the mean loss
    expected = _nn_thor_update(a_ms, g_scaled, dw, batch, batch * positions)
    got = _one_thor_step(net, x, y)["conv.weight"].reshape(expected.shape)
    assert ref.rel_err(got, expected) < 1e-4
    # the former default ("sqrt": sqrt(l) on both factors, A summed over positions) is a different step
    sqrt_split = ref.preconditioned(positions * a_ms, g_scaled / SCALE ** 2 * batch ** 2, dw, LAMBDA, "sqrt")
    assert ref.rel_err(sqrt_split, expected) > 0.1


def test_dense_step_equals_nn_thor():
    rng = np.random.default_rng(4)
    net = SeedNet()
    set_weights(net, rng)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    y = rng.integers(0, 2, 6).astype(np.int32)
    w1, w2 = (p.asnumpy().astype(np.float64) for p in net.trainable_params())
    h_pre = x.astype(np.float64) @ w1.T
    h = np.tanh(h_pre)
    _, dlogits = ref.softmax_ce(h @ w2.T, y)
    dout2 = SCALE * dlogits
    dout1 = (dout2 @ w2) * (1 - h ** 2)
    batch = x.shape[0]
    steps = _one_thor_step(net, x, y)
    for name, inputs, dout in (("fc1.weight", x.astype(np.float64), dout1), ("fc2.weight", h, dout2)):
        expected = _nn_thor_update(inputs.T @ inputs / batch, dout.T @ dout / batch, dout.T @ inputs / SCALE,
                                   batch, batch)
        assert ref.rel_err(steps[name], expected) < 1e-3, name
