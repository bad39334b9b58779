"""LayerNorm preconditioned unit-wise by SP-NGD (issue 35), against a float64 reference written by hand.

A LayerNorm over the last axis of a (B, R, D) sequence is y = gamma * xhat + beta per position, with
xhat each position's features centred and divided by their (biased) standard deviation. Each feature d is
a unit with the parameters (gamma_d, beta_d); one example's gradients sum over its positions,

    g_gamma[b, d] = sum_r xhat[b, r, d] dy[b, r, d],    g_beta[b, d] = sum_r dy[b, r, d],

(dy the gradient of the example's own loss), and SP-NGD's unit-wise Fisher of feature d is the 2x2 mean
over the batch of [g_gamma, g_beta][g_gamma, g_beta]^T, as for a BatchNorm channel (Osawa et al. 2020,
sec. 4.3). The update of (gamma_d, beta_d) is (F_d + damping I)^-1 times their gradient."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor
from mindspore.train import Model
import mindspore.dataset as ds

import mindspore_ngd as ngd
from benchmarks.embedding_choice import TokenEncoder, token_task
from mindspore_ngd.capture import find_layernorms
from nets import set_weights
from reference import numpy_kfac as ref
from training import train_step

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
B, R, D_IN, D, CLASSES = 5, 4, 3, 6, 3


class SeqNet(nn.Cell):
    """Dense on a sequence -> LayerNorm over the features -> Dense -> mean over positions: logits."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Dense(D_IN, D)
        self.norm = nn.LayerNorm((D,), epsilon=1e-5)
        self.head = nn.Dense(D, CLASSES)

    def construct(self, x):
        return self.head(self.norm(self.embed(x))).mean(1)


def _reference(net, x, labels, damping):
    """float64 by hand: the Fisher entries (D, 3) of the LayerNorm and the natural gradient of
    (gamma, beta), (D, 2)."""
    f64 = lambda p: p.asnumpy().astype(np.float64)           # noqa: E731
    w1, b1, gamma, beta = f64(net.embed.weight), f64(net.embed.bias), f64(net.norm.gamma), f64(net.norm.beta)
    w2 = f64(net.head.weight)
    z = x.astype(np.float64) @ w1.T + b1                      # (B, R, D)
    centred = z - z.mean(-1, keepdims=True)
    xhat = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5)
    y = gamma * xhat + beta
    logits = (y @ w2.T + f64(net.head.bias)).mean(1)
    _, dlogits = ref.softmax_ce(logits, labels)               # of the mean loss
    dy = np.broadcast_to((dlogits[:, None, :] / R) @ w2, (B, R, D))    # of the mean loss
    g_gamma = (dy * xhat).sum(1) * B                           # per example: of its own loss
    g_beta = dy.sum(1) * B
    fisher = np.stack([(g_gamma ** 2).mean(0), (g_gamma * g_beta).mean(0), (g_beta ** 2).mean(0)], 1)
    grad = np.stack([g_gamma.mean(0), g_beta.mean(0)], 1)
    natural = np.stack([np.linalg.solve(np.array([[f[0], f[1]], [f[1], f[2]]]) + damping * np.eye(2), g)
                        for f, g in zip(fisher, grad)])
    return fisher, grad, natural


def _case(seed=0):
    ms.set_seed(seed)
    net = SeqNet()
    rng = np.random.default_rng(seed + 3)
    set_weights(net, rng)
    net.norm.gamma.set_data(Tensor(rng.uniform(0.5, 1.5, D).astype(np.float32)))
    x = rng.standard_normal((B, R, D_IN)).astype(np.float32)
    labels = rng.integers(0, CLASSES, B).astype(np.int32)
    return net, x, labels


def test_layernorm_fisher_and_step_equal_the_float64_reference():
    net, x, labels = _case()
    damping, lr = 1e-2, 0.1
    fisher, grad, natural = _reference(net, x, labels, damping)
    gamma0, beta0 = net.norm.gamma.asnumpy().copy(), net.norm.beta.asnumpy().copy()
    opt = ngd.SPNGD(net, learning_rate=lr, damping=1e-2, momentum=0.0, batchnorm_damping=damping, kl_clip=None,
                    verbose=False)
    assert [block.spec.kind for block in opt.norm_blocks] == ["layernorm"]
    train_step(net, opt)(Tensor(x), Tensor(labels))
    np.testing.assert_allclose(opt.norm_blocks[0].fisher.asnumpy(), fisher, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose((gamma0 - net.norm.gamma.asnumpy()) / lr, natural[:, 0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose((beta0 - net.norm.beta.asnumpy()) / lr, natural[:, 1], rtol=1e-4, atol=1e-6)
    assert not np.allclose(natural, grad, rtol=0.1)      # the preconditioning is not a no-op here


def test_the_probe_leaves_the_forward_pass_and_the_gradients_unchanged():
    x, labels = _case()[1:]
    nets = [_case()[0] for _ in range(2)]
    ngd.SPNGD(nets[1], learning_rate=0.1, verbose=False)
    outputs, grads = [], []
    for net in nets:
        net.set_train()
        outputs.append(net(Tensor(x)).asnumpy())
        grads.append(ops.GradOperation(get_by_list=True)(nn.WithLossCell(net, CE), net.trainable_params())(
            Tensor(x), Tensor(labels)))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-6, atol=1e-7)
    for plain, probed in zip(*grads):
        np.testing.assert_allclose(probed.asnumpy(), plain.asnumpy(), rtol=1e-5, atol=1e-7)


def test_only_layernorms_over_the_last_axis_are_taken_and_the_others_are_named():
    class Norms(nn.Cell):
        def __init__(self):
            super().__init__()
            self.last = nn.LayerNorm((6,))
            self.two_axes = nn.LayerNorm((4, 6), begin_norm_axis=-2, begin_params_axis=-2)
            self.frozen = nn.LayerNorm((6,))
            self.frozen.gamma.requires_grad = False

    specs, cells, skipped = find_layernorms(Norms())
    assert [(s.name, s.kind, s.channels) for s in specs] == [("last", "layernorm", 6)]
    reasons = dict(skipped)
    assert "normalises more than the last axis" in reasons["two_axes"]
    assert reasons["frozen"] == "gamma/beta not trainable"
    # K-FAC and THOR leave LayerNorm to the plain update, as they do BatchNorm
    assert ngd.KFAC(SeqNet(), learning_rate=0.1, verbose=False).norm_blocks == ()


# a token classifier on MindSpore's stock nn.TransformerEncoderLayer (two LayerNorms), and its task
TinyEncoder = TokenEncoder


def test_spngd_trains_a_stock_transformer_encoder_layer_in_model_train():
    """The label is whether token 1 occurs in the sequence: SP-NGD preconditions both LayerNorms unit-wise
    and the training loss falls."""
    ms.set_seed(0)
    tokens, labels = token_task(0)
    net = TinyEncoder()
    opt = ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, verbose=False)
    assert sorted(block.spec.name for block in opt.norm_blocks) == ["layer.norm1", "layer.norm2"]
    losses = []

    class Record(ms.train.Callback):
        def on_train_step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(32)
    Model(net, loss_fn=CE, optimizer=opt).train(4, data, callbacks=[Record()], dataset_sink_mode=False)
    assert np.isfinite(losses).all()
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8]), losses
    for block in opt.norm_blocks:
        assert np.abs(block.fisher.asnumpy()).sum() > 0
