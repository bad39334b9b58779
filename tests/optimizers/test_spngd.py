"""SP-NGD: the stale-statistics rule, unit-wise BatchNorm, the shared engine, Model.train.

Elsewhere: the Monte-Carlo Fisher (``fisher="mc"``, any optimizer) in test_mc_fisher.py, SP-NGD's
arguments in tests/unit/test_arguments.py, its polynomial schedule in tests/unit/test_schedules.py."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from mindspore_ngd.curvature.factors import unit_natural_gradient
from mindspore_ngd.curvature.statistics import damped_square_norm, relative_change
from mindspore_ngd.curvature.unitwise import unit_damped_square_norms
from mindspore_ngd.schedule.rules import StaleIntervals, stale_intervals
from nets import DenseNet, set_weights
from reference import numpy_kfac as ref
from training import batch, train_step, weights_after

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


# ------------------------------------------------------------------ the refresh rule
class _StaleRule(nn.Cell):
    """The graph side of the rule: new intervals and next refresh steps (as the optimizer's rule cell)."""

    def construct(self, intervals, next_refresh, changes, step):
        intervals, taken = stale_intervals(intervals, changes, 0.1, 8)
        return intervals, ops.select(taken, step + intervals, next_refresh)


def stale_plan(changes_at, total_steps, threshold, max_interval):
    return StaleIntervals(threshold, max_interval).plan(changes_at, total_steps)


def _drive(changes_at, steps):
    """Run the graph rule for one statistic over ``steps`` steps; return [(step, interval)] at refreshes."""
    rule = _StaleRule()
    intervals, upcoming = Tensor(np.ones(1, np.int32)), Tensor(np.zeros(1, np.int32))
    plan, index = [], 0
    for step in range(steps):
        if step >= int(upcoming.asnumpy()[0]):
            change = np.inf if index == 0 else changes_at(step, index)
            index += 1
        else:
            change = -1.0
        intervals, upcoming = rule(intervals, upcoming, Tensor(np.array([change], np.float32)),
                                   Tensor(np.int32(step)))
        if change != -1.0:
            plan.append((step, int(intervals.asnumpy()[0])))
    return plan


def test_stale_rule_on_a_synthetic_sequence_gives_the_exact_intervals():
    # stable, stable, stable, moving, moving, stable, ...: doubling, halving, never below 1, cap 8
    changes = {1: 0.0, 2: 0.05, 3: 0.099, 4: 0.5, 5: 0.1, 6: 0.0, 7: 0.0, 8: 0.0, 9: 0.0}
    expected = [(0, 1), (1, 2), (3, 4), (7, 8), (15, 4), (19, 2), (21, 4), (25, 8), (33, 8), (41, 8)]
    planned = stale_plan(lambda step, i: changes[i], 42, 0.1, 8)
    assert planned == expected
    assert _drive(lambda step, i: changes[i], 42) == expected


def test_a_statistic_that_never_changes_ends_at_the_cap_and_one_that_keeps_changing_stays_at_one():
    assert _drive(lambda step, i: 0.0, 60)[-1][1] == 8
    assert stale_plan(lambda step, i: 0.0, 60, 0.1, 8)[-1][1] == 8
    moving = _drive(lambda step, i: 1.0, 20)
    assert [interval for _, interval in moving] == [1] * 20
    # a rejected (non-finite) capture changes nothing: interval and next refresh stay
    rule = _StaleRule()
    intervals, upcoming = rule(Tensor(np.array([4], np.int32)), Tensor(np.array([9], np.int32)),
                               Tensor(np.array([-1.0], np.float32)), Tensor(np.int32(9)))
    assert int(intervals.asnumpy()[0]) == 4 and int(upcoming.asnumpy()[0]) == 9


def _dense_spngd(max_interval=4, threshold=0.1, **kwargs):
    ms.set_seed(0)
    net = DenseNet()
    set_weights(net, np.random.default_rng(0))
    opt = ngd.SPNGD(net, learning_rate=kwargs.pop("lr", 1e-6), damping=kwargs.pop("damping", 1e-2),
                    refresh_threshold=threshold,
                    max_interval=max_interval, factor_decay=0.0, verbose=False, **kwargs)
    return net, opt, train_step(net, opt)


def test_optimizer_intervals_follow_the_rule_for_constant_and_moving_inputs():
    x, y = batch(1, n=16, shape=(5,))
    # fc1's A depends only on the input: the same batch every step never changes it
    _, opt, step = _dense_spngd()
    for _ in range(20):
        step(x, y)
    state = opt.refresh_state()
    planned = stale_plan(lambda s, i: 0.0, 20, 0.1, 4)
    assert state["fc1.A"] == (4, planned[-1][0] + 4, len(planned))
    assert opt.state_counters()["step"] == 20
    # a batch whose scale alternates 1, 10, 1, ... moves fc1's A by far more than 10% every step
    _, opt, step = _dense_spngd()
    for i in range(12):
        step(x * (10.0 if i % 2 else 1.0), y)
    assert opt.refresh_state()["fc1.A"] == (1, 12, 12)


# ------------------------------------------------------------------ the change measured against the damped statistic
def test_damped_square_norms_and_relative_change_equal_numpy():
    rng = np.random.default_rng(3)
    m = rng.standard_normal((6, 6)).astype(np.float32)
    m = m @ m.T
    shift = np.float32(0.7)
    expected = np.sum((m.astype(np.float64) + shift * np.eye(6)) ** 2)
    np.testing.assert_allclose(damped_square_norm(Tensor(m), Tensor(shift)).asnumpy(), expected, rtol=1e-5)
    # unit-wise Fisher entries (F00, F01, F11) per channel: the damping on F00 and F11, each entry once;
    # two layers stacked (5 and 3 channels), one norm per layer
    f = rng.standard_normal((8, 3)).astype(np.float32)
    damped_f = (f.astype(np.float64) + shift * np.array([1.0, 0.0, 1.0])) ** 2
    expected_f = [np.sum(damped_f[:5]), np.sum(damped_f[5:])]
    rows = Tensor(np.array([0] * 5 + [1] * 3, np.int32))
    np.testing.assert_allclose(unit_damped_square_norms(Tensor(f), float(shift), rows, 2).asnumpy(), expected_f,
                               rtol=1e-5)
    new = m + rng.standard_normal((6, 6)).astype(np.float32)
    raw = np.linalg.norm(new.astype(np.float64) - m) / np.linalg.norm(m.astype(np.float64))
    damped = np.linalg.norm(new.astype(np.float64) - m) / np.sqrt(expected)
    np.testing.assert_allclose(relative_change(Tensor(new), Tensor(m)).asnumpy(), raw, rtol=1e-5)
    np.testing.assert_allclose(relative_change(Tensor(new), Tensor(m), Tensor(np.float32(expected))).asnumpy(),
                               damped, rtol=1e-5)
    # a first capture (old = 0) stays +inf, whatever the reference
    zero = Tensor(np.zeros((6, 6), np.float32))
    assert np.isinf(relative_change(Tensor(new), zero, Tensor(np.float32(expected))).asnumpy())


def _input_factor(x):
    """fc1's A of DenseNet for inputs ``x``: ``[x, 1]^T [x, 1] / n``, float64."""
    tilde = np.concatenate([x.astype(np.float64), np.ones((x.shape[0], 1))], axis=1)
    return tilde.T @ tilde / x.shape[0]


@pytest.mark.parametrize("measure", ["damped", "raw"])
def test_a_factor_far_below_its_damping_rests_only_when_measured_against_the_damped_factor(measure):
    """The input scale alternates 1, 1.5, 1, ...: fc1's A moves by 125 % / 56 % of itself at every
    capture, but by about 1 % of ``A + sqrt(damping) I`` with damping 1e4 (split "sqrt": A's shift is
    100, independent of G). Damped, the interval doubles to the cap; raw, it stays at 1."""
    x, y = batch(1, n=16, shape=(5,))
    small, large = _input_factor(x.asnumpy()), _input_factor(1.5 * x.asnumpy())
    shift = 100.0
    for old, new in ((small, large), (large, small)):
        assert np.linalg.norm(new - old) / np.linalg.norm(old) > 0.5                       # raw: moving
        assert np.linalg.norm(new - old) / np.linalg.norm(old + shift * np.eye(6)) < 0.05  # damped: stable
    _, opt, step = _dense_spngd(refresh_measure=measure, damping_split="sqrt", adaptive_damping=False,
                                damping=1e4)
    for i in range(16):
        step(x * (1.5 if i % 2 else 1.0), y)
    interval, _, refreshes = opt.refresh_state()["fc1.A"]
    if measure == "damped":
        assert interval == 4 and refreshes < 16
    else:
        assert (interval, refreshes) == (1, 16)


def test_refresh_measure_is_validated():
    net = DenseNet()
    with pytest.raises(ValueError, match="refresh_measure must be one of"):
        ngd.SPNGD(net, 0.1, refresh_measure="relative", verbose=False)


def test_refresh_state_is_checkpointed_and_restored(tmp_path):
    x, y = batch(1, n=16, shape=(5,))
    net, opt, step = _dense_spngd()
    for _ in range(9):
        step(x, y)
    path = str(tmp_path / "spngd.ckpt")
    ms.save_checkpoint(opt, path)
    saved = opt.refresh_state()
    net2, opt2, _ = _dense_spngd()
    ms.load_param_into_net(opt2, ms.load_checkpoint(path))
    assert opt2.refresh_state() == saved
    assert {"spngd.intervals", "spngd.next_refresh", "spngd.refreshes"} <= set(ms.load_checkpoint(path))


# slow since issue 11/12 grew the default suite: test_policy_contract checks the same equality
@pytest.mark.slow
# ------------------------------------------------------------------ one engine
def test_spngd_without_stale_statistics_equals_kfac_with_intervals_one():
    common = dict(momentum=0.9, weight_decay=1e-3, damping_split="pi", factor_decay=0.0, kl_clip=None,
                  verbose=False)
    spngd, opt = weights_after(lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, stale=False, batchnorm_damping=None,
                                                     **common))
    kfac, _ = weights_after(lambda net: ngd.KFAC(net, 0.05, damping=1e-2, factor_update_interval=1,
                                                 inverse_update_interval=1, **common))
    for name in kfac:
        np.testing.assert_array_equal(spngd[name], kfac[name], err_msg=name)
    assert opt.state_counters()["statistic_refreshes"] == 7 * 4


def test_damping_is_floored_at_the_weight_decay():
    common = dict(momentum=0.9, weight_decay=5e-2, factor_decay=0.0, kl_clip=None, verbose=False)
    floored, _ = weights_after(lambda net: ngd.SPNGD(net, 0.05, damping=1e-4, stale=False, batchnorm_damping=None,
                                                     **common), steps=3)
    kfac, _ = weights_after(lambda net: ngd.KFAC(net, 0.05, damping=5e-2, factor_update_interval=1,
                                                 inverse_update_interval=1, **common), steps=3)
    for name in kfac:
        np.testing.assert_array_equal(floored[name], kfac[name], err_msg=name)


# ------------------------------------------------------------------ unit-wise BatchNorm
class ConvBNNet(nn.Cell):
    """conv (valid, no bias) -> BatchNorm2d -> flatten -> Dense: the unit-wise reference case."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 2, pad_mode="valid", has_bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(3 * 3 * 3, 4)

    def construct(self, x):
        return self.fc(self.flatten(self.bn(self.conv(x))))


def _numpy_unit_wise(net, x, labels, eps, damping):
    """float64 forward/backward by hand: per-example (g_gamma, g_beta), F per channel, the natural
    gradient of gamma and beta."""
    w = net.conv.weight.asnumpy().astype(np.float64)
    gamma = net.bn.gamma.asnumpy().astype(np.float64)
    beta = net.bn.beta.asnumpy().astype(np.float64)
    v = net.fc.weight.asnumpy().astype(np.float64)
    bias = net.fc.bias.asnumpy().astype(np.float64)
    x = x.astype(np.float64)
    patches, (oh, ow) = ref.im2col(x, (2, 2), (1, 1), (1, 1), "valid", (0, 0, 0, 0))
    b = x.shape[0]
    z = (patches @ w.reshape(3, -1).T).transpose(0, 2, 1).reshape(b, 3, oh, ow)
    mean = z.mean(axis=(0, 2, 3), keepdims=True)
    var = z.var(axis=(0, 2, 3), keepdims=True)
    xhat = (z - mean) / np.sqrt(var + eps)
    y = gamma.reshape(1, 3, 1, 1) * xhat + beta.reshape(1, 3, 1, 1)
    logits = y.reshape(b, -1) @ v.T + bias
    _, dlogits = ref.softmax_ce(logits, labels)
    dy = (dlogits @ v).reshape(y.shape)
    g_gamma = (dy * xhat).sum(axis=(2, 3)) * b          # per example, (B, C)
    g_beta = dy.sum(axis=(2, 3)) * b
    fisher = np.stack([(g_gamma ** 2).mean(0), (g_gamma * g_beta).mean(0), (g_beta ** 2).mean(0)], 1)
    grad = np.stack([g_gamma.mean(0), g_beta.mean(0)], 1)    # (C, 2): gradient of the mean loss
    natural = np.stack([np.linalg.solve(np.array([[f[0], f[1]], [f[1], f[2]]]) + damping * np.eye(2), g)
                        for f, g in zip(fisher, grad)])
    return fisher, grad, natural


def test_unit_wise_batchnorm_step_equals_the_numpy_reference():
    ms.set_seed(0)
    net = ConvBNNet()
    rng = np.random.default_rng(3)
    set_weights(net, rng)
    net.bn.gamma.set_data(Tensor(np.array([1.5, 0.7, -0.4], np.float32)))
    net.bn.beta.set_data(Tensor(np.array([0.2, -0.3, 0.5], np.float32)))
    x = rng.standard_normal((6, 2, 4, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 6).astype(np.int32)
    fisher, grad, natural = _numpy_unit_wise(net, x, labels, float(net.bn.eps), 1e-2)
    gamma0, beta0 = net.bn.gamma.asnumpy().copy(), net.bn.beta.asnumpy().copy()
    lr = 0.1
    opt = ngd.SPNGD(net, learning_rate=lr, damping=1e-2, momentum=0.0, batchnorm_damping=1e-2, kl_clip=None,
                    verbose=False)
    train_step(net, opt)(Tensor(x), Tensor(labels))
    np.testing.assert_allclose(opt.norm_blocks[0].fisher.asnumpy(), fisher, rtol=1e-4, atol=1e-6)
    # step = -lr * (F_c + damping I)^-1 [g_gamma, g_beta] per channel (no weight decay on gamma/beta)
    np.testing.assert_allclose((gamma0 - net.bn.gamma.asnumpy()) / lr, natural[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose((beta0 - net.bn.beta.asnumpy()) / lr, natural[:, 1], rtol=1e-4, atol=1e-5)
    assert not np.allclose(natural, grad, rtol=0.1)      # the preconditioning is not a no-op here


class _StackCase(nn.Cell):
    """Per-layer and stacked unit-wise natural gradients of the same inputs, in one graph."""

    def __init__(self, stack, sizes):
        super().__init__()
        self.stack, self.sizes = stack, sizes

    def construct(self, gradients, fishers, counts, damping):
        grads = self.stack.gradients(gradients)
        stacked = self.stack.precondition(fishers, counts, grads, damping)
        per_layer = ()
        for j in range(len(self.sizes)):
            gamma, beta = gradients[2 * j], gradients[2 * j + 1]
            pre = unit_natural_gradient(fishers[j], gamma, beta, damping)
            known = counts[j] > 0
            per_layer += ((ops.select(ops.broadcast_to(known, gamma.shape), pre[0], gamma),
                           ops.select(ops.broadcast_to(known, beta.shape), pre[1], beta)),)
        return self.stack.layer_pairs(stacked), self.stack.dots(stacked, grads), per_layer


def test_stacked_unit_wise_natural_gradient_is_bit_identical_to_the_per_layer_one():
    """Three BatchNorm layers of 2, 5 and 3 channels, the second never captured (plain gradient)."""
    from mindspore_ngd.capture.discover import NormSpec
    from mindspore_ngd.curvature.unitwise import UnitBatchNormBlock, UnitWiseGroup
    sizes = (2, 5, 3)
    blocks = [UnitBatchNormBlock(NormSpec(f"bn{j}", f"bn{j}.gamma", f"bn{j}.beta", c, 1e-5), "stack", 2 * j, 2 * j + 1)
              for j, c in enumerate(sizes)]
    rng = np.random.default_rng(5)
    gradients = tuple(Tensor(rng.standard_normal(c).astype(np.float32)) for c in sizes for _ in range(2))
    fishers = []
    for c in sizes:
        u = rng.standard_normal((c, 2, 8)).astype(np.float32)
        f = np.einsum("cik,cjk->cij", u, u) / 8
        fishers.append(Tensor(np.stack([f[:, 0, 0], f[:, 0, 1], f[:, 1, 1]], axis=1).astype(np.float32)))
    counts = Tensor(np.array([3, 0, 1], np.int32))
    pairs, dots, per_layer = _StackCase(UnitWiseGroup(blocks), sizes)(gradients, tuple(fishers), counts,
                                                                       Tensor(np.float32(1e-3)))
    for j, c in enumerate(sizes):
        for part in range(2):
            assert pairs[j][part].shape == (c,)
            np.testing.assert_array_equal(pairs[j][part].asnumpy(), per_layer[j][part].asnumpy())
        expected = (np.sum(per_layer[j][0].asnumpy() * gradients[2 * j].asnumpy(), dtype=np.float64)
                    + np.sum(per_layer[j][1].asnumpy() * gradients[2 * j + 1].asnumpy(), dtype=np.float64))
        np.testing.assert_allclose(dots[j].asnumpy(), expected, rtol=1e-5)
    # the never-captured layer keeps its plain gradient; the others are preconditioned
    np.testing.assert_array_equal(pairs[1][0].asnumpy(), gradients[2].asnumpy())
    assert not np.allclose(pairs[0][0].asnumpy(), gradients[0].asnumpy())


def test_batchnorm_probe_leaves_the_forward_pass_and_gradients_unchanged():
    ms.set_seed(0)
    rng = np.random.default_rng(4)
    x = Tensor(rng.standard_normal((6, 2, 4, 4)).astype(np.float32))
    labels = Tensor(rng.integers(0, 4, 6).astype(np.int32))
    nets = []
    for _ in range(2):
        net = ConvBNNet()
        set_weights(net, np.random.default_rng(5))
        nets.append(net)
    ngd.SPNGD(nets[1], learning_rate=0.1, verbose=False)
    grads = []
    for net in nets:
        net.set_train()
        with_loss = nn.WithLossCell(net, CE)
        grads.append(ops.GradOperation(get_by_list=True)(with_loss, net.trainable_params())(x, labels))
    for plain, probed in zip(*grads):
        np.testing.assert_allclose(probed.asnumpy(), plain.asnumpy(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ Model.train
def test_spngd_trains_a_batchnorm_cnn_in_model_train_with_refresh_monitor():
    from benchmarks.data import array_dataset, digits_arrays
    from benchmarks.models import DigitsCNN
    ms.set_seed(0)
    xtr, ytr, xte, yte = digits_arrays()
    net = DigitsCNN(batchnorm=True)
    opt = ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, weight_decay=1e-4, verbose=False)
    monitor = ngd.RefreshMonitor(opt, verbose=False)
    model = Model(net, CE, opt, metrics={"acc"})
    model.train(3, array_dataset(xtr, ytr, 32, shuffle=True), callbacks=[monitor], dataset_sink_mode=False)
    acc = model.eval(array_dataset(xte, yte, 120), dataset_sink_mode=False)["acc"]
    assert acc > 0.9
    assert [epoch for epoch, _, _ in monitor.history] == [1, 2, 3]
    ratios = [ratio for _, _, ratio in monitor.history]
    assert all(0 < r <= 1 for r in ratios) and ratios[-1] < ratios[0]
    assert any(name.endswith(".F") for name in opt.statistic_names)


def test_refresh_monitor_and_refresh_state_need_per_statistic_intervals():
    opt = ngd.KFAC(DenseNet(), 0.1, verbose=False)
    with pytest.raises(TypeError, match="per-statistic refresh intervals"):
        ngd.RefreshMonitor(opt)
    with pytest.raises(TypeError, match="per-statistic refresh intervals"):
        opt.refresh_state()
