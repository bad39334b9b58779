"""Peak resident memory of a training step: nn.Momentum, K-FAC, SP-NGD and THOR side by side.

    python -m benchmarks.memory [--model resnet50] [--image 32] [--batch 32]
                                [--optimizers momentum,kfac,spngd,thor] [--out results/]
    python -m benchmarks.memory --model mlp --layers 4 --width 1024

Each optimizer trains in a process of its own (a process's peak resident set, ``ru_maxrss``, only
grows), on the same synthetic batch, through ``nn.TrainOneStepCell``. The first step of every
natural-gradient optimizer captures the factors and inverts them (the worst case); two more steps
follow. Reported per optimizer: the resident set after the network and optimizer are built, after
the graph is compiled and after the steps, the peak, and the peak above Momentum's in units of the
dense Kronecker factors' own size (A and G of every preconditioned layer, float32). The issue-33
goal is a ratio of at most 3.

``--model resnet50`` is the model zoo's ResNet-50 v1.5 (10 classes), ``--model resnet32`` the zoo's CIFAR
ResNet-32 (its CIFAR recipes' network: activations, not factors, dominate there); ``--model mlp`` a stack of
``--layers`` Dense layers of ``--width`` units, the size the test suite's memory guard uses
(``tests/benchmarks/test_memory.py``). Results are printed as a Markdown table and saved as JSON.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

OPTIMIZERS = ("momentum", "kfac", "spngd", "thor")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mb():
    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10


def _network(args):
    from mindspore import nn
    if args.model in ("resnet50", "resnet32"):
        sys.path.insert(0, os.path.join(ROOT, "model_zoo", "resnet50"))
        from src.resnet import build_network
        if args.model == "resnet32":      # the zoo's CIFAR recipes' network
            return build_network("resnet_cifar", 10, {"blocks_per_stage": 5, "width": 16}), (3, args.image, args.image)
        return build_network("resnet50", 10), (3, args.image, args.image)
    cells = []
    for _ in range(args.layers):
        cells += [nn.Dense(args.width, args.width), nn.ReLU()]
    return nn.SequentialCell(cells + [nn.Dense(args.width, 10)]), (args.width,)


def _optimizer(name, network):
    from mindspore import nn
    import mindspore_ngd as ngd
    if name == "momentum":
        return nn.Momentum(network.trainable_params(), 0.01, 0.9)
    common = {"learning_rate": 0.01, "damping": 1e-2, "verbose": False}
    if name == "kfac":       # factors and inverses on step 0 (every 20 steps after)
        return ngd.KFAC(network, **common)
    if name == "spngd":      # every statistic is refreshed on its first step
        return ngd.SPNGD(network, **common)
    if name == "thor":       # nn.thor's call form; frequency 4, 128-blocks as the zoo's recipe
        return ngd.THOR(network, 0.01, 1e-2, 0.9, frequency=4, split_dim=128, verbose=False)
    raise ValueError(f"unknown optimizer {name!r}; choose from {list(OPTIMIZERS)}")


def worker(args):
    """One optimizer in this process: print one JSON line."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, Tensor
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    network, shape = _network(args)
    opt = _optimizer(args.worker, network)
    factors = sum(4 * (b.spec.a_dim ** 2 + b.spec.g_dim ** 2) for b in getattr(opt, "blocks", ()))
    step = nn.TrainOneStepCell(nn.WithLossCell(network, nn.CrossEntropyLoss()), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((args.batch,) + shape).astype(np.float32))
    y = Tensor(rng.integers(0, 10, args.batch).astype(np.int32))
    out = {"optimizer": args.worker, "factors_mb": factors / 2 ** 20, "built_mb": _rss_mb()}
    start = time.perf_counter()
    step.compile(x, y)
    out["compile_s"] = time.perf_counter() - start
    out["compiled_mb"] = _rss_mb()
    losses = []
    for _ in range(args.steps):
        losses.append(float(step(x, y).asnumpy()))
    out.update(stepped_mb=_rss_mb(), peak_mb=_peak_mb(), losses=losses,
               layers=len(getattr(opt, "blocks", ())))
    print("RESULT " + json.dumps(out), flush=True)


def measure(args, name):
    """Run one optimizer in a child process; its result dict (``error`` set if it failed)."""
    command = [sys.executable, "-m", "benchmarks.memory", "--worker", name, "--model", args.model,
               "--image", str(args.image), "--batch", str(args.batch), "--layers", str(args.layers),
               "--width", str(args.width), "--steps", str(args.steps)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"optimizer": name, "error": f"exit code {proc.returncode}: {' / '.join(tail)}"}


def table(results):
    base = next((r["peak_mb"] for r in results if r["optimizer"] == "momentum" and "peak_mb" in r), None)
    lines = ["| optimizer | dense factors (MB) | built (MB) | compiled (MB) | after steps (MB) | peak (MB) | "
             "peak - Momentum's, in factor sizes | compile (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['optimizer']} | | | | | failed: {r['error']} | | |")
            continue
        ratio = "" if base is None or not r["factors_mb"] else f"{(r['peak_mb'] - base) / r['factors_mb']:.1f}"
        lines.append(f"| {r['optimizer']} | {r['factors_mb']:.0f} | {r['built_mb']:.0f} | {r['compiled_mb']:.0f} | "
                     f"{r['stepped_mb']:.0f} | {r['peak_mb']:.0f} | {ratio} | {r['compile_s']:.0f} |")
    return "\n".join(lines)


def parse(argv=None):
    """The command line's arguments (the defaults with ``argv=[]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("resnet50", "resnet32", "mlp"), default="resnet50")
    parser.add_argument("--image", type=int, default=32, help="ResNet-50 input size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4, help="mlp: Dense layers")
    parser.add_argument("--width", type=int, default=1024, help="mlp: units per layer")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(args)
    results = []
    for name in args.optimizers.split(","):
        results.append(measure(args, name.strip()))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{args.model} ({'image %d, ' % args.image if args.model != 'mlp' else ''}batch {args.batch}), "
          f"{time.strftime('%Y-%m-%d')}\n")
    print(table(results))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"memory_{args.model}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
