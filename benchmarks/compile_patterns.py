"""Compile time of one per-parameter pass written four ways, as MindSpore 2.10's graph mode sees them.

    python -m benchmarks.compile_patterns [--sizes 40,160] [--out results/]

The pass is the one the engine runs over every gradient before its finiteness check: cast each
tensor to float32, flatten it and concatenate the results. The tensors have ``n`` distinct shapes
((i + 1, 3) for i < n), as a network's parameters mostly do. Each row is a fresh graph-mode Cell and
its first call (compile + one tiny step) in its own child process, so that no compiled graph is
shared between rows:

* ``tuple +=`` -- ``out = (); for x in xs: out += (f(x),)``, the engine's style before 0.2.1;
* ``list.append`` -- ``out = []; for x in xs: out.append(f(x))``;
* ``comprehension`` -- ``[f(x) for x in xs]``;
* ``HyperMap`` -- ``C.HyperMap()(f, xs)`` over a ``MultitypeFuncGraph`` (what ``nn.Momentum`` and,
  since 0.2.1, the engine's per-parameter passes use).

The first three grow a tuple or list one element at a time; their compile time grows faster than
``n`` (measured 2026-11-23: from 40 to 160 tensors, 4.8x for ``tuple +=`` and 2.1x for ``HyperMap``).

Results are printed as a Markdown table and saved as JSON (:func:`benchmarks.save_results`).
"""
import argparse
import json
import os
import subprocess
import sys
import time

PATTERNS = ("tuple +=", "list.append", "comprehension", "HyperMap")


def _first_call(pattern, size):
    """Seconds of the first call (compile + step) of ``pattern`` over ``size`` tensors (run in-process)."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops, Tensor
    from mindspore.ops import composite as C

    ms.set_context(mode=ms.GRAPH_MODE)
    flat = C.MultitypeFuncGraph("flat")

    @flat.register("Tensor")
    def _flat(x):                                 # pylint: disable=unused-variable
        return ops.cast(x, ms.float32).reshape(-1)

    class Grown(nn.Cell):
        def construct(self, xs):
            out = ()
            for x in xs:
                out += (ops.cast(x, ms.float32).reshape(-1),)
            return ops.concat(out)

    class Appended(nn.Cell):
        def construct(self, xs):
            out = []
            for x in xs:
                out.append(ops.cast(x, ms.float32).reshape(-1))
            return ops.concat(out)

    class Comprehension(nn.Cell):
        def construct(self, xs):
            return ops.concat([ops.cast(x, ms.float32).reshape(-1) for x in xs])

    class Mapped(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hyper_map = C.HyperMap()

        def construct(self, xs):
            return ops.concat(self.hyper_map(flat, xs))

    cell = dict(zip(PATTERNS, (Grown, Appended, Comprehension, Mapped)))[pattern]()
    xs = tuple(Tensor(np.ones((i + 1, 3), np.float16)) for i in range(size))
    start = time.perf_counter()
    out = cell(xs).asnumpy()
    seconds = time.perf_counter() - start
    if out.shape != (3 * size * (size + 1) // 2,):
        raise RuntimeError(f"{pattern}: wrong result shape {out.shape}")
    return seconds


def measure(sizes):
    rows = []
    for size in sizes:
        for pattern in PATTERNS:
            done = subprocess.run([sys.executable, "-m", "benchmarks.compile_patterns", "--child", pattern,
                                   "--sizes", str(size)], capture_output=True, text=True, check=False,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                raise RuntimeError(f"{pattern} at {size}: {done.stderr.strip().splitlines()[-1:]}")
            rows.append(json.loads(lines[-1]))
    return rows


def markdown(rows):
    sizes = sorted({r["size"] for r in rows})
    lines = ["| pass written as | " + " | ".join(f"{n} tensors, s" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for pattern in PATTERNS:
        cells = [next(f"{r['seconds']:.2f}" for r in rows if r["pattern"] == pattern and r["size"] == n)
                 for n in sizes]
        lines.append(f"| {pattern} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="40,160", help="comma-separated numbers of tensors")
    parser.add_argument("--out", default="results")
    parser.add_argument("--child", default=None, choices=PATTERNS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    if any(n < 1 for n in sizes):
        raise SystemExit(f"--sizes must be positive integers, got {args.sizes!r}")
    if args.child:
        print(json.dumps({"pattern": args.child, "size": sizes[0], "seconds": _first_call(args.child, sizes[0])}))
        return None
    rows = measure(sizes)
    table = markdown(rows)
    print(table)
    from . import save_results
    return save_results(args.out, "compile_patterns", {"rows": rows, "markdown": table})


if __name__ == "__main__":
    main()
