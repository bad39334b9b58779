"""Compile time of one per-parameter pass written four ways, as MindSpore 2.10's graph mode sees them.

    python -m benchmarks.compile_patterns [--family pass|idioms] [--sizes 40,160] [--out results/]

The pass is the one the engine runs over every gradient before its finiteness check: cast each
tensor to float32, flatten it and concatenate the results. The tensors have ``n`` distinct shapes
((i + 1, 3) for i < n), as a network's parameters mostly do. Each row is a fresh graph-mode Cell and
its first call (compile + one tiny step) in its own child process, so that no compiled graph is
shared between rows:

* ``tuple +=`` -- ``out = (); for x in xs: out += (f(x),)``, the engine's style before commit 88124f0;
* ``list.append`` -- ``out = []; for x in xs: out.append(f(x))``;
* ``comprehension`` -- ``[f(x) for x in xs]``;
* ``HyperMap`` -- ``C.HyperMap()(f, xs)`` over a ``MultitypeFuncGraph`` (what ``nn.Momentum`` and,
  since commit 88124f0, the engine's per-parameter passes use).

The first three grow a tuple or list one element at a time; their compile time grows faster than
``n`` (measured 2026-11-23: from 40 to 160 tensors, 4.8x for ``tuple +=`` and 2.1x for ``HyperMap``).

``--family idioms`` compiles instead ``n`` call sites of one small idiom, each on a matrix of its own
shape ((i + 2, i + 3)), in two forms: the indexing or Tensor method the engine used before commit
``c928381`` and the single-primitive helper of :mod:`mindspore_ngd._graph` (or ``ops.reduce_sum``)
that replaced it. The last pair is the exception: a slice of the leading axis, ``m[:2]``, which
compiles as cheaply as the ``Slice`` it would become, so the engine keeps it. Each row also records
a checksum of the results, so that the two forms of an idiom can be checked to agree (the test does).

Results are printed as a Markdown table and saved as JSON (:func:`benchmarks.save_results`).
"""
import argparse
import json
import os
import subprocess
import sys
import time

PATTERNS = ("tuple +=", "list.append", "comprehension", "HyperMap")
# (indexing or method form, single-primitive form) of each idiom
IDIOMS = (("m[0, 0]", "corner(m)"), ("m[:2, :2]", "top_left(m, 2, 2)"), ("m[:, 1:2]", "columns(m, 1, 1)"),
          ("m.swapaxes(-1, -2)", "transposed(m)"), ("m.sum()", "ops.reduce_sum(m)"),
          ("m[:2]", "Slice(m, (0, 0), (2, cols))"))
FAMILIES = {"pass": PATTERNS, "idioms": tuple(form for pair in IDIOMS for form in pair)}


def _idiom_call(form, size):
    """First call (compile + step) of ``size`` call sites of one idiom form: ``(seconds, checksum)``."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops, Tensor
    from mindspore_ngd._graph import columns, corner, top_left, transposed

    ms.set_context(mode=ms.GRAPH_MODE)

    def indexed_corner(m):
        return m[0, 0]

    def sliced_block(m):
        return m[:2, :2]

    def block(m):
        return top_left(m, 2, 2)

    def sliced_column(m):
        return m[:, 1:2]

    def column(m):
        return columns(m, 1, 1)

    def sliced_rows(m):
        return m[:2]

    def sliced_rows_primitive(m):
        return ops.Slice()(m, (0, 0), (2, m.shape[1]))

    def swapped(m):
        return m.swapaxes(-1, -2)

    def method_sum(m):
        return m.sum()

    forms = {"m[0, 0]": indexed_corner, "corner(m)": corner, "m[:2, :2]": sliced_block, "top_left(m, 2, 2)": block,
             "m[:, 1:2]": sliced_column, "columns(m, 1, 1)": column, "m.swapaxes(-1, -2)": swapped,
             "transposed(m)": transposed, "m.sum()": method_sum, "ops.reduce_sum(m)": ops.reduce_sum,
             "m[:2]": sliced_rows, "Slice(m, (0, 0), (2, cols))": sliced_rows_primitive}
    idiom = forms[form]

    class Sites(nn.Cell):
        def construct(self, ms_):
            total = ops.zeros((), ms.float32)
            for m in ms_:
                total = total + ops.reduce_sum(idiom(m))
            return total

    rng = np.random.default_rng(0)
    mats = tuple(Tensor(rng.standard_normal((i + 2, i + 3)).astype(np.float32)) for i in range(size))
    start = time.perf_counter()
    out = Sites()(mats).asnumpy()
    return time.perf_counter() - start, float(out)


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


def measure(sizes, family="pass"):
    rows = []
    for size in sizes:
        for pattern in FAMILIES[family]:
            done = subprocess.run([sys.executable, "-m", "benchmarks.compile_patterns", "--child", pattern,
                                   "--family", family, "--sizes", str(size)], capture_output=True, text=True,
                                  check=False,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                raise RuntimeError(f"{pattern} at {size}: {done.stderr.strip().splitlines()[-1:]}")
            rows.append(json.loads(lines[-1]))
    return rows


def markdown(rows, family="pass"):
    sizes = sorted({r["size"] for r in rows})
    label, unit = ("idiom", "call sites") if family == "idioms" else ("pass", "tensors")
    lines = [f"| {label} written as | " + " | ".join(f"{n} {unit}, s" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for pattern in FAMILIES[family]:
        cells = [next(f"{r['seconds']:.2f}" for r in rows if r["pattern"] == pattern and r["size"] == n)
                 for n in sizes]
        lines.append(f"| {pattern} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="40,160", help="comma-separated numbers of tensors")
    parser.add_argument("--out", default="results")
    parser.add_argument("--family", default="pass", choices=sorted(FAMILIES),
                        help="pass: one per-parameter pass written four ways; idioms: indexing and "
                             "Tensor-method idioms against their single-primitive forms")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    if any(n < 1 for n in sizes):
        raise SystemExit(f"--sizes must be positive integers, got {args.sizes!r}")
    if args.child:
        if args.child not in FAMILIES[args.family]:
            raise SystemExit(f"--child must be one of {FAMILIES[args.family]}, got {args.child!r}")
        row = {"pattern": args.child, "size": sizes[0]}
        if args.family == "idioms":
            row["seconds"], row["checksum"] = _idiom_call(args.child, sizes[0])
        else:
            row["seconds"] = _first_call(args.child, sizes[0])
        print(json.dumps(row))
        return None
    rows = measure(sizes, args.family)
    table = markdown(rows, args.family)
    print(table)
    from . import save_results
    name = "compile_patterns" if args.family == "pass" else "compile_patterns_idioms"
    return save_results(args.out, name, {"family": args.family, "rows": rows, "markdown": table})


if __name__ == "__main__":
    main()
