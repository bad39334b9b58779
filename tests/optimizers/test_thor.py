"""THOR: shared engine (equals K-FAC with the same policy), refresh rules, splitting, the built-in
THOR's argument list, Model.train.

Elsewhere: THOR's bad arguments in tests/unit/test_arguments.py, its learning-rate and damping
schedules in tests/unit/test_schedules.py."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from mindspore_ngd.curvature.statistics import relative_change, relative_changes
from mindspore_ngd.schedule.rules import GrowingInterval, grown_interval
from mindspore_ngd.schedule.thor import thor_damping, thor_lr
from nets import CONV_CASES, BNNet, DenseNet, make_conv_net
from training import batch, train_step, weights_after

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


# slow: tests/optimizers/test_policy_contract.py checks the same equivalence (KFAC and THOR with one
# policy train to identical weights) in the default run, with damping split pi and KL clipping
@pytest.mark.slow
def test_thor_without_splitting_or_trace_rule_equals_kfac_with_the_same_policy():
    common = dict(momentum=0.9, weight_decay=1e-3, damping_split="sqrt", factor_decay=0.0, kl_clip=None,
                  verbose=False)
    thor, _ = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=3, split_dim=None,
                                                 trace_threshold=None, decay_filter=ngd.default_decay_filter,
                                                 **common))
    kfac, _ = weights_after(lambda net: ngd.KFAC(net, 0.05, damping=1e-2, factor_update_interval=3,
                                                 inverse_update_interval=3, **common))
    for name in kfac:
        np.testing.assert_array_equal(thor[name], kfac[name], err_msg=name)


# slow since issue 11/12 grew the default suite: block-split equivalences are in numerics/test_blocks
@pytest.mark.slow
def test_split_dim_at_least_the_factor_size_changes_nothing():
    base, _ = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, split_dim=None, verbose=False))
    big, _ = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, split_dim=1000, verbose=False))
    for name in base:
        np.testing.assert_array_equal(big[name], base[name], err_msg=name)


def test_split_factors_are_stored_as_blocks_and_train():
    weights, opt = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, split_dim=8, verbose=False))
    # conv: A is 2*3*3 + 1 = 19 -> 3 blocks of 8; fc: A is 101 -> 13 blocks of 8; G's 4 and 3 stay whole
    assert opt.blocks[0].a_inverse.shape == (3, 8, 8) and opt.blocks[1].a_inverse.shape == (13, 8, 8)
    assert opt.blocks[0].g_inverse.shape == (4, 4) and opt.blocks[1].g_inverse.shape == (3, 3)
    assert opt.state_counters()["inverse_faults"] == 0
    assert all(np.isfinite(w).all() for w in weights.values())


def test_layer_branches_is_validated_and_only_matters_with_traces():
    with pytest.raises(TypeError, match="layer_branches must be a bool, got str"):
        GrowingInterval(2, trace_threshold=0.1, layer_branches="yes").validated()
    assert GrowingInterval(2, trace_threshold=0.1).per_layer
    assert not GrowingInterval(2, trace_threshold=0.1, layer_branches=False).per_layer
    assert not GrowingInterval(2).per_layer


def test_growing_refresh_interval_planner_and_optimizer_agree():
    assert grown_interval(3, 1.5, None) == 5 and grown_interval(8, 2.0, 10) == 10
    assert grown_interval(4, 1.0, None) == 4 and grown_interval(2, 1.5, None) == 3     # no float32 round-up
    expected = GrowingInterval(2, 2.0, 8).plan(30)
    assert expected == [0, 2, 6, 14, 22]
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.THOR(net, 0.05, 1e-2, frequency=2, frequency_growth=2.0, max_frequency=8, verbose=False)
    step = train_step(net, opt)
    x, y = batch(0, shape=(5,))
    seen, last = [], 0
    for i in range(30):
        step(x, y)
        updates = opt.factor_updates()[opt.layer_specs[0].name][0]
        if updates > last:
            seen.append(i)
            last = updates
    assert seen == expected
    assert opt.state_counters()["interval"] == 8


class _TraceRule(nn.Cell):
    """The rule's test, on the vector of every statistic's trace at once (as the rule runs it)."""

    def construct(self, new, old, threshold):
        return relative_changes(new, old) > threshold


class _Changes(nn.Cell):
    def construct(self, new, old):
        return relative_changes(new, old), relative_change(new[0], old[0])


def test_relative_changes_of_vectors_equal_numpy_and_the_scalar_formula():
    new = np.array([10.5, 3.0, 0.0, 1.0, -2.0], np.float32)
    old = np.array([10.0, 4.0, 5.0, 0.0, -1.0], np.float32)
    vector, scalar = _Changes()(Tensor(new), Tensor(old))
    expected = np.abs(new - old) / np.abs(np.where(old == 0, 1.0, old))
    expected[old == 0] = np.inf                       # nothing to compare with: a first capture
    np.testing.assert_allclose(vector.asnumpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(scalar.asnumpy(), expected[0], rtol=1e-6)


def test_trace_rule_on_a_synthetic_sequence():
    rule = _TraceRule()
    traces = [10.0, 10.5, 10.9, 13.0, 13.1, 0.0, 1.0]
    kept = traces[0]
    decisions = []
    for value in traces[1:]:
        changed = bool(rule(Tensor(np.float32([value])), Tensor(np.float32([kept])), 0.1).asnumpy()[0])
        decisions.append(changed)
        if changed:
            kept = value                  # the inverse is rebuilt from the new statistic
    # 10.5 (+5%) keep; 10.9 (+9% of 10) keep; 13.0 (+30%) refresh; 13.1 keep; 0.0 refresh; from 0 always
    assert decisions == [False, False, True, False, True, True]


@pytest.mark.parametrize("threshold, expected_refreshes", [(1e9, 1), (1e-9, 3)])
def test_trace_threshold_controls_which_layers_refresh(threshold, expected_refreshes):
    # refresh points 0, 2, 4, 6: step 0 captures everything; points 2, 4, 6 probe traces and the
    # following step (3, 5; 7 is beyond the run) captures what moved
    _, opt = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, trace_threshold=threshold,
                                                verbose=False), steps=7)
    counters = opt.state_counters()
    assert counters["layer_refreshes"] == [expected_refreshes] * 2
    assert set(opt.factor_updates().values()) == {(expected_refreshes, expected_refreshes)}


@pytest.mark.parametrize("threshold", [0.2, pytest.param(1e-9, marks=pytest.mark.slow)])  # 0.2: refreshes 3 and 2
def test_block_split_thor_with_traces_inverts_under_one_branch_with_the_same_result(threshold, monkeypatch):
    def make(net):
        return ngd.THOR(net, 0.05, 1e-2, frequency=2, trace_threshold=threshold, split_dim=2, verbose=False)

    one, opt = weights_after(make, steps=7)
    assert not opt.refresh_rule.per_layer             # split factors: one fold and one inversion branch
    # the same optimizer with a run-time branch per layer, as THOR builds it without block splitting
    import mindspore_ngd.optim.thor as thor_module
    monkeypatch.setattr(thor_module, "GrowingInterval",
                        lambda *args, **kwargs: GrowingInterval(*args, **{**kwargs, "layer_branches": True}))
    per_layer, opt_per_layer = weights_after(make, steps=7)
    assert opt_per_layer.refresh_rule.per_layer
    for name in one:
        np.testing.assert_array_equal(one[name], per_layer[name], err_msg=name)
    assert opt.state_counters() == opt_per_layer.state_counters()
    assert opt.factor_updates() == opt_per_layer.factor_updates()
    if threshold == 0.2:                              # some layer kept its inverse at a refresh point
        assert len(set(opt.state_counters()["layer_refreshes"])) == 2
    _, dense = weights_after(lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, trace_threshold=threshold,
                                                  split_dim=None, verbose=False), steps=1)
    assert dense.refresh_rule.per_layer               # dense inverses are costly: a branch per layer


class _Traces(nn.Cell):
    def __init__(self, capture):
        super().__init__()
        self.capture = capture

    def construct(self, x):
        return self.capture.input_trace(x)


@pytest.mark.parametrize("case", range(6))
def test_input_trace_without_forming_the_factor(case):
    from mindspore_ngd.capture import LayerCapture, find_layers
    rng = np.random.default_rng(case)
    net, x, y, _ = make_conv_net(CONV_CASES[case], rng)
    factors = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(y))
    specs, _, _ = find_layers(net)
    for spec in specs:
        probe = _Traces(LayerCapture(spec, "t"))
        inputs = x if spec.kind == "conv2d" else np.maximum(net.conv(Tensor(x)).asnumpy(), 0).reshape(len(x), -1)
        assert float(probe(Tensor(inputs)).asnumpy()) == pytest.approx(np.trace(factors[spec.name][0]), rel=1e-5)


def test_trace_rule_skips_the_factor_computation_of_unmoved_statistics():
    ms.set_seed(0)
    net = BNNet()
    opt = ngd.THOR(net, 0.05, 1e-2, frequency=2, trace_threshold=1e9, verbose=False)
    step = train_step(net, opt)
    step(*batch(0))                                             # step 0 captures every factor
    first = opt.blocks[0].capture.a_batch.asnumpy().copy()
    for i in range(1, 6):                                       # refresh points 2 and 4 only probe traces
        step(*batch(i))
    np.testing.assert_array_equal(opt.blocks[0].capture.a_batch.asnumpy(), first)
    assert float(opt.blocks[0].capture.a_trace.asnumpy()) > 0         # the probe ran
    assert opt.factor_updates()[opt.layer_specs[0].name][0] == 1


def test_builtin_thor_argument_set_is_accepted_positionally():
    lr = Tensor(thor_lr(0.05803, 4.0839, 53, 10, 2))
    damping = Tensor(thor_damping(0.03, 0.50036, 10, 2))
    net = BNNet()
    # thor(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
    #      decay_filter, split_indices, enable_clip_grad, frequency)
    opt = ngd.THOR(net, lr, damping, 0.9, 5e-4, 128, 32, False, lambda x: x.name not in [], [26, 53], True, 4,
                   verbose=False)
    assert opt.policy.clip_norm == 1.0 and opt.policy.refresh.frequency == 4
    assert len(opt.decayed_parameters()) == len(net.trainable_params())


def test_enable_clip_grad_bounds_every_update():
    ms.set_seed(0)
    net = DenseNet()
    opt = ngd.THOR(net, 10.0, 1e-3, momentum=0.0, enable_clip_grad=True, frequency=1, verbose=False)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    train_step(net, opt)(*batch(0, shape=(5,)))
    for p in net.trainable_params():
        assert np.linalg.norm(p.asnumpy() - before[p.name]) <= 10.0 * (1 + 1e-5)


def test_thor_trains_the_digits_cnn_on_cpu_in_model_train():
    from benchmarks.data import array_dataset, digits_arrays
    from benchmarks.models import DigitsCNN
    x_train, y_train, x_test, y_test = digits_arrays()
    ms.set_seed(0)
    net = DigitsCNN()
    opt = ngd.THOR(net, 0.05, 1e-2, 0.9, 5e-4, frequency=10, split_dim=64, trace_threshold=0.05, kl_clip=1e-3,
                   verbose=False)
    model = Model(net, CE, opt, metrics={"acc"})
    model.train(2, array_dataset(x_train, y_train, 64), dataset_sink_mode=False)
    result = model.eval(array_dataset(x_test, y_test, 64, shuffle=False, drop_remainder=False))
    assert result["acc"] > 0.85, result



def test_trace_rule_captures_on_the_step_after_a_probe_only():
    # probes at refresh points 2, 4, 6; captures at 0 and after a probe (every statistic moves with a
    # threshold of 1e-9) -- for every layer, not only the first (whose probe flag the others read)
    ms.set_seed(0)
    net = BNNet()
    opt = ngd.THOR(net, 0.05, 1e-2, frequency=2, trace_threshold=1e-9, verbose=False)
    step = train_step(net, opt)
    captured, probed = [], []
    for i in range(7):
        captured.append([bool(c.capture_a.asnumpy()) and bool(c.capture_g.asnumpy()) for c in [b.capture for b in opt.blocks]])
        probed.append([bool(c.trace_a.asnumpy()) for c in [b.capture for b in opt.blocks]])
        step(*batch(i))
    assert captured == [[i in (0, 3, 5)] * 2 for i in range(7)]
    assert probed == [[i in (2, 4, 6)] * 2 for i in range(7)]
