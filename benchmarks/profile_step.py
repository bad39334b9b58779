"""Where a training step's time goes: MindSpore's profiler on steps that refresh nothing.

    python -m benchmarks.profile_step [--models resnet20,fmnist-mlp-b1024] [--optimizers momentum,kfac-P/P,thor]
                                      [--period 20] [--data digits] [--spngd-warmup 300] [--out results/]

For each model and optimizer (the networks, batches and optimizer settings of
:mod:`benchmarks.cost_model`) it trains ``period + 1`` steps (step 0 and step ``period`` capture and
invert), then profiles the ``period - 1`` steps that follow, none of which captures a statistic or
inverts a factor for ``kfac-P/P`` and ``thor`` (``kfac`` captures factors on every step). The
``+lean`` kinds train with :class:`mindspore_ngd.NGDTrainOneStepCell`: those steps run its lean graph.

SP-NGD's refreshes depend on the data: it trains ``--spngd-warmup`` more steps first, and the row
reports how many statistics it refreshed in the profiled steps (``statistic_refreshes``; 0 makes
them all steps without a refresh). On synthetic data its statistics keep moving; with ``--data
digits`` (the digits CNN, ``digits-bn``, on the digits training split, as in the cost model) its
intervals grow as in training. The profiler (``mindspore.Profiler``, CPU
operator timeline) records every kernel launched; :func:`summarize_trace` reads its
``trace_view.json`` and reports, per step:

* the number of kernels and their summed duration, split into forward, backward and optimizer
  (kernels MindSpore names ``Expand/...`` are expanded composite operators: in these graphs the
  optimizer's matmuls and sums);
* the step's wall time over the profiled steps, and the *host gap*: wall time minus kernel time,
  the launch and control-flow cost that no kernel accounts for;
* the operator types with the most kernels and the most time.

The profiler's timings move with the machine (the same convolutions ran 8-30 % apart between two
runs here), so compare kernel counts, and each run's own host gap and kernel split, rather than
absolute milliseconds across runs. Results are printed as Markdown and saved as JSON.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import mindspore as ms  # noqa: E402

from . import parse_names, save_results  # noqa: E402
from .cost_model import DATA_SOURCES, MODELS, _batches, base_kind, build_cell, data_error  # noqa: E402

PROFILED = ("momentum", "kfac", "kfac-P/P", "spngd", "thor", "kfac-P/P+lean", "spngd+lean", "thor+lean")
DEFAULT_MODELS = ("resnet20", "fmnist-mlp-b1024")
DEFAULT_OPTIMIZERS = ("momentum", "kfac-P/P", "thor")
_KERNEL = re.compile(r"-op\d+$")


def _region(name):
    parts = name.split("/")
    if parts[0] == "Gradients":
        return "backward"
    if parts[0] == "Expand":
        return "optimizer"          # composite operators expanded by MindSpore (matmul, sum, ...)
    if len(parts) > 1 and parts[1].startswith("optimizer"):
        return "optimizer"
    if len(parts) > 1 and parts[1].startswith("network"):
        return "forward"
    return "other"                  # e.g. TensorMove and Assign copies placed at the graph's top level


def summarize_trace(events, steps):
    """Per-step kernel statistics of a profiler timeline (the list in ``trace_view.json``).

    A kernel is a complete event (``"ph": "X"``) whose name ends in ``-op<N>``; the other complete
    events are the scopes that contain them. Returns ``{"kernels", "kernel_ms", "regions": {region:
    {"kernels", "ms"}}, "ops": {op type: {"kernels", "ms"}}}``, all per step."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    regions = collections.defaultdict(lambda: {"kernels": 0.0, "ms": 0.0})
    ops = collections.defaultdict(lambda: {"kernels": 0.0, "ms": 0.0})
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or not _KERNEL.search(name):
            continue
        ms_per_step = float(event.get("dur", 0.0)) / 1e3 / steps
        op = _KERNEL.sub("", name.split("/")[-1])
        for table, key in ((regions, _region(name)), (ops, op)):
            table[key]["kernels"] += 1.0 / steps
            table[key]["ms"] += ms_per_step
    return {"kernels": sum(r["kernels"] for r in regions.values()),
            "kernel_ms": sum(r["ms"] for r in regions.values()),
            "regions": dict(regions), "ops": dict(ops)}


def read_trace(path):
    """The events of the ``trace_view.json`` the profiler wrote under ``path``."""
    files = sorted(glob.glob(os.path.join(path, "**", "trace_view.json"), recursive=True))
    if not files:
        raise FileNotFoundError(f"the profiler wrote no trace_view.json under {path}")
    with open(files[0], encoding="utf-8") as handle:
        return json.load(handle)


def profile_one(model_name, optimizer, period, keep=None, data="synthetic", spngd_warmup=0):
    """Profile ``period - 1`` steps that refresh nothing (SP-NGD: after ``spngd_warmup`` more steps,
    with the statistics it refreshed in them counted); returns :func:`summarize_trace` plus the
    profiled wall time per step (``step_ms``) and the host gap (``gap_ms``)."""
    if optimizer not in PROFILED:
        raise ValueError(f"optimizer must be one of {PROFILED}, got {optimizer!r}")
    if period < 2:
        raise ValueError(f"period must be >= 2, got {period}")
    cell, opt = build_cell(model_name, optimizer, period)
    batches = _batches(model_name, data=data)
    adaptive = base_kind(optimizer) == "spngd"
    warm = period + 1 + (spngd_warmup if adaptive else 0)
    for step in range(warm):                        # steps 0 .. period: both refresh steps
        cell(*batches[step % len(batches)]).asnumpy()
    path = keep or tempfile.mkdtemp(prefix="ngd_profile_")
    steps = period - 1
    refreshes = opt.state_counters()["statistic_refreshes"] if adaptive else None
    try:
        profiler = ms.Profiler(output_path=path)
        start = time.perf_counter()
        for step in range(warm, warm + steps):
            cell(*batches[step % len(batches)]).asnumpy()
        step_ms = (time.perf_counter() - start) / steps * 1e3
        profiler.stop()
        profiler.analyse()
        summary = summarize_trace(read_trace(path), steps)
    finally:
        if keep is None:
            shutil.rmtree(path, ignore_errors=True)
    summary.update(model=model_name, optimizer=optimizer, steps=steps, step_ms=step_ms,
                   gap_ms=step_ms - summary["kernel_ms"], data=data)
    if refreshes is not None:
        summary["statistic_refreshes"] = opt.state_counters()["statistic_refreshes"] - refreshes
    return summary


def _label(row):
    if "statistic_refreshes" not in row:
        return row["optimizer"]
    return f"{row['optimizer']} ({row['statistic_refreshes']} statistic refreshes)"


def markdown(rows, top=8):
    lines = ["| model | optimizer | wall ms/step | kernel ms | host gap ms | kernels | forward / backward / "
             "optimizer / other kernels | optimizer kernel ms |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reg = r["regions"]
        counts = " / ".join(f"{reg.get(k, {'kernels': 0})['kernels']:.0f}"
                            for k in ("forward", "backward", "optimizer", "other"))
        lines.append(f"| {r['model']} | {_label(r)} | {r['step_ms']:.1f} | {r['kernel_ms']:.1f} | "
                     f"{r['gap_ms']:.1f} | {r['kernels']:.0f} | {counts} | "
                     f"{reg.get('optimizer', {'ms': 0.0})['ms']:.1f} |")
    lines += ["", "| model | optimizer | most kernels per step (op: kernels, ms) |", "|---|---|---|"]
    for r in rows:
        most = sorted(r["ops"].items(), key=lambda item: -item[1]["kernels"])[:top]
        lines.append(f"| {r['model']} | {_label(r)} | "
                     + ", ".join(f"{op}: {v['kernels']:.0f}, {v['ms']:.1f}" for op, v in most) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"among {', '.join(MODELS)}")
    parser.add_argument("--optimizers", default=",".join(DEFAULT_OPTIMIZERS), help=f"among {', '.join(PROFILED)}")
    parser.add_argument("--period", type=int, default=20, help="refresh period of kfac-P/P and thor (>= 2)")
    parser.add_argument("--data", default="synthetic", choices=DATA_SOURCES,
                        help="synthetic batches, or the digits (models with 1x8x8 inputs: digits-bn)")
    parser.add_argument("--spngd-warmup", type=int, default=300,
                        help="SP-NGD's extra steps before the profiled ones, so that its intervals have grown")
    parser.add_argument("--out", default="results", help="output directory of the JSON")
    args = parser.parse_args(argv)
    args.models = parse_names(parser, "--models", args.models, list(MODELS))
    args.optimizers = parse_names(parser, "--optimizers", args.optimizers, list(PROFILED))
    if args.period < 2:
        parser.error(f"--period must be an integer >= 2, got {args.period}")
    if args.spngd_warmup < 0:
        parser.error(f"--spngd-warmup must be an integer >= 0, got {args.spngd_warmup}")
    if data_error(args.data, args.models):
        parser.error(data_error(args.data, args.models))
    return args


def main(argv=None):
    args = parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rows = [profile_one(model, opt, args.period, data=args.data, spngd_warmup=args.spngd_warmup)
            for model in args.models for opt in args.optimizers]
    table = markdown(rows)
    print(table)
    command = "python -m benchmarks.profile_step " + " ".join(argv if argv is not None else sys.argv[1:])
    return save_results(args.out, "profile_step", {"command": command, "period": args.period, "data": args.data,
                                                   "spngd_warmup": args.spngd_warmup, "rows": rows,
                                                   "markdown": table})


if __name__ == "__main__":
    main()
