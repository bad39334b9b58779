"""Preconditioning an embedding or not: the same small transformer trained both ways, per optimizer.

    python -m benchmarks.embedding_choice [--optimizers kfac,spngd,spngd-plain-ln,thor] [--epochs 4] [--seeds 1]

The network is a stock ``nn.TransformerEncoderLayer`` (width 16, 2 heads, post-LayerNorm) between an
``nn.Embedding`` (16 tokens, MindSpore's default initialisation) and a Dense classifier on the mean
over positions; the task is whether token 1 occurs in a sequence of 8 (256 sequences, batch 32, 8
steps per epoch, the same data and initial weights for every run). Each optimizer runs at learning
rate 0.05 and damping 1e-2, its defaults otherwise (``spngd-plain-ln``: SP-NGD with the LayerNorms left
to the plain update, ``batchnorm_damping=None``), once with ``precondition_embeddings=False`` (the
embedding gets the plain update) and once with True, in ``Model.train``. Printed per run: the mean
training loss of the first and of the last 8 steps, or the optimizer's stop. The evidence behind the
default of ``precondition_embeddings`` (docs/algorithms.md, "Factor definitions").
"""
import argparse
import os
import sys

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import dataset as ds, nn  # noqa: E402
from mindspore.train import Model  # noqa: E402

__all__ = ["TokenEncoder", "token_task", "run", "main", "OPTIMIZERS"]

VOCAB, LENGTH, WIDTH, SEQUENCES, BATCH = 16, 8, 16, 256, 32


class TokenEncoder(nn.Cell):
    """Embedding, one stock transformer encoder layer, and a classifier on the mean over positions."""

    def __init__(self, vocab=VOCAB, width=WIDTH, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Dense(width, classes)

    def construct(self, tokens):
        return self.head(self.layer(self.embed(tokens)).mean(1))


def token_task(seed=0):
    """(tokens (256, 8) int32, labels (256,) int32): label 1 when token 1 occurs in the sequence."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, VOCAB, (SEQUENCES, LENGTH)).astype(np.int32)
    labels = (rng.random(SEQUENCES) < 0.5).astype(np.int32)
    tokens[labels == 1, rng.integers(0, LENGTH, int(labels.sum()))] = 1
    return tokens, labels


def _optimizers():
    import mindspore_ngd as ngd
    return {
        "kfac": lambda net, embeddings: ngd.KFAC(net, learning_rate=0.05, damping=1e-2, verbose=False,
                                                 precondition_embeddings=embeddings),
        "spngd": lambda net, embeddings: ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, verbose=False,
                                                   precondition_embeddings=embeddings),
        "spngd-plain-ln": lambda net, embeddings: ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, verbose=False,
                                                            batchnorm_damping=None,
                                                            precondition_embeddings=embeddings),
        "thor": lambda net, embeddings: ngd.THOR(net, learning_rate=0.05, damping=1e-2, momentum=0.9, frequency=4,
                                                 verbose=False, precondition_embeddings=embeddings),
    }


OPTIMIZERS = ("kfac", "spngd", "spngd-plain-ln", "thor")


def run(optimizer, embeddings, epochs=4, seed=0):
    """One run: ``{"losses": every step's loss, "first": mean of the first 8, "last": mean of the last 8,
    "stopped": the optimizer's error message or None}``."""
    ms.set_seed(seed)
    tokens, labels = token_task(seed)
    net = TokenEncoder()
    opt = _optimizers()[optimizer](net, embeddings)
    losses = []

    class Record(ms.train.Callback):
        def on_train_step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(BATCH)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    stopped = None
    try:
        Model(net, loss, opt).train(epochs, data, callbacks=[Record()], dataset_sink_mode=False)
    except RuntimeError as error:
        if "diverged" not in str(error):
            raise
        stopped = str(error).split(":")[0]
    return {"losses": losses, "first": float(np.mean(losses[:8])), "last": float(np.mean(losses[-8:])),
            "stopped": stopped}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.optimizers.split(",") if name.strip()]
    unknown = sorted(set(names) - set(OPTIMIZERS))
    if unknown or not names:
        parser.error(f"--optimizers must name some of {list(OPTIMIZERS)}, got {args.optimizers!r}")
    if args.epochs < 2:
        parser.error("--epochs must be >= 2 (the last 8 steps are compared with the first 8)")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    print("| optimizer | seed | embedding | loss, first 8 steps | loss, last 8 steps |")
    print("|---|---|---|---|---|")
    for name in names:
        for seed in range(args.seeds):
            for embeddings in (False, True):
                result = run(name, embeddings, args.epochs, seed)
                last = result["stopped"] or f"{result['last']:.3f}"
                print(f"| {name} | {seed} | {'preconditioned' if embeddings else 'plain update'} | "
                      f"{result['first']:.3f} | {last} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
