"""Monte-Carlo Fisher (``fisher="mc"`` with ``MCFisherTrainStep``): G from labels sampled from the
model's own predictive distribution, for K-FAC, SP-NGD and THOR, alone and in ``Model.train``."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from mindspore_ngd.schedule.rules import GrowingInterval
from nets import BNNet, DenseNet, set_weights
from training import batch, train_step

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def test_mc_fisher_g_of_the_output_layer_averages_to_the_true_fisher():
    """G of the logits layer from sampled labels: E_t[(p - e_t)(p - e_t)^T] = diag(p) - p p^T."""
    ms.set_seed(0)
    net = DenseNet()
    set_weights(net, np.random.default_rng(6), scale=0.8)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((32, 5)).astype(np.float32)
    labels = rng.integers(0, 3, 32).astype(np.int32)
    opt = ngd.KFAC(net, learning_rate=1e-9, damping=1e-2, factor_decay=0.0, fisher="mc", verbose=False)
    step = ngd.MCFisherTrainStep(net, CE, opt, seed=1)
    step.set_train()
    draws = []
    for _ in range(300):
        step(Tensor(x), Tensor(labels))
        draws.append(opt.blocks[1].g_factor.asnumpy().copy())   # asnumpy() may alias the device buffer
    logits = net(Tensor(x)).asnumpy().astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    exact = np.mean([np.diag(q) - np.outer(q, q) for q in p], axis=0)
    draws = np.array(draws)
    stderr = draws.std(0) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(0) - exact) <= 5 * stderr + 1e-4)
    # a single draw differs from the empirical G (same weights, real labels)
    empirical = ngd.kronecker_factors(net, CE, Tensor(x), Tensor(labels))["fc2"][1]
    assert not np.allclose(draws[-1], empirical, atol=1e-3)


# slow since issue 11/12 grew the default suite: the softmax case stays
@pytest.mark.slow
def test_mc_fisher_gaussian_g_and_the_true_gradient_reach_the_optimizer():
    ms.set_seed(0)
    net = BNNet()
    set_weights(net, np.random.default_rng(8))
    x, labels = batch(3, n=16)
    twin = BNNet()
    set_weights(twin, np.random.default_rng(8))
    # a plain-update parameter (the grouped conv) moves by -lr * (true gradient) with momentum 0
    opt = ngd.SPNGD(net, learning_rate=0.1, momentum=0.0, fisher="mc", verbose=False)
    step = ngd.MCFisherTrainStep(net, CE, opt, distribution="gaussian", seed=2)
    step.set_train()
    moving = net.bn.moving_mean.asnumpy().copy()
    loss = step(x, labels)
    twin.set_train()
    with_loss = nn.WithLossCell(twin, CE)
    true_loss = with_loss(x, labels)
    grads = ops.GradOperation(get_by_list=True)(with_loss, twin.trainable_params())(x, labels)
    gconv = [g for g, p in zip(grads, twin.trainable_params()) if p.name == "gconv.weight"][0]
    np.testing.assert_allclose(float(loss.asnumpy()), float(true_loss.asnumpy()), rtol=1e-6)
    w0 = twin.gconv.weight.asnumpy()
    np.testing.assert_allclose(net.gconv.weight.asnumpy(), w0 - 0.1 * gconv.asnumpy(), rtol=1e-5, atol=1e-6)
    # BatchNorm moving statistics moved once (the Monte-Carlo pass is undone): 0.9 * 0 + 0.1 * batch mean
    batch_mean = twin.conv(x).asnumpy().mean(axis=(0, 2, 3))
    np.testing.assert_allclose(net.bn.moving_mean.asnumpy(), moving + 0.1 * batch_mean, rtol=1e-5, atol=1e-7)
    # Gaussian G of the output layer: one sample of N(0, I) outer products, so its trace is near dim
    g_out = opt.blocks[1].g_factor.asnumpy()
    assert 0.5 * 3 < np.trace(g_out) < 2.0 * 3


def test_mc_fisher_optimizer_without_the_mc_step_fails_clearly():
    net = DenseNet()
    opt = ngd.KFAC(net, learning_rate=0.1, fisher="mc", verbose=False)
    with pytest.raises(RuntimeError, match="MCFisherTrainStep"):
        train_step(net, opt)(*batch(0, shape=(5,)))
    with pytest.raises(ValueError, match="fisher='mc'"):
        ngd.MCFisherTrainStep(DenseNet(), CE, ngd.KFAC(DenseNet(), 0.1, verbose=False))


def test_thor_takes_the_monte_carlo_fisher_only_at_its_refresh_points():
    """THOR(fisher="mc"): the sampled-label pass runs on the steps that capture (0, f, 2f, ...), the
    refresh's G is not the training labels' G, and the step returns the real loss."""
    ms.set_seed(0)
    net = DenseNet()
    set_weights(net, np.random.default_rng(6), scale=0.8)
    twin = DenseNet()
    set_weights(twin, np.random.default_rng(6), scale=0.8)
    rng = np.random.default_rng(7)
    x = Tensor(rng.standard_normal((32, 5)).astype(np.float32))
    labels = Tensor(rng.integers(0, 3, 32).astype(np.int32))
    empirical = ngd.kronecker_factors(twin, CE, x, labels)["fc2"][1]
    true_loss = float(nn.WithLossCell(twin, CE)(x, labels).asnumpy())
    opt = ngd.THOR(net, 0.05, 0.03, frequency=3, verbose=False, fisher="mc")
    step = ngd.MCFisherTrainStep(net, CE, opt, seed=3)
    step.set_train()
    sampled, losses = [], []
    for _ in range(7):
        sampled.append(bool(step.pending.asnumpy()))
        losses.append(float(step(x, labels).asnumpy()))
        if len(losses) == 1:
            g_first = opt.blocks[1].g_factor.asnumpy().copy()
    assert sampled == [True, False, False, True, False, False, True]
    np.testing.assert_allclose(losses[0], true_loss, rtol=1e-6)
    assert np.all(np.isfinite(g_first)) and not np.allclose(g_first, empirical, atol=1e-3)
    assert losses[-1] < losses[0]
    with pytest.raises(ValueError, match="trace_threshold=None"):
        ngd.THOR(DenseNet(), 0.05, 0.03, trace_threshold=0.1, fisher="mc", verbose=False)
    with pytest.raises(ValueError, match="trace_threshold=None"):      # the policy's own check, for any optimizer
        ngd.NGDOptimizer(DenseNet(), 0.05, verbose=False, policy=ngd.Policy(
            name="custom", refresh=GrowingInterval(3, trace_threshold=0.1), fisher="mc"))


def test_mc_fisher_trains_in_model_train():
    from benchmarks.data import array_dataset, digits_arrays
    from benchmarks.models import DigitsCNN
    ms.set_seed(0)
    xtr, ytr, xte, yte = digits_arrays()
    net = DigitsCNN()
    opt = ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, fisher="mc", verbose=False)
    model = Model(ngd.MCFisherTrainStep(net, CE, opt), eval_network=nn.WithEvalCell(net, CE),
                  eval_indexes=[0, 1, 2], metrics={"acc"})
    model.train(2, array_dataset(xtr, ytr, 32, shuffle=True), dataset_sink_mode=False)
    acc = model.eval(array_dataset(xte, yte, 120), dataset_sink_mode=False)["acc"]
    assert acc > 0.85
