"""Accuracy of the Newton-Schulz inverse against float64, per size, shift and product precision.

    python -m benchmarks.newton_precision [--cases 128x16,256,1024,2048] [--shifts 1e-3,1e-4]
                                          [--out /tmp/newton_precision]

The factors are issue 34's: Grams of power-law features (feature i has variance i^-2, 4 D samples),
scaled to mean eigenvalue 1, so the shift is the damping relative to the mean eigenvalue. ``128x16``
is a factor of size 2048 inverted as THOR inverts it with ``split_dim=128``: its 16 diagonal blocks,
each shifted by the same amount. Every variant runs :func:`mindspore_ngd.curvature.newton.newton_inverse`
in graph mode on CPU:

* ``newton12``: the iteration as it was before issue 34 (12 steps, no refinement, the step
  tolerance as the only test);
* ``newton`` / ``newton_split``: the current defaults (steps from the condition bound, two split-residual
  refinements, acceptance by the estimated error), with plain or split (float16-exact) products;

each with float32 products and with ``products="float16"`` (every product's inputs rounded to
float16, float32 accumulation: how a cube unit multiplies). The error is the relative Frobenius
error against the float64 NumPy inverse of the same float32 matrix (the largest over blocks);
``accepted`` is the iteration's own verdict, ``wrong`` flags an accepted inverse whose error exceeds
the acceptance bound (1e-4 float32, 1e-3 float16). ``low`` is ``total / ||M||_inf``, the smallest
relative eigenvalue the cold start has to lift (the largest over blocks is not shown).
"""
import argparse
import datetime
import sys
import time

import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

from mindspore_ngd.curvature import newton
from . import save_results

CASES = ("128x16", "256", "1024", "2048")
SHIFTS = (1e-3, 1e-4)
VARIANTS = ("newton12", "newton", "newton_split")
PRECISIONS = ("float32", "float16")
DEFAULT_OUT = "/tmp/newton_precision"


def powerlaw_gram(size, seed=0):
    """A (size, size) Gram of power-law features: feature i has variance i^-2, 4 size samples;
    scaled to mean eigenvalue 1 (trace = size). Float64."""
    rng = np.random.default_rng(seed)
    scales = 1.0 / np.arange(1, size + 1)
    features = scales[:, None] * rng.standard_normal((size, 4 * size))
    gram = features @ features.T / (4 * size)
    return gram * (size / np.trace(gram))


def case_matrix(case, seed=0):
    """``"D"``: one (D, D) factor; ``"SxN"``: the N diagonal (S, S) blocks of a factor of size S N."""
    if "x" in case:
        size, count = (int(v) for v in case.split("x"))
        gram = powerlaw_gram(size * count, seed)
        return np.stack([gram[i * size:(i + 1) * size, i * size:(i + 1) * size] for i in range(count)])
    return powerlaw_gram(int(case), seed)


class NewtonCell(nn.Cell):
    """``newton_inverse`` of ``sym + total I`` as one variant runs it."""

    def __init__(self, variant, products):
        super().__init__()
        self.variant, self.products = variant, products

    def construct(self, sym, total):
        if self.variant == "newton12":
            return newton.newton_inverse(sym, total, steps=12, refinements=0, products=self.products)
        return newton.newton_inverse(sym, total, products=self.products, split=self.variant == "newton_split")


def relative_error(inv, m64, total):
    """Largest relative Frobenius error over the matrices of ``inv`` against float64 inverses."""
    eye = np.eye(m64.shape[-1])
    ref = np.linalg.inv(m64 + total * eye)
    diff = np.asarray(inv, np.float64) - ref
    return float(np.max(np.sqrt((diff ** 2).sum((-2, -1)) / (ref ** 2).sum((-2, -1)))))


def measure(case, shifts, variants=VARIANTS, precisions=PRECISIONS):
    m32 = case_matrix(case).astype(np.float32)
    m64 = m32.astype(np.float64)
    rows = []
    for shift in shifts:
        total = np.float32(shift)
        bound = np.abs(m64 + shift * np.eye(m64.shape[-1])).sum(-1).max(-1)
        for variant in variants:
            for products in precisions:
                cell = NewtonCell(variant, products)
                start = time.perf_counter()
                inv, accepted, _ = cell(Tensor(m32), Tensor(total))
                seconds = time.perf_counter() - start
                error = relative_error(inv.asnumpy(), m64, float(total))
                accepted = bool(accepted.asnumpy())
                limit = newton.NEWTON_ACCEPT[products]
                row = {"case": case, "shift": shift, "variant": variant, "products": products,
                       "low": float(np.min(shift / bound)), "error": error if np.isfinite(error) else None,
                       "accepted": accepted, "wrong": bool(accepted and not error <= limit),
                       "seconds_with_compile": seconds}
                print(f"{case:>7} shift {shift:.0e} {variant:>12} {products}: error "
                      f"{error:.1e} {'accepted' if accepted else 'refused'}"
                      f"{'  WRONG' if row['wrong'] else ''} (low {row['low']:.1e}, {seconds:.1f} s)", flush=True)
                rows.append(row)
    return rows


def markdown(rows):
    columns = [(v, p) for v in VARIANTS for p in PRECISIONS if any(r["variant"] == v and r["products"] == p
                                                                  for r in rows)]
    lines = ["| case | shift | " + " | ".join(f"{v} {p}" for v, p in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    keys = []
    for r in rows:
        if (r["case"], r["shift"]) not in keys:
            keys.append((r["case"], r["shift"]))
    for case, shift in keys:
        cells = []
        for v, p in columns:
            match = [r for r in rows if (r["case"], r["shift"], r["variant"], r["products"]) == (case, shift, v, p)]
            if not match:
                cells.append("")
                continue
            r = match[0]
            text = "NaN" if r["error"] is None else f"{r['error']:.1e}"
            cells.append(text + ("" if r["accepted"] else " refused") + (" WRONG" if r["wrong"] else ""))
        lines.append(f"| {case} | {shift:.0e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shifts", default=",".join(f"{s:g}" for s in SHIFTS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    shifts = [float(s) for s in args.shifts.split(",")]
    variants = args.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        parser.error(f"--variants must be among {VARIANTS}")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rows = []
    for case in cases:
        rows.extend(measure(case, shifts, variants))
    table = markdown(rows)
    print(table)
    return save_results(args.out, "newton_precision", {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.newton_precision"] + list(argv if argv is not None else sys.argv[1:])),
        "device": "CPU (float16-input products emulated)", "steps": newton.NEWTON_STEPS,
        "refinements": newton.NEWTON_REFINEMENTS, "rows": rows, "markdown": table})


if __name__ == "__main__":
    main()
