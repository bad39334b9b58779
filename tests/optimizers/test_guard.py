"""Adaptive damping and the divergence stop (issue 12), against a NumPy replay of the rule.

The rule (mindspore_ngd/optim/damping.py): with ``s_t = g_t' delta_t`` and ``s'_t = g_{t+1}' delta_t``,
``delta_t = -lr v_{t+1}``, exponential averages ``num <- b num + (1-b) (s_t + s'_t)/2`` and
``den <- b den + (1-b) s_t`` give ``rho = num/den``; the multiplier is raised by
``max(2 (1 - rho), 1.5)`` when ``rho < 1/4``, lowered by 1.2 when ``rho > 3/4`` and clipped to
``[1, max_damping_boost]``.
"""
import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.optim import guard
from nets import DenseNet

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def data(seed, n=16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def _replay_boost(boost, num, den, slope, slope_next, decay=0.9, max_boost=1e4):
    num = decay * num + (1 - decay) * 0.5 * (slope + slope_next)
    den = decay * den + (1 - decay) * slope
    rho = num / den
    factor = max(2 * (1 - rho), guard.BOOST_UP) if rho < 0.25 else (1 / guard.BOOST_DOWN if rho > 0.75 else 1.0)
    return min(max(boost * factor, 1.0), max_boost), num, den


@pytest.mark.parametrize("lr", [0.05, 3.0])
def test_multiplier_follows_the_numpy_replay_of_the_rule(lr):
    """Per step: the gradient the optimizer will see (same batch, same weights) and the momentum buffers
    before the step give ``s'``; the replayed multiplier matches the optimizer's. A small learning rate
    lowers it to the floor 1, a huge one (overshoot) raises it."""
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=lr, damping=1e-2, kl_clip=None, inverse_update_interval=1, verbose=False)
    with_loss = nn.WithLossCell(net, CE)
    step = nn.TrainOneStepCell(with_loss, opt)
    step.set_train()
    grad_fn = ops.GradOperation(get_by_list=True)(with_loss, opt.parameters)
    boost, num, den = 1.0, 0.0, 0.0
    slope, last_lr = 0.0, 0.0
    boosts = []
    for t in range(8):
        x, y = (Tensor(a) for a in data(t))
        grads = [g.asnumpy().astype(np.float64) for g in grad_fn(x, y)]
        moments = [m.asnumpy().astype(np.float64).copy() for m in opt.moments]
        slope_next = -last_lr * sum((g * v).sum() for g, v in zip(grads, moments))
        if t > 0 and slope < 0:
            boost, num, den = _replay_boost(boost, num, den, slope, slope_next)
        step(x, y)
        new_moments = [m.asnumpy().astype(np.float64) for m in opt.moments]
        slope, last_lr = -lr * sum((g * v).sum() for g, v in zip(grads, new_moments)), lr
        got = opt.state_counters()["damping_boost"]
        np.testing.assert_allclose(got, boost, rtol=1e-3, err_msg=f"step {t}")
        np.testing.assert_allclose(float(opt.step_slope.asnumpy()), slope, rtol=1e-3, atol=1e-7)
        boosts.append(got)
    if lr < 1:
        assert boosts[-1] == 1.0
    else:
        assert boosts[-1] > 10.0


def test_adaptive_damping_off_keeps_the_multiplier_at_one():
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=3.0, damping=1e-2, kl_clip=None, adaptive_damping=False, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    for t in range(4):
        step(*(Tensor(a) for a in data(t)))
    assert opt.state_counters()["damping_boost"] == 1.0


def test_non_finite_steps_warn_then_stop_with_the_evidence(caplog):
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.THOR(net, 0.1, 1e-3, divergence_patience=3, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    x, y = data(0)
    step(Tensor(x), Tensor(y))
    bad = x.copy()
    bad[0, 0] = np.nan
    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        step(Tensor(bad), Tensor(y))
        step(Tensor(bad), Tensor(y))
        with pytest.raises(RuntimeError) as info:
            step(Tensor(bad), Tensor(y))
    warnings = [r.getMessage() for r in caplog.records if r.name == "mindspore_ngd" and r.levelno == logging.WARNING]
    assert warnings[:2] == [
        "THOR: step 1 skipped: non-finite gradient (1 in a row, 1 in total); weights and moments unchanged",
        "THOR: step 2 skipped: non-finite gradient (2 in a row, 2 in total); weights and moments unchanged"]
    message = str(info.value)
    assert ngd.is_divergence(info.value)
    assert message.startswith("THOR diverged at step 3: 3 consecutive steps with a non-finite gradient")
    for advice in ("Raise the damping", "kl_clip", "lower the learning rate"):
        assert advice in message
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    assert not ngd.is_divergence(RuntimeError("something else"))


def test_a_finite_step_resets_the_run():
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, divergence_patience=2, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    x, y = data(0)
    bad = x.copy()
    bad[0, 0] = np.inf
    for batch in (x, bad, x, bad, x):                 # never two non-finite steps in a row
        step(Tensor(batch), Tensor(y))
    counters = opt.state_counters()
    assert counters["skipped_steps"] == 2 and int(opt.nonfinite_run.asnumpy()) == 0


@pytest.mark.parametrize("kwargs, words", [
    (dict(divergence_patience=0), ["divergence_patience", ">= 1"]),
    (dict(adaptive_damping="yes"), ["adaptive_damping", "bool"]),
])
def test_bad_guard_arguments_are_named(kwargs, words):
    with pytest.raises((TypeError, ValueError)) as info:
        ngd.KFAC(DenseNet(), learning_rate=0.1, verbose=False, **kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("name", ["KFAC", "SPNGD", "THOR"])
def test_the_compile_cache_is_refused_by_name_before_compiling(name, monkeypatch):
    """MindSpore 2.10 fails the first call of a step with host calls when its compile cache is on."""
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    with pytest.raises(RuntimeError, match=r"MS_COMPILER_CACHE_ENABLE=1.*PyExecute"):
        getattr(ngd, name)(DenseNet(), learning_rate=0.1, damping=1e-3, verbose=False)
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "0")
    ms.set_context(enable_compile_cache=True)
    try:
        with pytest.raises(RuntimeError, match=r"enable_compile_cache=True"):
            getattr(ngd, name)(DenseNet(), learning_rate=0.1, damping=1e-3, verbose=False)
    finally:
        ms.set_context(enable_compile_cache=False)
    getattr(ngd, name)(DenseNet(), learning_rate=0.1, damping=1e-3, verbose=False)     # off again: builds
