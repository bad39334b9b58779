"""Time-to-accuracy benchmark: natural-gradient optimizers against MindSpore's first-order ones.

    python -m benchmarks.convergence --task digits-cnn \\
        --optimizers momentum,adam,sgd,kfac,thor --seeds 3 --out results/
    python -m benchmarks.convergence --task all --quick      # one seed, few epochs

For every task (``--task``, see :mod:`benchmarks.tasks`), optimizer, grid point
(learning rate, and damping for the natural-gradient optimizers) and seed, one training run:

* same initial weights (``ms.set_seed(seed)`` before building the network) and the same data order
  (a NumPy generator seeded with ``seed``) for every optimizer within a seed;
* a plain jitted ``nn.TrainOneStepCell`` loop over pre-sliced batches; wall-clock time counts
  training steps only (batch slicing and the per-epoch evaluation are outside the clock). The first
  step's extra time over a steady step is reported as compile time;
* after every epoch the whole training and test sets are evaluated (eval mode, in calls of at most
  ``task.eval_batch`` examples);
* each run in a fresh process (``--isolate yes``, the default outside ``--quick``), so memory stays
  bounded: MindSpore keeps every compiled graph for the life of its process;
* every step's loss goes to ``ngd.DivergenceMonitor`` at its defaults, which stops a run that diverges
  while its loss stays finite, as it stops a user's run, including its end-of-run check (``--monitor
  no``: it only watches). The record keeps each step's loss and what the monitor saw; the report says
  how often it stopped a run.

The best grid point per optimizer is the one with the best median (over seeds) of its best test
metric (ties: the better median of the metric averaged over epochs). The target is Momentum's
result at its best grid point, per seed: its best test accuracy (classification) or its final
training loss (autoencoder). A large-batch race has a fixed target instead (``Task.target``): every
optimizer runs to the same test accuracy, each run stops there, each optimizer's grid point is the one
that gets there in the fewest training seconds, and the *anchor* -- the better of tuned Momentum and
Adam -- is the reference (``--grid tuned`` tunes on seed 0 and repeats the chosen points with the
other seeds). Reported per optimizer: the best test
metric, epochs and seconds (with and without compile time) to reach the target, seconds per epoch,
compile time, as median [min, max] over seeds. Output: ``convergence_<task>.json`` (every run's
curve), ``.md`` (tables) and ``.png`` (test metric vs epoch and vs seconds); ``--from-json``
rebuilds the tables and plots of saved JSON files without training.

A task whose data or package is missing here (e.g. Fashion-MNIST: ``sudo apt-get install
dataset-fashion-mnist``) is skipped with one line saying how to get it.
"""
import argparse
import dataclasses
import functools
import importlib.util
import inspect
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, Tensor  # noqa: E402

import mindspore_ngd as ngd  # noqa: E402
from mindspore_ngd.train.divergence import step_loss  # noqa: E402
from . import parse_names, save_results  # noqa: E402
from .baselines import BranchedAdam, BranchedMomentum  # noqa: E402
from .data import DataUnavailable  # noqa: E402
from .tasks import TASKS  # noqa: E402

__all__ = ["OPTIMIZERS", "OptimizerSpec", "available_optimizers", "run_one", "run_task", "summarize",
           "markdown", "plot", "main"]

# One learning-rate grid for every SGD-type optimizer (Momentum, SGD and the natural-gradient ones);
# Adam's step is normalised, so it gets the same three half-decade points around its usual 3e-3.
SGD_LRS = (0.03, 0.1, 0.3)
ADAM_LRS = (1e-3, 3e-3, 1e-2)
NGD_DAMPINGS = (1e-3, 1e-2)


@dataclass(frozen=True)
class OptimizerSpec:
    """How to build one optimizer: ``build(network, lr, damping, seed) -> nn.Optimizer``.

    ``family`` names the learning-rate grid it uses: ``"sgd"`` (:data:`SGD_LRS`) or ``"adam"``
    (:data:`ADAM_LRS`); a task may replace a family's grid (:attr:`benchmarks.tasks.Task.lrs`).
    """
    build: Callable
    lrs: tuple
    dampings: tuple = (None,)
    settings: dict = field(default_factory=dict)   # fixed arguments, recorded in the JSON
    requires: str = ""                              # attribute of mindspore_ngd it needs, if any
    family: str = "sgd"

    def available(self):
        return not self.requires or getattr(ngd, self.requires, None) is not None

    def lrs_for(self, task=None):
        """The learning-rate grid on ``task``: its override for this family, else the default."""
        overrides = getattr(task, "lrs", None) or {}
        return tuple(overrides.get(self.family, self.lrs))


# Each builder takes the optimizer's fixed settings as defaults and ``**overrides`` on top of them.
MOMENTUM_SETTINGS = dict(momentum=0.9)
ADAM_SETTINGS = dict(beta1=0.9, beta2=0.999, eps=1e-8)
# AdamW as transformers are trained: decoupled weight decay on the matrices (embeddings included), none
# on biases and LayerNorm's gamma and beta
ADAMW_SETTINGS = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
KFAC_SETTINGS = dict(momentum=0.9, kl_clip=1e-3, factor_update_interval=1, inverse_update_interval=20)
THOR_SETTINGS = dict(momentum=0.9, frequency=10, split_dim=64, trace_threshold=0.05, kl_clip=1e-3)
SPNGD_SETTINGS = dict(momentum=0.9)


def _momentum(net, lr, damping, seed, **overrides):
    return nn.Momentum(net.trainable_params(), learning_rate=lr, **{**MOMENTUM_SETTINGS, **overrides})


def _adam(net, lr, damping, seed, **overrides):
    return nn.Adam(net.trainable_params(), learning_rate=lr, **{**ADAM_SETTINGS, **overrides})


def _adamw(net, lr, damping, seed, **overrides):
    settings = {**ADAMW_SETTINGS, **overrides}
    decay = settings.pop("weight_decay")
    params = net.trainable_params()
    groups = [{"params": [p for p in params if len(p.shape) >= 2], "weight_decay": decay},
              {"params": [p for p in params if len(p.shape) < 2], "weight_decay": 0.0}]
    return nn.AdamWeightDecay([g for g in groups if g["params"]], learning_rate=lr, **settings)


def _momentum_cf(net, lr, damping, seed, **overrides):
    return BranchedMomentum(net.trainable_params(), learning_rate=lr, **{**MOMENTUM_SETTINGS, **overrides})


def _adam_cf(net, lr, damping, seed, **overrides):
    return BranchedAdam(net.trainable_params(), learning_rate=lr, **{**ADAM_SETTINGS, **overrides})


def _sgd(net, lr, damping, seed, **overrides):
    return nn.SGD(net.trainable_params(), learning_rate=lr, **overrides)


def _kfac(net, lr, damping, seed, **overrides):
    return ngd.KFAC(net, learning_rate=lr, damping=damping, verbose=False, **{**KFAC_SETTINGS, **overrides})


def _thor(net, lr, damping, seed, **overrides):
    return ngd.THOR(net, learning_rate=lr, damping=damping, verbose=False, **{**THOR_SETTINGS, **overrides})


def _spngd(net, lr, damping, seed, **overrides):
    cls = getattr(ngd, "SPNGD", None)
    if cls is None:
        raise RuntimeError("optimizer 'spngd' needs mindspore_ngd.SPNGD, which this installation does not have")
    params = inspect.signature(cls).parameters
    extra = {name: value for name, value in (("seed", seed), ("verbose", False)) if name in params}
    return cls(net, learning_rate=lr, damping=damping, **{**SPNGD_SETTINGS, **extra, **overrides})


def _variant(spec, **overrides):
    """The same optimizer with some settings changed (recorded in the JSON like the others)."""
    return replace(spec, build=functools.partial(spec.build, **overrides), settings=dict(spec.settings, **overrides))


def _fixed(spec):
    """The same optimizer with the damping held fixed (``adaptive_damping=False``, the behaviour before
    adaptive damping existed): the adaptive default is compared against it."""
    return _variant(spec, adaptive_damping=False)


OPTIMIZERS = {
    "momentum": OptimizerSpec(_momentum, SGD_LRS, settings=MOMENTUM_SETTINGS),
    "adam": OptimizerSpec(_adam, ADAM_LRS, settings=ADAM_SETTINGS, family="adam"),
    "sgd": OptimizerSpec(_sgd, SGD_LRS),
    "kfac": OptimizerSpec(_kfac, SGD_LRS, NGD_DAMPINGS, KFAC_SETTINGS),
    "thor": OptimizerSpec(_thor, SGD_LRS, NGD_DAMPINGS, THOR_SETTINGS),
    "spngd": OptimizerSpec(_spngd, SGD_LRS, NGD_DAMPINGS, SPNGD_SETTINGS, requires="SPNGD"),
}
DEFAULT_OPTIMIZERS = tuple(OPTIMIZERS)     # the variants below run only when named
# AdamW, the first-order anchor of the transformer task (named there: --optimizers adamw,...)
OPTIMIZERS["adamw"] = OptimizerSpec(_adamw, ADAM_LRS, settings=ADAMW_SETTINGS, family="adam")
OPTIMIZERS.update({name + "-fixed": _fixed(OPTIMIZERS[name]) for name in ("kfac", "thor", "spngd")})
# the capture's cost options (not in the default list): statistics from half of each batch's examples,
# from every second output position of each convolution, K-FAC at KAISA's default rates (factors
# every 10 steps, inverses every 100; Pauloski et al. 2021) and with factors every 10 steps
OPTIMIZERS.update({
    "kfac-half": _variant(OPTIMIZERS["kfac"], stat_fraction=0.5),
    "kfac-stride2": _variant(OPTIMIZERS["kfac"], stat_stride=2),
    "kfac-10/100": _variant(OPTIMIZERS["kfac"], factor_update_interval=10, inverse_update_interval=100),
    # factors every 10 steps, inverses at K-FAC's default 20 (the capture interval alone changed)
    "kfac-10/20": _variant(OPTIMIZERS["kfac"], factor_update_interval=10),
    # K-FAC-reduce on sequence inputs (Eschenhagen et al. 2023): each example's rows averaged into one
    # input row and its output gradients summed, instead of every position counted as an example
    "kfac-reduce": _variant(OPTIMIZERS["kfac"], sequence_approx="reduce"),
    # SP-NGD with each change measured against the statistic alone, as before refresh_measure="damped"
    "spngd-raw": _variant(OPTIMIZERS["spngd"], refresh_measure="raw"),
    # the same first-order updates with one never-taken run-time branch in the step's graph, which
    # MindSpore 2.10's CPU runtime runs at the fast of its two speeds (benchmarks/baselines.py)
    "momentum-cf": OptimizerSpec(_momentum_cf, SGD_LRS, settings=MOMENTUM_SETTINGS),
    "adam-cf": OptimizerSpec(_adam_cf, ADAM_LRS, settings=ADAM_SETTINGS, family="adam"),
})


def available_optimizers():
    return [name for name, spec in OPTIMIZERS.items() if spec.available()]


def grid_points(name, grid="full", task=None):
    """The (lr, damping) pairs of optimizer ``name`` (on ``task``: with its learning-rate override, if
    any); ``grid="single"`` keeps the middle of each axis."""
    spec = OPTIMIZERS[name]
    lrs, dampings = spec.lrs_for(task), spec.dampings
    if grid == "single":
        lrs, dampings = (lrs[len(lrs) // 2],), (dampings[len(dampings) // 2],)
    return [(lr, damping) for lr in lrs for damping in dampings]


# ----------------------------------------------------------------------------------------- running

class Progress:
    """A one-line progress bar per run (carriage return on a terminal, one line per run otherwise)."""

    def __init__(self, label, total, stream=None, width=20):
        self.label, self.total, self.width = label, total, width
        self.stream = stream or sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()

    def _line(self, done, note):
        filled = int(round(self.width * done / max(self.total, 1)))
        return f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {note}"

    def update(self, done, note=""):
        if self.live:
            self.stream.write("\r" + self._line(done, note) + "\033[K")
            self.stream.flush()

    def close(self, done, note=""):
        self.stream.write(("\r" if self.live else "") + self._line(done, note) + ("\033[K" if self.live else "") + "\n")
        self.stream.flush()


def _batches(rng, x, y, batch_size):
    """One epoch's batches (drop remainder) as Tensors, in the order of a fresh permutation."""
    steps = len(x) // batch_size
    order = rng.permutation(len(x))[:steps * batch_size].reshape(steps, batch_size)
    return [(Tensor(x[idx]), Tensor(y[idx])) for idx in order]


def _param_checksum(net):
    return float(sum(np.abs(p.asnumpy().astype(np.float64)).sum() for p in net.trainable_params()))


def run_one(task, arrays, optimizer, lr, damping, seed, epochs, progress=None, monitor=True):
    """Train ``task``'s network once; return the run record with its per-epoch curve. ``monitor``: watch
    the losses with ``ngd.DivergenceMonitor`` (its default settings), which stops a run that diverges
    while staying finite, as it does for users; False counts what it would have seen without stopping."""
    x_train, y_train, x_test, y_test = arrays
    y_train_eval = y_train[:task.eval_train] if task.eval_train else y_train
    x_all = np.concatenate([x_train[:len(y_train_eval)], x_test])
    eval_chunks = [Tensor(x_all[i:i + task.eval_batch]) for i in range(0, len(x_all), task.eval_batch)]
    del x_all
    ms.set_seed(seed)
    net = task.build()
    init_checksum = _param_checksum(net)
    opt = OPTIMIZERS[optimizer].build(net, lr, damping, seed)
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, task.loss()), opt)
    cell.set_train()
    rng = np.random.default_rng(seed)
    # the loss-side stop a user adds (ngd.with_divergence_stops, the zoo's train.py): every run is
    # watched by it, so the suite shows whether it fires on a healthy run
    watch = ngd.DivergenceMonitor(name=optimizer)
    most_recent = 0
    losses = []                                      # every step's loss, for reading a stop afterwards

    def observe(loss):
        value = step_loss(loss)
        losses.append(value)
        try:
            watch.observe(value)
        except RuntimeError:
            if monitor:
                raise

    curve, seconds, compile_s, diverged, stopped = [], 0.0, 0.0, None, None
    note = ""
    for epoch in range(1, epochs + 1):
        batches = _batches(rng, x_train, y_train, task.batch_size)
        start = time.perf_counter()
        try:
            if epoch == 1:                           # time the first step (graph compilation) alone
                observe(cell(*batches[0]))
                first = time.perf_counter() - start
                rest_start = time.perf_counter()
            for batch in batches[1:] if epoch == 1 else batches:
                observe(cell(*batch))
                most_recent = max(most_recent, watch.recent)
        except RuntimeError as error:                # the optimizer's divergence stop ends this run only
            if not ngd.is_divergence(error):
                raise
            diverged, stopped = epoch, str(error).split("#dmsg#")[0].strip().splitlines()[0]
            note = "stopped: " + stopped
            break
        epoch_s = time.perf_counter() - start
        if epoch == 1:
            steady = (time.perf_counter() - rest_start) / max(len(batches) - 1, 1)
            compile_s = max(first - steady, 0.0)
        seconds += epoch_s
        net.set_train(False)
        metrics = task.evaluate(np.concatenate([net(chunk).asnumpy() for chunk in eval_chunks]), y_train_eval, y_test)
        net.set_train(True)
        curve.append({"epoch": epoch, "step": epoch * len(batches), **metrics, "epoch_s": epoch_s, "seconds": seconds,
                      "seconds_excl_compile": seconds - compile_s})
        note = f"{task.metric} {metrics[task.metric]:.4f}  {seconds:.1f}s"
        if progress:
            progress.update(epoch, note)
        if not np.isfinite(metrics["train_loss"]):
            diverged = epoch
            break
        if task.target is not None and metrics[task.metric] >= task.target:
            break                                    # a race to a fixed target ends at the target
    ended_exploding = False
    if stopped is None and diverged is None:
        try:                                         # the monitor's end-of-run check, as Model.train calls it
            watch.finish()
        except RuntimeError as error:
            ended_exploding = True
            if monitor:
                diverged, stopped = len(curve), str(error).splitlines()[0]
                note = "stopped: " + stopped
    if progress:
        progress.close(len(curve), note + (f"  diverged at epoch {diverged}" if diverged else ""))
    counters = opt.state_counters() if hasattr(opt, "state_counters") else None   # refreshes, faults
    return {"optimizer": optimizer, "lr": lr, "damping": damping, "seed": seed, "compile_s": compile_s,
            "steps_per_epoch": len(x_train) // task.batch_size, "diverged_epoch": diverged, "stopped": stopped,
            "init_checksum": init_checksum, "counters": counters, "curve": curve,
            "monitor": {"stops": monitor, "patience": watch.patience, "window": 2 * watch.patience,
                        "most_exploded": max(most_recent, watch.recent), "longest_run": watch.longest,
                        "worst_ratio": watch.worst, "ended_exploding": ended_exploding},
            "step_losses": losses}


def with_target(task, target):
    """``task`` raced to the fixed test accuracy ``target`` (None: the task as defined); ValueError
    for a target outside (0, 1] or a task that is not a classification task."""
    if target is None or target == task.target:
        return task
    if not 0.0 < target <= 1.0:
        raise ValueError(f"the target must be a test accuracy in (0, 1], got {target}")
    if task.kind != "classification":
        raise ValueError(f"a fixed target is a test accuracy, which only a classification task has: "
                         f"task {task.name!r} is of kind {task.kind!r}")
    return dataclasses.replace(task, target=float(target))


def _run_in_child(task_name, target, name, lr, damping, seed, epochs, label, monitor=True):
    """Entry point of a fresh (spawned) process: one run, returned to the parent by pickling."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    task = with_target(TASKS[task_name], target)
    return run_one(task, task.load(), name, lr, damping, seed, epochs, Progress(label, epochs), monitor)


def run_task(task, optimizers, seeds, epochs, grid="full", stream=None, isolate=False, monitor=True):
    """Every run of ``task``: optimizers x grid points x seeds; returns the list of run records.

    ``grid="tuned"``: the full grid with seed 0 only, then seeds 1..N-1 at each optimizer's chosen
    point (the grid point :func:`summarize` picks from seed 0) -- each optimizer tuned on the same grid
    for a fraction of the cost of every point at every seed.

    ``isolate=True`` runs each in a fresh process: MindSpore 2.10 keeps every compiled training graph
    for the life of the process (measured: +130-170 MB per K-FAC run of the autoencoder, with
    ``gc.collect()``), so a full suite in one process grows past 13 GB.
    """
    if grid == "tuned":
        runs = run_task(task, optimizers, 1, epochs, "full", stream, isolate, monitor)
        chosen = summarize(task, runs)["best"]
        plan = [(name, chosen[name]["lr"], chosen[name]["damping"], seed)
                for seed in range(1, seeds) for name in optimizers]
        return runs + _run_plan(task, plan, epochs, stream, isolate, monitor)
    plan = [(name, lr, damping, seed) for seed in range(seeds) for name in optimizers
            for lr, damping in grid_points(name, grid, task)]
    return _run_plan(task, plan, epochs, stream, isolate, monitor)


def _run_plan(task, plan, epochs, stream, isolate, monitor=True):
    labels = [f"{task.name} {i}/{len(plan)} {name} lr={lr:g}" + (f" damping={damping:g}" if damping else "")
              + f" seed={seed}" for i, (name, lr, damping, seed) in enumerate(plan, 1)]
    if isolate:
        import multiprocessing
        context = multiprocessing.get_context("spawn")
        runs = []
        for (name, lr, damping, seed), label in zip(plan, labels):
            with context.Pool(1) as pool:
                runs.append(pool.apply(_run_in_child, (task.name, task.target, name, lr, damping, seed, epochs, label,
                                                       monitor)))
        return runs
    arrays = task.load()
    return [run_one(task, arrays, name, lr, damping, seed, epochs, Progress(label, epochs, stream), monitor)
            for (name, lr, damping, seed), label in zip(plan, labels)]


# ------------------------------------------------------------------------------------- summarizing

def _stats(values):
    """median, min, max of finite-or-inf values (NaN counts as not available)."""
    values = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def _best(values, higher):
    values = [v for v in values if np.isfinite(v)]
    if not values:
        return float("nan")
    return max(values) if higher else min(values)


def _first_reaching(curve, key, target, higher):
    for row in curve:
        value = row[key]
        if np.isfinite(value) and (value >= target if higher else value <= target):
            return row
    return None


def _final_train_loss(run):
    """The training loss after the last epoch a run completed; NaN for a run the optimizer stopped in its
    first epoch (no epoch completed)."""
    return run["curve"][-1]["train_loss"] if run["curve"] else float("nan")


def summarize(task, runs):
    """Grid table rows, the best grid point per optimizer, targets and time-to-target statistics."""
    higher = task.higher_is_better
    sign = 1.0 if higher else -1.0
    groups = {}
    for run in runs:
        groups.setdefault((run["optimizer"], run["lr"], run["damping"]), []).append(run)
    grid = []
    for (name, lr, damping), group in groups.items():
        bests = [_best([r[task.metric] for r in run["curve"]], higher) for run in group]
        means = [float(np.mean([v for v in (r[task.metric] for r in run["curve"]) if np.isfinite(v)] or [np.nan]))
                 for run in group]
        grid.append({"optimizer": name, "lr": lr, "damping": damping, "seeds": len(group),
                     "best_metric": _stats(bests), "mean_metric": _stats(means),
                     "final_train_loss": _stats([_final_train_loss(run) for run in group]),
                     "diverged_runs": sum(run["diverged_epoch"] is not None for run in group)})
        if task.target is not None:
            hits = [_first_reaching(run["curve"], task.metric, task.target, higher) for run in group]
            grid[-1]["reached"] = sum(hit is not None for hit in hits)
            grid[-1]["seconds_to_target"] = _stats(
                [hit["seconds_excl_compile"] if hit else math.inf for hit in hits])

    def score(row):
        """The points run on the most seeds first: with ``grid="tuned"`` the point chosen on seed 0 and
        repeated on the others stays chosen (its median over every seed is not compared with another
        point's seed 0 alone). Then the best metric; ties (common: one test image is 1/360 on digits)
        go to the grid point with the better metric averaged over the epochs, i.e. the one that got
        there sooner. With a fixed target: the most seeds reaching it, then the fewest median training
        seconds to it, then (no point reached it) the best metric, as without a target."""
        values = (row["best_metric"]["median"], row["mean_metric"]["median"])
        metric = tuple(-math.inf if math.isnan(v) else sign * v for v in values)
        if task.target is not None:
            return (row["seeds"], row["reached"], -row["seconds_to_target"]["median"]) + metric
        return (row["seeds"],) + metric

    chosen = {}
    for row in grid:
        current = chosen.get(row["optimizer"])
        if current is None or score(row) > score(current):
            chosen[row["optimizer"]] = row
    for row in grid:
        row["chosen"] = chosen[row["optimizer"]] is row

    def best_runs(name):
        row = chosen[name]
        return sorted(groups[(name, row["lr"], row["damping"])], key=lambda r: r["seed"])

    targets = {}
    target_higher = task.target_metric == "test_acc"
    if task.target is not None:
        targets = {run["seed"]: float(task.target) for run in runs}
    elif task.reference in chosen:
        for run in best_runs(task.reference):
            values = [r[task.target_metric] for r in run["curve"]]
            if task.target_rule == "final":
                targets[run["seed"]] = values[-1] if run["diverged_epoch"] is None else float("nan")
            else:
                targets[run["seed"]] = _best(values, target_higher)
    best = {}
    for name in chosen:
        row, runs_ = chosen[name], best_runs(name)
        per_seed = []
        for run in runs_:
            target = targets.get(run["seed"], float("nan"))
            hit = _first_reaching(run["curve"], task.target_metric, target, target_higher) \
                if np.isfinite(target) else None
            epoch_s = [r["epoch_s"] for r in run["curve"][1:]]
            per_seed.append({
                "seed": run["seed"], "target": target,
                "best_metric": _best([r[task.metric] for r in run["curve"]], higher),
                "final_train_loss": _final_train_loss(run),
                "epochs_to_target": hit["epoch"] if hit else math.inf,
                "seconds_to_target": hit["seconds"] if hit else math.inf,
                "seconds_to_target_excl_compile": hit["seconds_excl_compile"] if hit else math.inf,
                "seconds_per_epoch": float(np.median(epoch_s)) if epoch_s else float("nan"),
                "compile_s": run["compile_s"]})
        best[name] = {"lr": row["lr"], "damping": row["damping"], "per_seed": per_seed,
                      "reached": sum(math.isfinite(s["epochs_to_target"]) for s in per_seed)}
        for key in ("best_metric", "final_train_loss", "epochs_to_target", "seconds_to_target",
                    "seconds_to_target_excl_compile", "seconds_per_epoch", "compile_s"):
            best[name][key] = _stats([s[key] for s in per_seed])
    anchor = _anchor(best)
    for reference_name, suffix in ((task.reference, "_vs_" + task.reference), (anchor, "_vs_anchor")):
        if reference_name not in best:
            continue
        reference = {s["seed"]: s for s in best[reference_name]["per_seed"]}
        for name, entry in best.items():
            for key in ("epochs_to_target", "seconds_to_target", "seconds_to_target_excl_compile"):
                # a reference that never reached the target gives no ratio (x / inf would read 0)
                ratios = [s[key] / reference[s["seed"]][key] for s in entry["per_seed"]
                          if s["seed"] in reference and 0 < reference[s["seed"]][key] < math.inf]
                entry[key + suffix] = _stats(ratios)
    return {"grid": grid, "best": best, "targets": {str(k): v for k, v in targets.items()}, "anchor": anchor,
            "monitor": _monitor_summary(runs)}


def _monitor_summary(runs):
    """Per optimizer, over all its runs: how many the loss-side ``DivergenceMonitor`` stopped, and the
    most exploded losses it saw in one window (a run stops at ``patience`` of them)."""
    out = {}
    for run in runs:
        seen = run.get("monitor")
        if seen is None:                             # a record from before the monitor watched every run
            continue
        entry = out.setdefault(run["optimizer"], {"runs": 0, "stopped": 0, "most_exploded": 0,
                                                  "patience": seen["patience"], "window": seen["window"]})
        entry["runs"] += 1
        entry["stopped"] += bool(run["stopped"]) and "DivergenceMonitor" in run["stopped"]
        entry["most_exploded"] = max(entry["most_exploded"], seen["most_exploded"])
        entry["watching_only"] = entry.get("watching_only", False) or not seen.get("stops", True)
    return out


ANCHORS = ("momentum", "adam", "momentum-cf", "adam-cf", "adamw")


def _anchor(best):
    """The better first-order anchor: of tuned Momentum and Adam (stock, or with a run-time branch:
    ``momentum-cf``, ``adam-cf``, when they ran) and AdamW, the one with the fewer median training seconds
    (compilation excluded) to the target; None when none ran."""
    present = [name for name in ANCHORS if name in best]
    if not present:
        return None
    return min(present, key=lambda name: (-best[name]["reached"],
                                          best[name]["seconds_to_target_excl_compile"]["median"]))


def _fmt(value, digits):
    if isinstance(value, float) and math.isinf(value):
        return "not reached"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _range(stats, digits, single=False):
    text = _fmt(stats["median"], digits)
    if single or stats["min"] == stats["max"] or text in ("-", "not reached"):
        return text
    return f"{text} [{_fmt(stats['min'], digits)}, {_fmt(stats['max'], digits)}]"


def _point(lr, damping):
    return f"{lr:g}" + (f", {damping:g}" if damping else "")


DISPLAY_NAMES = {"momentum": "Momentum", "adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def _display(name):
    return DISPLAY_NAMES.get(name, name)


def markdown(task, summary, seeds, epochs):
    """The task's Markdown: the per-optimizer table (best grid points) and the whole grid."""
    one = seeds == 1
    lm = task.kind == "language-model"
    metric = "test acc" if task.metric == "test_acc" else ("validation loss" if lm else "test loss")
    reference = _display(task.reference)
    digits = 4
    if task.target_rule == "fixed":
        target_text = f"test accuracy {task.target:g} (fixed; each run stops when it gets there)"
    elif task.target_rule == "best":
        target_text = f"{reference}'s best test accuracy in {epochs} epochs"
    else:
        target_text = f"{reference}'s final {'validation' if lm else 'training'} loss after {epochs} epochs"
    targets = list(summary["targets"].values())
    lines = [f"### {task.name}", "", task.description + ".", "",
             f"Target: {target_text}, per seed ({', '.join(_fmt(t, 4) for t in targets)}). "
             f"{'One seed.' if one else f'Median [min, max] over {seeds} seeds.'} Seconds are training "
             "time only (evaluation excluded); *incl.* counts graph compilation, *excl.* does not. "
             f"*Anchor*: the best tuned first-order optimizer on this task ({summary.get('anchor') or '-'}).", "",
             f"| optimizer | lr, damping | best {metric} | final train loss | epochs to target | "
             f"x {reference} | s to target incl. | s to target excl. | x {reference} (excl.) | x anchor (epochs) | "
             "x anchor (excl.) | s/epoch | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary["best"].items():
        reached = "" if entry["reached"] == len(entry["per_seed"]) else \
            f" ({entry['reached']}/{len(entry['per_seed'])} reached)"
        ratio_e = entry.get("epochs_to_target_vs_" + task.reference, {"median": float("nan")})
        ratio_s = entry.get("seconds_to_target_excl_compile_vs_" + task.reference, {"median": float("nan")})
        anchor_e = entry.get("epochs_to_target_vs_anchor", {"median": float("nan")})
        anchor_s = entry.get("seconds_to_target_excl_compile_vs_anchor", {"median": float("nan")})
        lines.append(
            f"| {name} | {_point(entry['lr'], entry['damping'])} | {_range(entry['best_metric'], digits, one)} | "
            f"{_range(entry['final_train_loss'], digits, one)} | {_range(entry['epochs_to_target'], 0, one)}"
            f"{reached} | {_fmt(ratio_e['median'], 2)} | {_range(entry['seconds_to_target'], 1, one)} | "
            f"{_range(entry['seconds_to_target_excl_compile'], 1, one)} | {_fmt(ratio_s['median'], 2)} | "
            f"{_fmt(anchor_e['median'], 2)} | {_fmt(anchor_s['median'], 2)} | "
            f"{_fmt(entry['seconds_per_epoch']['median'], 3)} | {_fmt(entry['compile_s']['median'], 1)} |")
    watched = summary.get("monitor") or {}
    if watched:
        lines += ["", "The loss-side `DivergenceMonitor` (growth 1.5, stops at patience exploded losses in a window of "
                  "2 x patience) watched every run: " + "; ".join(
                      f"{name} {'(watching only) ' if m.get('watching_only') else ''}stopped {m['stopped']} "
                      f"of {m['runs']}, at most {m['most_exploded']} of {m['window']} exploded"
                      for name, m in watched.items()) + "."]
    lines += ["", f"Whole grid ({'chosen' if one else 'median over seeds; chosen'} point in bold):", "",
              f"| optimizer | lr | damping | best {metric} | final train loss | diverged runs |", "|---|---|---|---|---|---|"]
    for row in summary["grid"]:
        bold = "**" if row["chosen"] else ""
        damping = "-" if row["damping"] is None else f"{row['damping']:g}"
        lines.append(f"| {bold}{row['optimizer']}{bold} | {row['lr']:g} | {damping} | "
                     f"{bold}{_range(row['best_metric'], digits, one)}{bold} | "
                     f"{_range(row['final_train_loss'], digits, one)} | {row['diverged_runs']} |")
    lrs = {}
    for row in summary["grid"]:
        lrs.setdefault(row["optimizer"], set()).add(row["lr"])
    edge = [f"{name} (lr {entry['lr']:g})" for name, entry in summary["best"].items()
            if len(lrs[name]) > 1 and entry["lr"] in (min(lrs[name]), max(lrs[name]))]
    if edge:
        lines += ["", "Best learning rate at the edge of its grid: " + ", ".join(edge) + "."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- plotting

def plot(task, runs, summary, path):
    """Test metric vs epoch and vs seconds of each optimizer's best grid point: the median over seeds,
    or, in a race to a fixed target, every seed's run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a language model is read against its steps (as transformers are compared); the rest per epoch
    panels = [(task.metric, "step" if task.kind == "language-model" else "epoch"), (task.metric, "seconds")]
    if task.target_metric != task.metric:
        panels.append((task.target_metric, "epoch"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), dpi=90)
    labels = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss",
              "epoch": "epoch", "step": "training step", "seconds": "training seconds (incl. compile)"}
    if task.kind == "language-model":
        labels["test_loss"] = "validation loss (nats per byte)"
    targets = [t for t in summary["targets"].values() if np.isfinite(t)]
    for name, entry in summary["best"].items():
        chosen = [r for r in runs if r["optimizer"] == name and r["lr"] == entry["lr"]
                  and r["damping"] == entry["damping"]]
        label = f"{name} ({_point(entry['lr'], entry['damping'])})"
        length = min(len(r["curve"]) for r in chosen)
        for ax, (key, x_key) in zip(axes, panels):
            if task.target is not None:
                # a race stops each run at the target, after a different number of epochs: every seed
                # is drawn, with markers (a run that hits the target in its first epoch is one point)
                color = None
                for i, r in enumerate(chosen):
                    line, = ax.plot([row[x_key] for row in r["curve"]], [row[key] for row in r["curve"]],
                                    marker="o", ms=3, lw=1, color=color, label=label if i == 0 else None)
                    color = line.get_color()
                continue
            values = np.array([[row[key] for row in r["curve"][:length]] for r in chosen])
            xs = np.median(np.array([[row[x_key] for row in r["curve"][:length]] for r in chosen]), 0)
            line, = ax.plot(xs, np.median(values, 0), label=label)
            if len(chosen) > 1:
                ax.fill_between(xs, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
    for ax, (key, x_key) in zip(axes, panels):
        if key == task.target_metric and targets:
            ax.axhline(float(np.median(targets)), color="gray", ls="--", lw=0.8, label="target")
        if key != "test_acc":
            ax.set_yscale("log")
        elif targets:
            ax.set_ylim(max(0.0, min(targets) - 0.15), 1.0)
        ax.set_xlabel(labels[x_key])
        ax.set_ylabel(labels[key])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(task.name, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"saved {path}")
    return path


# ------------------------------------------------------------------------------------------- CLI

def _positive(parser, option, value):
    if value is not None and value < 1:
        parser.error(f"{option} must be an integer >= 1, got {value}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="digits-cnn",
                        help=f"comma-separated tasks among {', '.join(TASKS)}, or all (default digits-cnn)")
    parser.add_argument("--optimizers", default=",".join(n for n in available_optimizers() if n in DEFAULT_OPTIMIZERS),
                        help=f"comma-separated among {', '.join(OPTIMIZERS)}; must include each task's "
                             "reference (momentum; adamw for stdlib-bytes), whose result is the target, unless "
                             "the task has a fixed target. Default: all available")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds 0..N-1 (default 3; 1 with --quick)")
    parser.add_argument("--epochs", type=int, default=None, help="epoch budget (default: the task's)")
    parser.add_argument("--grid", choices=("full", "single", "tuned"), default=None,
                        help="full: every lr (and damping) of the grid at every seed; single: the middle "
                             "point; tuned: the full grid at seed 0, the other seeds at each optimizer's "
                             "chosen point (default full; single with --quick)")
    parser.add_argument("--target", type=float, default=None,
                        help="race every task to this test accuracy in (0, 1] (classification tasks only; "
                             "replaces the task's own fixed target or its Momentum-derived one)")
    parser.add_argument("--quick", action="store_true",
                        help="one seed, the task's quick epoch budget, single grid point")
    parser.add_argument("--out", default=None, help="output directory (default results/; with --from-json: "
                        "next to each JSON file)")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots (no matplotlib needed)")
    parser.add_argument("--isolate", choices=("yes", "no"), default=None,
                        help="run every training run in a fresh process (bounded memory: MindSpore keeps "
                             "compiled graphs for the life of a process); default yes, no with --quick")
    parser.add_argument("--monitor", choices=("yes", "no"), default="yes",
                        help="stop a run that ngd.DivergenceMonitor (default settings) sees diverge, as a user's "
                             "run stops (default yes); no: record what it saw, without stopping")
    parser.add_argument("--from-json", nargs="+", metavar="FILE",
                        help="rebuild the Markdown and PNG of saved convergence_<task>.json files (no training)")
    args = parser.parse_args(argv)
    args.out_given = args.out is not None
    args.out = args.out or "results"
    for path in args.from_json or ():
        if not os.path.isfile(path):
            parser.error(f"--from-json: no such file {path!r}")
    args.tasks = parse_names(parser, "--task", args.task, list(TASKS), all_value=TASKS)
    args.optimizer_names = parse_names(parser, "--optimizers", args.optimizers, list(OPTIMIZERS))
    missing = [n for n in args.optimizer_names if not OPTIMIZERS[n].available()]
    if missing:
        parser.error(f"--optimizers: {', '.join(missing)} needs mindspore_ngd."
                     f"{OPTIMIZERS[missing[0]].requires}, which this installation of mindspore_ngd "
                     f"does not have; available: {', '.join(available_optimizers())}")
    open_targets = [name for name in args.tasks if args.target is None and TASKS[name].target is None]
    for reference in sorted({TASKS[name].reference for name in open_targets} - set(args.optimizer_names)):
        tasks = [name for name in open_targets if TASKS[name].reference == reference]
        parser.error(f"--optimizers must include {reference}: its result is the target of "
                     f"{', '.join(tasks)} (tasks with a fixed target, or --target, do without it)")
    _positive(parser, "--seeds", args.seeds)
    _positive(parser, "--epochs", args.epochs)
    for name in args.tasks:
        try:
            with_target(TASKS[name], args.target)
        except ValueError as err:
            parser.error(f"--target: {err}")
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.grid is None:
        args.grid = "single" if args.quick else "full"
    args.isolate = (args.isolate or ("no" if args.quick else "yes")) == "yes"
    args.monitor = args.monitor == "yes"
    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:
        parser.error("plots need matplotlib (pip install matplotlib), or pass --no-plots")
    return args


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        return None


def _json_safe(value):
    """Non-finite floats (a target not reached: inf; nothing to report: NaN) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _write_reports(task, runs, meta, out, name, plots):
    """Markdown and (optionally) PNG for one task's runs; returns (summary, table, md path, png path)."""
    summary = summarize(task, runs)
    table = markdown(task, summary, meta["seeds"], meta["epochs"])
    md_path = os.path.join(out, name + ".md")
    os.makedirs(out, exist_ok=True)
    with open(md_path, "w", encoding="utf-8") as handle:
        handle.write(f"`{meta['command']}`\n\n{table}\n\nTotal time for this task: {meta['total_seconds']:.0f} s "
                     f"on {meta.get('cpu_model') or 'an unknown CPU'}.\n")
    png_path = plot(task, runs, summary, os.path.join(out, name + ".png")) if plots else None
    return summary, table, md_path, png_path


def _nan_for_null(value):
    if value is None:
        return float("nan")
    if isinstance(value, dict):
        return {k: _nan_for_null(v) if k != "diverged_epoch" else v for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_for_null(v) for v in value]
    return value


def rebuild(json_path, out=None, plots=True):
    """Tables and plots again from a saved ``convergence_<task>.json`` (no training)."""
    with open(json_path, encoding="utf-8") as handle:
        payload = json.load(handle)
    runs = [dict(run, curve=_nan_for_null(run["curve"])) for run in payload["runs"]]
    name = os.path.splitext(os.path.basename(json_path))[0]
    task = with_target(TASKS[payload["task"]], payload.get("target"))
    _, table, md_path, png_path = _write_reports(task, runs, payload,
                                                 out or os.path.dirname(json_path), name, plots)
    print(table)
    return {"json": json_path, "markdown": md_path, "png": png_path}


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        return {path: rebuild(path, args.out if args.out_given else None, not args.no_plots)
                for path in args.from_json}
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    command = "python -m benchmarks.convergence " + " ".join(
        argv if argv is not None else sys.argv[1:])
    outputs = {}
    for task_name in args.tasks:
        task = with_target(TASKS[task_name], args.target)
        epochs = args.epochs or (task.quick_epochs if args.quick else task.epochs)
        reason = task.unavailable_reason()
        if reason:
            print(f"skipping task {task.name}: {reason}", flush=True)
            continue
        start = time.perf_counter()
        try:
            runs = run_task(task, args.optimizer_names, args.seeds, epochs, args.grid, isolate=args.isolate,
                            monitor=args.monitor)
        except DataUnavailable as err:      # the files went away after the check
            print(f"skipping task {task.name}: {err}", flush=True)
            continue
        settings = {n: {"lrs": list(OPTIMIZERS[n].lrs_for(task)), "dampings": list(OPTIMIZERS[n].dampings),
                        "settings": OPTIMIZERS[n].settings} for n in args.optimizer_names}
        meta = {"task": task.name, "description": task.description, "kind": task.kind,
                "metric": task.metric, "higher_is_better": task.higher_is_better,
                "target_metric": task.target_metric, "target_rule": task.target_rule, "target": task.target,
                "epochs": epochs, "seeds": args.seeds, "batch_size": task.batch_size, "grid": args.grid,
                "quick": args.quick, "isolated_runs": args.isolate, "optimizers": settings, "command": command,
                "total_seconds": time.perf_counter() - start, "cpu_model": _cpu_model()}
        name = f"convergence_{task.name}" + ("" if args.target is None else f"_target{args.target:g}") \
            + ("_quick" if args.quick else "")
        summary, table, md_path, png_path = _write_reports(task, runs, meta, args.out, name, not args.no_plots)
        print(table, flush=True)
        json_path = save_results(args.out, name, _json_safe({**meta, "runs": runs, **summary, "markdown": table}))
        outputs[task.name] = {"json": json_path, "markdown": md_path, "png": png_path}
        print(f"{task.name}: {len(runs)} runs in {meta['total_seconds']:.0f} s", flush=True)
    return outputs


if __name__ == "__main__":
    main()
