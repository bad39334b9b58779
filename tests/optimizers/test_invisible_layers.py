"""No invisible layers: every trainable layer is either preconditioned from factors it actually
captured or gets exactly the plain update, and the user is told which and why.

- construction: one WARNING line naming every non-normalisation layer left to the plain update,
  grouped by reason (normalisation layers are expected there and only named at INFO);
- first capture step: a preconditioned layer that captured nothing (construct never called) is demoted
  with a WARNING, or ``strict=True`` raises;
- the judge: a stock ``nn.TransformerEncoderLayer`` with a Dense head, one K-FAC step. Its attention's
  packed input projection and its ``out_proj`` (which the stock attention reads without calling it) are
  captured by the attention's capturing construct and preconditioned like every Dense layer;
- the package logger reaches the user by default and defers to the application's logging.
"""
import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

import mindspore_ngd as ngd
from reference import numpy_kfac as ref

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class StepWithGrads(nn.TrainOneStepCell):
    """TrainOneStepCell that also returns the gradients it handed to the optimizer."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        return ops.depend(grads, self.optimizer(grads))


def one_step(net, opt, x, y):
    """Weights before and after one step, and the gradients the optimizer got, by parameter name."""
    step = StepWithGrads(nn.WithLossCell(net, CE), opt)
    step.set_train()
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    grads = step(Tensor(x), Tensor(y))
    grads = {p.name: g.asnumpy().copy() for p, g in zip(net.trainable_params(), grads)}
    after = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    return before, after, grads, step


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "mindspore_ngd" and r.levelno == logging.WARNING]


# ------------------------------------------------------------------ the judge: a stock Transformer layer
class Transformer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Dense(8, 3)

    def construct(self, x):
        return self.head(self.encoder(x).mean(1))


def test_transformer_every_update_is_captured_preconditioning_or_exactly_plain(caplog):
    ms.set_seed(0)
    net = Transformer()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 8)).astype(np.float32)
    y = rng.integers(0, 3, 4).astype(np.int32)
    damping = 1e-3
    # the head's input before the step (dropout 0: evaluation computes what training does)
    net.set_train(False)
    features = net.encoder(Tensor(x)).asnumpy().astype(np.float64).mean(1)
    with caplog.at_level(logging.INFO, logger="mindspore_ngd"):
        opt = ngd.KFAC(net, learning_rate=1.0, momentum=0.0, damping=damping, kl_clip=None)
        construction = warnings_of(caplog)
        before, after, grads, step = one_step(net, opt, x, y)
        at_step = warnings_of(caplog)[len(construction):]

    # construction: nothing to warn about. The attention's packed input projection is a layer of its own
    # and its out_proj is called as a layer (tests/numerics/test_attention_block.py); LayerNorm's plain
    # update is not warned about
    assert construction == []
    assert at_step == []
    factors = opt.kronecker_factors()
    preconditioned = {s.name: s for s in opt.layer_specs}
    assert sorted(preconditioned) == ["encoder.dense1", "encoder.dense2", "encoder.self_attn",
                                      "encoder.self_attn.out_proj", "head"]
    covered = set()
    for name, spec in preconditioned.items():
        big_a, big_g = (f.astype(np.float64) for f in factors[name])
        # factors actually captured: finite, non-zero traces
        assert np.isfinite(big_a).all() and np.isfinite(big_g).all()
        assert np.trace(big_a) > 0 and np.trace(big_g) > 0, name
        grad = np.concatenate([grads[spec.weight_name], grads[spec.bias_name][:, None]], axis=1)
        p = ref.preconditioned(big_a, big_g, grad.astype(np.float64), damping, "pi", jitter=1e-6)
        delta = np.concatenate([after[spec.weight_name] - before[spec.weight_name],
                                (after[spec.bias_name] - before[spec.bias_name])[:, None]], axis=1)
        # float32 inverses at damping 1e-3 (condition numbers up to ~1e3): 1e-4 norm-wise
        assert ref.rel_err(delta, -p) < 1e-4, (name, ref.rel_err(delta, -p))
        # and not the plain step: preconditioning changed it
        assert ref.rel_err(delta, -grad) > 0.5, name
        covered |= {spec.weight_name, spec.bias_name}

    # the head's factors against an independent NumPy reference from its input features
    w, b = before["head.weight"].astype(np.float64), before["head.bias"].astype(np.float64)
    _, dlogits = ref.softmax_ce(features @ w.T + b, y)
    big_a, big_g = ref.dense_factors(features, dlogits, True)
    assert ref.rel_err(factors["head"][0], big_a) < 1e-5
    assert ref.rel_err(factors["head"][1], big_g) < 1e-5

    # every other weight: exactly the plain step w - lr * grad (lr 1, momentum 0), bit for bit
    plain = [name for name in before if name not in covered]
    assert sorted(plain) == sorted(["encoder.norm1.gamma", "encoder.norm1.beta", "encoder.norm2.gamma",
                                    "encoder.norm2.beta"])
    for name in plain:
        np.testing.assert_array_equal(after[name], before[name] - grads[name], err_msg=name)

    # later steps: no warning, nothing demoted (every preconditioned layer captured its factors)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        step(Tensor(x), Tensor(y))
        step(Tensor(x), Tensor(y))
    assert warnings_of(caplog) == []
    assert opt.demoted_layers() == []


# ------------------------------------------------------------------ demotion on a small net
class Peeking(nn.Cell):
    """``proj`` is read like MultiheadAttention's out_proj (weight used directly, construct never
    called); ``dead`` runs but its output is multiplied by zero: a genuinely zero G, still captured."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 3)
        self.proj = nn.Dense(3, 3)
        self.dead = nn.Dense(3, 3)

    def construct(self, x):
        h = ops.relu(self.fc(x))
        return ops.matmul(h, self.proj.weight.T) + self.proj.bias + 0.0 * self.dead(h)


def peeking_batch():
    rng = np.random.default_rng(1)
    return rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int32)


def test_demoted_layer_gets_exactly_the_plain_step_under_kl_clip_and_momentum(tmp_path, caplog):
    ms.set_seed(1)
    net = Peeking()
    opt = ngd.KFAC(net, learning_rate=0.5, momentum=0.9, damping=1e-2, kl_clip=1e-6, verbose=False)
    x, y = peeking_batch()
    before, after, grads, step = one_step(net, opt, x, y)
    # a zero output gradient is still a capture: dead is not demoted
    assert opt.demoted_layers() == ["proj"]
    assert float(np.trace(opt.kronecker_factors()["dead"][1])) == 0.0
    lr = np.float32(0.5)
    for name in ("proj.weight", "proj.bias"):
        # first step of nn.Momentum: accumulation = grad; w - lr * grad, outside the KL budget
        np.testing.assert_array_equal(after[name], before[name] - lr * grads[name], err_msg=name)
    # the KL budget holds the preconditioned layers only (dead's gradient is zero): the step of fc is
    # -lr * nu * P with nu = sqrt(kl_clip / (lr^2 <P, grad>)); with proj inside it nu would be smaller
    big_a, big_g = (f.astype(np.float64) for f in opt.kronecker_factors()["fc"])
    grad = np.concatenate([grads["fc.weight"], grads["fc.bias"][:, None]], axis=1).astype(np.float64)
    p = ref.preconditioned(big_a, big_g, grad, 1e-2, "pi", jitter=1e-6)
    delta = np.concatenate([after["fc.weight"] - before["fc.weight"], (after["fc.bias"] - before["fc.bias"])[:, None]],
                           axis=1)
    vg = 0.25 * (p * grad).sum()
    nu, nu_with_proj = np.sqrt(1e-6 / vg), np.sqrt(1e-6 / (vg + 0.25 * sum((grads[n] ** 2).sum() for n in
                                                                         ("proj.weight", "proj.bias"))))
    assert nu < 0.1 and abs(nu_with_proj / nu - 1) > 1e-2
    assert ref.rel_err(delta, -0.5 * nu * p) < 1e-3, (ref.rel_err(delta, -0.5 * nu * p), nu, nu_with_proj)

    # reported once, at the start of the next step
    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        step(Tensor(x), Tensor(y))
        step(Tensor(x), Tensor(y))
    assert [m.split(": ")[1] for m in warnings_of(caplog)] == [
        "1 preconditioned layer(s) captured no statistics on their first capture step"]

    # the demotion is state: in the optimizer's checkpoint under a stable name, restored on load
    path = str(tmp_path / "opt.ckpt")
    ms.save_checkpoint(opt, path)
    saved = ms.load_checkpoint(path)
    order = [s.name for s in opt.layer_specs]
    demoted = dict(zip(order, saved["kfac.demoted"].asnumpy().tolist()))
    assert demoted["proj"] and not demoted["fc"]
    fresh = ngd.KFAC(Peeking(), learning_rate=0.5, verbose=False)
    assert fresh.demoted_layers() == []
    ms.load_param_into_net(fresh, saved)
    assert fresh.demoted_layers() == ["proj"]


@pytest.mark.parametrize("make", [
    lambda net: ngd.SPNGD(net, learning_rate=0.5, momentum=0.0, verbose=False),
    lambda net: ngd.THOR(net, learning_rate=0.5, damping=1e-3, momentum=0.0, frequency=2, trace_threshold=0.1,
                         split_dim=2, verbose=False)], ids=["SPNGD", "THOR-trace-split"])
def test_spngd_and_thor_demote_alike(make):
    ms.set_seed(1)
    net = Peeking()
    opt = make(net)
    x, y = peeking_batch()
    before, after, grads, step = one_step(net, opt, x, y)
    for name in ("proj.weight", "proj.bias"):
        np.testing.assert_array_equal(after[name], before[name] - np.float32(0.5) * grads[name], err_msg=name)
    for _ in range(3):                         # per-statistic intervals / trace probes / block split keep going
        step(Tensor(x), Tensor(y))
    assert opt.demoted_layers() == ["proj"]
    counters = opt.state_counters()
    assert counters["factor_faults"] == counters["inverse_faults"] == counters["skipped_steps"] == 0
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_strict_raises_naming_the_layer():
    net = Peeking()
    opt = ngd.KFAC(net, learning_rate=0.1, strict=True, verbose=False)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    x, y = peeking_batch()
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    step(Tensor(x), Tensor(y))                 # the first step demotes: proj already gets the plain update
    assert opt.demoted_layers() == ["proj"]
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params()) and before
    with pytest.raises(RuntimeError, match=r"KFAC: 1 preconditioned layer\(s\) captured no statistics on their "
                                           r"first capture step: proj\..*strict=True: name them in skip_layers"):
        step(Tensor(x), Tensor(y))


@pytest.mark.parametrize("make", [ngd.KFAC, ngd.SPNGD, lambda net, **kw: ngd.THOR(net, damping=1e-3, **kw)],
                         ids=["KFAC", "SPNGD", "THOR"])
def test_strict_must_be_a_bool(make):
    with pytest.raises(TypeError, match="strict must be a bool, got str"):
        make(Peeking(), learning_rate=0.1, strict="yes", verbose=False)


# ------------------------------------------------------------------ the construction warning
class Scale(nn.Cell):
    """A custom cell with its own parameter."""

    def __init__(self):
        super().__init__()
        self.alpha = Parameter(Tensor(np.ones(1, np.float32)), name="alpha")


class DoubledDense(nn.Dense):
    def construct(self, x):
        return super().construct(x) * 2


class Everything(nn.Cell):
    """One cell of each kind the construction warning must sort (never run)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.gconv = nn.Conv2d(4, 4, 3, group=2)
        self.conv1d = nn.Conv1d(2, 4, 3)
        self.conv3d = nn.Conv3d(2, 4, 3)
        self.deconv = nn.Conv2dTranspose(4, 2, 3)
        self.emb = nn.Embedding(10, 4)
        self.lstm = nn.LSTM(4, 4)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm((4,))
        self.frozen = nn.Dense(4, 4)
        self.frozen.weight.requires_grad = False
        self.all_frozen = nn.Dense(4, 4)
        self.all_frozen.weight.requires_grad = False
        self.all_frozen.bias.requires_grad = False
        self.doubled = DoubledDense(4, 4)
        self.skipped = nn.Dense(4, 4)
        self.scale = Scale()
        self.fc = nn.Dense(4, 3)
        self.offset = Parameter(Tensor(np.zeros(3, np.float32)), name="offset")


def test_one_warning_line_names_every_plain_layer_by_reason(caplog):
    with caplog.at_level(logging.INFO, logger="mindspore_ngd"):
        opt = ngd.KFAC(Everything(), learning_rate=0.1, skip_layers=["skipped"])
    warned = warnings_of(caplog)
    assert warned == [
        "KFAC: the trainable parameters of 10 layer(s) are not preconditioned and get the plain momentum update -- "
        "parameters owned by the network itself: offset; group=2 convolution: gconv; "
        "layer type not preconditioned: conv1d (Conv1d), conv3d (Conv3d), deconv (Conv2dTranspose), "
        "lstm (LSTM); weight is not trainable: frozen; custom construct: doubled; skip_layers: skipped; "
        "custom cell with its own parameters: scale (Scale)"]
    assert opt.normalisation_layers == ["bn", "ln"]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) == 1 and "bn.gamma, bn.beta" in info[0] and "ln.gamma, ln.beta" in info[0]
    # verbose=False silences the INFO line only
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mindspore_ngd"):
        ngd.KFAC(Everything(), learning_rate=0.1, skip_layers=["skipped"], verbose=False)
    assert [r.levelno for r in caplog.records if r.name == "mindspore_ngd"] == [logging.WARNING]


def test_unit_wise_batchnorm_that_cannot_be_taken_is_warned_about(caplog):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3)
            self.bn = nn.BatchNorm2d(4, use_batch_statistics=True)

    with caplog.at_level(logging.WARNING, logger="mindspore_ngd"):
        ngd.SPNGD(Net(), learning_rate=0.1, verbose=False)
    assert warnings_of(caplog) == ["SPNGD: the trainable parameters of 1 layer(s) are not preconditioned and get the "
                                   "plain momentum update -- use_batch_statistics=True: bn"]


# ------------------------------------------------------------------ the logger
def test_logger_reaches_stderr_by_default_and_defers_to_configured_logging(capsys, caplog):
    logger = logging.getLogger("mindspore_ngd")
    assert logger.propagate
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []                        # an application that configured no logging
    try:
        logger.warning("unconfigured %d", 1)
    finally:
        root.handlers = saved
    assert capsys.readouterr().err == "[mindspore_ngd] WARNING unconfigured 1\n"
    # configured (here pytest's caplog on the root logger): the record propagates there, nothing on stderr
    with caplog.at_level(logging.WARNING):
        logger.warning("configured")
    assert capsys.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records] == ["configured"]
