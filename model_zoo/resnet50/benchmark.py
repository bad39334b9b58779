"""Training throughput of several optimizers on one synthetic batch, measured side by side.

    python model_zoo/resnet50/benchmark.py --config_path cpu_smoke --optimizers momentum,kfac,thor
    python model_zoo/resnet50/benchmark.py --config_path 'resnet_cifar10_{optimizer}' --batch_size 32

Each optimizer's training cell (network, loss and optimizer built by the same factory as train.py,
from the config's section; ``{optimizer}`` in ``--config_path`` is replaced by the optimizer's name) runs
``--rounds`` interleaved rounds of ``--steps`` steps on the same synthetic batch, so machine noise
hits every optimizer alike. Reported per optimizer: the first call (graph compilation + step 0), the
median step, the mean step over all rounds (refresh steps included, amortised) and images/s =
batch / mean step. An optimizer this mindspore_ngd lacks is reported as n/a.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")   # CPU only; must precede the MindSpore import

import numpy as np  # noqa: E402


def _cell(config_name, optimizer, batch_size, steps_per_epoch):
    from mindspore import nn

    from src.config import load_config
    from src.optimizer import build_optimizer
    from src.resnet import build_network
    config = load_config(config_name.format(optimizer=optimizer), {"optimizer": optimizer, "batch_size": batch_size})
    network = build_network(config["net"], config["class_num"], config["net_options"])
    opt, _, _ = build_optimizer(config, network, steps_per_epoch, extra={"verbose": False})
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=config["label_smooth_factor"])
    cell = nn.TrainOneStepCell(nn.WithLossCell(network, loss), opt, sens=config["loss_scale"])
    cell.set_train()
    return cell, config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config_path", "--config", dest="config", default="cpu_smoke", help="config name/file; '{optimizer}' is substituted")
    parser.add_argument("--optimizers", default="momentum,kfac,thor,spngd")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the config's")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--out", default="", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    import mindspore as ms
    from mindspore import Tensor

    from src.config import load_config
    from src.optimizer import OptimizerUnavailable
    from src.runtime import allow_deep_graphs
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    allow_deep_graphs()
    names = [n for n in args.optimizers.split(",") if n]
    first = load_config(args.config.format(optimizer=names[0]))
    batch = args.batch_size or first["batch_size"]
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, 3, first["image_size"], first["image_size"])).astype(np.float32))
    y = Tensor((np.arange(batch) % first["class_num"]).astype(np.int32))

    cells, results = {}, {}
    for name in names:
        ms.set_seed(0)
        try:
            cell, config = _cell(args.config, name, batch, args.rounds * args.steps)
        except OptimizerUnavailable as err:
            results[name] = {"error": str(err)}
            continue
        start = time.perf_counter()
        cell(x, y).asnumpy()
        results[name] = {"config": config["config_path"], "first_call_s": time.perf_counter() - start, "steps": []}
        cells[name] = cell
    for _ in range(args.rounds):
        for name, cell in cells.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                cell(x, y).asnumpy()
                results[name]["steps"].append(time.perf_counter() - start)

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print("| config | optimizer | batch | first call s (compile) | median step ms | mean step ms | images/s |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        record = results[name]
        label = os.path.basename(args.config.format(optimizer=name))
        if "error" in record:
            print(f"| {label} | {name} | {batch} | | | | n/a |")
            continue
        steps = np.asarray(record["steps"])
        record.update(median_ms=1e3 * float(np.median(steps)), mean_ms=1e3 * float(steps.mean()),
                      images_per_s=batch / float(steps.mean()))
        print(f"| {label} | {name} | {batch} | {record['first_call_s']:.1f} | {record['median_ms']:.1f} | "
              f"{record['mean_ms']:.1f} | {record['images_per_s']:.1f} |")
    print(f"\n{args.rounds} interleaved rounds x {args.steps} steps; load average (1, 5, 15 min) at the end: {load}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"batch_size": batch, "rounds": args.rounds, "steps": args.steps, "load": load,
                       "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
