"""The arithmetic a model zoo recipe's optimizer adds to training, and the step ratio it implies.

    python -m benchmarks.recipe_flops [--config_path resnet50_imagenet2012_kfac_8p,...]
                                      [--batch_size 32,128] [--image_size 224] [--num_classes N] [--out results/]

Each entry of ``--config_path`` is a model zoo config, optionally followed by ``+section.key=value``
overrides (as ``train.py --set``), e.g. ``resnet50_imagenet2012_kfac_8p+kfac.split_dim=128+kfac.stat_stride=2``.
The network and the optimizer are built by the zoo's own factories (``src.resnet``, ``src.optimizer``),
and every preconditioned layer's input and output shapes are recorded in one PyNative forward pass
(:func:`benchmarks.cost_model.network_geometry`). Nothing is compiled or trained.

Per layer the FLOP model is :meth:`mindspore_ngd.curvature.registry.KroneckerType.flops`: training (forward
and backward), capture of A and G, the damped inversions (the optimizer's ``split_dim`` blocks) and the
preconditioning. The capture is counted on the rows the optimizer's ``stat_fraction`` and ``stat_stride``
keep (the first ``ceil(f B)`` examples; every ``s``-th output position per spatial axis of a convolution).
The step is then weighted by the recipe's own schedule (the zoo benchmark's ``schedule_shares``: a capture
on capture and refresh steps, the inversion on refresh steps), and the **arithmetic ratio** is

    (training + preconditioning + capture x capture share + inversion x refresh share) / training

that is, the step time relative to the first-order step's if every FLOP ran at the training's rate. It is a
floor for what a step can cost on a device whose matrix products and convolutions run at one rate,
not a measurement. Not modelled: the BatchNorm and classifier-bias arithmetic of training, SP-NGD's
unit-wise BatchNorm Fisher (O(1) per activation), the factors' moving averages and checks (O(D^2)), and
the update that Momentum pays too. For an adaptive schedule (SP-NGD's) the share is unknown: the table
gives the step without a refresh, the step that refreshes every statistic, and the share of a full
refresh per step at which the amortised ratio would be 1.2 (none when the step without a refresh is
already above it).
"""
import argparse
import math
import os
import sys

from . import save_results

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo", "resnet50")
GOAL = 1.2        # issue 36's amortised goal, x the first-order step


def parse_entry(text):
    """``(config name, ["section.key=value", ...])`` of one ``--config_path`` entry."""
    name, *sets = text.split("+")
    for item in sets:
        if "=" not in item:
            raise ValueError(f"--config_path override {item!r} is not key=value or section.key=value")
    return name, sets


def capture_rows(batch, positions, is_spatial, fraction, stride, output_shape):
    """Rows of one layer's batch statistics after ``stat_fraction`` (the capture's own
    :func:`~mindspore_ngd.curvature.factors.kept_rows`) and ``stat_stride`` (the length of the
    capture's ``[::s, ::s]`` slice of the output positions)."""
    from mindspore_ngd.curvature.factors import kept_rows
    if is_spatial and stride > 1:
        height, width = output_shape[-2], output_shape[-1]
        positions = math.ceil(height / stride) * math.ceil(width / stride)
    return kept_rows(batch, fraction) * positions


def recipe_flops(specs, geometry, batch, policy):
    """``{phase: FLOPs}`` summed over the layers: ``training`` per step, ``precondition`` per step,
    ``capture`` per capture, ``inverse`` per refresh."""
    from mindspore_ngd.curvature.registry import block_type_of
    split = policy.split_dim if policy is not None else None
    fraction = policy.stat_fraction if policy is not None else 1.0
    stride = policy.stat_stride if policy is not None else 1
    total = dict.fromkeys(("training", "precondition", "capture", "inverse"), 0)
    for spec in specs:
        kind = block_type_of(spec)
        if kind.family != "kronecker":          # SP-NGD's unit-wise BatchNorm: not modelled
            continue
        place = geometry[spec.name]
        full = kind.flops(spec, batch, place["positions"], split)
        rows = capture_rows(batch, place["positions"], spec.kind == "conv2d", fraction, stride, place["output"])
        sampled = kind.flops(spec, rows, 1, split)          # the capture's arithmetic is per row
        total["training"] += full["forward"] + full["backward"]
        total["precondition"] += full["precondition"]
        total["capture"] += sampled["capture_a"] + sampled["capture_g"]
        total["inverse"] += full["inverse_a"] + full["inverse_g"]
    return total


def arithmetic_ratios(flops, shares):
    """The ratios of the module docstring from :func:`recipe_flops`' totals and a schedule's shares
    (None: adaptive)."""
    train = flops["training"]
    plain = (train + flops["precondition"]) / train
    full = (train + flops["precondition"] + flops["capture"] + flops["inverse"]) / train
    out = {"plain": plain, "full_refresh": full, "amortised": None, "goal_refresh_share": None}
    if shares is not None:
        captures = shares["capture"] + shares["refresh"]
        out["amortised"] = plain + (flops["capture"] * captures + flops["inverse"] * shares["refresh"]) / train
    elif plain < GOAL:
        out["goal_refresh_share"] = (GOAL - plain) / (full - plain)
    return out


def measure(entry, batch, image_size, num_classes):
    """One row: the config's network and optimizer at ``batch`` (see the module docstring)."""
    if ZOO not in sys.path:
        sys.path.insert(0, ZOO)
    from benchmark import schedule_shares                 # model_zoo/resnet50/benchmark.py
    from src.config import load_config
    from src.optimizer import build_optimizer
    from src.resnet import build_network
    from mindspore_ngd.optim.engine import NGDOptimizer
    from .cost_model import network_geometry

    name, sets = parse_entry(entry)
    config = load_config(name, {"batch_size": batch}, sets)
    classes = num_classes or config["class_num"]
    size = image_size or config["image_size"]
    network = build_network(config["net"], classes, config["net_options"])
    optimizer, _, _ = build_optimizer(config, network, 100, extra={"verbose": False})
    natural = isinstance(optimizer, NGDOptimizer)
    if natural:
        specs, policy = optimizer.layer_specs, optimizer.policy
    else:                     # the training arithmetic of the same layers, from a K-FAC view of the network
        import mindspore_ngd as ngd
        specs, policy = ngd.KFAC(network, learning_rate=0.1, verbose=False).layer_specs, None
    geometry = network_geometry(lambda: network, (3, size, size), specs)
    flops = recipe_flops(specs, geometry, batch, policy)
    if not natural:
        flops.update(precondition=0, capture=0, inverse=0)
    shares = schedule_shares(policy.refresh) if natural else {"plain": 1.0, "capture": 0.0, "refresh": 0.0}
    return {"entry": entry, "optimizer": config["optimizer"], "batch": batch, "image_size": size,
            "classes": classes, "layers": len(specs), "split_dim": getattr(policy, "split_dim", None),
            "stat_stride": getattr(policy, "stat_stride", 1), "stat_fraction": getattr(policy, "stat_fraction", 1.0),
            "shares": shares, "gflop": {k: v / 1e9 for k, v in flops.items()},
            "ratios": arithmetic_ratios(flops, shares)}


def _num(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows):
    lines = ["| recipe | batch | training GFLOP | preconditioning GFLOP | capture GFLOP | inversion GFLOP | "
             "captures / refreshes per step | step without a refresh | step refreshing everything | "
             f"amortised | refresh share for {GOAL}x |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, q, s = r["gflop"], r["ratios"], r["shares"]
        shares = "adaptive" if s is None else f"{s['capture'] + s['refresh']:.4f} / {s['refresh']:.4f}"
        lines.append(f"| {r['entry']} | {r['batch']} | {g['training']:.0f} | {g['precondition']:.1f} | "
                     f"{g['capture']:.0f} | {g['inverse']:.1f} | {shares} | {_num(q['plain'])}x | "
                     f"{_num(q['full_refresh'])}x | {_num(q['amortised'])}{'x' if q['amortised'] else ''} | "
                     f"{_num(q['goal_refresh_share'], 4) if s is None else ''} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config_path", default="resnet50_imagenet2012_momentum_8p,resnet50_imagenet2012_kfac_8p,"
                        "resnet50_imagenet2012_thor_8p,resnet50_imagenet2012_spngd_bs4k",
                        help="comma-separated zoo configs, each optionally with +section.key=value overrides")
    parser.add_argument("--batch_size", default="32", help="comma-separated batch sizes")
    parser.add_argument("--image_size", type=int, default=None, help="default: each config's")
    parser.add_argument("--num_classes", type=int, default=None, help="default: each config's")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch_size.split(",") if b]
        entries = [e for e in args.config_path.split(",") if e]
        for entry in entries:
            parse_entry(entry)
    except ValueError as err:
        parser.error(str(err))
    if not batches or min(batches) < 1:
        parser.error(f"--batch_size must be positive integers, got {args.batch_size!r}")
    rows = [measure(entry, batch, args.image_size, args.num_classes) for batch in batches for entry in entries]
    print(markdown(rows))
    if args.out:
        save_results(args.out, "recipe_flops", {"rows": rows})
    return rows


if __name__ == "__main__":
    main()
