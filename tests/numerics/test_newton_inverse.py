"""The matmul-only inverse (``inverse_method="newton"``, curvature/newton.py) against float64 NumPy.

Factors come from a ResNet-style convolution at test time (reference/realistic_factors.py): A is the
im2col covariance of post-BatchNorm/ReLU activations, G that of the output gradients, damped with the
project's pi split and the 1e-6 trace jitter exactly as KroneckerBlock.refreshed damps them.

Accuracy is the relative error in the Frobenius norm, ``||X - X_ref||_F / ||X_ref||_F``, with
``X_ref`` the float64 ``numpy.linalg.inv`` of the same damped matrix; the bound is 1e-4 throughout.
Measured with a NumPy float32 replica of the same iteration (12 steps): at most 2.2e-6 for A of size
4608 at damping 1e-4, where
float32 Cholesky gives 4.2e-7.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.curvature import inverse as inv_ops
from mindspore_ngd.curvature import newton
from nets import DenseNet
from reference.numpy_kfac import damping_shifts
from reference.realistic_factors import conv_layer_factors

JITTER = 1e-6
RTOL = 1e-4
CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def frobenius_rel(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


def reference_inverse(m, shift):
    return np.linalg.inv(m + (shift + JITTER * np.trace(m)) * np.eye(m.shape[-1]))


class _Refresh(nn.Cell):
    """sanitize -> pi split -> damped_inverse for A and G, as KroneckerBlock.refreshed."""

    def __init__(self, method="newton"):
        super().__init__()
        self.method = method

    def construct(self, a, g, damping):
        a_safe, a_valid = inv_ops.sanitize(a)
        g_safe, g_valid = inv_ops.sanitize(g)
        a_shift, g_shift = inv_ops.split_damping(a_safe, g_safe, damping, "pi")
        a_inv, a_ok = inv_ops.damped_inverse(a_safe, a_shift, self.method, inv_ops.trace_jitter(a_safe, JITTER))
        g_inv, g_ok = inv_ops.damped_inverse(g_safe, g_shift, self.method, inv_ops.trace_jitter(g_safe, JITTER))
        return a_inv, g_inv, ops.logical_and(ops.logical_and(a_valid, g_valid), ops.logical_and(a_ok, g_ok))


class _Newton(nn.Cell):
    """newton_inverse of one matrix or stack, with an optional warm start."""

    def __init__(self, steps=None, warm=True):
        super().__init__()
        self.steps, self.warm = steps, warm

    def construct(self, m, total, warm, trust):
        sym = (m + m.swapaxes(-1, -2)) * 0.5
        return newton.newton_inverse(sym, total, warm if self.warm else None, trust, self.steps)


class _Damped(nn.Cell):
    """damped_inverse with method "newton" of a matrix or a stack, without a warm start."""

    def construct(self, blocks, shift, jitter_shift):
        return inv_ops.damped_inverse(blocks, shift, "newton", jitter_shift)


def _check_refresh(channels, dampings):
    a, g = conv_layer_factors(channels)
    cell = _Refresh()
    for damping in dampings:
        a_inv, g_inv, ok = cell(Tensor(a.astype(np.float32)), Tensor(g.astype(np.float32)),
                                Tensor(np.float32(damping)))
        shift_a, shift_g = damping_shifts(a, g, damping, "pi")
        assert bool(ok.asnumpy()), (channels, damping)
        assert frobenius_rel(a_inv.asnumpy(), reference_inverse(a, shift_a)) < RTOL, (channels, damping, "A")
        assert frobenius_rel(g_inv.asnumpy(), reference_inverse(g, shift_g)) < RTOL, (channels, damping, "G")


@pytest.mark.parametrize("channels", [8, 32])
def test_newton_matches_numpy_on_conv_factors(channels):
    """A of size 72 / 288 and G of size 8 / 32, damping 1e-4 to 1e-1 (one compiled graph per size)."""
    _check_refresh(channels, [1e-4, 1e-3, 1e-2, 1e-1])


@pytest.mark.slow
def test_newton_matches_numpy_on_512_channel_conv_factors():
    """A of size 4608 (512 channels x 3 x 3) and G of size 512: the largest ResNet-50 factor."""
    _check_refresh(512, [1e-4, 1e-2, 1e-1])


def test_newton_on_a_stack_of_blocks_matches_numpy_block_by_block():
    """THOR's (nb, s, s) stack goes through the same code as one matrix."""
    a, _ = conv_layer_factors(32)
    blocks = np.stack([a[i:i + 72, i:i + 72] for i in range(0, 288, 72)])     # (4, 72, 72)
    for damping in (1e-3, 1e-1):
        shift = np.sqrt(damping) * 10.0
        jitter = JITTER * np.trace(a)
        inv, ok = _Damped()(Tensor(blocks.astype(np.float32)), Tensor(np.float32(shift)), Tensor(np.float32(jitter)))
        assert bool(ok.asnumpy())
        expected = np.stack([np.linalg.inv(b + (shift + jitter) * np.eye(72)) for b in blocks])
        for got, want in zip(inv.asnumpy(), expected):
            assert frobenius_rel(got, want) < RTOL


def _damped(m, damping):
    shift = np.sqrt(damping) * np.sqrt(np.trace(m) / m.shape[0]) + JITTER * np.trace(m)
    return m, np.float32(shift)


def test_warm_start_is_used_only_when_trusted_and_convergent():
    """The previous inverse starts the iteration when the factor moved little: 0.1% of a new batch's
    statistics folded in (residual ||I - M W||_F = 0.38), and then 4 steps suffice where the cold
    start needs about 8. Untrusted, NaN or far-off previous inverses (5% of a new batch: residual 19;
    the initial identity) are not used, and the cold start with the full count is still exact."""
    old, _ = conv_layer_factors(32, batch=64)
    other, _ = conv_layer_factors(32, batch=96)
    _, total_old = _damped(old, 1e-2)
    previous = np.linalg.inv(old + total_old * np.eye(288)).astype(np.float32)
    eye = np.eye(288, dtype=np.float32)
    nan = previous.copy()
    nan[3, 5] = np.nan
    short, full = _Newton(steps=4), _Newton()
    for weight, cases in ((1e-3, ((previous, True, True),)),
                          (5e-2, ((previous, True, False), (eye, True, False), (nan, True, False)))):
        m, total = _damped((1 - weight) * old + weight * other, 1e-2)
        expected = reference_inverse(m, total - JITTER * np.trace(m))
        args = (Tensor(m.astype(np.float32)), Tensor(total))
        for warm, trusted, usable in cases:
            inv, converged, used = short(*args, Tensor(warm), Tensor(trusted))
            assert bool(used.asnumpy().all()) == usable and bool(converged.asnumpy()) == usable
            if usable:
                assert frobenius_rel(inv.asnumpy(), expected) < RTOL
                _, converged, used = short(*args, Tensor(warm), Tensor(False))    # not trusted: cold
                assert not bool(used.asnumpy().any()) and not bool(converged.asnumpy())
            else:
                inv, converged, used = full(*args, Tensor(warm), Tensor(trusted))
                assert not bool(used.asnumpy().any()) and bool(converged.asnumpy())
                assert frobenius_rel(inv.asnumpy(), expected) < RTOL


def test_no_convergence_and_nan_input_are_flagged():
    a, _ = conv_layer_factors(32)
    m, total = _damped(a, 1e-4)
    eye = Tensor(np.eye(288, dtype=np.float32))
    _, converged, _ = _Newton(steps=2, warm=False)(Tensor(m.astype(np.float32)), Tensor(total), eye, Tensor(False))
    assert not bool(converged.asnumpy())
    bad = m.astype(np.float32)
    bad[7, 7] = np.nan
    for blocks in (bad, np.stack([m[:72, :72], bad[:72, :72]]).astype(np.float32)):
        inv, ok = _Damped()(Tensor(blocks), Tensor(total), Tensor(np.float32(0.0)))
        assert not bool(ok.asnumpy())
    # indefinite beyond the damping: passes the cheap checks but the iteration diverges
    x = np.array([[1, 0.9, 0.9], [0.9, 1, -0.9], [0.9, -0.9, 1]], np.float32)
    _, ok = _Damped()(Tensor(x), Tensor(np.float32(1e-3)), Tensor(np.float32(0.0)))
    assert not bool(ok.asnumpy())


def test_optimizer_keeps_the_previous_inverse_when_newton_does_not_converge(monkeypatch):
    """The fallback is rejection: the layer keeps its previous (here the initial identity) inverses
    and the refresh counts as an inverse fault; training goes on with finite weights."""
    monkeypatch.setattr(newton, "NEWTON_STEPS", 1)
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, damping=1e-4, inverse_update_interval=1, inverse_method="newton",
                   verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    for _ in range(2):
        step(Tensor(rng.standard_normal((8, 5)).astype(np.float32)), Tensor(rng.integers(0, 3, 8).astype(np.int32)))
    assert opt.inverse_method == "newton"
    assert opt.state_counters()["inverse_faults"] == 2 * len(opt.blocks)     # every layer, both refreshes
    for block in opt.blocks:
        np.testing.assert_array_equal(block.a_inverse.asnumpy(), np.eye(block.a_inverse.shape[0]))
    assert not opt.counters.has_inverse.asnumpy().any()
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
