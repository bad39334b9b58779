"""Distributed K-FAC on CPU ranks: factor bytes, per-rank inversion time and step time, 2 ranks vs 1 process.

    # everything (1 process here, then 2 ranks through msrun), one table:
    python -m benchmarks.distributed [--workers 2] [--out results/]
    # the multi-rank part alone (msrun launches "python ARGS..." as given when the script is "python"):
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \\
        python -m benchmarks.distributed --out results/

Both from the repository root: ``benchmarks`` is not installed with the package.

Model: ``ResNetCifar(blocks_per_stage=1, width=16, in_channels=1)`` (10 preconditioned layers) on
scikit-learn's 8x8 digits (synthetic 8x8 inputs if scikit-learn is missing), a global batch of
``--batch`` images split evenly over the ranks, K-FAC with factors every step and inverses every
``--period`` steps, ``Model``-style ``TrainOneStepCell`` under ``DATA_PARALLEL``.

Reported per rank:

* bytes sent per capture step for the factors (ring model, per rank): ours -- the packed upper
  triangles laid out by owner, one AllReduce on CPU (``2 (N-1)/N`` of the buffer) or one
  ReduceScatter where the backend has it (``(N-1)/N``) -- versus an AllReduce of every full factor;
  the preconditioned-gradient AllGather (``(N-1)`` chunks) and the data-parallel gradient all-reduce
  for scale. These are computed from the ownership plan, not measured on the wire;
* inversion time: the owned layers' damped inverses (the engine's own refresh code, compiled alone
  and timed over ``--repeats`` calls) -- with 2 ranks each rank inverts its share, one rank at a
  time while the others wait in a collective (whether MCCL's wait spins is not known), with 1
  process all layers;
* step time: median of non-refresh steps, median of refresh steps and the mean over whole periods.

This machine has 2 cores shared with other jobs and the 2 ranks share them: the numbers are noisy
medians, and 2 ranks cannot be faster than 1 process here (the point is the split of the work).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, ops, Tensor  # noqa: E402

from mindspore_ngd.curvature.state import InverseState  # noqa: E402

RANKS_FILE = "distributed_ranks.json"
# msrun starts the workers (and its scheduler) as "python -m benchmarks.distributed" in this directory
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = ("inversion_ms", "quiet_ms", "refresh_ms", "amortised_ms", "compile_s")


def _data(batch, seed=0):
    try:
        from .data import digits_arrays
        x, y, _, _ = digits_arrays()
        source = "digits"
    except ImportError:
        rng = np.random.default_rng(seed)
        x = rng.random((1024, 1, 8, 8), dtype=np.float32)
        y = rng.integers(0, 10, 1024).astype(np.int32)
        source = "synthetic"
    return x[:batch * (len(x) // batch)], y[:batch * (len(y) // batch)], source


class _Inversions(nn.Cell):
    """The optimizer's inverse refresh (owned layers only when distributed), compiled alone."""

    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        self.curvature = optimizer.curvature

    def construct(self, damping):
        curvature = self.curvature
        inverses = curvature.refreshed(curvature.stored_factors(), damping, None, ops.ones((), ms.bool_))
        return inverses[InverseState.HAS_INVERSE]


class _Barrier(nn.Cell):
    """A world AllReduce of one float, waited for (MCCL on CPU has no Barrier kernel)."""

    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce()
        self.one = Tensor(np.ones(1, np.float32))

    def construct(self):
        return self.op(self.one)


def measure(rank, world, args):
    """Train, time, and describe this rank's share; a dict of plain numbers."""
    from mindspore_ngd import KFAC
    from .models import ResNetCifar
    ms.set_seed(0)
    net = ResNetCifar(blocks_per_stage=1, width=16, in_channels=1)
    opt = KFAC(net, learning_rate=0.05, damping=1e-2, inverse_update_interval=args.period, verbose=rank == 0)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    x, y, source = _data(args.batch)
    part = args.batch // world
    batches = [(Tensor(x[i:i + args.batch][rank * part:(rank + 1) * part]),
                Tensor(y[i:i + args.batch][rank * part:(rank + 1) * part])) for i in range(0, len(x), args.batch)]
    start = time.perf_counter()
    step(*batches[0]).asnumpy()
    compile_s = time.perf_counter() - start
    for i in range(1, args.period):                       # finish the first period (warm-up)
        step(*batches[i % len(batches)]).asnumpy()
    times = []
    for i in range(args.rounds * args.period):
        data = batches[(args.period + i) % len(batches)]
        start = time.perf_counter()
        step(*data).asnumpy()
        times.append(time.perf_counter() - start)
    times = np.asarray(times)
    refresh = times[0::args.period]
    quiet = np.delete(times, np.arange(0, len(times), args.period))
    invert = _Inversions(opt)
    damping = Tensor(np.float32(1e-2))
    invert(damping).asnumpy()                             # compile
    barrier = _Barrier() if world > 1 else None
    inv_times = []
    for turn in range(world):                             # one rank at a time: the others wait in a collective
        if barrier is not None:
            barrier().asnumpy()
        if turn == rank:
            for _ in range(args.repeats):
                start = time.perf_counter()
                invert(damping).asnumpy()
                inv_times.append(time.perf_counter() - start)
    if barrier is not None:
        barrier().asnumpy()
    specs = opt.layer_specs
    full = sum(s.a_dim ** 2 + s.g_dim ** 2 for s in specs)
    grads = sum(p.size for p in net.trainable_params())
    ring = 2 * (world - 1) / world
    out = {"rank": rank, "world": world, "data": source, "batch_per_rank": part, "layers": len(specs),
           "owned_layers": list(opt.owned_layers),
           "owned_cost_share": 1.0, "compile_s": compile_s,
           "inversion_ms": 1e3 * float(np.median(inv_times)), "quiet_ms": 1e3 * float(np.median(quiet)),
           "refresh_ms": 1e3 * float(np.median(refresh)), "amortised_ms": 1e3 * float(times.mean()),
           "full_factor_allreduce_bytes": ring * full * 4, "dp_gradient_allreduce_bytes": ring * grads * 4,
           "factor_bytes": 0.0, "factor_bytes_reduce_scatter": 0.0, "gather_bytes": 0.0}
    comm = opt.communicator
    if comm is not None:
        plan = comm.plan
        total = plan.factor_layout().total * 4
        out.update(factor_bytes=comm.factor_bytes(), factor_bytes_reduce_scatter=(world - 1) / world * total,
                   gather_bytes=(world - 1) * plan.gradient_layout().chunk * 4 if comm.gather_collective else 0.0,
                   owned_cost_share=plan.load(comm.position) / plan.total_cost, plan=str(plan),
                   collectives=comm.describe(), owned_by_rank=[list(plan.layers_of(r)) for r in range(world)])
    return out


def _gather_ranks(result, world):
    """Every rank's numeric metrics on every rank (world AllGather of a small vector)."""
    class Gather(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.AllGather()

        def construct(self, v):
            return self.op(v)
    values = Tensor(np.array([result[k] for k in METRICS] + [result["owned_cost_share"]], np.float32))
    table = Gather()(values).asnumpy().reshape(world, -1)
    return [dict(zip(METRICS + ("owned_cost_share",), (float(v) for v in row)), rank=r) for r, row in enumerate(table)]


def markdown(rows, common):
    lines = [f"K-FAC, ResNetCifar(1 block/stage, width 16) on 8x8 {common['data']}, global batch {common['batch']}, "
             f"inverses every {common['period']} steps; medians over {common['rounds'] * common['period']} steps "
             f"and {common['repeats']} inversion calls on a shared 2-core machine (noisy); MB per rank per "
             "capture step, ring model from the ownership plan", "",
             "| run | rank | owned layers (cost share) | inversion ms | non-refresh step ms | refresh step ms "
             "| amortised step ms | factors MB: ours, CPU AllReduce (ReduceScatter) "
             "| factors MB: AllReduce of full factors | precond. gather MB | DP gradient all-reduce MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["world"] > 1:
            comm = (f"{1e-6 * r['factor_bytes']:.3f} ({1e-6 * r['factor_bytes_reduce_scatter']:.3f}) "
                    f"| {1e-6 * r['full_factor_allreduce_bytes']:.3f} | {1e-6 * r['gather_bytes']:.3f} "
                    f"| {1e-6 * r['dp_gradient_allreduce_bytes']:.3f}")
        else:
            comm = "- | - | - | -"
        lines.append(
            f"| {r['run']} | {r['rank']} | {r['owned']} ({100 * r['owned_cost_share']:.0f}%) | {r['inversion_ms']:.1f} "
            f"| {r['quiet_ms']:.1f} | {r['refresh_ms']:.1f} | {r['amortised_ms']:.1f} | {comm} |")
    return "\n".join(lines)


def _rows(results, run):
    return [dict(r, run=run, owned=len(r["owned_layers"])) for r in results]


def worker(args):
    from mindspore.communication import init, get_rank, get_group_size
    from mindspore.context import ParallelMode
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    mine = measure(rank, world, args)
    everyone = _gather_ranks(mine, world)
    if rank == 0:
        # owned layers and bytes follow from the plan, identical on every rank
        for entry in everyone:
            entry.update({k: mine[k] for k in ("full_factor_allreduce_bytes", "dp_gradient_allreduce_bytes",
                                               "factor_bytes", "factor_bytes_reduce_scatter", "gather_bytes",
                                               "world", "data", "batch_per_rank", "layers")})
            entry["owned_layers"] = mine["owned_by_rank"][entry["rank"]]
        payload = {"ranks": everyone, "plan": mine.get("plan"), "collectives": mine.get("collectives")}
        path = os.path.join(args.out, RANKS_FILE)
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
        print(mine["collectives"])
        print(mine["plan"])
        print(markdown(_rows(everyone, f"{world} ranks"), _common(args, mine["data"])))


def _common(args, data):
    return {"batch": args.batch, "period": args.period, "rounds": args.rounds, "repeats": args.repeats, "data": data}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def driver(args):
    from . import save_results
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    single = measure(0, 1, args)
    workdir = tempfile.mkdtemp(prefix="ngd_bench_")
    command = ["msrun", f"--worker_num={args.workers}", f"--local_worker_num={args.workers}",
               f"--master_port={_free_port()}", f"--log_dir={os.path.join(workdir, 'logs')}", "--join=True",
               "python", "-m", "benchmarks.distributed", "--out", workdir, "--batch", str(args.batch),
               "--period", str(args.period), "--rounds", str(args.rounds), "--repeats", str(args.repeats)]
    start = time.time()
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)           # msrun, its scheduler and its workers
        output, _ = proc.communicate()
    elapsed = time.time() - start
    path = os.path.join(workdir, RANKS_FILE)
    if proc.returncode != 0 or not os.path.exists(path):
        raise SystemExit(f"msrun failed ({proc.returncode}); logs in {workdir}/logs\n{output[-3000:]}")
    with open(path, encoding="utf-8") as handle:
        ranks = json.load(handle)
    shutil.rmtree(workdir, ignore_errors=True)
    rows = _rows([single], "1 process") + _rows(ranks["ranks"], f"{args.workers} ranks")
    common = _common(args, single["data"])
    table = markdown(rows, common)
    print(ranks["collectives"])
    print(ranks["plan"])
    print(table)
    save_results(args.out, "distributed", {"settings": common, "workers": args.workers, "single": single,
                                           "ranks": ranks["ranks"], "plan": ranks["plan"],
                                           "collectives": ranks["collectives"], "msrun_seconds": elapsed,
                                           "markdown": table})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="ranks of the msrun part (driver only)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    parser.add_argument("--period", type=int, default=5, help="inverse refresh period (steps)")
    parser.add_argument("--rounds", type=int, default=4, help="timed periods")
    parser.add_argument("--repeats", type=int, default=10, help="timed inversion calls")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the msrun part (driver only)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    if args.batch % max(args.workers, 1):
        parser.error("--batch must be divisible by --workers")
    if os.environ.get("MS_ROLE"):       # launched by msrun: a worker, or the scheduler (it runs this script too)
        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
