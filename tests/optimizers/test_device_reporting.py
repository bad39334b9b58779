"""Training works or stops with a reason without host calls (issue 34): ``host_calls=False``.

Ascend's GE and GPU run the step's graph whole on the device, so there the optimizers are built with
``host_calls=False`` ("auto"): the step records a stop in ``{prefix}.status`` and freezes the weights,
prints its reports with ``ops.Print``, and ``opt.check_status()`` / :class:`mindspore_ngd.TrainingGuard`
raise the error on the host. These tests run that graph on CPU: the same numerics as the host-call
graph while training is healthy, the same error message as the host-call graph's ``raise``, and
weights that no step after the stop changes."""
import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from mindspore_ngd.optim import guard
from benchmarks.data import array_dataset
from nets import DenseNet

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def data(seed, n=16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def _make(kind, host_calls, **kwargs):
    ms.set_seed(0)
    net = DenseNet()
    if kind == "kfac":
        opt = ngd.KFAC(net, 0.1, damping=1e-2, inverse_update_interval=2, verbose=False, host_calls=host_calls,
                       **kwargs)
    else:
        opt = ngd.THOR(net, 0.1, 1e-2, frequency=2, split_dim=2, trace_threshold=0.1, verbose=False,
                       host_calls=host_calls, **kwargs)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    return net, opt, step


def _weights(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def _state(opt):
    return {p.name: p.asnumpy().copy() for p in opt.moments}


def test_host_calls_argument():
    assert guard.resolve_host_calls("auto", "CPU") is True
    assert guard.resolve_host_calls("auto", "Ascend") is False and guard.resolve_host_calls("auto", "GPU") is False
    assert guard.resolve_host_calls(False, "CPU") is False
    _, opt, _ = _make("kfac", "auto")
    assert opt.host_calls is True and opt.run_status is None          # CPU: the host-call graph, unchanged
    with pytest.raises(TypeError, match='host_calls must be "auto", True or False'):
        ngd.KFAC(DenseNet(), 0.1, host_calls="yes", verbose=False)


def test_compile_cache_is_not_refused_without_host_calls(monkeypatch):
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    with pytest.raises(RuntimeError, match="MS_COMPILER_CACHE_ENABLE=1"):
        ngd.KFAC(DenseNet(), 0.1, host_calls=True, verbose=False)
    opt = ngd.KFAC(DenseNet(), 0.1, host_calls=False, verbose=False)                    # nothing to refuse
    assert opt.run_status.name == "kfac.status" and opt.stop_evidence.name == "kfac.divergence.evidence"


@pytest.mark.parametrize("kind", ["kfac", pytest.param("thor", marks=pytest.mark.slow)])
def test_healthy_training_is_bit_identical_to_the_host_call_graph(kind):
    runs = []
    for host_calls in (True, False):
        net, opt, step = _make(kind, host_calls)
        for t in range(5):
            step(*(Tensor(a) for a in data(t)))
        runs.append((_weights(net), _state(opt), opt.state_counters()))
    (w1, m1, c1), (w2, m2, c2) = runs
    for name in w1:
        np.testing.assert_array_equal(w1[name], w2[name], err_msg=name)
    for name in m1:
        np.testing.assert_array_equal(m1[name], m2[name], err_msg=name)
    assert c1 == c2


def _host_error(kind, batches, **kwargs):
    """The RuntimeError the host-call graph raises on ``batches``."""
    _, _, step = _make(kind, True, **kwargs)
    with pytest.raises(RuntimeError) as info:
        for x, y in batches:
            step(Tensor(x), Tensor(y))
    return str(info.value)


def test_check_status_with_host_calls_reports_and_never_raises():
    _, opt, step = _make("kfac", True, divergence_patience=2)
    bad = np.full_like(data(0)[0], np.nan)
    with pytest.raises(RuntimeError):
        for _ in range(2):
            step(Tensor(bad), Tensor(data(0)[1]))
    status = opt.check_status()
    assert status["stopped"] and status["reason"] == "non-finite gradients" and status["skipped_steps"] >= 1


def test_non_finite_divergence_freezes_the_weights_and_check_status_raises_the_host_message(capfd):
    good = [data(t) for t in range(2)]
    bad = [(np.full_like(data(9)[0], np.nan), data(9)[1])] * 3
    net, opt, step = _make("kfac", False, divergence_patience=2)
    for x, y in good:
        step(Tensor(x), Tensor(y))
    before, moments = _weights(net), _state(opt)
    assert opt.check_status()["stopped"] is False
    for x, y in bad + good:                   # the stop at the 2nd bad step; later good steps are frozen too
        step(Tensor(x), Tensor(y))
    for name, value in _weights(net).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    for name, value in _state(opt).items():
        np.testing.assert_array_equal(value, moments[name], err_msg=name)
    status = opt.run_status.asnumpy().tolist()
    assert status == [1, 3, 2, 2, 0]          # non-finite gradients, step 3, 2 in a row, 2 skipped, no finite run
    printed = capfd.readouterr().out
    assert "KFAC stopped at step" in printed and "skipped: non-finite gradient" in printed

    with pytest.raises(RuntimeError) as info:
        opt.check_status()
    assert ngd.is_divergence(info.value)
    assert str(info.value) == _host_error("kfac", good + bad, divergence_patience=2)
    assert str(info.value).startswith("KFAC diverged at step 3: 2 consecutive steps with a non-finite gradient")
    with pytest.raises(RuntimeError):         # the stop is state: it stays until cleared
        opt.check_status()
    opt.clear_status()
    assert opt.check_status()["stopped"] is False
    x, y = good[0]
    step(Tensor(x), Tensor(y))
    assert any(not np.array_equal(v, before[k]) for k, v in _weights(net).items())        # training goes on


def test_finite_divergence_is_recorded_with_its_evidence():
    """A gradient norm 1e3x the first step's (inputs scaled by 1e3) with divergence_growth=10: two such
    steps stop the run (reason code 2); the message is the host-call graph's, evidence included."""
    x0, y0 = data(0)
    batches = [(x0, y0)] + [(1e3 * data(t)[0], data(t)[1]) for t in range(1, 4)]
    net, opt, step = _make("thor", False, divergence_patience=2, divergence_growth=10.0)
    for x, y in batches:
        step(Tensor(x), Tensor(y))
    code, at, run, _, finite_run = opt.run_status.asnumpy().tolist()
    assert (code, at, run, finite_run) == (2, 2, 0, 2)
    norm, reference, growth = opt.stop_evidence.asnumpy()[:3]
    assert growth == 10.0 and norm > 10 * reference > 0
    with pytest.raises(RuntimeError) as info:
        opt.check_status()
    message = str(info.value)
    assert message == _host_error("thor", batches, divergence_patience=2, divergence_growth=10.0)
    assert "2 consecutive finite steps that explode" in message and "divergence_growth=10" in message
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


@pytest.mark.parametrize("sink", [False, True], ids=["steps", "sink"])
def test_training_guard_stops_model_train_with_the_reason(sink):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((48, 5)).astype(np.float32)
    x[16:] = np.nan                                        # from the 3rd batch of 8 on: non-finite gradients
    y = rng.integers(0, 3, 48).astype(np.int32)
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.KFAC(net, 0.1, damping=1e-2, verbose=False, host_calls=False, divergence_patience=2)
    guard_cb = ngd.TrainingGuard(opt)
    with pytest.raises(RuntimeError) as info:
        Model(net, CE, opt).train(3, array_dataset(x, y, 8, shuffle=False), callbacks=[guard_cb],
                                  dataset_sink_mode=sink)
    assert ngd.is_divergence(info.value) and guard_cb.error is info.value
    assert "KFAC diverged at step 3: 2 consecutive steps with a non-finite gradient" in str(info.value)
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_training_guard_arguments():
    with pytest.raises(TypeError, match="TrainingGuard needs an optimizer of mindspore_ngd"):
        ngd.TrainingGuard(nn.Momentum(DenseNet().trainable_params(), 0.1, 0.9))
    with pytest.raises(ValueError, match="interval"):
        ngd.TrainingGuard(ngd.KFAC(DenseNet(), 0.1, verbose=False), interval=0)


@pytest.mark.parametrize("strict", [False, True], ids=["demote", "strict"])
def test_demoted_layers_are_reported_by_check_status(strict, caplog):
    """A layer that captures nothing (``proj``, read like MultiheadAttention's out_proj): demoted with one
    WARNING from check_status; with strict=True the next step stops (reason code 3, weights frozen) and
    check_status raises the host-call graph's error naming the layer."""
    from test_invisible_layers import Peeking, peeking_batch
    x, y = (Tensor(a) for a in peeking_batch())
    ms.set_seed(1)
    net = Peeking()
    opt = ngd.KFAC(net, learning_rate=0.1, strict=strict, verbose=False, host_calls=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    step(x, y)                                 # demotes proj (it already gets the plain update)
    assert opt.demoted_layers() == ["proj"]
    before = _weights(net)
    step(x, y)
    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        if strict:
            with pytest.raises(RuntimeError, match=r"KFAC: 1 preconditioned layer\(s\) captured no statistics on "
                                                   r"their first capture step: proj\..*strict=True"):
                opt.check_status()
        else:
            assert opt.check_status()["demoted_layers"] == ["proj"]
            opt.check_status()                 # reported once
    if strict:
        assert opt.run_status.asnumpy().tolist()[:2] == [3, 1]
        for name, value in _weights(net).items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)
        assert not [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "mindspore_ngd"]
    else:
        warned = [r.getMessage() for r in caplog.records if r.name == "mindspore_ngd" and r.levelno == logging.WARNING]
        assert len(warned) == 1 and "proj" in warned[0] and "demoted to the plain momentum update" in warned[0]
        assert any(not np.array_equal(v, before[k]) for k, v in _weights(net).items())
