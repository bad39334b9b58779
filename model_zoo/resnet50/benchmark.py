"""Training throughput of several optimizers on one synthetic batch, measured side by side.

    python model_zoo/resnet50/benchmark.py --config_path cpu_smoke --optimizers momentum,kfac,thor
    python model_zoo/resnet50/benchmark.py --config_path 'resnet_cifar10_{optimizer}' --batch_size 32
    python model_zoo/resnet50/benchmark.py --optimizers momentum,kfac \
        --config_path resnet50_imagenet2012_momentum_8p,resnet50_imagenet2012_kfac_8p --batch_size 32

Each optimizer's training cell (network, loss and optimizer built by the same factory as train.py,
from the config's section; ``{optimizer}`` in ``--config_path`` is replaced by the optimizer's name, or
``--config_path`` names one config per optimizer, comma-separated in ``--optimizers``' order) is
compiled (``Cell.compile``, timed alone; with ``--lean_step`` a natural-gradient optimizer trains with
``mindspore_ngd.NGDTrainOneStepCell``, as ``train.py``'s ``lean_step: true``, and its lean graph is compiled
and timed too, the compile time being both), then runs ``--rounds`` interleaved rounds of ``--steps`` steps
on the same synthetic batch, so machine noise hits every optimizer alike. The network, image size and
classes are the first config's (``--image_size`` overrides the size).

Every step of a natural-gradient optimizer is classified from its own state: a *refresh* step
recomputed an inverse (its ``inverse_refreshes`` counter moved), a *capture* step captured statistics
without inverting, a *plain* step did neither. Reported per optimizer: the compilation, the first
step, the median step of each kind (the first step included: compilation is timed apart, but it also
pays one-time allocations, so a kind seen only at step 0, such as a recipe's first refresh, is timed
high), the mean step over all rounds and images/s = batch / mean step;
and the step **amortised over the recipe's own schedule**: each kind's median weighted by how often
the optimizer's refresh rule (``opt.policy.refresh.plan``) runs it over ``--horizon`` steps (default:
100 times the rule's longest interval). That weighting exists for fixed schedules (K-FAC's intervals,
THOR's frequency without a trace threshold); SP-NGD's adaptive intervals depend on how its statistics
move, which synthetic data does not show, so its amortised step is left out (its mean over the run is
the rate it showed on this one batch). Ratios are to ``momentum`` when it runs. An optimizer this
mindspore_ngd lacks is reported as n/a.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")   # CPU only; must precede the MindSpore import

import numpy as np  # noqa: E402


def _cell(config_name, optimizer, batch_size, steps_per_epoch, network_config=None, lean=False):
    from mindspore import nn

    import mindspore_ngd as ngd

    from src.config import load_config
    from src.optimizer import build_optimizer
    from src.resnet import build_network
    config = load_config(config_name.format(optimizer=optimizer), {"optimizer": optimizer, "batch_size": batch_size})
    net = network_config or config                     # every cell trains the same network
    network = build_network(net["net"], net["class_num"], net["net_options"])
    opt, _, _ = build_optimizer(config, network, steps_per_epoch, extra={"verbose": False})
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=config["label_smooth_factor"])
    step = ngd.NGDTrainOneStepCell if lean and isinstance(opt, ngd.NGDOptimizer) else nn.TrainOneStepCell
    cell = step(nn.WithLossCell(network, loss), opt, sens=config["loss_scale"])
    cell.set_train()
    return cell, config


KINDS = ("plain", "capture", "refresh")


def _is_natural_gradient(opt):
    import mindspore_ngd as ngd
    return isinstance(opt, ngd.NGDOptimizer)


def _natural_gradient_state(opt):
    """(whether the next step captures, inverse refreshes so far) of a natural-gradient optimizer; None
    for a first-order one."""
    if not _is_natural_gradient(opt):
        return None
    return bool(opt.curvature.capture_control.capturing.asnumpy()), int(opt.inverse_refreshes.asnumpy())


def step_kind(before, after):
    """The kind of a step from the optimizer's state before and after it (see the module docstring)."""
    if before is None:
        return "plain"
    if after[1] > before[1]:
        return "refresh"
    return "capture" if before[0] else "plain"


def schedule_shares(rule, horizon=None):
    """``{kind: share of steps}`` of a refresh rule over ``horizon`` steps (default: 100 times its longest
    interval), or None for a rule whose schedule depends on the data (adaptive or trace-driven)."""
    from mindspore_ngd.schedule.rules import FixedInterval, GrowingInterval
    if isinstance(rule, FixedInterval):
        horizon = horizon or 100 * max(rule.factor_interval, rule.inverse_interval)
        counts = dict.fromkeys(KINDS, 0)
        for _, captured, inverted in rule.plan(horizon):
            counts["refresh" if inverted else "capture" if captured else "plain"] += 1
    elif isinstance(rule, GrowingInterval) and rule.trace_threshold is None:
        horizon = horizon or 100 * max(rule.frequency, rule.max_frequency or 0)
        refreshes = len(rule.plan(horizon))
        counts = {"plain": horizon - refreshes, "capture": 0, "refresh": refreshes}
    else:
        return None
    return {kind: count / horizon for kind, count in counts.items()}


def amortised(medians, shares):
    """The mean step over a schedule: each kind's median weighted by its share; None when the schedule is
    unknown or a kind it runs was not measured."""
    if shares is None or any(share > 0 and medians.get(kind) is None for kind, share in shares.items()):
        return None
    return sum(share * medians[kind] for kind, share in shares.items() if share > 0)


def _ratio(value, reference):
    return "" if value is None or not reference else f" ({value / reference:.2f}x)"


def _ms(value):
    return "-" if value is None else f"{1e3 * value:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config_path", "--config", dest="config", default="cpu_smoke",
                        help="config name/file ('{optimizer}' is substituted), or one per optimizer, comma-separated")
    parser.add_argument("--optimizers", default="momentum,kfac,thor,spngd")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the config's")
    parser.add_argument("--image_size", type=int, default=None, help="default: the first config's")
    parser.add_argument("--horizon", type=int, default=None,
                        help="steps over which a fixed schedule is amortised (default: 100x its longest interval)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--out", default="", help="also write the results to this JSON file")
    parser.add_argument("--lean_step", action="store_true",
                        help="natural-gradient optimizers train with NGDTrainOneStepCell (train.py's lean_step: "
                             "true); its lean graph is compiled with the full one, and the compile time is both")
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
    configs = [c for c in args.config.split(",") if c]
    if len(configs) == 1:
        configs = [configs[0].format(optimizer=name) for name in names]
    elif len(configs) != len(names):
        parser.error(f"--config_path names {len(configs)} configs for {len(names)} optimizers; give one, or one each")
    first = load_config(configs[0])
    batch = args.batch_size or first["batch_size"]
    size = args.image_size or first["image_size"]
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    y = Tensor((np.arange(batch) % first["class_num"]).astype(np.int32))

    cells, results = {}, {}
    for name, config_name in zip(names, configs):
        ms.set_seed(0)
        try:
            cell, config = _cell(config_name, name, batch, args.rounds * args.steps, first, args.lean_step)
        except OptimizerUnavailable as err:
            results[name] = {"error": str(err)}
            continue
        start = time.perf_counter()
        cell.compile(x, y)
        compile_s = time.perf_counter() - start
        lean_s = None
        if hasattr(cell, "compile_lean"):
            start = time.perf_counter()
            cell.compile_lean(x, y)
            lean_s = time.perf_counter() - start
            compile_s += lean_s
        results[name] = {"config": config["config_path"], "compile_s": compile_s, "lean_compile_s": lean_s,
                         "steps": [], "kinds": [],
                         "shares": schedule_shares(cell.optimizer.policy.refresh, args.horizon)
                         if _is_natural_gradient(cell.optimizer) else {"plain": 1.0, "capture": 0.0, "refresh": 0.0}}
        cells[name] = cell
    for _ in range(args.rounds):
        for name, cell in cells.items():
            for _ in range(args.steps):
                before = _natural_gradient_state(cell.optimizer)
                start = time.perf_counter()
                cell(x, y).asnumpy()
                results[name]["steps"].append(time.perf_counter() - start)
                results[name]["kinds"].append(step_kind(before, _natural_gradient_state(cell.optimizer)))

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    for name in names:
        record = results[name]
        if "error" in record:
            continue
        steps = np.asarray(record["steps"])
        record.update(first_step_s=float(steps[0]), mean_ms=1e3 * float(steps.mean()),
                      images_per_s=batch / float(steps.mean()))
        record["medians"] = {kind: float(np.median([t for t, k in zip(steps, record["kinds"]) if k == kind]))
                             if kind in record["kinds"] else None for kind in KINDS}
        record["count"] = {kind: record["kinds"].count(kind) for kind in KINDS}
        record["amortised_s"] = amortised(record["medians"], record["shares"])
    reference = results.get("momentum", {})
    print(f"Input {size}x{size}, batch {batch}; ratios to momentum in parentheses. Median step of each kind, "
          "the first step included; amortised over the recipe's schedule.\n")
    print("| config | optimizer | compile s | first step s | plain step ms | capture step ms | refresh step ms | "
          "amortised ms | mean step ms | images/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, config_name in zip(names, configs):
        record = results[name]
        label = os.path.basename(config_name)
        if "error" in record:
            print(f"| {label} | {name} | | | | | | | | n/a |")
            continue
        med, ref_med = record["medians"], reference.get("medians", {})
        counts = record["count"]
        print(f"| {label} | {name} | {record['compile_s']:.1f}{_ratio(record['compile_s'], reference.get('compile_s'))} | "
              f"{record['first_step_s']:.1f} | "
              f"{_ms(med['plain'])}{_ratio(med['plain'], ref_med.get('plain'))} [{counts['plain']}] | "
              f"{_ms(med['capture'])} [{counts['capture']}] | {_ms(med['refresh'])} [{counts['refresh']}] | "
              f"{_ms(record['amortised_s'])}{_ratio(record['amortised_s'], reference.get('amortised_s'))} | "
              f"{record['mean_ms']:.1f} | {record['images_per_s']:.1f} |")
    lean = [f"{name} {results[name]['lean_compile_s']:.1f} s" for name in names
            if results[name].get("lean_compile_s") is not None]
    if lean:
        print("\nThe compile time includes the lean graph's (NGDTrainOneStepCell): " + ", ".join(lean) + ".")
    print(f"\n{args.rounds} interleaved rounds x {args.steps} steps ([n]: steps of that kind, the first included); "
          f"load average (1, 5, 15 min) at the end: {load}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"batch_size": batch, "image_size": size, "rounds": args.rounds, "steps": args.steps,
                       "load": load, "results": results}, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
