"""The branched first-order baselines: the stock update, bit for bit, from a graph with a run-time branch."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

from benchmarks.baselines import BranchedAdam, BranchedMomentum


def _train(optimizer_class, steps=3, **kwargs):
    ms.set_seed(0)
    net = nn.Dense(4, 3)
    opt = optimizer_class(net.trainable_params(), learning_rate=0.1, **kwargs)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        step(Tensor(rng.standard_normal((5, 4)).astype(np.float32)), Tensor(np.zeros((5, 3), np.float32)))
    return net.weight.asnumpy().copy(), net.bias.asnumpy().copy(), opt


@pytest.mark.parametrize("branched, stock, kwargs", [(BranchedMomentum, nn.Momentum, {"momentum": 0.9}),
                                                     (BranchedAdam, nn.Adam, {})])
def test_the_branched_baseline_updates_exactly_as_the_stock_optimizer(branched, stock, kwargs):
    weight, bias, opt = _train(branched, **kwargs)
    stock_weight, stock_bias, _ = _train(stock, **kwargs)
    assert np.array_equal(weight, stock_weight) and np.array_equal(bias, stock_bias)
    assert not np.array_equal(weight, _train(stock, steps=0, **kwargs)[0])      # it did train
    # the branch is never taken
    assert not bool(opt.branch_flag.asnumpy()) and float(opt.branch_count.asnumpy()) == 0.0
    assert type(opt).__name__ == "Branched" + stock.__name__ and isinstance(opt, stock)


def test_momentum_baseline_builds_the_stock_or_the_branched_optimizer_and_names_bad_kinds():
    from benchmarks.baselines import MOMENTUM_KINDS, momentum_baseline
    params = nn.Dense(2, 2).trainable_params()
    stock, branched = (momentum_baseline(kind, params, 0.01) for kind in MOMENTUM_KINDS)
    assert type(stock) is nn.Momentum and type(branched) is BranchedMomentum
    with pytest.raises(ValueError, match="kind must be one of"):
        momentum_baseline("adam", params, 0.01)
