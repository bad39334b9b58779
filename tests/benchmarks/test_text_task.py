"""The transformer task on real text (issue 35): the standard-library corpus, the byte-level
transformer language model of stock layers, and the time-to-accuracy harness's language-model kind
(validation loss, target set by AdamW). The race itself is a benchmark:
``python -m benchmarks.convergence --task stdlib-bytes --optimizers adamw,momentum,kfac,thor --grid tuned``."""
import math
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks import convergence, data, models
from benchmarks.tasks import TASKS

TASK = TASKS["stdlib-bytes"]


def test_the_corpus_is_fixed_windows_of_the_stdlib_each_target_its_input_shifted():
    x_train, y_train, x_valid, y_valid = data.stdlib_text_arrays(length=16, train_windows=64, valid_windows=8)
    assert x_train.shape == y_train.shape == (64, 16) and x_valid.shape == y_valid.shape == (8, 16)
    assert x_train.dtype == np.int32 and 0 <= x_train.min() and x_train.max() < 256
    np.testing.assert_array_equal(x_train[:, 1:], y_train[:, :-1])
    np.testing.assert_array_equal(x_valid[:, 1:], y_valid[:, :-1])
    # each window is 17 consecutive bytes of a training (resp. validation) file, and only of those
    root = data._stdlib_root()

    def text_of(names):
        return b"\n".join(open(os.path.join(root, name), "rb").read() for name in names)

    train_text, valid_text = text_of(data.STDLIB_TRAIN_FILES), text_of(data.STDLIB_VALID_FILES)
    for x, y, text in ((x_train, y_train, train_text), (x_valid, y_valid, valid_text)):
        for row in range(len(x)):
            window = bytes(np.concatenate([x[row], y[row, -1:]]).astype(np.uint8))
            assert window in text
    assert not set(data.STDLIB_TRAIN_FILES) & set(data.STDLIB_VALID_FILES)
    # no two windows share an input byte: distinct starts on a stride of the window's input length
    starts = data._window_starts(1000, 16, 40, seed=0)
    assert len(set(starts)) == 40 and (starts % 16 == 0).all() and starts.max() + 17 <= 1000
    assert (np.diff(starts) >= 16).all()
    # the same windows on every call (the seed fixes them); another seed takes others
    data.stdlib_text_arrays.cache_clear()
    again = data.stdlib_text_arrays(length=16, train_windows=64, valid_windows=8)
    np.testing.assert_array_equal(again[0], x_train)
    other = data.stdlib_text_arrays(length=16, train_windows=64, valid_windows=8, seed=1)
    assert not np.array_equal(other[0], x_train)


def test_a_missing_stdlib_file_is_named_and_too_many_windows_is_an_error(monkeypatch, tmp_path):
    assert data.stdlib_text_missing() is None and TASK.available()
    monkeypatch.setattr(data, "_stdlib_root", lambda: str(tmp_path))
    reason = data.stdlib_text_missing()
    assert "argparse.py" in reason and str(tmp_path) in reason
    with pytest.raises(data.DataUnavailable, match="argparse.py"):
        data.stdlib_text_arrays(length=8, train_windows=3, valid_windows=3, seed=7)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="fewer than the 10000000 asked for"):
        data.stdlib_text_arrays(length=64, train_windows=10_000_000, valid_windows=1, seed=7)


def test_the_language_model_loss_and_evaluation_are_cross_entropy_per_position():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 7)).astype(np.float32)
    labels = rng.integers(0, 7, (3, 5)).astype(np.int32)
    z = logits.astype(np.float64)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_p, labels[..., None], -1).mean()
    loss = TASK.loss()(Tensor(logits), Tensor(labels)).asnumpy()
    assert abs(float(loss) - expected) < 1e-5
    # evaluate: outputs of concat(train, test), the first two sequences the training ones
    metrics = TASK.evaluate(logits, labels[:2], labels[2:])
    assert set(metrics) == {"train_loss", "test_loss"}
    ref_train = -np.take_along_axis(log_p[:2], labels[:2, :, None], -1).mean()
    ref_test = -np.take_along_axis(log_p[2:], labels[2:, :, None], -1).mean()
    assert abs(metrics["train_loss"] - ref_train) < 1e-6 and abs(metrics["test_loss"] - ref_test) < 1e-6
    assert TASK.metric == TASK.target_metric == "test_loss" and not TASK.higher_is_better
    assert TASK.target_rule == "final" and TASK.reference == "adamw"


def _curve(values, seconds):
    return [{"epoch": e, "step": 10 * e, "train_loss": v, "test_loss": v, "epoch_s": seconds,
             "seconds": 1.0 + seconds * e, "seconds_excl_compile": seconds * e} for e, v in enumerate(values, 1)]


def _run(name, lr, damping, seed, values, seconds=1.0):
    return {"optimizer": name, "lr": lr, "damping": damping, "seed": seed, "compile_s": 1.0,
            "diverged_epoch": None, "curve": _curve(values, seconds)}


def test_the_target_is_adamws_final_validation_loss_and_ratios_are_against_adamw():
    runs = []
    for seed in range(2):
        runs += [_run("adamw", 3e-3, None, seed, (3.0, 2.5, 2.2, 2.0)),
                 _run("adamw", 1e-2, None, seed, (2.9, 2.6, 2.4, 2.3)),
                 _run("momentum", 0.1, None, seed, (2.8, 2.6, 2.5, 2.4)),
                 _run("kfac", 0.1, 1e-2, seed, (2.5, 1.9, 1.8, 1.7), seconds=3.0)]
    summary = convergence.summarize(TASK, runs)
    best = summary["best"]
    assert best["adamw"]["lr"] == 3e-3                 # lower final validation loss
    assert summary["targets"] == {"0": 2.0, "1": 2.0}
    assert best["kfac"]["epochs_to_target"]["median"] == 2
    assert best["kfac"]["epochs_to_target_vs_adamw"]["median"] == 0.5
    assert best["kfac"]["seconds_to_target_excl_compile_vs_adamw"]["median"] == 1.5     # 6 s vs 4 s
    assert best["momentum"]["reached"] == 0
    assert "epochs_to_target_vs_momentum" not in best["kfac"]
    text = convergence.markdown(TASK, summary, seeds=2, epochs=4)
    assert "AdamW's final validation loss after 4 epochs" in text
    assert "| x AdamW |" in text and "best validation loss" in text
    assert "| kfac | 0.1, 0.01 | 1.7000 | 1.7000 | 2 | 0.50 |" in text


def test_the_cli_asks_for_adamw_on_the_text_task():
    with pytest.raises(SystemExit):
        convergence.parse_args(["--task", "stdlib-bytes", "--optimizers", "momentum,kfac", "--no-plots"])
    args = convergence.parse_args(["--task", "stdlib-bytes", "--optimizers", "adamw,kfac", "--no-plots"])
    assert args.tasks == ["stdlib-bytes"]


def test_adamw_decays_the_matrices_only():
    net = models.ByteTransformerLM(length=8, dim=8, heads=2, layers=1, feedforward=16)
    opt = convergence.OPTIMIZERS["adamw"].build(net, 1e-3, None, 0)
    assert isinstance(opt, nn.AdamWeightDecay) and opt.is_group
    decays = {p.name: float(wd.asnumpy()) for p, wd in zip(opt.parameters, opt.weight_decay)}
    assert sorted(decays) == sorted(p.name for p in net.trainable_params())
    for p in net.trainable_params():
        expected = 0.01 if len(p.shape) >= 2 else 0.0
        assert abs(decays[p.name] - expected) < 1e-9, p.name
    assert decays["tokens.embedding_table"] > 0 and decays["encoder.norm.gamma"] == 0.0


def test_the_stock_transformer_encoder_trains_with_thor_in_model_train():
    """MindSpore's stock nn.TransformerEncoder (with nn.Embedding, nn.LayerNorm and a dense read-out)
    in Model.train with THOR: every Dense, attention and Embedding layer is preconditioned, LayerNorm
    gets the plain update, and the loss falls."""
    ms.set_seed(0)
    length = 16
    net = models.ByteTransformerLM(length=length, dim=16, heads=2, layers=2, feedforward=32)
    x_train, y_train, _, _ = data.stdlib_text_arrays(length=length, train_windows=64, valid_windows=8)
    opt = ngd.THOR(net, learning_rate=0.1, damping=1e-2, momentum=0.9, frequency=5, split_dim=16, verbose=False)
    layers = sorted(spec.name for spec in opt.layer_specs)
    assert layers == sorted(["tokens", "positions", "head"] + [
        f"encoder.layers.{i}.{name}" for i in range(2)
        for name in ("self_attn", "self_attn.out_proj", "dense1", "dense2")])
    losses = []

    class Record(ms.train.Callback):
        def on_train_step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    model = Model(net, loss_fn=models.TokenCrossEntropy(), optimizer=opt)
    dataset = data.array_dataset(x_train, y_train, batch_size=16, shuffle=False)
    model.train(6, dataset, callbacks=[Record()], dataset_sink_mode=False)
    assert len(losses) == 24 and all(math.isfinite(v) for v in losses)
    # from log(256) ~ 5.5 towards the unigram entropy of Python source and below
    assert losses[0] > 5.0 and np.mean(losses[-4:]) < 3.3, losses
    assert opt.demoted_layers() == []
