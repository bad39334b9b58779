"""Damping x learning-rate sweep on the digits CNN: every run trains or stops with a reason.

    python -m benchmarks.damping_sweep [--epochs 3] [--optimizers kfac spngd thor]
        [--dampings 1e-4 1e-3 1e-2] [--lrs 0.01 0.1 0.3] [--monitor] [--out results/] [--set KEY=VALUE ...]

Each optimizer at its constructor defaults (only ``learning_rate`` and ``damping`` set), trained
through stock ``mindspore.train.Model.train`` on scikit-learn's digits (batch 64, same initial weights
and data order for every run). A run ends either with a test accuracy or with the optimizer's divergence
stop (``RuntimeError``, :func:`mindspore_ngd.is_divergence`); the table gives which, the skipped steps,
the damping the optimizer ended with and how many times its initial norm the weights' norm ended at
(the JSON keeps every step's loss and weight norm). ``--set key=value`` passes extra constructor
arguments to every optimizer (e.g. ``--set adaptive_damping=False`` for the fixed-damping baseline).
``--monitor`` adds a :class:`mindspore_ngd.DivergenceMonitor` at its defaults to the callbacks, as
``ConvertModelUtils``' THOR model and the model zoo's ``train.py`` do: its stop then counts as
"diverged" too.
"""
import argparse
import ast
import os
import time

import numpy as np

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import mindspore as ms  # noqa: E402
from mindspore import nn, Tensor  # noqa: E402
from mindspore.train import Callback, Model  # noqa: E402

from mindspore_ngd.train.divergence import step_loss  # noqa: E402

from . import save_results  # noqa: E402


def _build(kind, net, lr, damping, extra):
    import mindspore_ngd as ngd
    cls = {"kfac": ngd.KFAC, "spngd": ngd.SPNGD, "thor": ngd.THOR}[kind]
    return cls(net, learning_rate=lr, damping=damping, verbose=False, **extra)


def _weight_norm(net):
    """The 2-norm of all of ``net``'s trainable weights together, as a float (copied off the device)."""
    return float(np.sqrt(sum(float(np.square(p.asnumpy().astype(np.float64)).sum()) for p in net.trainable_params())))


class _LossLog(Callback):
    """Keeps every step's loss (the first item of a loss-scale cell's output tuple) and the norm of the
    weights before the first step and after every step, for reading a run, or a candidate stopping
    rule, afterwards."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.losses = []
        self.weight_norms = [_weight_norm(net)]

    def on_train_step_end(self, run_context):      # read as DivergenceMonitor reads a step's outputs
        self.losses.append(step_loss(run_context.original_args().net_outputs))
        self.weight_norms.append(_weight_norm(self.net))


def run_one(kind, damping, lr, epochs, batch_size=64, seed=0, extra=None, monitor=False):
    """One run; returns a dict with the outcome ("trained" or "diverged"), accuracy, counters and
    every step's loss."""
    import mindspore_ngd as ngd
    from .data import array_dataset, digits_arrays
    from .models import DigitsCNN
    x_train, y_train, x_test, y_test = digits_arrays()
    ms.set_seed(seed)
    net = DigitsCNN()
    opt = _build(kind, net, lr, damping, extra or {})
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
    start = time.perf_counter()
    outcome, reason = "trained", ""
    log = _LossLog(net)
    try:
        callbacks = [log] + ([ngd.DivergenceMonitor(name=type(opt).__name__)] if monitor else [])
        model.train(epochs, array_dataset(x_train, y_train, batch_size, seed=seed), callbacks=callbacks,
                    dataset_sink_mode=False)
    except RuntimeError as error:
        if not ngd.is_divergence(error):
            raise
        outcome, reason = "diverged", str(error).split("\n")[0]
    seconds = time.perf_counter() - start
    net.set_train(False)
    acc = float((net(Tensor(x_test)).asnumpy().argmax(1) == y_test).mean())
    counters = opt.state_counters()
    return {"optimizer": kind, "damping": damping, "lr": lr, "outcome": outcome, "test_acc": acc,
            "skipped_steps": counters["skipped_steps"], "damping_end": counters["damping_boost"] * damping,
            "steps": counters["step"], "seconds": seconds, "reason": reason,
            "step_losses": log.losses, "weight_norms": log.weight_norms,
            "weight_growth": log.weight_norms[-1] / log.weight_norms[0]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--optimizers", nargs="+", default=["kfac", "spngd", "thor"])
    parser.add_argument("--dampings", nargs="+", type=float, default=[1e-4, 1e-3, 1e-2])
    parser.add_argument("--lrs", nargs="+", type=float, default=[0.01, 0.1, 0.3])
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra optimizer arguments, e.g. adaptive_damping=False")
    parser.add_argument("--monitor", action="store_true", help="add a DivergenceMonitor (the loss-side stop)")
    parser.add_argument("--out", default="results")
    parser.add_argument("--name", default="damping_sweep")
    args = parser.parse_args(argv)
    extra = {}
    for item in args.set:
        key, value = item.split("=", 1)
        extra[key] = ast.literal_eval(value)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rows = []
    header = ("| optimizer | damping | lr | outcome | test acc | skipped steps | damping at the end | "
              "weight norm, last / first | s |\n|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    for kind in args.optimizers:
        for damping in args.dampings:
            for lr in args.lrs:
                row = run_one(kind, damping, lr, args.epochs, extra=extra, monitor=args.monitor)
                rows.append(row)
                print(f"| {kind} | {damping:g} | {lr:g} | {row['outcome']} | {row['test_acc']:.4f} | "
                      f"{row['skipped_steps']} | {row['damping_end']:.3g} | {row['weight_growth']:.3g} | "
                      f"{row['seconds']:.0f} |", flush=True)
                if row["reason"]:
                    print(f"    {row['reason'][:300]}", flush=True)
    bad = [r for r in rows if r["outcome"] == "trained" and r["test_acc"] < 0.90]
    print(f"\n{len(rows)} runs: {sum(r['outcome'] == 'diverged' for r in rows)} stopped with the divergence error, "
          f"{len(bad)} trained below 0.90 without an exception", flush=True)
    save_results(args.out, args.name, {"epochs": args.epochs, "extra": {k: repr(v) for k, v in extra.items()},
                                       "monitor": args.monitor, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
