"""The loss-side divergence stop (mindspore_ngd.DivergenceMonitor, issue 32): a loss that explodes and
stays finite stops the run with the optimizers' kind of error; healthy losses never do."""
import os
from math import inf
from types import SimpleNamespace

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset
from benchmarks.models import ConvBNNet
from training import template_images

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")


def _feed(monitor, losses):
    for value in losses:
        monitor.observe(value)


def test_patience_exploded_steps_stop_with_the_evidence():
    monitor = ngd.DivergenceMonitor(growth=2.0, patience=3, name="THOR")
    _feed(monitor, [2.3, 2.0, 5.0, 6.0])
    assert monitor.run == 2
    with pytest.raises(RuntimeError) as info:
        monitor.observe(Tensor(np.float32(7.0)))
    message = str(info.value)
    assert ngd.is_divergence(info.value)
    assert message.startswith("THOR diverged at step 5: the loss stayed above 2x the first step's 2.3 or was not "
                              "finite for 3 consecutive steps (now 7"), message
    assert "Raise the damping" in message and "lower the learning rate" in message
    assert monitor.worst == pytest.approx(7.0 / 2.3)


def test_a_healthy_step_ends_a_run_but_not_the_count_over_the_last_two_patiences():
    monitor = ngd.DivergenceMonitor(growth=1.5, patience=3)
    _feed(monitor, [float("nan"), 2.0, 4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert monitor.reference == 2.0            # the first finite loss; it cleared the NaN's count
    assert monitor.run == 0 and monitor.recent == 1 and monitor.longest == 2   # one 4.0 left in the last 6
    _feed(monitor, [4.0, 1.0, 4.0])
    assert monitor.run == 1 and monitor.recent == 2
    with pytest.raises(RuntimeError) as info:
        monitor.observe(np.float32(float("inf")))  # a non-finite loss counts as exploded
    assert str(info.value).startswith("training diverged at step 13: the loss was above 1.5x the first step's 2 or "
                                      "not finite on 3 of the last 6 steps (now inf)"), str(info.value)


def test_an_exploded_loss_on_most_steps_stops_though_never_patience_in_a_row():
    """THOR at damping 1e-4, lr 0.1 on the digits CNN in Model.train (its losses, 2026-11-29): after step
    33 the loss was infinite or above 1.5x the first on 25 of 33 steps, never more than 5 in a row, and the
    run ended at 0.87 test accuracy with no error under the consecutive rule."""
    losses = [2.304, 2.253, 2.053, 1.559, 0.7795, 0.6752, 0.3787, 0.3794, 0.5584, 1.357, 0.6873, 1.832, 1.704,
              0.8353, 0.4055, 1.434, 0.6783, 0.9639, 0.2202, 0.7987, 2.567, 0.891, 0.4084, 1.904, 1.532, 1.804,
              0.8536, 1.819, 4.483, 0.9083, 2.653, 2.721, 2.022, inf, 4.993, 7.671, 3.318, inf, 2.202, 3.014, inf,
              inf, inf, inf, 2.047, inf, 1.744, 4.738, inf, 2.643, inf, inf, 3.322, 3.976, 3.868, 1.82]
    monitor = ngd.DivergenceMonitor(name="THOR")
    with pytest.raises(RuntimeError) as info:
        _feed(monitor, losses)
    assert monitor.steps == 46 and monitor.longest == 4
    assert "THOR diverged at step 46: the loss was above 1.5x the first step's 2.304 or not finite on 10 of the " \
           "last 20 steps (now inf)" in str(info.value)


def test_a_run_of_infinite_losses_with_finite_gradients_stops():
    """A blown-up softmax cross-entropy is inf while its gradient stays bounded: the optimizer takes
    finite steps and never stops itself, so the monitor does, before or after a first finite loss."""
    monitor = ngd.DivergenceMonitor(patience=3, name="THOR")
    _feed(monitor, [2.3, 0.5, float("inf"), float("inf")])
    with pytest.raises(RuntimeError) as info:
        monitor.observe(np.float32(float("inf")))
    assert ngd.is_divergence(info.value)
    assert "or was not finite for 3 consecutive steps (now inf)" in str(info.value)
    fresh = ngd.DivergenceMonitor(patience=2)
    fresh.observe(np.float32(float("nan")))
    with pytest.raises(RuntimeError, match="the loss was not finite for 2 consecutive steps"):
        fresh.observe(np.float32(float("inf")))
    assert fresh.reference is None


def test_a_loss_scale_cells_output_tuple_is_read_by_its_loss():
    monitor = ngd.DivergenceMonitor(growth=1.5, patience=1)
    monitor.observe((Tensor(np.float32(2.0)), Tensor(False), Tensor(np.float32(128.0))))
    monitor.observe((Tensor(np.float32(2.5)), Tensor(False), Tensor(np.float32(128.0))))
    assert monitor.reference == 2.0 and monitor.run == 0
    with pytest.raises(RuntimeError, match="now 3.5"):
        monitor.observe((Tensor(np.float32(3.5)), Tensor(True), Tensor(np.float32(64.0))))


def test_the_callback_reads_the_step_outputs_of_model_train():
    monitor = ngd.DivergenceMonitor(growth=1.5, patience=2)
    context = lambda loss: SimpleNamespace(original_args=lambda: SimpleNamespace(net_outputs=Tensor(np.float32(loss))))
    for loss in (2.0, 3.5):
        monitor.on_train_step_end(context(loss))
    with pytest.raises(RuntimeError, match="diverged at step 3"):
        monitor.on_train_step_end(context(4.0))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(growth=1.0), ValueError, "growth must be a finite number > 1"),
    (dict(growth=float("inf")), ValueError, "growth"),
    (dict(growth="2"), TypeError, "growth"),
    (dict(patience=0), ValueError, "patience"),
    (dict(patience=2.5), TypeError, "patience"),
    (dict(name=""), TypeError, "name"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=words):
        ngd.DivergenceMonitor(**kwargs)


def test_model_train_stops_a_finite_blow_up_before_the_optimizers_own_rule():
    """THOR at damping 1e-6 and lr 0.5 on a conv+BatchNorm net blows up finitely (test_finite_divergence:
    the optimizer's gradient rule stops it at step 13). The loss-side stop, patience 3, ends the same
    Model.train run earlier, with the loss as evidence."""
    x, y = template_images()
    ms.set_seed(0)
    net = ConvBNNet(widths=(3, 16, 32, 32))
    opt = ngd.THOR(net, 0.5, 1e-6, 0.9, 5e-4, frequency=4, kl_clip=None, verbose=False)   # nn.thor's step
    monitor = ngd.DivergenceMonitor(patience=3, name="THOR")
    model = Model(net, nn.CrossEntropyLoss(reduction="mean"), opt)
    with pytest.raises(RuntimeError) as info:
        model.train(5, array_dataset(x, y, 32, shuffle=False), callbacks=[monitor], dataset_sink_mode=False)
    assert ngd.is_divergence(info.value)
    assert "DivergenceMonitor growth=1.5, patience=3" in str(info.value), str(info.value)
    assert monitor.steps < 13 and int(opt.finite_run.asnumpy()) < 10
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_an_infinite_loss_with_finite_gradients_is_stopped_in_model_train():
    """THOR (default clip) at damping 1e-4, lr 0.01 on the digits CNN: the loss falls to 0.2, then is inf
    from step 49 while every gradient stays finite, so the optimizer's own rule never fires and the run
    ended at 0.52 test accuracy without a word. With the monitor, as the models repository's flow and the
    zoo's train.py add it, it stops with the reason (measured: step 60 when the monitor counted consecutive
    steps only; step 42 counting 10 of the last 20, 2026-11-29)."""
    from benchmarks.damping_sweep import run_one
    row = run_one("thor", 1e-4, 0.01, 3, monitor=True)
    assert row["outcome"] == "diverged", row
    assert row["skipped_steps"] == 0 and row["steps"] < 66, row         # finite gradients throughout
    assert "or not finite on 10 of the last 20 steps" in row["reason"], row["reason"]
