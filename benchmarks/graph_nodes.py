"""What one more preconditioned layer adds to the compiled training step: nodes, by source file, and kept memory.

    python -m benchmarks.graph_nodes [--layers 4,8] [--width 64] [--optimizers momentum,kfac,thor,spngd]
        [--model mlp|convbn] [--lean] [--top 12] [--out results/]

A stack of ``n`` Dense layers of one width (:mod:`benchmarks.memory`'s ``mlp`` model, each optimizer as
that benchmark builds it) is compiled as ``nn.TrainOneStepCell`` twice per layer count, each time in a
fresh child process:

* once for memory: the resident set after ``malloc_trim`` before and after ``compile`` (what MindSpore
  keeps of the compiled graph; the step then runs once and its loss is recorded);
* once for its final front-end graph (the ``validate`` IR, :func:`mindspore_ngd.audit.ir.compiled_primitives`):
  every operator node, attributed to the innermost source line outside MindSpore's own package.

The differences between two layer counts, divided by the layers added, are what one more layer costs:
nodes, kept MB and compile seconds, and the nodes per source file of this project. Every layer has the
same shapes, so the slopes do not depend on which layer is added. ``--model convbn`` compiles
:mod:`benchmarks.memory`'s Conv2d-BatchNorm blocks instead (16x16 images, ``--width`` channels, batch
8): one layer is then a convolution and its BatchNorm, which SP-NGD captures unit-wise. ``--lean``
also compiles the natural-gradient optimizers' lean graph (the one
:class:`mindspore_ngd.NGDTrainOneStepCell` runs on steps that capture nothing: no capture branches, no
fold), which splits the cost of capturing and folding from the rest.

Why it matters: MindSpore 2.10 keeps host memory for every node of a compiled graph for as long as the
graph lives (:mod:`benchmarks.graph_retention`), and on ResNet-50 that is the largest part of a
natural-gradient step's peak above ``nn.Momentum``'s (docs/performance.md, "Memory"); compile time grows
the same way. Results are printed as Markdown tables and saved as JSON (:func:`benchmarks.save_results`).
"""
import argparse
import collections
import os
import time

from . import ROOT, child_error, parse_names, positive_ints, print_result, run_child, save_results
from .memory import OPTIMIZERS, trimmed_rss_mb

_PROJECT = ROOT.rstrip(os.sep) + os.sep


def _step(name, layers, width, lean, model="mlp"):
    """The compiled-to-be training step of ``name`` on ``layers`` Dense layers (``model`` "convbn": conv-BatchNorm
    blocks of ``width`` channels on 16x16 images), and its inputs."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, Tensor
    from . import memory

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    args = memory.parse(["--model", model, "--layers", str(layers), "--width", str(width), "--image", "16"])
    network, shape = memory._network(args)
    opt = memory._optimizer(name, network)
    if lean:
        opt._set_lean(True)
    step = nn.TrainOneStepCell(nn.WithLossCell(network, nn.CrossEntropyLoss()), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    inputs = (Tensor(rng.standard_normal((8,) + shape).astype(np.float32)),
              Tensor(rng.integers(0, 10, 8).astype(np.int32)))
    return step, inputs


def _source_file(where):
    """A node's source ``file:line`` as a file path relative to the project, or to ``site-packages`` for an
    installed package's (MindSpore's own) file; "?" when the IR names no source."""
    path = where.rsplit(":", 1)[0]
    if path.startswith(_PROJECT):
        return path[len(_PROJECT):]
    return path.split(os.sep + "site-packages" + os.sep, 1)[-1]


def worker(name, layers, width, lean, what, model="mlp"):
    """One measurement in this process (``what``: "memory" or "nodes"); print it as JSON."""
    step, inputs = _step(name, layers, width, lean, model)
    result = {"optimizer": name, "layers": layers, "lean": lean, "what": what}
    if what == "memory":
        before = trimmed_rss_mb()
        start = time.perf_counter()
        step.compile(*inputs)
        result["compile_s"] = time.perf_counter() - start
        result["kept_mb"] = trimmed_rss_mb() - before
        result["loss"] = float(step(*inputs).asnumpy())
    else:
        from mindspore_ngd.audit.ir import compiled_primitives
        primitives = compiled_primitives(step, *inputs)
        files = collections.Counter(_source_file(where) for sources in primitives.values() for where in sources)
        result["nodes"] = sum(files.values())
        result["files"] = dict(files)
    print_result(result)


def measure(name, layers, width, lean, what, model="mlp"):
    """:func:`worker` in a child process; its result dict (``error`` set if it failed)."""
    argv = ["--worker", what, "--optimizers", name, "--layers", str(layers), "--width", str(width),
            "--model", model]
    result, proc = run_child("benchmarks.graph_nodes", argv + (["--lean"] if lean else []))
    if result is None:
        return {"optimizer": name, "layers": layers, "lean": lean, "what": what, "error": child_error(proc)}
    return result


def per_layer(small, large, key):
    """``(large[key] - small[key])`` per layer added; None if either failed."""
    if "error" in small or "error" in large:
        return None
    return (large[key] - small[key]) / (large["layers"] - small["layers"])


def summarize(rows):
    """Per (optimizer, lean): the per-layer slopes between the smallest and the largest layer count."""
    out = []
    for (name, lean), by_count in rows.items():
        counts = sorted(by_count)
        small, large = by_count[counts[0]], by_count[counts[-1]]
        files = {}
        if "error" not in small["nodes"] and "error" not in large["nodes"]:
            names = set(small["nodes"]["files"]) | set(large["nodes"]["files"])
            span = counts[-1] - counts[0]
            files = {f: (large["nodes"]["files"].get(f, 0) - small["nodes"]["files"].get(f, 0)) / span
                     for f in names}
        out.append({"optimizer": name, "lean": lean,
                    "nodes_per_layer": per_layer(small["nodes"], large["nodes"], "nodes"),
                    "kept_mb_per_layer": per_layer(small["memory"], large["memory"], "kept_mb"),
                    "compile_s_per_layer": per_layer(small["memory"], large["memory"], "compile_s"),
                    "files_per_layer": {f: v for f, v in files.items() if v},
                    "errors": [r["error"] for r in (small["nodes"], large["nodes"], small["memory"],
                                                    large["memory"]) if "error" in r]})
    return out


def _fmt(value, digits):
    return "failed" if value is None else f"{value:.{digits}f}"


def tables(summary, top):
    label = {False: "", True: " (lean graph)"}
    lines = ["| optimizer | nodes per layer | kept MB per layer | compile s per layer |", "|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['optimizer']}{label[s['lean']]} | {_fmt(s['nodes_per_layer'], 1)} | "
                     f"{_fmt(s['kept_mb_per_layer'], 1)} | {_fmt(s['compile_s_per_layer'], 2)} |")
    for s in summary:
        if s["optimizer"] == "momentum" or not s["files_per_layer"]:
            continue
        lines += ["", f"Nodes per layer by source file, {s['optimizer']}{label[s['lean']]}:", "",
                  "| source | nodes per layer |", "|---|---|"]
        ranked = sorted(s["files_per_layer"].items(), key=lambda kv: (-kv[1], kv[0]))
        for where, value in ranked[:top]:
            lines.append(f"| {where} | {value:.1f} |")
        rest = sum(v for _, v in ranked[top:])
        if rest:
            lines.append(f"| (the rest) | {rest:.1f} |")
    for s in summary:
        for error in s["errors"]:
            lines.append(f"\n{s['optimizer']}: {error}")
    return "\n".join(lines)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="4,8", help="comma-separated Dense layer counts (two or more)")
    parser.add_argument("--width", type=int, default=64, help="units per layer, or channels (default 64)")
    parser.add_argument("--model", choices=("mlp", "convbn"), default="mlp",
                        help="mlp: Dense layers (default); convbn: Conv2d-BatchNorm blocks (benchmarks.memory's)")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help=f"comma-separated, from {list(OPTIMIZERS)}")
    parser.add_argument("--lean", action="store_true", help="also the natural-gradient optimizers' lean graph")
    parser.add_argument("--top", type=int, default=12, help="source files listed per optimizer (default 12)")
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--worker", choices=("memory", "nodes"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.optimizers = parse_names(parser, "--optimizers", args.optimizers, OPTIMIZERS)
    text = args.layers
    args.layers = positive_ints(text)
    if not args.layers or (not args.worker and len(set(args.layers)) < 2):
        parser.error(f"--layers: give two or more different positive layer counts, got {text!r}")
    if args.width < 1 or args.top < 1:
        parser.error(f"--width and --top must be positive, got {args.width} and {args.top}")
    return args


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(args.optimizers[0], args.layers[0], args.width, args.lean, args.worker, args.model)
    rows = {}
    for name in args.optimizers:
        for lean in (False, True) if args.lean and name != "momentum" else (False,):
            rows[(name, lean)] = {n: {what: measure(name, n, args.width, lean, what, args.model)
                                      for what in ("memory", "nodes")}
                                  for n in args.layers}
    summary = summarize(rows)
    stack = "Dense stack of width" if args.model == "mlp" else "Conv2d-BatchNorm stack (16x16 images) of channels"
    print(f"\n{stack} {args.width}, {' and '.join(map(str, args.layers))} layers, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print(tables(summary, args.top))
    if args.out:
        save_results(args.out, "graph_nodes", {"args": vars(args), "summary": summary,
                                               "runs": [dict(r, optimizer=name) for (name, _), by in rows.items()
                                                        for n in by.values() for r in n.values()]})
    return summary


if __name__ == "__main__":
    main()
