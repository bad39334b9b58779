"""Step-time benchmark: K-FAC versus nn.Momentum, refresh and non-refresh steps, side by side.

    python -m mindspore_ngd.benchmarks.step_time [--models digits,resnet20] [--rounds 5] [--out results/]

For each model three training cells are built in one process (same architecture, same batch):

* ``momentum``   -- ``nn.Momentum``;
* ``kfac-20/20`` -- K-FAC capturing factors and inverting every 20 steps: step 0 of each period is a
  refresh step (capture + moving average + inverses), the other 19 pay only for preconditioning;
* ``kfac-1/20``  -- K-FAC with the default schedule (factors every step, inverses every 20 steps);
* ``thor-20-split128`` / ``thor-20-nosplit`` -- THOR with ``frequency=20`` (factors and inverses every
  20 steps, fixed interval), with and without 128-blocks.

They run in interleaved rounds of 20 steps (round-robin, so machine noise hits all alike); each step
ends with ``.asnumpy()``. Reported: median step time per kind of step, the ratio to Momentum, and
the amortised (mean) step time over whole 20-step periods. Results are printed as a Markdown table
and saved as JSON. Synthetic inputs: step time does not depend on the data.
"""
import argparse
import os
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, Tensor  # noqa: E402

from . import save_results  # noqa: E402

PERIOD = 20

MODELS = {
    # name: (constructor, input shape without batch, batch size, classes)
    "digits": ("DigitsCNN", (1, 8, 8), 64),
    "resnet20": ("resnet20", (3, 32, 32), 128),
}


def _build(model_name, optimizer, seed=0):
    from . import models
    from .. import KFAC
    ctor = MODELS[model_name][0]
    ms.set_seed(seed)
    net = getattr(models, ctor)()
    if optimizer == "momentum":
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    elif optimizer.startswith("thor"):
        from .. import THOR
        split_dim = None if optimizer.endswith("nosplit") else 128
        opt = THOR(net, learning_rate=0.01, damping=1e-2, frequency=PERIOD, split_dim=split_dim, verbose=False)
    else:
        factor_interval = PERIOD if optimizer == "kfac-20/20" else 1
        opt = KFAC(net, learning_rate=0.01, damping=1e-2, factor_update_interval=factor_interval,
                   inverse_update_interval=PERIOD, verbose=False)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    cell.set_train()
    return cell


KINDS = ("momentum", "kfac-20/20", "kfac-1/20", "thor-20-split128", "thor-20-nosplit")


def bench_model(model_name, rounds, kinds=KINDS):
    _, shape, batch = MODELS[model_name]
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch,) + shape).astype(np.float32))
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32))
    cells, compile_s = {}, {}
    for kind in kinds:
        cells[kind] = _build(model_name, kind)
        start = time.perf_counter()
        cells[kind](x, y).asnumpy()                     # compile + step 0
        compile_s[kind] = time.perf_counter() - start
        for _ in range(PERIOD - 1):                     # finish the first period (warm-up)
            cells[kind](x, y).asnumpy()
    times = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            for _ in range(PERIOD):
                start = time.perf_counter()
                cells[kind](x, y).asnumpy()
                times[kind].append(time.perf_counter() - start)
    return summarize(model_name, batch, times, compile_s)


def summarize(model_name, batch, times, compile_s):
    base = float(np.median(times["momentum"]))
    rows = []
    for kind, values in times.items():
        values = np.asarray(values)
        refresh = values[0::PERIOD]                     # step 0 of every period
        quiet = np.delete(values, np.arange(0, len(values), PERIOD))
        row = {"model": model_name, "batch": batch, "optimizer": kind, "steps": len(values),
               "compile_s": compile_s[kind], "median_s": float(np.median(values)),
               "amortised_s": float(values.mean()), "amortised_ratio": float(values.mean()) / base}
        if kind != "momentum":
            row.update(refresh_median_s=float(np.median(refresh)), quiet_median_s=float(np.median(quiet)),
                       quiet_ratio=float(np.median(quiet)) / base, refresh_ratio=float(np.median(refresh)) / base)
        rows.append(row)
    return rows


def markdown(rows):
    lines = ["| model (batch) | optimizer | first call (compile) s | median step ms | non-refresh step ms (x Momentum) "
             "| refresh step ms (x Momentum) | amortised ms (x Momentum) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        quiet = f"{1e3 * r['quiet_median_s']:.1f} ({r['quiet_ratio']:.2f}x)" if "quiet_ratio" in r else "-"
        refresh = f"{1e3 * r['refresh_median_s']:.1f} ({r['refresh_ratio']:.2f}x)" if "refresh_ratio" in r else "-"
        lines.append(f"| {r['model']} ({r['batch']}) | {r['optimizer']} | {r['compile_s']:.1f} | "
                     f"{1e3 * r['median_s']:.1f} | {quiet} | {refresh} | "
                     f"{1e3 * r['amortised_s']:.1f} ({r['amortised_ratio']:.2f}x) |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="digits,resnet20")
    parser.add_argument("--rounds", type=int, default=5, help="20-step rounds per optimizer")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rows = []
    for model_name in args.models.split(","):
        rows += bench_model(model_name, args.rounds)
    table = markdown(rows)
    print(table)
    save_results(args.out, "step_time", {"rounds": args.rounds, "period": PERIOD, "rows": rows, "markdown": table})

if __name__ == "__main__":
    main()
