"""Epochs and seconds to Momentum's best test accuracy on scikit-learn's digits, per optimizer.

    python -m benchmarks.digits_epochs [--epochs 10] [--out results/]

Runs (same CNN, initial weights, data order and learning rate 0.05): ``nn.Momentum``, K-FAC, THOR
with 64-blocks and THOR without splitting. Prints a Markdown table (final training loss, best test
accuracy, the epoch and training seconds at which Momentum's best accuracy is first reached, and
the mean time per epoch after the first, which excludes graph compilation) and saves every curve
as JSON.
"""
import argparse
import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402

from .demo import first_reaching, train_digits  # noqa: E402
from . import save_results  # noqa: E402

RUNS = {
    "momentum": ("momentum", {}),
    "kfac": ("kfac", {}),
    "thor (split 64)": ("thor", {"split_dim": 64}),
    "thor (no split)": ("thor", {"split_dim": None}),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    curves = {label: train_digits(kind, args.epochs, verbose=False, **kwargs)
              for label, (kind, kwargs) in RUNS.items()}
    target = max(r["test_acc"] for r in curves["momentum"])
    lines = [f"Target: Momentum's best test accuracy in {args.epochs} epochs = {target:.4f}", "",
             "| optimizer | final train loss | best test acc | epoch reaching target | seconds to target | "
             "s/epoch after the first |", "|---|---|---|---|---|---|"]
    for label, rows in curves.items():
        hit = first_reaching(rows, target)
        per_epoch = np.diff([r["seconds"] for r in rows]).mean() if len(rows) > 1 else float("nan")
        reached = f"{hit['epoch']} | {hit['seconds']:.1f}" if hit else "not reached | -"
        lines.append(f"| {label} | {rows[-1]['train_loss']:.4f} | {max(r['test_acc'] for r in rows):.4f} | "
                     f"{reached} | {per_epoch:.2f} |")
    table = "\n".join(lines)
    print(table)
    save_results(args.out, "digits_epochs", {"target": target, "curves": curves, "markdown": table})

if __name__ == "__main__":
    main()
