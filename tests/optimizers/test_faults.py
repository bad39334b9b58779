"""Numerical faults never corrupt the weights: a NaN batch is skipped and counted (and reported as a
WARNING), a NaN or indefinite factor keeps the previous inverse.

Elsewhere: bad arguments in tests/unit/test_arguments.py; the inverse paths' own fault flags in
tests/numerics/test_inverses.py."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import DenseNet

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def data(seed, n=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def test_nan_batch_leaves_weights_finite_and_is_counted():
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, inverse_update_interval=1, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    x, y = data(0)
    step(Tensor(x), Tensor(y))
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    inverses = [a.asnumpy().copy() for a in [b.a_inverse for b in opt.blocks]]
    bad = x.copy()
    bad[3, 2] = np.nan
    step(Tensor(bad), Tensor(y))
    for p in net.trainable_params():                       # the faulty step changed nothing
        np.testing.assert_array_equal(p.asnumpy(), before[p.name])
    for a, old in zip([b.a_inverse for b in opt.blocks], inverses):
        assert np.isfinite(a.asnumpy()).all()
    counters = opt.state_counters()
    assert counters["skipped_steps"] == 1
    # a step with a non-finite gradient folds nothing: it is one skipped step, not a curvature fault
    # (a loss-scale overflow looks the same, issue 11)
    assert counters["factor_faults"] == 0
    assert all(np.isfinite(f).all() for pair in opt.kronecker_factors().values() for f in pair)
    step(Tensor(x), Tensor(y))                               # training goes on
    assert any(not np.array_equal(p.asnumpy(), before[p.name]) for p in net.trainable_params())
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


# the Newton-Schulz paths compile longest: the default run keeps newton_split (Ascend's) with a NaN factor
_SLOW_FAULTS = {("newton", "nan"), ("newton", "indefinite"), ("newton_split", "indefinite")}


@pytest.mark.parametrize("corruption, method", [
    pytest.param(c, m, marks=pytest.mark.slow) if (m, c) in _SLOW_FAULTS else (c, m)
    for c in ("nan", "indefinite") for m in ("cholesky", "lu", "eigh", "newton", "newton_split")])
def test_corrupt_factor_keeps_previous_inverse(method, corruption):
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, factor_update_interval=100, inverse_update_interval=2,
                   inverse_method=method, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    x, y = Tensor(data(0)[0]), Tensor(data(0)[1])
    step(x, y)                                                # step 0: factors + inverses
    good = opt.blocks[0].a_inverse.asnumpy().copy()
    dim = opt.blocks[0].a_factor.shape[0]
    if corruption == "nan":
        bad = opt.blocks[0].a_factor.asnumpy().copy()
        bad[0, 0] = np.nan
    else:                                                     # symmetric, positive diagonal, indefinite
        bad = np.eye(dim, dtype=np.float32)
        bad[0, 1] = bad[1, 0] = 2.0
    opt.blocks[0].a_factor.set_data(Tensor(bad))
    step(x, y)
    step(x, y)                                                # step 2: refresh with the corrupt factor
    assert opt.state_counters()["inverse_faults"] == 1
    np.testing.assert_array_equal(opt.blocks[0].a_inverse.asnumpy(), good)
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
