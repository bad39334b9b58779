"""nn.MultiheadAttention's packed input projection and its out_proj as curvature blocks.

Captured, a self-attention computes what the stock layer computes (loss and every gradient), its input
projection's A and G match a float64 reference built from the stock layer's own weight gradient, and
every optimizer trains a stock nn.TransformerEncoderLayer with both projections preconditioned. The
decoder and training tests are slow (their compiled graphs are large):
``python -m pytest -m "slow or not slow" tests/numerics/test_attention_block.py``."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.capture.discover import READ_DIRECTLY
from mindspore_ngd.capture.attention import SELF_ATTENTION_ONLY
from training import StepLosses, assert_same_state, train_by

B, L, E, HEADS, C = 2, 3, 8, 2, 3
CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class Encoder(nn.Cell):
    """A stock nn.TransformerEncoderLayer (post-LayerNorm, so its attention's input is the layer's input;
    optionally causal), then a classifier on the mean over positions."""

    def __init__(self, causal=False, has_bias=True):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16, dropout=0.0, batch_first=True)
        if not has_bias:
            self.layer.self_attn = nn.MultiheadAttention(E, HEADS, has_bias=False, batch_first=True)
        self.head = nn.Dense(E, C)
        self.mask = Tensor(np.triu(np.full((L, L), -1e9, np.float32), 1)) if causal else None

    def construct(self, x):
        return self.head(self.layer(x, src_mask=self.mask).mean(1))


def _pair(seed, **kwargs):
    """Two networks with the same weights: one to be captured, one left stock."""
    nets = [Encoder(**kwargs) for _ in range(2)]
    rng = np.random.default_rng(seed)
    for params in zip(*(n.trainable_params() for n in nets)):
        value = Tensor((0.5 * rng.standard_normal(params[0].shape)).astype(np.float32))
        for p in params:
            p.set_data(value)
    return nets


def _data(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, L, E)).astype(np.float32), rng.integers(0, C, B).astype(np.int32)


def _loss_and_grads(net, x, y):
    net.set_train()
    fn = ms.value_and_grad(nn.WithLossCell(net, CE), None, net.trainable_params())
    loss, grads = fn(Tensor(x), Tensor(y))
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(net.trainable_params(), grads)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_captured_self_attention_computes_what_the_stock_one_does(causal):
    net, stock = _pair(0, causal=causal)
    opt = ngd.KFAC(net, 0.1, damping=1e-2, verbose=False)
    kinds = {s.name: s.kind for s in opt.layer_specs}
    assert kinds["layer.self_attn"] == "attention" and kinds["layer.self_attn.out_proj"] == "dense"
    assert opt.skipped_layers == ()
    x, y = _data(1)
    loss, grads = _loss_and_grads(net, x, y)
    stock_loss, stock_grads = _loss_and_grads(stock, x, y)
    assert abs(loss - stock_loss) < 1e-6 * abs(stock_loss)
    for name, grad in stock_grads.items():
        np.testing.assert_allclose(grads[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("approx", ["expand", "reduce"])
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
def test_the_input_projection_factors_match_a_float64_reference(has_bias, approx):
    """Expand: A = (1/N) sum_n xbar xbar^T over the N = B L rows of the input; G = N sum_n dy dy^T, with
    dy the gradient of the mean loss w.r.t. the packed projection's output rows. Reduce (Eschenhagen et
    al. 2023): A = (1/B) sum_b abar_b abar_b^T with abar_b the mean of sequence b's rows, G = N sum_b s_b
    s_b^T with s_b the sum of its rows' dy. With N <= E + 1 the stock layer's weight gradient
    dW = dY^T Xbar determines dY (Xbar has full row rank)."""
    net, stock = _pair(2, has_bias=has_bias)
    x, y = _data(3)
    _, stock_grads = _loss_and_grads(stock, x, y)
    stock_grads = {name.split(".")[-1]: g for name, g in stock_grads.items() if ".self_attn." in name or
                   name.split(".")[-1].startswith("in_proj")}
    rows = x.astype(np.float64).reshape(-1, E)
    if has_bias:
        rows = np.concatenate([rows, np.ones((rows.shape[0], 1))], axis=1)
        d_w = np.concatenate([stock_grads["in_proj_weight"], stock_grads["in_proj_bias"][:, None]], axis=1)
    else:
        d_w = stock_grads["in_proj_weight"]
    d_w = d_w.astype(np.float64)
    n = rows.shape[0]
    d_y = np.linalg.solve(rows @ rows.T, rows @ d_w.T)            # (N, 3E): dW = dY^T Xbar
    opt = ngd.KFAC(net, 0.1, damping=1e-2, verbose=False, sequence_approx=approx)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    step(Tensor(x), Tensor(y))
    block = next(b for b in opt.blocks if b.spec.kind == "attention")
    a, g = (f.asnumpy().astype(np.float64) for f in block.factors())
    assert a.shape == (E + int(has_bias),) * 2 and g.shape == (3 * E, 3 * E)
    if approx == "reduce":                          # rows are (b, l) in order: x is (B, L, E)
        rows = rows.reshape(B, L, -1).mean(axis=1)
        d_y = d_y.reshape(B, L, -1).sum(axis=1)
    np.testing.assert_allclose(a, rows.T @ rows / rows.shape[0], rtol=1e-5, atol=1e-6)
    want = n * d_y.T @ d_y
    assert np.linalg.norm(g - want) < 1e-4 * np.linalg.norm(want)
    assert opt.demoted_layers() == []


class UserAttention(nn.Cell):
    """A self-attention of the user's own model: an nn.MultiheadAttention called ``attn(x, x, x)``, or
    (``wrapped``) a SelfAttention called ``attn(x)``; then a classifier on the mean over positions."""

    def __init__(self, wrapped):
        super().__init__()
        self.attn = (ngd.SelfAttention if wrapped else nn.MultiheadAttention)(E, HEADS, batch_first=True)
        self.head = nn.Dense(E, C)
        self.wrapped = wrapped

    def construct(self, x):
        if self.wrapped:
            out = self.attn(x, need_weights=False)[0]
        else:
            out = self.attn(x, x, x, need_weights=False)[0]
        return self.head(out.mean(1))


def test_a_self_attention_cell_of_ones_own_is_preconditioned_against_the_float64_reference():
    wrapped, called, stock = UserAttention(True), UserAttention(False), UserAttention(False)
    names = [p.name for p in wrapped.trainable_params()]
    assert names == [p.name for p in stock.trainable_params()]          # the same checkpoint keys
    rng = np.random.default_rng(4)
    for params in zip(wrapped.trainable_params(), called.trainable_params(), stock.trainable_params()):
        value = Tensor((0.5 * rng.standard_normal(params[0].shape)).astype(np.float32))
        for p in params:
            p.set_data(value)
    # the stock layer called by user code gets the plain update, and the reason names the way out
    skipped = dict(ngd.KFAC(called, 0.1, damping=1e-2, verbose=False).skipped_layers)
    assert skipped["attn"] == SELF_ATTENTION_ONLY and "mindspore_ngd.SelfAttention" in SELF_ATTENTION_ONLY
    opt = ngd.KFAC(wrapped, 0.1, damping=1e-2, verbose=False)
    assert {s.name: s.kind for s in opt.layer_specs} == {"attn": "attention", "attn.out_proj": "dense",
                                                         "head": "dense"}
    assert opt.skipped_layers == ()
    x, y = _data(5)
    loss, grads = _loss_and_grads(wrapped, x, y)                # captured: the stock values
    stock_loss, stock_grads = _loss_and_grads(stock, x, y)
    assert abs(loss - stock_loss) < 1e-6 * abs(stock_loss)
    for name, grad in stock_grads.items():
        np.testing.assert_allclose(grads[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)
    # A and G of the packed input projection (K-FAC-expand), as in the encoder's test above
    rows = np.concatenate([x.astype(np.float64).reshape(-1, E), np.ones((B * L, 1))], axis=1)
    d_w = np.concatenate([stock_grads["attn.in_proj_weight"], stock_grads["attn.in_proj_bias"][:, None]], axis=1)
    d_y = np.linalg.solve(rows @ rows.T, rows @ d_w.astype(np.float64).T)
    step = nn.TrainOneStepCell(nn.WithLossCell(wrapped, CE), opt)
    step.set_train()
    step(Tensor(x), Tensor(y))
    a, g = (f.asnumpy().astype(np.float64) for f in opt.blocks[0].factors())
    np.testing.assert_allclose(a, rows.T @ rows / rows.shape[0], rtol=1e-5, atol=1e-6)
    want = rows.shape[0] * d_y.T @ d_y
    assert np.linalg.norm(g - want) < 1e-4 * np.linalg.norm(want)
    assert opt.demoted_layers() == []
    wrapped.set_train(False)                                     # inference: the stock computation
    stock.set_train(False)
    after = {p.name: p.data for p in wrapped.trainable_params()}
    for p in stock.trainable_params():
        p.set_data(after[p.name].copy())
    np.testing.assert_allclose(wrapped(Tensor(x)).asnumpy(), stock(Tensor(x)).asnumpy(), rtol=1e-6, atol=1e-7)


def _self_attention_state(how):
    """Three THOR steps on UserAttention(wrapped=True), by ``how`` ("model": Model.train; "jit": MindSpore's
    functional loop under ms.jit, ``ms.value_and_grad`` then ``opt(grads)``): every weight and optimizer
    Parameter by name."""
    ms.set_seed(3)
    net = UserAttention(True)
    opt = ngd.THOR(net, 0.05, 1e-2, frequency=2, verbose=False)
    state = train_by(how, net, opt, [_data(20 + i) for i in range(3)], CE)
    assert opt.demoted_layers() == [] and tuple(opt.factor_updates()["attn"]) == (2, 2)
    return state


def test_the_functional_loop_trains_a_self_attention_cell_as_model_train():
    assert_same_state(_self_attention_state("jit"), _self_attention_state("model"), "Model.train")


def test_self_attention_refuses_a_key_or_value_size_of_its_own():
    with pytest.raises(ValueError, match="kdim must be None or embed_dim=8"):
        ngd.SelfAttention(E, HEADS, kdim=4)


@pytest.mark.slow
def test_only_the_self_attention_of_stock_transformer_layers_is_captured_and_the_rest_say_why():
    class Mixed(nn.Cell):
        def __init__(self):
            super().__init__()
            self.decoder = nn.TransformerDecoderLayer(E, HEADS, dim_feedforward=16, dropout=0.0, batch_first=True)
            self.attn = nn.MultiheadAttention(E, HEADS, batch_first=True)             # called by user code
            self.other = nn.MultiheadAttention(E, HEADS, kdim=4, vdim=4, batch_first=True)
            self.head = nn.Dense(E, C)

        def construct(self, x, memory):
            out = self.decoder(x, memory) + self.attn(x, memory, memory, need_weights=False)[0]
            out = out + self.other(x, memory[:, :, :4], memory[:, :, :4], need_weights=False)[0]
            return self.head(out.mean(1))

    net = Mixed()
    opt = ngd.KFAC(net, 0.1, damping=1e-2, verbose=False)
    skipped = dict(opt.skipped_layers)
    assert skipped["decoder.multihead_attn"] == SELF_ATTENTION_ONLY           # the decoder's cross-attention
    assert skipped["attn"] == skipped["other"] == SELF_ATTENTION_ONLY
    for name in ("decoder.multihead_attn.out_proj", "attn.out_proj", "other.out_proj"):
        assert skipped[name] == READ_DIRECTLY
    assert {"decoder.self_attn", "decoder.self_attn.out_proj"} <= {s.name for s in opt.layer_specs}
    rng = np.random.default_rng(0)
    x, memory = (Tensor(rng.standard_normal((B, L, E)).astype(np.float32)) for _ in range(2))
    y = Tensor(rng.integers(0, C, B).astype(np.int32))

    class WithLoss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = net

        def construct(self, x, memory, y):
            return CE(self.net(x, memory), y)

    step = nn.TrainOneStepCell(WithLoss(), opt)
    step.set_train()
    for _ in range(2):
        assert np.isfinite(step(x, memory, y).asnumpy())
    assert opt.demoted_layers() == []


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda net: ngd.KFAC(net, 0.05, damping=1e-2, verbose=False),
    lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, verbose=False),
    lambda net: ngd.THOR(net, learning_rate=0.05, damping=1e-2, momentum=0.9, frequency=4, verbose=False),
], ids=["kfac", "spngd", "thor"])
def test_every_optimizer_trains_a_stock_encoder_layer_with_its_attention_preconditioned(make):
    from benchmarks.embedding_choice import TokenEncoder, token_task
    from mindspore.train import Model
    ms.set_seed(2)
    tokens, labels = token_task(2)
    net = TokenEncoder()
    opt = make(net)
    names = [s.name for s in opt.layer_specs]
    assert "layer.self_attn" in names and "layer.self_attn.out_proj" in names
    losses = StepLosses()
    data = ms.dataset.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(32)
    Model(net, CE, opt).train(4, data, callbacks=[losses], dataset_sink_mode=False)
    assert np.isfinite(losses.values).all()
    assert np.mean(losses.values[-8:]) < 0.7 * np.mean(losses.values[:8]), losses.values
    assert opt.demoted_layers() == [] and int(opt.factor_faults.asnumpy()) == 0
