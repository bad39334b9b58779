"""One contract, run against K-FAC, SP-NGD and THOR alike.

* the optimizer is its policy: ``NGDOptimizer(network, ..., policy=opt.policy)`` trains to the same
  weights, bit for bit, as the optimizer class that built the policy;
* the same policy reached through different classes gives bit-identical weights: K-FAC with both
  intervals f, THOR with frequency f (no splitting, same damping split, decay filter, moving average
  and KL clip), and SP-NGD without stale statistics against K-FAC with intervals 1;
* a checkpoint taken mid-run (network and optimizer) resumes bit-identically, here into the engine
  built from the class's policy;
* a step with a non-finite gradient changes no weight and is counted;
* bad arguments fail before any graph is compiled, naming the argument.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.optim.policy import default_decay_filter
from nets import set_weights

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
STEPS = 6


class SmallNet(nn.Cell):
    """conv(bias) -> BatchNorm -> ReLU -> Dense -> ReLU -> Dense: every block kind of the engine."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(64, 8)
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        x = self.flatten(self.relu(self.bn(self.conv(x))))
        return self.fc2(self.relu(self.fc1(x)))


def _batches(steps=STEPS):
    rng = np.random.default_rng(21)
    return [(rng.standard_normal((8, 2, 4, 4)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
            for _ in range(steps)]


def _net():
    ms.set_seed(0)
    net = SmallNet()
    set_weights(net, np.random.default_rng(2), scale=0.3)
    return net


# name: optimizer class builder (network -> optimizer), at the class's defaults except lr/damping
OPTIMIZERS = {
    "kfac": lambda net: ngd.KFAC(net, 0.05, damping=1e-2, inverse_update_interval=2, verbose=False),
    "spngd": lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, max_interval=4, verbose=False),
    "thor": lambda net: ngd.THOR(net, 0.05, 1e-2, frequency=2, split_dim=16, trace_threshold=0.1, verbose=False),
}
HYPER = {"kfac": {}, "spngd": {"factor_decay": 0.9}, "thor": {"factor_decay": 0.0}}


def _train(net, opt, batches):
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    for x, y in batches:
        step(Tensor(x), Tensor(y))
    return step


def _weights(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def _assert_identical(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), f"{name} differs"


def _checkpointed_run(net, opt, batches, path):
    """Train on ``batches[:3]``, save the step cell's checkpoint, then the rest and one step with a
    non-finite input (which must change nothing)."""
    step = _train(net, opt, batches[:3])
    ms.save_checkpoint(step, path)
    _finish(step, batches[3:])
    return step


def _finish(step, batches):
    for x, y in batches:
        step(Tensor(x), Tensor(y))
    before = {p.name: p.asnumpy().copy() for p in step.weights}
    x, y = batches[0]
    x = x.copy()
    x[0, 0, 0, 0] = np.inf
    step(Tensor(x), Tensor(y))
    after = {p.name: p.asnumpy().copy() for p in step.weights}
    for key in before:
        assert np.array_equal(before[key], after[key]), f"a non-finite step changed {key}"


@pytest.mark.parametrize("name", [n if n == "kfac" else pytest.param(n, marks=pytest.mark.slow) for n in OPTIMIZERS])
def test_the_engine_given_the_policy_resumes_the_checkpoint_to_identical_weights(name, tmp_path):
    """The class and ``NGDOptimizer(policy=class.policy)`` are the same optimizer: the engine loads the
    class's mid-run checkpoint (same Parameter names) and ends bit-identical; the non-finite last
    step is skipped and counted by both."""
    batches, path = _batches(), str(tmp_path / "mid.ckpt")
    net = _net()
    opt = OPTIMIZERS[name](net)
    _checkpointed_run(net, opt, batches, path)
    assert opt.state_counters()["skipped_steps"] == 1
    net2 = _net()
    engine = ngd.NGDOptimizer(net2, 0.05, damping=1e-2, policy=opt.policy, verbose=False,
                              decay_filter=(lambda p: True) if name == "thor" else None, **HYPER[name])
    assert engine._decay == opt._decay
    step2 = nn.TrainOneStepCell(nn.WithLossCell(net2, CE), engine)
    not_loaded, _ = ms.load_param_into_net(step2, ms.load_checkpoint(path))
    assert not not_loaded
    step2.set_train()
    _finish(step2, batches[3:])
    _assert_identical(_weights(net2), _weights(net))
    assert engine.state_counters() == opt.state_counters()


def _kfac_thor_pair(frequency):
    common = dict(damping=1e-2, momentum=0.9, factor_decay=0.95, damping_split="pi", kl_clip=1e-3, verbose=False)
    kfac = lambda net: ngd.KFAC(net, 0.05, factor_update_interval=frequency, inverse_update_interval=frequency,
                                **common)
    thor = lambda net: ngd.THOR(net, 0.05, frequency=frequency, split_dim=None,
                                decay_filter=default_decay_filter, **common)
    return kfac, thor


@pytest.mark.parametrize("frequency", [3])
def test_kfac_and_thor_with_the_same_policy_train_to_identical_weights(frequency):
    results = []
    for make in _kfac_thor_pair(frequency):
        net = _net()
        _train(net, make(net), _batches())
        results.append(_weights(net))
    _assert_identical(*results)


def test_spngd_without_stale_statistics_and_kfac_with_intervals_one_train_to_identical_weights():
    results = []
    for make in (lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, factor_decay=0.9, stale=False,
                                       batchnorm_damping=None, verbose=False),
                 lambda net: ngd.KFAC(net, 0.05, damping=1e-2, factor_decay=0.9, inverse_update_interval=1,
                                      verbose=False)):
        net = _net()
        _train(net, make(net), _batches())
        results.append(_weights(net))
    _assert_identical(*results)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("argument, value, error", [
    ("learning_rate", -0.1, ValueError), ("damping", 0.0, ValueError), ("momentum", 1.5, ValueError),
    ("weight_decay", -1.0, ValueError), ("factor_decay", 1.0, ValueError), ("loss_scale", 0.0, ValueError),
    ("inverse_method", "qr", ValueError), ("balance", "speed", ValueError)])
def test_bad_arguments_fail_before_compiling_and_name_the_argument(name, argument, value, error):
    kwargs = {"learning_rate": 0.05, "damping": 1e-2, "verbose": False, argument: value}
    cls = {"kfac": ngd.KFAC, "spngd": ngd.SPNGD, "thor": ngd.THOR}[name]
    with pytest.raises(error, match=argument):
        cls(_net(), **kwargs)
