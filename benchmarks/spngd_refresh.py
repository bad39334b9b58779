"""SP-NGD's stale statistics at work: refresh ratio, step time and accuracy against K-FAC and Momentum.

    python -m benchmarks.spngd_refresh [--networks cnn-bn,resnet8] [--epochs 10] [--out results/]

For each network (scikit-learn's digits; "cnn-bn" is the digits CNN with BatchNorm, "resnet8" a
CIFAR-style ResNet with BatchNorm) trains, with the same initial weights, data order, learning rate
(0.05), damping (1e-2), KL clip (1e-3) and factor moving average (0.9):

* ``nn.Momentum``, stock and with one never-taken run-time branch (``momentum-cf``,
  :mod:`benchmarks.baselines`: MindSpore 2.10's CPU runtime often runs the stock graph at the speed of
  one core); the "vs Momentum" column divides by the faster of the two;
* K-FAC with factors and inverses every step (``factor_update_interval=1, inverse_update_interval=1``);
* SP-NGD with its defaults (stale statistics, unit-wise BatchNorm).

Reports per run the refresh ratio per epoch (statistics recomputed per step / statistics; 1 for
K-FAC with interval 1), its mean over the second half of training, the final and best test
accuracy, and the seconds per epoch after the first (the first includes graph compilation), i.e.
the amortised step time, side by side in one process. Saves every curve as JSON.
"""
import argparse
import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402

from .demo import NETWORKS, train_digits  # noqa: E402
from . import save_results  # noqa: E402

COMMON = dict(damping=1e-2, kl_clip=1e-3, factor_decay=0.9)
RUNS = {
    "momentum": ("momentum", {}),
    "momentum-cf": ("momentum-cf", {}),
    "kfac (interval 1)": ("kfac", dict(COMMON, factor_update_interval=1, inverse_update_interval=1)),
    "spngd": ("spngd", dict(COMMON)),
}


def summarize(rows, steps_per_epoch):
    half = rows[len(rows) // 2:]
    per_epoch = float(np.median(np.diff([0.0] + [r["seconds"] for r in rows])[1:])) if len(rows) > 1 else float("nan")
    return {"final_acc": rows[-1]["test_acc"], "best_acc": max(r["test_acc"] for r in rows),
            "refresh_ratio_second_half": float(np.mean([r.get("refresh_ratio", 1.0) for r in half])),
            "seconds_per_epoch": per_epoch, "ms_per_step": 1000.0 * per_epoch / steps_per_epoch}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", default="cnn-bn,resnet8",
                        help=f"comma-separated, from {', '.join(NETWORKS)}")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    networks = [n for n in args.networks.split(",") if n]
    unknown = [n for n in networks if n not in NETWORKS]
    if unknown or not networks:
        parser.error(f"--networks must name some of {', '.join(NETWORKS)}, got {args.networks!r}")
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2, got {args.epochs}")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    steps = 1437 // args.batch_size            # digits training split, drop_remainder
    curves, lines = {}, []
    for network in networks:
        lines += [f"### {network}, {args.epochs} epochs, batch {args.batch_size}", "",
                  "| optimizer | refresh ratio, 2nd half | final test acc | best test acc | ms/step (after epoch 1) "
                  "| vs K-FAC interval 1 | vs Momentum |", "|---|---|---|---|---|---|---|"]
        results = {}
        for label, (kind, kwargs) in RUNS.items():
            rows = train_digits(kind, args.epochs, batch_size=args.batch_size, verbose=False, network=network,
                                **kwargs)
            curves[f"{network}/{label}"] = rows
            results[label] = summarize(rows, steps)
            print(f"{network} {label}: " + ", ".join(f"{k} {v:.4g}" for k, v in results[label].items()),
                  flush=True)
        kfac = results["kfac (interval 1)"]["ms_per_step"]
        momentum = min(results["momentum"]["ms_per_step"], results["momentum-cf"]["ms_per_step"])
        for label, r in results.items():
            ratio = "-" if label.startswith("momentum") else f"{r['refresh_ratio_second_half']:.3f}"
            lines.append(f"| {label} | {ratio} | {r['final_acc']:.4f} | {r['best_acc']:.4f} | "
                         f"{r['ms_per_step']:.1f} | {r['ms_per_step'] / kfac:.2f}x | {r['ms_per_step'] / momentum:.2f}x |")
        lines.append("")
    table = "\n".join(lines)
    print(table)
    save_results(args.out, "spngd_refresh", {"curves": curves, "markdown": table, "epochs": args.epochs,
                                             "batch_size": args.batch_size})


if __name__ == "__main__":
    main()
