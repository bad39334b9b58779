"""Peak resident memory of a training step: nn.Momentum, K-FAC, SP-NGD and THOR side by side.

    python -m benchmarks.memory [--model resnet50] [--image 32] [--batch 32]
                                [--optimizers momentum,kfac,spngd,thor] [--out results/]
    python -m benchmarks.memory --model mlp --layers 4 --width 1024
    python -m benchmarks.memory --model convbn --layers 4 --width 32 --image 64 --batch 8

Each optimizer trains in a process of its own (a process's peak resident set, ``ru_maxrss``, only
grows), on the same synthetic batch, through ``nn.TrainOneStepCell``. The first step of every
natural-gradient optimizer captures the factors and inverts them (the worst case); two more steps
follow. Reported per optimizer: the resident set after the network and optimizer are built, after
the graph is compiled and after the steps, the peak, and the peak above Momentum's in units of the
dense Kronecker factors' own size (A and G of every preconditioned layer, float32). The issue-33
goal is a ratio of at most 3.

The resident set also holds what MindSpore's compiler keeps of the step's graph, host memory that
grows with the number of graph nodes, not with the tensors. So two more columns split the tensors
out: the stored state (every Parameter of the training cell, and the capture's batch buffers, which
are not Parameters) and the peak of MindSpore's run-time memory pool (its own statistics,
``MS_DEV_RUNTIME_CONF=memory_statistics:True``, printed at the child's exit): together, what a device
would hold. Their sum above Momentum's is given in factor sizes as well.

``--model resnet50`` is the model zoo's ResNet-50 v1.5 (10 classes), ``--model resnet32`` the zoo's CIFAR
ResNet-32 (its CIFAR recipes' network: activations, not factors, dominate there); ``--model mlp`` a stack of
``--layers`` Dense layers of ``--width`` units, the size the test suite's memory guard uses
(``tests/benchmarks/test_memory.py``); ``--model convbn`` a stack of ``--layers`` conv3x3-BatchNorm-ReLU
blocks of ``--width`` channels at ``--image`` x ``--image`` (stride 1), whose memory is the activations':
the guard of the capture's activation-sized work. Results are printed as a Markdown table and saved as
JSON.
"""
import argparse
import ctypes
import gc
import json
import os
import re
import resource
import sys
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

from . import ROOT, child_error, print_result, run_child  # noqa: E402

OPTIMIZERS = ("momentum", "kfac", "spngd", "thor")


def rss_mb():
    """This process's resident set now, in MB."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def trimmed_rss_mb():
    """:func:`rss_mb` after a garbage collection and ``malloc_trim``: every free page returned to the
    system, so what is left is what the process keeps."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10


def _state_mb(step, opt):
    """MB of the training cell's Parameters and of the capture's batch buffers (not Parameters)."""
    tensors = {id(p): p for p in step.get_parameters()}
    for block in tuple(getattr(opt, "blocks", ())) + tuple(getattr(opt, "norm_blocks", ())):
        capture = getattr(block, "capture", None)
        for name in ("a_batch", "g_batch", "f_batch"):
            buffer = getattr(capture, name, None)
            if buffer is not None:
                tensors[id(buffer)] = buffer
    return sum(t.size * t.itemsize for t in tensors.values()) / 2 ** 20


def _pool_peak_mb(output):
    """The run-time pool's peak ("actual peak used mem:<N>M") from MindSpore's exit statistics."""
    peaks = [int(mb) for mb in re.findall(r"actual peak used mem:(\d+)M", output)]
    return max(peaks) if peaks else None


def _network(args):
    from mindspore import nn
    if args.model in ("resnet50", "resnet32"):
        sys.path.insert(0, os.path.join(ROOT, "model_zoo", "resnet50"))
        from src.resnet import build_network
        if args.model == "resnet32":      # the zoo's CIFAR recipes' network
            return build_network("resnet_cifar", 10, {"blocks_per_stage": 5, "width": 16}), (3, args.image, args.image)
        return build_network("resnet50", 10), (3, args.image, args.image)
    if args.model == "convbn":        # activations, not factors: the guard of the BatchNorm capture
        from .models import ConvBNNet
        return (ConvBNNet(widths=(3,) + (args.width,) * args.layers, strides=(1,) * args.layers),
                (3, args.image, args.image))
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
    out = {"optimizer": args.worker, "factors_mb": factors / 2 ** 20, "built_mb": rss_mb(),
           "state_mb": _state_mb(step, opt)}
    start = time.perf_counter()
    step.compile(x, y)
    out["compile_s"] = time.perf_counter() - start
    out["compiled_mb"] = rss_mb()
    losses = []
    for _ in range(args.steps):
        losses.append(float(step(x, y).asnumpy()))
    out.update(stepped_mb=rss_mb(), peak_mb=_peak_mb(), losses=losses,
               layers=len(getattr(opt, "blocks", ())))
    print_result(out)


def measure(args, name):
    """Run one optimizer in a child process; its result dict (``error`` set if it failed)."""
    child_args = ["--worker", name, "--model", args.model, "--image", str(args.image), "--batch", str(args.batch),
                  "--layers", str(args.layers), "--width", str(args.width), "--steps", str(args.steps)]
    env = dict(os.environ)
    conf = env.get("MS_DEV_RUNTIME_CONF", "")
    env["MS_DEV_RUNTIME_CONF"] = ",".join(filter(None, (conf, "memory_statistics:True")))
    result, proc = run_child("benchmarks.memory", child_args, env)
    if result is None:
        return {"optimizer": name, "error": child_error(proc)}
    result["pool_peak_mb"] = _pool_peak_mb(proc.stdout + proc.stderr)
    return result


def _tensors_mb(result):
    """Stored state plus the run-time pool's peak (None without the pool's statistics)."""
    pool = result.get("pool_peak_mb")
    return None if pool is None else result["state_mb"] + pool


def _ratio(value, base, factors):
    return "" if value is None or base is None or not factors else f"{(value - base) / factors:.1f}"


def table(results):
    momentum = next((r for r in results if r["optimizer"] == "momentum" and "peak_mb" in r), None)
    base = None if momentum is None else momentum["peak_mb"]
    base_tensors = None if momentum is None else _tensors_mb(momentum)
    lines = ["| optimizer | dense factors (MB) | built (MB) | compiled (MB) | after steps (MB) | peak (MB) | "
             "peak - Momentum's, in factor sizes | stored state (MB) | run-time pool peak (MB) | "
             "state + pool - Momentum's, in factor sizes | compile (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['optimizer']} | | | | | failed: {r['error']} | | | | | |")
            continue
        pool = r.get("pool_peak_mb")
        lines.append(f"| {r['optimizer']} | {r['factors_mb']:.0f} | {r['built_mb']:.0f} | {r['compiled_mb']:.0f} | "
                     f"{r['stepped_mb']:.0f} | {r['peak_mb']:.0f} | {_ratio(r['peak_mb'], base, r['factors_mb'])} | "
                     f"{r['state_mb']:.0f} | {'' if pool is None else pool} | "
                     f"{_ratio(_tensors_mb(r), base_tensors, r['factors_mb'])} | {r['compile_s']:.0f} |")
    return "\n".join(lines)


def parse(argv=None):
    """The command line's arguments (the defaults with ``argv=[]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("resnet50", "resnet32", "mlp", "convbn"), default="resnet50")
    parser.add_argument("--image", type=int, default=32, help="input size (resnet50, resnet32, convbn)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4, help="mlp: Dense layers; convbn: conv-BatchNorm blocks")
    parser.add_argument("--width", type=int, default=1024, help="mlp: units per layer; convbn: channels")
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
