"""Inverting many factors of one shape: one copy of the graph per layer, or one loop over the stack.

    python -m benchmarks.rolled_inverse [--counts 4,16] [--dim 64] [--out results/]

The step inverts each layer's factors in graph code written out once per layer (an unrolled Python
loop), so its compiled graph, and the host memory MindSpore keeps for it (``benchmarks.graph_retention``),
grows with the number of layers. ResNet-50 repeats its block shapes, so layers of one factor shape could
share one copy: a graph-mode ``while`` loop over their factors stacked in one tensor. This benchmark
measures both forms on ``n`` symmetric positive definite ``dim x dim`` factors, each form and count in a
child process of its own:

- ``unrolled``: one Parameter per factor and per inverse; for each, :func:`mindspore_ngd.curvature.inverse.damped_inverse`
  (Cholesky), its result kept where it passes its check, written back;
- ``rolled``: the factors in one ``(n, dim, dim)`` Parameter; a ``while`` loop over a Tensor counter takes
  factor ``k`` (``Gather``), inverts and checks it with the same function and puts it into the stacked
  result (``TensorScatterUpdate``), which is written once after the loop.

Reported per form and count: compile seconds, the resident memory the compiled graph keeps (after
``malloc_trim``), the time of one call after the first, and the largest error of the inverses relative to
float64 NumPy. Printed as a Markdown table and saved as JSON.
"""
import argparse
import os
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

from . import child_error, positive_ints, print_result, run_child, save_results  # noqa: E402
from .memory import trimmed_rss_mb  # noqa: E402

FORMS = ("unrolled", "rolled")
DAMPING = 1e-3


def factors(count, dim, seed=0):
    """``count`` sample covariances of ``dim`` features (4 * dim samples each), float32."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.standard_normal((4 * dim, dim)).astype(np.float32)
        out.append(x.T @ x / (4 * dim))
    return np.stack(out)


def worker(form, count, dim):
    """Compile and run one form in this process; print its measurements as JSON."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops, Parameter, Tensor

    from mindspore_ngd._graph import choose
    from mindspore_ngd.curvature.inverse import damped_inverse

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    stack = factors(count, dim)

    class Unrolled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.factors = ms.ParameterTuple([Parameter(Tensor(stack[k]), name=f"factor{k}") for k in range(count)])
            self.inverses = ms.ParameterTuple([Parameter(Tensor(np.zeros((dim, dim), np.float32)), name=f"inverse{k}")
                                               for k in range(count)])

        def construct(self, shift):
            for k in range(count):
                inv, ok = damped_inverse(self.factors[k], shift, "cholesky", 0.0)
                ops.assign(self.inverses[k], choose(ok, inv, self.inverses[k]))
            return shift

    class Rolled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.factors = Parameter(Tensor(stack), name="factors")
            self.inverses = Parameter(Tensor(np.zeros_like(stack)), name="inverses")

        def construct(self, shift):
            out = self.inverses * 1.0
            k = Tensor(0, ms.int32)
            while k < count:
                inv, ok = damped_inverse(ops.gather(self.factors, k, 0), shift, "cholesky", 0.0)
                kept = choose(ok, inv, ops.gather(out, k, 0))
                out = ops.tensor_scatter_update(out, ops.reshape(k, (1, 1)), ops.expand_dims(kept, 0))
                k = k + 1
            ops.assign(self.inverses, out)
            return shift

    net = Unrolled() if form == "unrolled" else Rolled()
    shift = Tensor(np.float32(DAMPING))
    before = trimmed_rss_mb()
    start = time.perf_counter()
    net.compile(shift)
    compile_s = time.perf_counter() - start
    kept_mb = trimmed_rss_mb() - before
    net(shift)
    start = time.perf_counter()
    net(shift)
    call_ms = (time.perf_counter() - start) * 1e3
    got = np.stack([p.asnumpy().copy() for p in net.inverses]) if form == "unrolled" else net.inverses.asnumpy().copy()
    ref = np.linalg.inv(stack.astype(np.float64) + DAMPING * np.eye(dim))
    error = float(np.abs(got - ref).max() / np.abs(ref).max())
    print_result({"form": form, "count": count, "dim": dim, "compile_s": compile_s, "kept_mb": kept_mb,
                  "call_ms": call_ms, "relative_error": error})


def measure(form, count, dim):
    """Run :func:`worker` in a child process; its result dict (``error`` set if it failed)."""
    result, proc = run_child("benchmarks.rolled_inverse", ["--worker", form, "--counts", str(count),
                                                           "--dim", str(dim)])
    return result if result is not None else {"form": form, "count": count, "dim": dim, "error": child_error(proc)}


def table(results):
    lines = ["| form | factors | compile (s) | kept after compile (MB) | call (ms) | error vs float64 |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['form']} | {r['count']} | failed | | | |")
            continue
        lines.append(f"| {r['form']} | {r['count']} | {r['compile_s']:.2f} | {r['kept_mb']:.1f} | {r['call_ms']:.1f} "
                     f"| {r['relative_error']:.1e} |")
    return "\n".join(lines)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="4,16", help="comma-separated factor counts")
    parser.add_argument("--dim", type=int, default=64, help="size of each factor (default 64)")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, from {list(FORMS)}")
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    counts = positive_ints(args.counts)
    if not counts:
        raise SystemExit(f"--counts: give positive factor counts, got {args.counts!r}")
    if args.dim < 2:
        raise SystemExit(f"--dim: the factor size must be at least 2, got {args.dim}")
    if args.worker:
        return worker(args.worker, counts[0], args.dim)
    forms = [f.strip() for f in args.forms.split(",")]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise SystemExit(f"--forms: unknown {unknown}; choose from {list(FORMS)}")
    results = [measure(form, n, args.dim) for form in forms for n in counts]
    print(table(results))
    if args.out:
        save_results(args.out, "rolled_inverse", {"args": vars(args), "results": results})
    return results


if __name__ == "__main__":
    main()
