"""Loss scaling follows the training cell (issue 11).

A training cell with a loss scale back-propagates with ``sens = scale`` and divides the gradients by
``scale`` before the optimizer sees them; the scale changes during training. The capture hooks see the
scaled output gradients, so the optimizer must unscale G (and the unit-wise BatchNorm Fishers, and
THOR's G traces) by the scale of *that* step, which it measures (mindspore_ngd/capture/loss_scale.py).

Checked here: 20 steps with a scale that rises, falls and overflows give the same factors and weights
as an unscaled run, for MindSpore's own ``TrainOneStepWithLossScaleCell`` with a
``DynamicLossScaleUpdateCell`` and for a cell that changes the scale on a fixed schedule (as the
dynamic manager does on an accelerator) with an overflow step. Scales are powers of two, so unscaling
is exact in float32 and the tolerance below only covers summation order.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor

import mindspore_ngd as ngd
from training import CE, batch
from nets import BNNet

STEPS = 20
RTOL = 1e-5


class ScheduledLossScaleStep(nn.Cell):
    """``TrainOneStepWithLossScaleCell`` as it runs on an accelerator, with the scale and the overflow
    given per step: backward with ``sens = scale`` (times inf on an overflow step), unscale, and call the
    optimizer only when every gradient is finite."""

    def __init__(self, net, optimizer):
        super().__init__(auto_prefix=False)
        self.network = nn.WithLossCell(net, CE)
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, y, scale, poison):
        loss = self.network(x, y)
        sens = ops.ones_like(loss) * scale * poison
        grads = self.grad(self.network, self.weights)(x, y, sens)
        unscaled, flat = (), ()
        for grad in grads:
            unscaled += (grad / scale,)
            flat += (ops.isfinite(grad).all(),)
        if ops.stack(flat).all():
            loss = ops.depend(loss, self.optimizer(unscaled))
        return loss


def _optimizer(kind, net):
    if kind == "kfac":
        return ngd.KFAC(net, learning_rate=0.1, damping=1e-2, inverse_update_interval=3, verbose=False)
    if kind == "spngd":
        return ngd.SPNGD(net, learning_rate=0.1, damping=1e-2, refresh_threshold=0.3, max_interval=4,
                         verbose=False)
    return ngd.THOR(net, 0.1, 1e-2, frequency=2, split_dim=16, trace_threshold=0.05, verbose=False)


def _state(net, opt):
    weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    stats = {p.name: p.asnumpy().copy() for p in opt.get_parameters() if p.name.endswith((".A", ".G", ".F"))}
    return weights, stats


def _compare(got, want):
    for part_got, part_want in zip(got, want):
        assert sorted(part_got) == sorted(part_want)
        for name, value in part_want.items():
            scale = max(float(np.abs(value).max()), 1e-30)
            np.testing.assert_allclose(part_got[name], value, rtol=0, atol=RTOL * scale, err_msg=name)


def _scheduled_run(kind, scales, overflow_step):
    ms.set_seed(0)
    net = BNNet()
    opt = _optimizer(kind, net)
    step = ScheduledLossScaleStep(net, opt)
    step.set_train()
    for i in range(STEPS):
        poison = np.float32(np.inf if i == overflow_step else 1.0)
        step(*batch(i), Tensor(np.float32(scales[i])), Tensor(poison))
    return _state(net, opt), opt


# rises at step 7, falls at step 14; step 10 overflows (the optimizer is not called)
SCHEDULE = [2.0 ** 10] * 7 + [2.0 ** 14] * 7 + [2.0 ** 6] * 6


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kfac", "spngd", "thor"])
def test_scheduled_scale_with_overflow_matches_the_unscaled_run(kind):
    reference, ref_opt = _scheduled_run(kind, [1.0] * STEPS, overflow_step=10)
    scaled, opt = _scheduled_run(kind, SCHEDULE, overflow_step=10)
    _compare(scaled, reference)
    # the overflow step folded nothing and is no fault of the curvature; the last scale seen is 2^6
    counters = opt.state_counters()
    assert counters["factor_faults"] == 0 and counters["inverse_faults"] == 0
    assert counters["factor_faults"] == ref_opt.state_counters()["factor_faults"]
    probe = opt.capture_control.scale_probe
    assert float(probe.scale_seen.asnumpy()) == 2.0 ** 6
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == STEPS - 1


class GpuStyleLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's ``TrainOneStepWithLossScaleCell`` unchanged except for its overflow check: its
    kernels (``NPUGetFloatStatusV2`` on Ascend, ``FloatStatus`` on GPU) do not exist on CPU, so the same
    test -- is any gradient not finite -- is written with ``IsFinite``."""

    def get_overflow_status(self, status, compute_output):
        flags = ()
        for grad in compute_output:
            flags += (ops.logical_not(ops.isfinite(grad).all()),)
        return ops.stack(flags).any()


def _poisoned(i):
    x, y = batch(i)
    if i == OVERFLOW_STEP:
        values = x.asnumpy().copy()
        values[0, 0, 0, 0] = np.inf
        x = Tensor(values)
    return x, y


OVERFLOW_STEP = 10


class BiasFreeBNNet(BNNet):
    """BNNet without a bias anywhere (as the model zoo's THOR ResNet-50: no convolution bias, a classifier
    without bias): no preconditioned layer can carry the loss-scale probe, so it sits at the BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="same", has_bias=False)
        self.fc = nn.Dense(4 * 5 * 5, 3, has_bias=False)


def _dynamic_scale_run(kind, scaled, network=BNNet):
    """20 steps of MindSpore's own loss-scale cell: with ``scaled`` its update cell doubles the scale after
    every 4 good steps from 2^12 and halves it on the overflow of step 10, where the optimizer is not
    called; without, the scale is 1. (state, optimizer, per-step (overflow, scale))."""
    ms.set_seed(0)
    net = network()
    opt = _optimizer(kind, net)
    sense = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 12, scale_factor=2, scale_window=4) \
        if scaled else Tensor(np.float32(1.0))
    step = GpuStyleLossScaleCell(nn.WithLossCell(net, CE), opt, sense)
    step.set_train()
    scales = []
    for i in range(STEPS):
        _, overflow, scale = step(*_poisoned(i))
        scales.append((bool(overflow.asnumpy()), float(scale.asnumpy())))
    return _state(net, opt), opt, scales


@pytest.mark.parametrize("kind", ["kfac", pytest.param("spngd", marks=pytest.mark.slow),
                                  pytest.param("thor", marks=pytest.mark.slow)])
def test_mindspore_dynamic_loss_scale_cell_matches_the_unscaled_run(kind):
    """MindSpore's own cell and update cell: the scale doubles after every 4 good steps from 2^12 and
    halves on the overflow of step 10, where the optimizer is not called."""
    reference, ref_opt, _ = _dynamic_scale_run(kind, False)
    scaled, opt, scales = _dynamic_scale_run(kind, True)
    assert [i for i, (overflow, _) in enumerate(scales) if overflow] == [OVERFLOW_STEP]
    assert len({scale for _, scale in scales}) >= 3              # rose and fell during the run
    _compare(scaled, reference)
    counters, ref_counters = opt.state_counters(), ref_opt.state_counters()
    assert counters["factor_faults"] == ref_counters["factor_faults"] == 0
    assert counters["skipped_steps"] == 0 and counters["step"] == STEPS - 1
    seen = float(opt.capture_control.scale_probe.scale_seen.asnumpy())
    if kind == "kfac":                   # folds every step: the scale of the last step
        assert seen == scales[-1][1]
    else:                                # the scale of the last step that captured something
        assert seen in {scale for _, scale in scales} and seen > 2.0 ** 12


@pytest.mark.parametrize("kind", ["kfac", pytest.param("thor", marks=pytest.mark.slow)])
def test_without_any_bias_the_scale_is_measured_at_a_batchnorm_layer(kind):
    """No layer has a bias: the probe reads the BatchNorm's beta gradient instead, and the dynamic scale
    is unscaled as exactly as with a bias (before, G kept the scale's square: 2^24 and more)."""
    reference, _, _ = _dynamic_scale_run(kind, False, BiasFreeBNNet)
    scaled, opt, scales = _dynamic_scale_run(kind, True, BiasFreeBNNet)
    assert [i for i, (overflow, _) in enumerate(scales) if overflow] == [OVERFLOW_STEP]
    _compare(scaled, reference)
    probe = opt.capture_control.scale_probe
    assert probe is not None and opt.curvature.probe_layer is None
    seen = float(probe.scale_seen.asnumpy())
    assert seen in {scale for _, scale in scales} and seen > 2.0 ** 12


def test_the_probe_sits_at_a_batchnorm_only_without_a_bias_and_outside_the_unit_wise_blocks():
    from mindspore_ngd.capture.loss_scale import BatchNormScaleCapture
    biased = ngd.KFAC(BNNet(), learning_rate=0.1, verbose=False)
    assert biased.curvature.probe_layer is not None          # the classifier's bias, as before
    assert not isinstance(biased.capture_control.scale_probe.capture, BatchNormScaleCapture)
    net = BiasFreeBNNet()
    bias_free = ngd.KFAC(net, learning_rate=0.1, verbose=False)
    probe = bias_free.capture_control.scale_probe
    assert isinstance(probe.capture, BatchNormScaleCapture) and probe.capture.spec.name == "bn"
    assert bias_free.parameters[probe.bias_index].name == net.bn.beta.name and probe.size == 4
    # SP-NGD preconditions the BatchNorm layer unit-wise: it is not free to carry the probe, and no other
    # layer can, so only the fixed loss_scale is unscaled (as before)
    assert ngd.SPNGD(BiasFreeBNNet(), learning_rate=0.1, verbose=False).capture_control.scale_probe is None
    # the Monte-Carlo Fisher captures at its own scale: no probe
    assert ngd.KFAC(BiasFreeBNNet(), learning_rate=0.1, fisher="mc", verbose=False).capture_control.scale_probe \
        is None


def test_the_batchnorm_probe_reads_a_batchnorm1d_on_dense_layers():
    """Dense layers without bias around a BatchNorm1d: the probe sums the (B, C) output gradient, and a
    fixed loss scale of 128 that the cell does not unscale is measured as 128."""
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(6, 8, has_bias=False), nn.BatchNorm1d(8), nn.ReLU(),
                             nn.Dense(8, 3, has_bias=False)])
    opt = ngd.KFAC(net, learning_rate=0.1, damping=1e-2, loss_scale=128.0, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt, sens=128.0)
    step.set_train()
    probe = opt.capture_control.scale_probe
    probe.scale_seen.set_data(Tensor(np.float32(7.0)))      # not a scale: the steps must measure it
    rng = np.random.default_rng(0)
    losses = [float(step(Tensor(rng.standard_normal((16, 6)).astype(np.float32)),
                         Tensor(rng.integers(0, 3, 16).astype(np.int32))).asnumpy()) for _ in range(3)]
    assert np.isfinite(losses).all(), losses
    assert probe.capture.spec.channels == 8 and float(probe.scale_seen.asnumpy()) == 128.0


def test_fixed_loss_scale_of_the_optimizer_still_works():
    """``FixedLossScaleManager(drop_overflow_update=False)``: the cell does not unscale, the optimizer's
    ``loss_scale`` does, and the measured scale is that constant."""
    def run(loss_scale):
        ms.set_seed(0)
        net = BNNet()
        opt = ngd.KFAC(net, learning_rate=0.1, damping=1e-2, inverse_update_interval=3, loss_scale=loss_scale,
                       verbose=False)
        step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt, sens=loss_scale)
        step.set_train()
        for i in range(8):
            step(*batch(i))
        return _state(net, opt), opt

    reference, _ = run(1.0)
    scaled, opt = run(128.0)
    _compare(scaled, reference)
    assert float(opt.capture_control.scale_probe.scale_seen.asnumpy()) == 128.0


def test_reference_layer_prefers_a_dense_bias():
    from mindspore_ngd.capture.loss_scale import reference_layer
    from mindspore_ngd.capture import find_layers
    specs, _, _ = find_layers(BNNet())
    assert specs[reference_layer(specs)].name == "fc"          # not the conv whose bias feeds BatchNorm
    assert reference_layer([s for s in specs if s.kind == "conv2d"]) is not None
    nobias = [s for s in specs if not s.has_bias]
    assert reference_layer(nobias) is None


@pytest.mark.parametrize("traces", [False, True])
def test_the_scale_is_measured_on_the_steps_that_use_it(traces):
    """Without THOR's trace probes the scale is measured only in the fold (on a step that captures),
    so a step between captures runs none of the probe's kernels; with them, on every step (the probes
    between captures unscale their G traces by it)."""
    ms.set_seed(0)
    net = BNNet()
    if traces:
        opt = ngd.THOR(net, 0.1, 1e-2, frequency=4, split_dim=16, trace_threshold=0.05, verbose=False)
    else:
        opt = ngd.KFAC(net, 0.1, damping=1e-2, factor_update_interval=4, inverse_update_interval=4, verbose=False)
    assert opt.curvature.probe_every_step is traces
    step = ScheduledLossScaleStep(net, opt)
    step.set_train()
    seen = []
    for i, scale in enumerate([2.0 ** 10] * 5 + [2.0 ** 14] * 2):       # steps 0 and 4 capture
        step(*batch(i), Tensor(np.float32(scale)), Tensor(np.float32(1.0)))
        seen.append(float(opt.capture_control.scale_probe.scale_seen.asnumpy()))
    assert seen[4] == 2.0 ** 10
    assert seen[5:] == ([2.0 ** 14] * 2 if traces else [2.0 ** 10] * 2)
