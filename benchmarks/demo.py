"""K-FAC, THOR and Momentum side by side on scikit-learn's digits (the quick-start job).

    python -m benchmarks.demo [--epochs 10] [--lr 0.05] [--batch-size 64] [--mode graph|pynative]

Trains the same small CNN (same initial weights, same data order) with ``nn.Momentum``,
:class:`mindspore_ngd.KFAC` and :class:`mindspore_ngd.THOR` through stock
``mindspore.train.Model.train``, and prints per-epoch training loss, test accuracy and wall-clock time,
then the results table of README.md (Markdown) as :func:`markdown_table` writes it.
"""
import argparse
import os
import time

# oneDNN picks a slow reference kernel for 3x3 convolutions on AVX-512 CPUs unless capped at AVX2;
# the variable must be set before MindSpore loads (see README).
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, Tensor  # noqa: E402
from mindspore.train import Callback, Model  # noqa: E402

__all__ = ["train_digits", "first_reaching", "markdown_table", "main"]

LABELS = {"momentum": "`nn.Momentum`", "kfac": "`ngd.KFAC`", "thor": "`ngd.THOR`"}


def first_reaching(rows, target):
    """The first per-epoch row whose test accuracy reaches ``target``, or None."""
    return next((r for r in rows if r["test_acc"] >= target), None)


class _EpochLog(Callback):
    """Collects per-epoch wall time, full training-set loss and test accuracy."""

    def __init__(self, net, train, test, verbose, label, refresh_monitor=None):
        super().__init__()
        self.net = net
        self.refresh_monitor = refresh_monitor      # runs before this callback in the same epoch
        self.train, self.test = train, test
        self.verbose, self.label = verbose, label
        self.rows, self.start, self.eval_time = [], None, 0.0

    def on_train_begin(self, run_context):
        self.start = time.perf_counter()

    def on_train_epoch_end(self, run_context):
        t_eval = time.perf_counter()
        net = self.net
        was_training = net.training
        net.set_train(False)
        logits = net(Tensor(self.train[0])).asnumpy()
        z = logits - logits.max(1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
        loss = float(-log_p[np.arange(len(self.train[1])), self.train[1]].mean())
        acc = float((net(Tensor(self.test[0])).asnumpy().argmax(1) == self.test[1]).mean())
        net.set_train(was_training)
        self.eval_time += time.perf_counter() - t_eval
        elapsed = time.perf_counter() - self.start - self.eval_time
        epoch = run_context.original_args().cur_epoch_num
        row = {"epoch": epoch, "train_loss": loss, "test_acc": acc, "seconds": elapsed}
        if self.refresh_monitor is not None:                # SP-NGD: fraction of statistics recomputed
            row["refresh_ratio"] = self.refresh_monitor.history[-1][2]
        self.rows.append(row)
        if self.verbose:
            print(f"  {self.label:8s} epoch {epoch:3d}  train loss {loss:.4f}  test acc {acc:.4f}  "
                  f"time {elapsed:6.1f} s", flush=True)


NETWORKS = ("cnn", "cnn-bn", "resnet8")
OPTIMIZERS = ("momentum", "kfac", "spngd", "thor")


def digits_network(name):
    """The digits networks: "cnn" (no BatchNorm), "cnn-bn" (BatchNorm after each convolution) and
    "resnet8" (a CIFAR-style ResNet with one basic block per stage, width 16, on 8x8x1 images)."""
    from .models import DigitsCNN, ResNetCifar
    if name == "cnn":
        return DigitsCNN()
    if name == "cnn-bn":
        return DigitsCNN(batchnorm=True)
    if name == "resnet8":
        return ResNetCifar(blocks_per_stage=1, width=16, num_classes=10, in_channels=1)
    raise ValueError(f"network must be one of {NETWORKS}, got {name!r}")


def train_digits(optimizer="kfac", epochs=10, lr=0.05, batch_size=64, seed=0, verbose=True, sink=False,
                 network="cnn", **kfac_kwargs):
    """Train a digits network with "momentum", "kfac", "spngd" or "thor" (or "momentum-cf", Momentum
    with a run-time branch: :mod:`benchmarks.baselines`); return the per-epoch rows.

    ``kfac_kwargs`` override the second-order optimizer's arguments. SP-NGD rows also carry the
    epoch's refresh ratio (statistics recomputed per step / number of statistics).
    """
    from mindspore_ngd import KFAC, NGDOptimizer
    from .baselines import MOMENTUM_KINDS, momentum_baseline
    from .data import array_dataset, digits_arrays

    x_train, y_train, x_test, y_test = digits_arrays()
    ms.set_seed(seed)
    net = digits_network(network)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if optimizer == "kfac":
        kwargs = dict(damping=1e-2, momentum=0.9, kl_clip=1e-3, inverse_update_interval=20, verbose=verbose)
        kwargs.update(kfac_kwargs)
        opt = KFAC(net, learning_rate=lr, **kwargs)
    elif optimizer == "thor":
        from mindspore_ngd import THOR
        kwargs = dict(damping=1e-2, momentum=0.9, frequency=10, split_dim=64, trace_threshold=0.05,
                      kl_clip=1e-3, verbose=verbose)
        kwargs.update(kfac_kwargs)
        opt = THOR(net, learning_rate=lr, **kwargs)
    elif optimizer == "spngd":
        from mindspore_ngd import SPNGD
        kwargs = dict(damping=1e-2, momentum=0.9, kl_clip=1e-3, verbose=verbose)
        kwargs.update(kfac_kwargs)
        opt = SPNGD(net, learning_rate=lr, **kwargs)
    elif optimizer in MOMENTUM_KINDS:          # "momentum-cf": the same update, graph with a run-time branch
        opt = momentum_baseline(optimizer, net.trainable_params(), lr)
    else:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS + ('momentum-cf',)}, got {optimizer!r}")
    model = Model(net, loss_fn, opt)
    callbacks = []
    if isinstance(opt, NGDOptimizer) and opt.policy.refresh.per_statistic:
        from mindspore_ngd.train import RefreshMonitor
        callbacks.append(RefreshMonitor(opt, verbose=False))
    log = _EpochLog(net, (x_train, y_train), (x_test, y_test), verbose, optimizer,
                    callbacks[0] if callbacks else None)
    callbacks.append(log)
    model.train(epochs, array_dataset(x_train, y_train, batch_size, seed=seed), callbacks=callbacks,
                dataset_sink_mode=sink)
    return log.rows


def markdown_table(results):
    """The README's results table from ``{optimizer: per-epoch rows}`` (Momentum's first): final
    training loss, best test accuracy, and the epoch and seconds (compilation included) at which each
    optimizer first reaches Momentum's best test accuracy."""
    target = max(r["test_acc"] for r in results["momentum"])
    lines = [f"| optimizer | final train loss | best test acc | first epoch at {target:.4f} (Momentum's best) "
             "| seconds to it, compilation included |",
             "|---|---|---|---|---|"]
    for name, rows in results.items():
        hit = first_reaching(rows, target)
        epoch, seconds = (str(hit["epoch"]), f"{hit['seconds']:.1f}") if hit else ("not reached", "-")
        lines.append(f"| {LABELS.get(name, name)} | {rows[-1]['train_loss']:.4f} | "
                     f"{max(r['test_acc'] for r in rows):.4f} | {epoch} | {seconds} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    print(f"digits CNN, {args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, {args.mode} mode, "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}")
    results = {}
    for name in ("momentum", "kfac", "thor"):
        results[name] = train_digits(name, args.epochs, args.lr, args.batch_size, args.seed)
    print("\noptimizer  epochs  final train loss  best test acc  seconds (incl. compilation)")
    for name, rows in results.items():
        print(f"{name:9s}  {len(rows):6d}  {rows[-1]['train_loss']:16.4f}  "
              f"{max(r['test_acc'] for r in rows):13.4f}  {rows[-1]['seconds']:8.1f}")
    target = max(r["test_acc"] for r in results["momentum"])
    for name, rows in results.items():
        hit = first_reaching(rows, target)
        where = f"epoch {hit['epoch']} ({hit['seconds']:.1f} s)" if hit else "not reached"
        print(f"{name:9s} reaches Momentum's best test accuracy {target:.4f} at {where}")
    print("\nREADME table:\n" + markdown_table(results))


if __name__ == "__main__":
    main()
