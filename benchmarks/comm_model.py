"""Communication / compute / memory model of distributed K-FAC schemes, from layer shapes alone.

    python -m benchmarks.comm_model --model resnet50 --devices 8,256,1024 [--out results/]
        [--bandwidth-gbps 100] [--tflops 10]

Pure Python + NumPy: nothing runs on a device. For one *refresh step* (batch factors reduced, inverses
recomputed, gradients preconditioned; with update intervals > 1 the factor and inverse terms are
paid only every interval) it gives, per device, the maximum over ranks of:

* bytes sent by the factor communication, the inverse communication and the preconditioned-gradient
  communication, plus the data-parallel gradient all-reduce that every scheme pays (``Model.train``
  in ``DATA_PARALLEL`` all-reduces every gradient before the optimizer);
* the inversion work (``d^3`` "flops" per ``d x d`` factor, the makespan of the ownership plan) and
  the preconditioning work ``2 (g^2 a + g a^2)`` per layer;
* persistent memory for factors and inverses (float32).

Collective cost model (ring algorithms, per device, ``B`` bytes in total, ``N`` devices):
all-reduce ``2 (N-1)/N B``; reduce-scatter and all-gather ``(N-1)/N B`` for equal chunks. With
unequal chunks (ReduceScatterV / AllGatherV, or per-layer Reduce / Broadcast pipelined along a
ring), a device moves every chunk but its own: ``B - B_own(rank)``. With equal chunks padded to the
largest (what a plain ReduceScatter / AllGather of a padded buffer does) it moves ``(N-1) chunk``.

Schemes:

(a) ``ours``: each layer owned by one rank (``grad_worker_fraction = 1/N``), LPT on ``a^3 + g^3``
    (:func:`mindspore_ngd.parallel.plan.plan_ownership`); batch factors reduce-scattered to their
    owners as upper triangles; owners average, invert, precondition; preconditioned gradients
    all-gathered. Shown with V-collectives (Ascend/GPU), with padded equal chunks, and with the CPU
    fallback (all-reduce of the packed triangles, world all-gather of padded chunks).
(b) ``thor``: MindSpore's THOR scheme: every rank inverts every layer from its *local* factors and
    the inverses are all-reduced (averaged; not the inverse of the averaged factor). Whole factors
    and THOR's 128-blocks (block-diagonal inverses, as on Ascend). No factor communication; no
    persistent factors (THOR inverts the step's factors directly).
(c) ``kaisa-comm-opt``: KAISA with grad-worker fraction 1 (Pauloski et al., SC'21): factors
    all-reduced (full matrices, kfac-pytorch's default ``symmetry_aware=False``), one inverse worker
    per layer (LPT), inverses broadcast to every rank, every rank preconditions every layer.
(d) ``kaisa-mem-opt``: KAISA with fraction 1/N: factors reduced to the layer's worker (full),
    worker inverts and preconditions, preconditioned gradient broadcast to every rank.

The time columns are a *projection*: bytes / bandwidth + flops / throughput, with the bandwidth and
throughput given on the command line; latency (number of collective calls, listed separately) and
overlap are not modelled.
"""
import argparse
import json
import os
from dataclasses import dataclass, field, asdict

from mindspore_ngd.curvature.blocks import block_layout, inverse_cubes, precondition_flops
from mindspore_ngd.parallel.packing import tri_size
from mindspore_ngd.parallel.plan import plan_ownership

FLOAT_BYTES = 4
MB = 1e6

DEFAULT_BANDWIDTH_GBPS = 100.0     # gigabits/s per device (~12.5 GB/s: a 100 Gb/s-class interconnect)
DEFAULT_TFLOPS = 10.0              # effective fp32 TFLOP/s for inversions and preconditioning matmuls
THOR_SPLIT = 128


# ----------------------------------------------------------------------------- layer shapes
@dataclass(frozen=True)
class Layer:
    name: str
    a_dim: int          # C_in * kh * kw (+1 with bias)
    g_dim: int          # C_out
    params: int         # weights + bias


def _conv(name, c_in, c_out, k):
    return Layer(name, c_in * k * k, c_out, c_in * c_out * k * k)


def resnet50_layers(num_classes=1000):
    """ResNet-50 v1.5 (stride on the 3x3, no conv bias, Dense(2048, classes) with bias): 54 layers.

    Bottleneck stages [3, 4, 6, 3] with widths 64, 128, 256, 512 and expansion 4; the first block of
    every stage has a 1x1 projection shortcut. BatchNorm parameters are counted in
    :func:`resnet50_other_params` (they are not preconditioned).
    """
    layers = [_conv("conv1", 3, 64, 7)]
    c_in = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            prefix = f"layer{stage}.{b}"
            layers += [_conv(f"{prefix}.conv1", c_in, width, 1),
                       _conv(f"{prefix}.conv2", width, width, 3),
                       _conv(f"{prefix}.conv3", width, 4 * width, 1)]
            if b == 0:
                layers.append(_conv(f"{prefix}.downsample", c_in, 4 * width, 1))
            c_in = 4 * width
    layers.append(Layer("fc", 2048 + 1, num_classes, 2048 * num_classes + num_classes))
    return layers


def resnet50_other_params():
    """BatchNorm gamma/beta of ResNet-50 (plain data-parallel gradients)."""
    channels = [64]
    for blocks, width in zip((3, 4, 6, 3), (64, 128, 256, 512)):
        for b in range(blocks):
            channels += [width, width, 4 * width] + ([4 * width] if b == 0 else [])
    return 2 * sum(channels)


MODELS = {"resnet50": (resnet50_layers, resnet50_other_params)}


# ----------------------------------------------------------------------------- per-scheme model
@dataclass
class SchemeCost:
    scheme: str
    devices: int
    factor_bytes: float = 0.0          # per device, max over ranks
    inverse_bytes: float = 0.0
    gather_bytes: float = 0.0          # preconditioned gradients
    grad_allreduce_bytes: float = 0.0  # data-parallel gradient all-reduce (every scheme)
    collectives: str = ""
    inverse_flops: float = 0.0         # max over ranks (makespan), d^3 per factor
    precondition_flops: float = 0.0    # max over ranks
    memory_floats: float = 0.0         # persistent factors + inverses, max over ranks
    transient_floats: float = 0.0      # batch factors / buffers alive during the step on every rank
    idle_ranks: int = 0                # ranks that invert nothing
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def total_bytes(self):
        return self.factor_bytes + self.inverse_bytes + self.gather_bytes + self.grad_allreduce_bytes

    def projection(self, bandwidth_gbps, tflops):
        """(communication s, compute s, total s) under the given bandwidth and throughput."""
        comm = self.total_bytes / (bandwidth_gbps * 1e9 / 8)
        compute = (self.inverse_flops + self.precondition_flops) / (tflops * 1e12)
        return comm, compute, comm + compute


def _sq(d):
    return d * d


def _precondition_flops(layer, split=None):
    """G^-1 (g x g) @ dW (g x a) @ A^-1 (a x a), with block-diagonal inverses when split."""
    return precondition_flops(layer.g_dim, layer.a_dim, split)


def _ring_allreduce(n, nbytes):
    return 2 * (n - 1) / n * nbytes


def _owned(plan, layers, rank, fn):
    index = {l.name: l for l in layers}
    return sum(fn(index[name]) for name in plan.layers_of(rank))


def _per_rank(plan, layers, fn):
    return [_owned(plan, layers, r, fn) for r in range(plan.world_size)]


def scheme_ours(layers, n, grad_bytes, padded=False):
    plan = plan_ownership([(l.name, l.a_dim, l.g_dim) for l in layers], n)
    tri = _per_rank(plan, layers, lambda l: tri_size(l.a_dim) + tri_size(l.g_dim))
    grads = _per_rank(plan, layers, lambda l: l.a_dim * l.g_dim)
    full = _per_rank(plan, layers, lambda l: _sq(l.a_dim) + _sq(l.g_dim))
    pre = _per_rank(plan, layers, _precondition_flops)
    if n == 1:
        factor = gather = 0.0
    elif padded:
        factor = (n - 1) * max(tri) * FLOAT_BYTES
        gather = (n - 1) * max(grads) * FLOAT_BYTES
    else:
        factor = (sum(tri) - min(tri)) * FLOAT_BYTES
        gather = (sum(grads) - min(grads)) * FLOAT_BYTES
    name = "ours (padded RS/AG)" if padded else "ours (RS-V/AG-V)"
    return SchemeCost(
        scheme=name, devices=n, factor_bytes=factor, gather_bytes=gather,
        grad_allreduce_bytes=_ring_allreduce(n, grad_bytes) if n > 1 else 0.0,
        collectives="1 reduce-scatter (packed triangles) + 1 all-gather + DP all-reduce",
        inverse_flops=plan.makespan, precondition_flops=max(pre), memory_floats=2 * max(full),
        transient_floats=sum(_sq(l.a_dim) + _sq(l.g_dim) for l in layers),
        idle_ranks=len(plan.idle_positions),
        notes="f = 1/N; LPT on a^3+g^3" + ("; every chunk padded to the largest" if padded else ""),
        extra={"makespan_over_lower_bound": plan.makespan / plan.lower_bound,
               "largest_layer_cost": max(plan.costs), "lower_bound": plan.lower_bound})


def scheme_ours_cpu_fallback(layers, n, grad_bytes):
    """What MindSpore 2.10's CPU backend allows: no ReduceScatter, so the packed triangles of every
    layer are all-reduced and each owner keeps its part; the gather is a world AllGather of padded
    chunks (subgroup AllGather is not supported on CPU either)."""
    plan = plan_ownership([(l.name, l.a_dim, l.g_dim) for l in layers], n)
    tri = sum(tri_size(l.a_dim) + tri_size(l.g_dim) for l in layers)
    grads = _per_rank(plan, layers, lambda l: l.a_dim * l.g_dim)
    full = _per_rank(plan, layers, lambda l: _sq(l.a_dim) + _sq(l.g_dim))
    return SchemeCost(
        scheme="ours (CPU fallback)", devices=n,
        factor_bytes=_ring_allreduce(n, tri * FLOAT_BYTES) if n > 1 else 0.0,
        gather_bytes=(n - 1) * max(grads) * FLOAT_BYTES,
        grad_allreduce_bytes=_ring_allreduce(n, grad_bytes) if n > 1 else 0.0,
        collectives="1 all-reduce (packed triangles) + 1 all-gather (padded) + DP all-reduce",
        inverse_flops=plan.makespan, precondition_flops=max(_per_rank(plan, layers, _precondition_flops)),
        memory_floats=2 * max(full), transient_floats=sum(_sq(l.a_dim) + _sq(l.g_dim) for l in layers),
        idle_ranks=len(plan.idle_positions), notes="all-reduce of triangles instead of reduce-scatter",
        extra={"makespan_over_lower_bound": plan.makespan / plan.lower_bound,
               "largest_layer_cost": max(plan.costs), "lower_bound": plan.lower_bound})


def scheme_thor(layers, n, grad_bytes, split=None):
    def inv_floats(l):
        ca, sa = block_layout(l.a_dim, split)
        cg, sg = block_layout(l.g_dim, split)
        return ca * sa * sa + cg * sg * sg

    def inv_cost(l):
        return inverse_cubes(l.a_dim, split) + inverse_cubes(l.g_dim, split)
    inverses = sum(inv_floats(l) for l in layers)
    return SchemeCost(
        scheme="thor (split 128)" if split else "thor (whole)", devices=n,
        inverse_bytes=_ring_allreduce(n, inverses * FLOAT_BYTES) if n > 1 else 0.0,
        grad_allreduce_bytes=_ring_allreduce(n, grad_bytes) if n > 1 else 0.0,
        collectives="1 all-reduce of all inverses + DP all-reduce",
        inverse_flops=sum(inv_cost(l) for l in layers),
        precondition_flops=sum(_precondition_flops(l, split) for l in layers),
        memory_floats=inverses,
        transient_floats=sum(_sq(l.a_dim) + _sq(l.g_dim) for l in layers),
        idle_ranks=0,
        notes="every rank inverts every layer from local factors; inverses averaged"
              + (f"; block-diagonal {split}-blocks" if split else ""))


def scheme_kaisa(layers, n, grad_bytes, comm_opt):
    plan = plan_ownership([(l.name, l.a_dim, l.g_dim) for l in layers], n)
    full = _per_rank(plan, layers, lambda l: _sq(l.a_dim) + _sq(l.g_dim))
    grads = _per_rank(plan, layers, lambda l: l.a_dim * l.g_dim)
    total_full = sum(full)
    nl = len(layers)
    dp = _ring_allreduce(n, grad_bytes) if n > 1 else 0.0
    if comm_opt:
        return SchemeCost(
            scheme="kaisa-comm-opt (f=1)", devices=n,
            factor_bytes=_ring_allreduce(n, total_full * FLOAT_BYTES) if n > 1 else 0.0,
            inverse_bytes=(total_full - min(full)) * FLOAT_BYTES if n > 1 else 0.0,
            grad_allreduce_bytes=dp,
            collectives=f"1 all-reduce of factors + {2 * nl} inverse broadcasts + DP all-reduce",
            inverse_flops=plan.makespan,
            precondition_flops=sum(_precondition_flops(l) for l in layers),
            memory_floats=2 * total_full, transient_floats=total_full,
            idle_ranks=len(plan.idle_positions),
            notes="factors all-reduced (full); one inverse worker per layer; inverses broadcast to all")
    return SchemeCost(
        scheme="kaisa-mem-opt (f=1/N)", devices=n,
        factor_bytes=(total_full - min(full)) * FLOAT_BYTES if n > 1 else 0.0,
        gather_bytes=(sum(grads) - min(grads)) * FLOAT_BYTES if n > 1 else 0.0,
        grad_allreduce_bytes=dp,
        collectives=f"{2 * nl} factor reduces + {nl} gradient broadcasts + DP all-reduce",
        inverse_flops=plan.makespan,
        precondition_flops=max(_per_rank(plan, layers, _precondition_flops)),
        memory_floats=2 * max(full), transient_floats=total_full,
        idle_ranks=len(plan.idle_positions),
        notes="factors reduced (full) to the layer's worker; preconditioned gradient broadcast")


def model_costs(layers, other_params, devices):
    """{devices: [SchemeCost, ...]} for every scheme."""
    grad_bytes = (sum(l.params for l in layers) + other_params) * FLOAT_BYTES
    out = {}
    for n in devices:
        out[n] = [scheme_ours(layers, n, grad_bytes), scheme_ours(layers, n, grad_bytes, padded=True),
                  scheme_ours_cpu_fallback(layers, n, grad_bytes),
                  scheme_thor(layers, n, grad_bytes), scheme_thor(layers, n, grad_bytes, split=THOR_SPLIT),
                  scheme_kaisa(layers, n, grad_bytes, comm_opt=True),
                  scheme_kaisa(layers, n, grad_bytes, comm_opt=False)]
    return out


# ----------------------------------------------------------------------------- report
def summary_lines(layers, other_params):
    params = sum(l.params for l in layers) + other_params
    full = sum(_sq(l.a_dim) + _sq(l.g_dim) for l in layers)
    tri = sum(tri_size(l.a_dim) + tri_size(l.g_dim) for l in layers)
    grads = sum(l.a_dim * l.g_dim for l in layers)
    costs = sorted(((inverse_cubes(l.a_dim) + inverse_cubes(l.g_dim), l.name) for l in layers), reverse=True)
    total = sum(c for c, _ in costs)
    return [
        f"{len(layers)} preconditioned layers, {params / 1e6:.2f} M parameters "
        f"({params * FLOAT_BYTES / MB:.1f} MB of gradients)",
        f"factors: {full / 1e6:.1f} M floats whole ({full * FLOAT_BYTES / MB:.1f} MB), "
        f"{tri / 1e6:.1f} M as upper triangles ({tri * FLOAT_BYTES / MB:.1f} MB); "
        f"preconditioned gradient matrices {grads / 1e6:.2f} M floats",
        f"inversion work (sum a^3+g^3): {total / 1e9:.1f} G; largest layers: "
        + ", ".join(f"{n} {c / 1e9:.2f} G ({100 * c / total:.0f}%)" for c, n in costs[:3]),
    ]


def markdown(results, layers, other_params, bandwidth_gbps, tflops):
    lines = ["# Distributed K-FAC communication model (projection)", ""]
    lines += [f"- {s}" for s in summary_lines(layers, other_params)]
    lines += ["- per device, per refresh step, max over ranks; 1 MB = 10^6 bytes; float32",
              f"- projected time = bytes / ({bandwidth_gbps:g} Gbit/s) + flops / ({tflops:g} TFLOP/s); "
              "latency and overlap not modelled (collective calls listed)", ""]
    header = ("| scheme | factor MB | inverse MB | precond. grad MB | DP grad all-reduce MB | total MB "
              "| inversion GFLOP (makespan) | precondition GFLOP | memory MB | idle ranks "
              "| proj. comm ms | proj. compute ms | proj. total ms |")
    for n, rows in results.items():
        lines += [f"## {n} devices", "", header, "|" + "---|" * 13]
        for c in rows:
            comm, compute, total = c.projection(bandwidth_gbps, tflops)
            lines.append(
                f"| {c.scheme} | {c.factor_bytes / MB:,.1f} | {c.inverse_bytes / MB:,.1f} | {c.gather_bytes / MB:,.1f} "
                f"| {c.grad_allreduce_bytes / MB:,.1f} | {c.total_bytes / MB:,.1f} | {c.inverse_flops / 1e9:,.2f} "
                f"| {c.precondition_flops / 1e9:,.2f} | {c.memory_floats * FLOAT_BYTES / MB:,.1f} | {c.idle_ranks} "
                f"| {1e3 * comm:,.1f} | {1e3 * compute:,.1f} | {1e3 * total:,.1f} |")
        ours = rows[0]
        lines += ["", f"ours: makespan / lower bound = {ours.extra['makespan_over_lower_bound']:.3f}; "
                  f"lower bound = max(largest layer {ours.extra['largest_layer_cost'] / 1e9:.2f} G, total / N); "
                  f"{ours.idle_ranks} of {n} ranks own no layer", ""]
        lines += ["collectives per step: " + "; ".join(f"{c.scheme}: {c.collectives}" for c in rows), ""]
    return "\n".join(lines)


def to_json(results, layers, other_params, bandwidth_gbps, tflops):
    payload = {"assumptions": {"float_bytes": FLOAT_BYTES, "bandwidth_gbps": bandwidth_gbps, "tflops": tflops,
                               "collectives": "ring; all-reduce 2(N-1)/N B; V-collectives and per-layer "
                                              "reduce/broadcast B - B_own; padded (N-1) * chunk",
                               "label": "projection, not a measurement"},
               "layers": [asdict(l) for l in layers], "other_params": other_params, "devices": {}}
    for n, rows in results.items():
        payload["devices"][str(n)] = []
        for c in rows:
            comm, compute, total = c.projection(bandwidth_gbps, tflops)
            row = asdict(c)
            row.update(total_bytes=c.total_bytes, projected_comm_s=comm, projected_compute_s=compute,
                       projected_total_s=total)
            payload["devices"][str(n)].append(row)
    return payload


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--devices", default="8,256,1024", help="comma-separated device counts")
    parser.add_argument("--bandwidth-gbps", type=float, default=DEFAULT_BANDWIDTH_GBPS,
                        help="per-device collective bandwidth in gigaBITS per second "
                             f"(default {DEFAULT_BANDWIDTH_GBPS:g}; this CPU machine's MCCL: ~2.4)")
    parser.add_argument("--tflops", type=float, default=DEFAULT_TFLOPS,
                        help=f"effective fp32 TFLOP/s for inversion and preconditioning (default {DEFAULT_TFLOPS:g})")
    parser.add_argument("--out", default=None, help="directory for comm_model_<model>.json and .md")
    args = parser.parse_args(argv)
    devices = [int(d) for d in args.devices.split(",") if d.strip()]
    if not devices or min(devices) < 1:
        parser.error("--devices must be positive integers, e.g. 8,256,1024")
    if args.bandwidth_gbps <= 0 or args.tflops <= 0:
        parser.error("--bandwidth-gbps and --tflops must be > 0")
    build, others = MODELS[args.model]
    layers, other_params = build(), others()
    results = model_costs(layers, other_params, devices)
    text = markdown(results, layers, other_params, args.bandwidth_gbps, args.tflops)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        base = os.path.join(args.out, f"comm_model_{args.model}")
        with open(base + ".json", "w", encoding="utf-8") as handle:
            json.dump(to_json(results, layers, other_params, args.bandwidth_gbps, args.tflops), handle, indent=1)
        with open(base + ".md", "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        print(f"saved {base}.json and {base}.md")
    return results


if __name__ == "__main__":
    main()
