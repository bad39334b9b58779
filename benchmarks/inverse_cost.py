"""Time and accuracy of the damped-inverse paths (cholesky, lu, eigh, newton cold and warm) per size.

    python -m benchmarks.inverse_cost [--sizes 64,128,...,4608] [--repeats 3] [--out /tmp/inverse_cost]

Each size D gets a factor shaped like a convolution's A: the Gram matrix of post-ReLU features
(correlated Gaussian inputs through a ReLU, 2 D rows), damped by ``1e-2 tr(A) / D`` (the pi split's
shift for damping 1e-4 when A's and G's mean eigenvalues multiply to 1) plus the 1e-6 trace jitter.
Every path runs through :func:`mindspore_ngd.curvature.inverse.damped_inverse` in graph mode; the time
is the median of ``--repeats`` calls after a compiling call. The newton warm start is the inverse of
the same factor before 0.1% of another batch's statistics were folded in (the regime in which the
residual test accepts it; see docs/algorithms.md). Accuracy is the relative Frobenius error against
the float64 NumPy inverse; for newton also the check's flag and the number of steps the start
interval's bound needs (the scalar recurrence of ``newton_inverse``) next to the static count.
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

from mindspore_ngd.curvature import inverse as inv_ops
from mindspore_ngd.curvature import newton
from . import save_results

SIZES = (64, 128, 256, 512, 1024, 2048, 4608)
METHODS = ("cholesky", "lu", "eigh", "newton", "newton (warm)")
JITTER = 1e-6
DEFAULT_OUT = "/tmp/inverse_cost"


class _Invert(nn.Cell):
    def __init__(self, method):
        super().__init__()
        self.method = method

    def construct(self, m, shift, jitter_shift, warm, trust):
        return inv_ops.damped_inverse(m, shift, self.method, jitter_shift, warm, trust)


def factor(size, seed=0, rows=None):
    """A PSD factor with a decaying spectrum, like the im2col covariance of post-ReLU activations."""
    rng = np.random.default_rng(seed)
    rows = rows or 2 * size
    mixing = rng.standard_normal((size, size)) / np.sqrt(size)
    mixing *= (1.0 / np.sqrt(1.0 + np.arange(size)))[None, :]              # decaying input variances
    features = np.maximum(rng.standard_normal((rows, size)) @ mixing.T, 0.0)
    return features.T @ features / rows


def steps_needed(low, rate_tol):
    """Steps of the scaled iteration until the contraction of [low, 1] falls below ``rate_tol``."""
    lower, steps = low, 0
    while True:
        rate = (1 - lower) / (1 + lower)
        steps += 1
        if rate < rate_tol or steps > 200:
            return steps
        lower = 1 - rate * rate


def _timed(cell, args, repeats):
    out = cell(*args)                                                      # compile
    out[0].asnumpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = cell(*args)
        inv = out[0].asnumpy().copy()
        times.append(time.perf_counter() - start)
    return statistics.median(times), inv, bool(out[1].asnumpy())


def measure(size, repeats):
    a = factor(size)
    new = 0.999 * a + 0.001 * factor(size, seed=1)
    shift = 1e-2 * np.trace(new) / size
    jitter = JITTER * np.trace(new)
    reference = np.linalg.inv(new + (shift + jitter) * np.eye(size))
    previous = np.linalg.inv(a + (1e-2 * np.trace(a) / size + JITTER * np.trace(a)) * np.eye(size))
    m32 = new.astype(np.float32)
    bound = np.abs(m32 + (shift + jitter) * np.eye(size, dtype=np.float32)).sum(1).max()
    rows = []
    for label in METHODS:
        method = label.split()[0]
        warm = label.endswith("(warm)")
        args = (Tensor(m32), Tensor(np.float32(shift)), Tensor(np.float32(jitter)),
                Tensor(previous.astype(np.float32) if warm else np.eye(size, dtype=np.float32)), Tensor(warm))
        seconds, inv, ok = _timed(_Invert(method), args, repeats)
        row = {"size": size, "method": label, "seconds": seconds, "ok": ok,
               "rel_frobenius_error": float(np.linalg.norm(inv - reference) / np.linalg.norm(reference))}
        if method == "newton":
            row["static_steps"] = newton.NEWTON_STEPS
            if warm:
                residual = np.eye(size) - (new + (shift + jitter) * np.eye(size)) @ previous
                rho = min(np.linalg.norm(residual), np.abs(residual).sum(1).max())
                row["warm_residual"] = float(rho)
                row["steps_needed"] = steps_needed(1 - rho, 1e-2) if rho < 1 else None
            else:
                row["steps_needed"] = steps_needed((shift + jitter) / bound, 1e-2)
        rows.append(row)
        print(f"  D={size:5d} {label:14s} {seconds * 1e3:10.1f} ms  ok={ok}  rel. error "
              f"{row['rel_frobenius_error']:.1e}" + (f"  steps needed {row['steps_needed']} of "
                                                     f"{row['static_steps']}" if method == "newton" else ""),
              flush=True)
    return rows


def markdown(rows):
    sizes = sorted({r["size"] for r in rows})
    lines = ["| D | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    for size in sizes:
        cells = []
        for label in METHODS:
            row = next(r for r in rows if r["size"] == size and r["method"] == label)
            cell = f"{row['seconds'] * 1e3:.1f} ms ({row['rel_frobenius_error']:.0e})"
            cells.append(cell if row["ok"] else cell + " rejected")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s < 2 for s in sizes) or args.repeats < 1:
        parser.error("--sizes must be integers >= 2 and --repeats >= 1")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rows = []
    for size in sizes:
        rows.extend(measure(size, args.repeats))
    table = markdown(rows)
    print(table)
    return save_results(args.out, "inverse_cost", {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.inverse_cost"] + list(argv if argv is not None else sys.argv[1:])),
        "device": "CPU", "mode": "graph", "repeats": args.repeats, "rows": rows, "markdown": table})


if __name__ == "__main__":
    main()
