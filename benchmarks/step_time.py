"""Step-time benchmark: K-FAC versus nn.Momentum, refresh and non-refresh steps, side by side.

    python -m benchmarks.step_time [--models digits,resnet20] [--rounds 5] [--out results/]

For each model three training cells are built in one process (same architecture, same batch):

* ``momentum``   -- ``nn.Momentum``;
* ``momentum-cf`` -- the same update with one never-taken run-time branch in its graph
  (:mod:`benchmarks.baselines`): MindSpore 2.10's CPU runtime often runs the stock graph at the speed
  of one core. With both, the ratios divide by the faster median;
* ``kfac-P/P`` -- K-FAC capturing factors and inverting every P steps (``--period``, default 20):
  step 0 of each period is a refresh step (capture + moving average + inverses), the other P - 1 pay
  only for preconditioning;
* ``kfac-1/P``  -- K-FAC with factors every step and inverses every P steps (the default schedule
  for P = 20);
* ``thor-split128`` / ``thor-nosplit`` -- THOR with ``frequency=P`` (factors and inverses every P
  steps, fixed interval), with and without 128-blocks.

They run in interleaved rounds of P steps (round-robin, so machine noise hits all alike); each step
ends with ``.asnumpy()``. Reported: median step time per kind of step, the ratio to Momentum, and
the amortised (mean) step time over whole periods. Results are printed as a Markdown table
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
from .baselines import MOMENTUM_KINDS, momentum_baseline  # noqa: E402

DEFAULT_PERIOD = 20

MODELS = {
    # name: (constructor, input shape without batch, batch size, classes)
    "digits": ("DigitsCNN", (1, 8, 8), 64),
    "resnet20": ("resnet20", (3, 32, 32), 128),
}


def _build(model_name, optimizer, period, seed=0):
    from . import models
    from mindspore_ngd import KFAC
    ctor = MODELS[model_name][0]
    ms.set_seed(seed)
    net = getattr(models, ctor)()
    if optimizer in BASELINES:
        opt = momentum_baseline(optimizer, net.trainable_params(), 0.01)
    elif optimizer.startswith("thor"):
        from mindspore_ngd import THOR
        split_dim = None if optimizer.endswith("nosplit") else 128
        opt = THOR(net, learning_rate=0.01, damping=1e-2, frequency=period, split_dim=split_dim, verbose=False)
    else:
        factor_interval = period if optimizer == "kfac-P/P" else 1
        opt = KFAC(net, learning_rate=0.01, damping=1e-2, factor_update_interval=factor_interval,
                   inverse_update_interval=period, verbose=False)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    cell.set_train()
    return cell


KINDS = ("momentum", "momentum-cf", "kfac-P/P", "kfac-1/P", "thor-split128", "thor-nosplit")
# first-order baselines: the ratios divide by the faster median (benchmarks/baselines.py)
BASELINES = MOMENTUM_KINDS


def bench_model(model_name, rounds, kinds=KINDS, period=DEFAULT_PERIOD):
    _, shape, batch = MODELS[model_name]
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch,) + shape).astype(np.float32))
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32))
    cells, compile_s = {}, {}
    for kind in kinds:
        cells[kind] = _build(model_name, kind, period)
        start = time.perf_counter()
        cells[kind](x, y).asnumpy()                     # compile + step 0
        compile_s[kind] = time.perf_counter() - start
        for _ in range(period - 1):                     # finish the first period (warm-up)
            cells[kind](x, y).asnumpy()
    times = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            for _ in range(period):
                start = time.perf_counter()
                cells[kind](x, y).asnumpy()
                times[kind].append(time.perf_counter() - start)
    return summarize(model_name, batch, times, compile_s, period)


def summarize(model_name, batch, times, compile_s, period):
    base = min(float(np.median(times[kind])) for kind in times if kind in BASELINES)
    rows = []
    for kind, values in times.items():
        values = np.asarray(values)
        refresh = values[0::period]                     # step 0 of every period
        quiet = np.delete(values, np.arange(0, len(values), period))
        row = {"model": model_name, "batch": batch, "optimizer": kind, "period": period,
               "steps": len(values),
               "compile_s": compile_s[kind], "median_s": float(np.median(values)),
               "amortised_s": float(values.mean()), "amortised_ratio": float(values.mean()) / base}
        if kind not in BASELINES:
            row.update(refresh_median_s=float(np.median(refresh)), quiet_median_s=float(np.median(quiet)),
                       quiet_ratio=float(np.median(quiet)) / base, refresh_ratio=float(np.median(refresh)) / base)
        rows.append(row)
    return rows


def markdown(rows):
    lines = ["| model (batch) | optimizer (period) | first call (compile) s | median step ms "
             "| non-refresh step ms (x Momentum) | refresh step ms (x Momentum) | amortised ms (x Momentum) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        quiet = f"{1e3 * r['quiet_median_s']:.1f} ({r['quiet_ratio']:.2f}x)" if "quiet_ratio" in r else "-"
        refresh = f"{1e3 * r['refresh_median_s']:.1f} ({r['refresh_ratio']:.2f}x)" if "refresh_ratio" in r else "-"
        lines.append(f"| {r['model']} ({r['batch']}) | {r['optimizer']} ({r['period']}) | {r['compile_s']:.1f} | "
                     f"{1e3 * r['median_s']:.1f} | {quiet} | {refresh} | "
                     f"{1e3 * r['amortised_s']:.1f} ({r['amortised_ratio']:.2f}x) |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="digits,resnet20")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --period steps per optimizer")
    parser.add_argument("--period", type=int, default=DEFAULT_PERIOD, help="refresh period P in steps")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    kinds = tuple(args.kinds.split(","))
    if kinds[0] not in BASELINES or any(k not in KINDS for k in kinds):
        raise SystemExit(f"--kinds must start with one of {BASELINES} and name kinds among {KINDS}")
    rows = []
    for model_name in args.models.split(","):
        rows += bench_model(model_name, args.rounds, kinds, args.period)
    table = markdown(rows)
    print(table)
    save_results(args.out, f"step_time_p{args.period}",
                 {"rounds": args.rounds, "period": args.period, "rows": rows, "markdown": table})

if __name__ == "__main__":
    main()
