"""Host memory MindSpore keeps for every node of a compiled graph.

    python -m benchmarks.graph_retention [--sizes 20,220] [--ops add,logical_and,matmul] [--loop while] [--out results/]

For each operator and size ``n``, a child process compiles a graph-mode Cell that applies the operator
``n`` times in a chain (an unrolled Python loop: ``n`` nodes in the final graph), then returns every
freed page to the system (``malloc_trim``) and reports how much its resident set grew. The slope between
two sizes is what one more node keeps for the life of the compiled graph. ``--front-end`` sets
``MS_DEV_PRECOMPILE_ONLY=1`` in the children: the front end compiles, the backend does not, which splits
the slope between the two. ``--loop while`` builds the chain as a graph-mode ``while`` loop over a
Tensor counter instead: its body is compiled once, whatever the count.

Why it matters here: the natural-gradient step compiles a few hundred nodes per preconditioned layer
(its checks, branches and writes), and on ResNet-50 the compiled graph, not any tensor, is the largest
part of the step's peak resident memory above ``nn.Momentum``'s (docs/performance.md, "Memory").
Results are printed as a Markdown table and saved as JSON (:func:`benchmarks.save_results`).
"""
import argparse
import os

from . import child_error, positive_ints, print_result, run_child, save_results
from .memory import trimmed_rss_mb

OPS = ("add", "logical_and", "matmul")


def worker(op, size, loop="for"):
    """Compile the chain of ``size`` ``op`` nodes in this process (``loop="while"``: one ``op`` node in a
    run-time loop taken ``size`` times); print its retained MB as JSON."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops, Tensor

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    class Chain(nn.Cell):
        def construct(self, flag, x):
            for k in range(size):
                if op == "add":
                    x = x + 1.0
                elif op == "logical_and":
                    flag = ops.logical_and(flag, x > k)
                else:
                    x = ops.matmul(x, x)
            return flag, x

    class Loop(nn.Cell):
        def construct(self, flag, x):
            k = Tensor(0, ms.int32)
            while k < size:
                if op == "add":
                    x = x + 1.0
                elif op == "logical_and":
                    flag = ops.logical_and(flag, x > ops.cast(k, ms.float32))
                else:
                    x = ops.matmul(x, x)
                k = k + 1
            return flag, x

    shape = (64, 64) if op == "matmul" else ()
    inputs = (Tensor(True), Tensor(np.ones(shape, np.float32)))
    net = Loop() if loop == "while" else Chain()
    before = trimmed_rss_mb()
    net.compile(*inputs)
    retained = trimmed_rss_mb() - before
    result = {"op": op, "size": size, "loop": loop, "retained_mb": retained}
    if os.environ.get("MS_DEV_PRECOMPILE_ONLY") != "1":      # with the backend compiled, run it once
        flag, value = net(*inputs)
        result.update(flag=bool(flag.asnumpy()), value=float(value.asnumpy().ravel()[0]))
    print_result(result)


def measure(op, size, front_end=False, loop="for"):
    """Run :func:`worker` in a child process; its result dict (``error`` set if it failed)."""
    env = dict(os.environ)
    if front_end:
        env["MS_DEV_PRECOMPILE_ONLY"] = "1"
    result, proc = run_child("benchmarks.graph_retention", ["--worker", op, "--sizes", str(size), "--loop", loop],
                             env)
    return result if result is not None else {"op": op, "size": size, "error": child_error(proc)}


def slope_kb(small, large):
    """KB kept per node between two results of one operator, or None if either failed."""
    if "error" in small or "error" in large or large["size"] == small["size"]:
        return None
    return (large["retained_mb"] - small["retained_mb"]) * 1024 / (large["size"] - small["size"])


def table(rows, sizes):
    lines = ["| operator | " + " | ".join(f"retained after compiling {n} nodes (MB)" for n in sizes)
             + " | KB per node |", "|---" * (len(sizes) + 2) + "|"]
    for op, results in rows:
        cells = [("failed" if "error" in r else f"{r['retained_mb']:.1f}") for r in results]
        kb = slope_kb(results[0], results[-1])
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {'' if kb is None else f'{kb:.0f}'} |")
    return "\n".join(lines)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,220", help="comma-separated node counts (two or more)")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {list(OPS)}")
    parser.add_argument("--front-end", action="store_true", help="compile the front end only")
    parser.add_argument("--loop", choices=("for", "while"), default="for",
                        help="for: an unrolled chain of nodes (default); while: one node in a run-time loop")
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    sizes = positive_ints(args.sizes)
    if args.worker:
        return worker(args.worker, sizes[0], args.loop)
    if len(sizes) < 2:
        raise SystemExit(f"--sizes: give two or more positive node counts, got {args.sizes!r}")
    ops = [op.strip() for op in args.ops.split(",")]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit(f"--ops: unknown {unknown}; choose from {list(OPS)}")
    rows = [(op, [measure(op, n, args.front_end, args.loop) for n in sizes]) for op in ops]
    print(table(rows, sizes))
    if args.out:
        save_results(args.out, "graph_retention", {"args": vars(args), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
