"""nn.Embedding as a curvature block: A is the diagonal of the tokens' frequencies, kept as a vector, G a
Dense layer's over the looked-up rows. Factors and the preconditioned step against a float64 NumPy
reference; every optimizer trains a small token model with it in Model.train (slow:
``python -m pytest -m "slow or not slow" tests/numerics/test_embedding_block.py``)."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from mindspore_ngd.curvature import factors
from mindspore_ngd.parallel.plan import WorkItem
from training import StepLosses, assert_same_state, one_step_update, train_by, train_step

V, D, B, R, C = 11, 4, 3, 5, 3
TOL = 2e-5


class TokenNet(nn.Cell):
    """Embedding (V, D), then a Dense layer on every position; each position's logits a row of the loss."""

    def __init__(self, rng, use_one_hot=False):
        super().__init__()
        self.embed = nn.Embedding(V, D, use_one_hot=use_one_hot)
        self.head = nn.Dense(D, C)
        self.embed.embedding_table.set_data(Tensor(rng.standard_normal((V, D)).astype(np.float32)))
        for p in (self.head.weight, self.head.bias):
            p.set_data(Tensor((0.7 * rng.standard_normal(p.shape)).astype(np.float32)))

    def construct(self, ids):
        return self.head(self.embed(ids)).reshape(-1, C)


def _data(seed, vocab=V):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (B, R)).astype(np.int32)
    ids[0, :3] = 2                                        # a repeated token, and (with V > B R / 2) unseen ones
    return rng, ids, rng.integers(0, C, B * R).astype(np.int32)


def _forward(net, ids, y):
    """float64: the looked-up rows, the head's input with a 1 appended, and the gradients of the mean
    cross-entropy w.r.t. the rows and the logits."""
    table = net.embed.embedding_table.asnumpy().astype(np.float64)
    w, b = (p.asnumpy().astype(np.float64) for p in (net.head.weight, net.head.bias))
    rows = table[ids.reshape(-1)]
    z = rows @ w.T + b
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    n = rows.shape[0]
    dz = (p - np.eye(C)[y]) / n
    return rows, dz @ w, dz


def reference_factors(net, ids, y):
    rows, drows, dz = _forward(net, ids, y)
    n = rows.shape[0]
    counts = np.bincount(ids.reshape(-1), minlength=V).astype(np.float64)
    head_a = np.concatenate([rows, np.ones((n, 1))], axis=1)
    return [(counts / n, n * drows.T @ drows), (head_a.T @ head_a / n, n * dz.T @ dz)]


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("use_one_hot", [False, True], ids=["gather", "one-hot"])
def test_embedding_factors_match_the_float64_reference(use_one_hot):
    rng, ids, y = _data(0)
    net = TokenNet(rng, use_one_hot)
    expected = reference_factors(net, ids, y)
    opt = ngd.KFAC(net, 0.05, damping=1e-2, verbose=False, precondition_embeddings=True)
    assert [b.spec.kind for b in opt.blocks] == ["embedding", "dense"]
    train_step(net, opt)(Tensor(ids), Tensor(y))
    a, g = (f.asnumpy() for f in opt.blocks[0].factors())
    assert a.shape == (V,) and g.shape == (D, D)
    assert _rel(a, expected[0][0]) < TOL and _rel(g, expected[0][1]) < TOL
    assert (a[np.bincount(ids.reshape(-1), minlength=V) == 0] == 0).all()
    for got, want in zip(opt.blocks[1].factors(), expected[1]):
        assert _rel(got.asnumpy(), want) < TOL


@pytest.mark.parametrize("split", ["pi", "sqrt"])
def test_one_step_is_the_diagonal_kronecker_natural_gradient(split):
    """lr 1, no momentum: the table moves by ``-diag(a + s_a)^-1 dW (G + s_g I)^-1``, the head by its own
    K-FAC step, with the damping split of the diagonal A read as the diagonal matrix it is."""
    damping = 3e-2
    rng, ids, y = _data(1)
    net = TokenNet(rng)
    (a, g), (head_a, head_g) = reference_factors(net, ids, y)
    rows, drows, dz = _forward(net, ids, y)
    d_table = np.zeros((V, D))
    np.add.at(d_table, ids.reshape(-1), drows)
    head_rows = np.concatenate([rows, np.ones((rows.shape[0], 1))], axis=1)
    d_head = dz.T @ head_rows                                  # (C, D + 1): [dW | db]

    def shifts(trace_a, dim_a, trace_g, dim_g):
        root = np.sqrt(damping)
        if split == "sqrt":
            return root, root
        pi = np.sqrt((trace_a / dim_a) / (trace_g / dim_g))
        return pi * root, root / pi

    s_a, s_g = shifts(a.sum(), V, np.trace(g), D)
    jitter = 1e-6
    want_table = -(d_table / (a + s_a + jitter * a.sum())[:, None]) @ np.linalg.inv(g + (s_g + jitter * np.trace(g)) * np.eye(D))
    s_a, s_g = shifts(np.trace(head_a), D + 1, np.trace(head_g), C)
    want_head = -np.linalg.inv(head_g + (s_g + jitter * np.trace(head_g)) * np.eye(C)) @ d_head \
        @ np.linalg.inv(head_a + (s_a + jitter * np.trace(head_a)) * np.eye(D + 1))
    moved = one_step_update(net, ids, y, split, damping, precondition_embeddings=True)
    assert _rel(moved[net.embed.embedding_table.name], want_table) < 1e-4
    assert _rel(np.concatenate([moved[net.head.weight.name], moved[net.head.bias.name][:, None]], axis=1),
                want_head) < 1e-4
    # a token that is not in the batch has no gradient and does not move
    unseen = np.bincount(ids.reshape(-1), minlength=V) == 0
    assert unseen.any() and (moved[net.embed.embedding_table.name][unseen] == 0).all()


def test_the_input_factor_counts_only_ids_inside_the_vocabulary():
    ids = Tensor(np.array([0, 3, 3, -1, 11, 10, 3, 0], np.int32))
    got = factors.embedding_input_factor(ids, V).asnumpy()
    want = np.bincount([0, 3, 3, 10, 3, 0], minlength=V) / 8.0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert abs(float(factors.embedding_input_trace(ids, V).asnumpy()) - 6 / 8) < 1e-7
    half = factors.embedding_input_factor(ids, V, fraction=0.5).asnumpy()      # the first 4 ids
    np.testing.assert_allclose(half, np.bincount([0, 3, 3], minlength=V) / 4.0, rtol=0, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda net: ngd.KFAC(net, 0.1, damping=1e-2, verbose=False, precondition_embeddings=True),
    lambda net: ngd.SPNGD(net, 0.1, damping=1e-2, verbose=False, precondition_embeddings=True),
    lambda net: ngd.THOR(net, learning_rate=0.1, damping=Tensor(np.full(100, 1e-2, np.float32)), momentum=0.9,
                         frequency=2, split_dim=4, verbose=False, precondition_embeddings=True),
], ids=["kfac", "spngd", "thor-split"])
def test_every_optimizer_trains_a_token_model_with_a_preconditioned_embedding_in_model_train(make):
    rng = np.random.default_rng(2)
    vocab, classes = 32, 4
    net = nn.SequentialCell([nn.Embedding(vocab, 8), nn.Flatten(), nn.Dense(8 * 6, classes)])
    ids = rng.integers(0, vocab, (96, 6)).astype(np.int32)
    y = (ids[:, 0] % classes).astype(np.int32)                 # the first token's class
    opt = make(net)
    assert opt.blocks[0].spec.kind == "embedding"
    data = ms.dataset.NumpySlicesDataset({"x": ids, "y": y}, shuffle=False).batch(32)
    losses = StepLosses()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
    model.train(4, data, callbacks=[losses], dataset_sink_mode=False)
    assert losses.values[-1] < 0.6 * losses.values[0], losses.values
    inverse = opt.blocks[0].a_inverse.asnumpy()
    assert inverse.shape == (vocab,) and not np.allclose(inverse, 1.0)       # refreshed, not the initial identity
    assert int(opt.factor_faults.asnumpy()) == 0 and int(opt.inverse_faults.asnumpy()) == 0
    assert not opt.counters.demoted.asnumpy().any()
    assert "8 (diagonal)" not in opt.summary() and f"{vocab} (diagonal)" in opt.summary()


def test_the_layer_spec_tells_the_ownership_plan_that_the_embedding_a_is_diagonal():
    # distributed, the exchange carries the (vocab,) diagonal and the (vocab, dim) step
    # (tests/distributed/test_distributed_training.py trains it on two msrun ranks)
    specs, _, _ = ngd.capture.find_layers(TokenNet(np.random.default_rng(0)))
    assert [(s.name, s.a_diagonal) for s in specs] == [("embed", True), ("head", False)]
    item = WorkItem.of(specs[0])
    assert item.a_diagonal and item.matrix_shape == (V, D) and item.factor_sizes() == [V, D * (D + 1) // 2]
    assert item.costs() == V + D ** 3 and item.costs("memory") == V + D ** 2


def _token_state(how):
    """Four K-FAC steps on the token model, by ``how`` ("model": Model.train; "jit" or "loop": MindSpore's
    functional loop, ``ms.value_and_grad`` then ``opt(grads)``, with and without ``ms.jit``): every weight
    and optimizer Parameter by name."""
    rng, _, _ = _data(0)
    net = TokenNet(rng)
    opt = ngd.KFAC(net, 0.1, damping=1e-2, verbose=False, precondition_embeddings=True)
    batches = [_data(10 + i)[1:] for i in range(4)]      # one batch: ids (B, R), labels (B R,)
    state = train_by(how, net, opt, batches)
    assert opt.demoted_layers() == [] and all(a > 0 and g > 0 for a, g in opt.factor_updates().values())
    return state


def test_the_functional_loop_under_jit_trains_the_embedding_as_model_train():
    assert_same_state(_token_state("jit"), _token_state("model"))


def test_the_functional_loop_in_pynative_trains_the_embedding_as_model_train(pynative):
    assert_same_state(_token_state("loop"), _token_state("model"))


def test_precondition_embeddings_false_leaves_them_to_the_plain_update_and_names_the_reason(caplog):
    import logging
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        opt = ngd.SPNGD(TokenNet(rng), 0.1, damping=1e-2, precondition_embeddings=False)
    assert [b.spec.name for b in opt.blocks] == ["head"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("precondition_embeddings=False: embed" in line for line in warned), warned
    for make in (ngd.KFAC, ngd.SPNGD):                                       # the default: preconditioned
        assert [b.spec.name for b in make(TokenNet(rng), 0.1, verbose=False).blocks] == ["embed", "head"]
    assert [b.spec.name for b in ngd.THOR(TokenNet(rng), learning_rate=0.1, damping=1e-2, verbose=False).blocks] == \
        ["embed", "head"]
    with pytest.raises(TypeError, match="precondition_embeddings must be a bool, got str"):
        ngd.KFAC(TokenNet(rng), 0.1, precondition_embeddings="yes")
