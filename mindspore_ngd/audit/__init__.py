"""Op audit: is every operator the optimizers add to a training graph documented for a device?

Run it as a script::

    python -m mindspore_ngd.audit --device Ascend --device GPU     # build each device's graph here
    python -m mindspore_ngd.audit --device GPU --native            # on a GPU machine: compile there
    python -m mindspore_ngd.audit --host-calls --lenient           # the CPU graph, host calls accepted

What it does, for each optimizer (K-FAC; SP-NGD with unit-wise BatchNorm; THOR with block splitting
and the trace rule) and each device:

1. builds the real training step, ``nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)``, of a
   small conv + BatchNorm + dense network, with the optimizer's kernel choice for that device
   (``inverse_method=DEVICE_INVERSE_METHODS[device]``, what ``inverse_method="auto"`` picks there) and
   its reporting choice (``host_calls=DEVICE_HOST_CALLS[device]``: False on Ascend and GPU, what
   ``host_calls="auto"`` picks there);
2. compiles it and reads MindSpore's saved IR of the final front-end graph (the ``validate`` pass:
   the graph handed to the device back-end), and extracts every primitive in it;
3. subtracts the primitives of a plain ``nn.Momentum`` training step of the same network;
4. looks each remaining primitive up in the *installed* MindSpore's docstrings ("Supported
   Platforms"), following the docstrings' own "Refer to :func:`...`" / "Alias for" links; and fails,
   naming the primitive, where the device is not listed or no documentation can be found.

The audit is strict by default: a node that runs on the host (JIT-fallback Python -- ``PyExecute``,
``JoinedStr``, ``raise`` -- and the scalar operations of graph-mode Python -- ``ScalarBoolNot``,
``ScalarAdd``, ...; :func:`~mindspore_ngd.audit.docs.is_host_node`) fails on Ascend and GPU, whatever
``mindspore.jit``'s documentation says: GE (Ascend's default back-end) runs the whole step on the
device, with no host round trip inside it. ``--lenient`` (``strict=False``) accepts them where
``mindspore.jit`` is documented, the audit of earlier versions.

Primitives without documentation of their own are handled by explicit, commented tables in
:mod:`mindspore_ngd.audit.docs`:
graph-structure nodes that are not operators (:data:`GRAPH_NODES`), a copy MindSpore's compiler
inserts (:data:`COMPILER_INSERTED`), internal primitives that documented public APIs compile to
(:data:`EMITTED_BY`; each link is checked by compiling the API, see ``tests/devices``), and backward
primitives ``XGrad`` (read as the documentation of the forward ``X``: MindSpore documents platforms
for forward operators only). The platform lists themselves are never typed here.

Limits (docs/testing.md, "The op audit"): the graph is built on the machine at hand. Without an accelerator,
MindSpore cannot set ``device_target`` to Ascend or GPU, so the front-end graph is the CPU build's;
back-end passes (operator fusion, kernel selection) of the real device are not covered. The
documentation is MindSpore's claim, not a run on hardware.
"""
import argparse
import collections
import dataclasses

import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

from .docs import (COMPILER_INSERTED, DEVICES, EMITTED_BY, GRAPH_NODES, HOST_NODES, Documentation, doc_reference,
                   documentation, is_host_node, supported_platforms)
from .ir import compiled_primitives, ir_copies, ir_primitives, read_ir_copies, read_ir_primitives

__all__ = ["DEVICES", "GRAPH_NODES", "COMPILER_INSERTED", "EMITTED_BY", "HOST_NODES", "OPTIMIZERS", "Documentation",
           "AuditReport", "is_host_node", "supported_platforms", "doc_reference", "ir_primitives", "read_ir_primitives",
           "ir_copies", "read_ir_copies",
           "compiled_primitives", "documentation", "audit_primitives", "AuditNet", "audit_inputs",
           "build_train_step", "device_host_calls", "audit_optimizer", "collectives_for", "audit_collectives", "main"]


# ------------------------------------------------------------------ the audit
@dataclasses.dataclass
class AuditReport:
    """Result of :func:`audit_primitives` for one graph and one device."""
    label: str
    device: str
    added: dict                 # primitive -> sources, the primitives the optimizer adds
    entries: tuple              # Documentation of each added primitive, sorted by name
    strict: bool = True         # host nodes fail on Ascend and GPU (Documentation.documented_for)

    @property
    def undocumented(self):
        """Names of added primitives not documented for the device (unmapped ones and, strict, host
        nodes on Ascend and GPU included)."""
        return tuple(e.name for e in self.entries if not e.documented_for(self.device, self.strict))

    @property
    def host_nodes(self):
        """Names of the added primitives that run on the host (:func:`is_host_node`)."""
        return tuple(e.name for e in self.entries if is_host_node(e.name))

    @property
    def unmapped(self):
        return tuple(e.name for e in self.entries if e.kind == "unmapped")

    @property
    def ok(self):
        return not self.undocumented

    def operators(self):
        """The added primitives that are operators (graph-structure nodes left out)."""
        return tuple(e.name for e in self.entries if e.kind != "graph")

    def failure_message(self):
        lines = [f"op audit failed for {self.label} on {self.device}:"]
        for e in self.entries:
            if e.documented_for(self.device, self.strict):
                continue
            where = sorted({s for s in self.added.get(e.name, ()) if s != "?"})[:3]
            if e.kind == "unmapped":
                why = "no documentation found in the installed MindSpore (map it in mindspore_ngd.audit.docs)"
            elif e.kind == "host":
                why = (f"runs on the host ({e.source}): no host round trip inside a step on {self.device} "
                       "(strict audit)")
            else:
                why = f"documented for {list(e.platforms)} only ({e.source})"
            lines.append(f"  {e.name}: {why}; used at {', '.join(where) or 'unknown'}")
        return "\n".join(lines)

    def format(self, verbose=False):
        """A summary line per kind of evidence; with ``verbose`` one row per primitive."""
        head = f"{self.label} on {self.device}: {'PASS' if self.ok else 'FAIL'} ({len(self.operators())} operators added)"
        rows = [head]
        if not verbose:
            kinds = collections.defaultdict(list)
            for e in self.entries:
                kinds[e.kind].append(e.name)
            rows += [f"  {kind}: {' '.join(names)}" for kind, names in sorted(kinds.items())]
            return "\n".join(rows)
        for e in self.entries:
            mark = "ok " if e.documented_for(self.device, self.strict) else "NO "
            plat = "-" if e.platforms is None else ",".join(e.platforms) or "none"
            rows.append(f"  {mark}{e.name:32s} {e.kind:11s} {plat:18s} {e.source}")
        return "\n".join(rows)


def audit_primitives(added, device, label="graph", strict=True):
    """Check the primitives ``added`` (names, or a dict name -> sources) against the documentation
    for ``device``; return an :class:`AuditReport`. ``strict``: host nodes fail on Ascend and GPU."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if not isinstance(added, dict):
        added = {name: [] for name in added}
    entries = tuple(documentation(name) for name in sorted(added))
    return AuditReport(label=label, device=device, added=dict(added), entries=entries, strict=bool(strict))


class AuditNet(nn.Cell):
    """conv (bias) -> BatchNorm -> ReLU -> flatten -> Dense: every layer kind the optimizers handle.

    Input (N, 2, 5, 5). With ``split_dim=8`` both A factors (19 and 101) are split into blocks."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 5 * 5, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.bn(self.conv(x)))))


def audit_inputs(batch=4):
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((batch, 2, 5, 5)).astype(np.float32)),
            Tensor(np.asarray(rng.integers(0, 3, batch), dtype=np.int32)))


def _kfac(net, method, host_calls):
    from ..optim import KFAC
    return KFAC(net, 0.05, inverse_method=method, verbose=False, host_calls=host_calls)


def _spngd(net, method, host_calls):
    from ..optim import SPNGD
    return SPNGD(net, 0.05, inverse_method=method, verbose=False, host_calls=host_calls)


def _thor(net, method, host_calls):
    from ..optim import THOR
    # split_dim 8 < the A factors (19, 101): block splitting; trace_threshold: the trace rule
    return THOR(net, 0.05, 0.03, split_dim=8, trace_threshold=0.1, frequency=2, inverse_method=method,
                verbose=False, host_calls=host_calls)


def _momentum(net, method, host_calls):
    return nn.Momentum(net.trainable_params(), 0.05, 0.9)


OPTIMIZERS = {"kfac": _kfac, "spngd": _spngd, "thor": _thor}


def build_train_step(optimizer, inverse_method=None, network=None, host_calls=False):
    """The real training step ``TrainOneStepCell(WithLossCell(net, loss), opt)`` in training mode.
    ``optimizer``: "kfac", "spngd", "thor" or "momentum" (the baseline); ``host_calls``: the
    optimizer's argument (default False: the graph of Ascend and GPU)."""
    makers = dict(OPTIMIZERS, momentum=_momentum)
    if optimizer not in makers:
        raise ValueError(f"optimizer must be one of {sorted(makers)}, got {optimizer!r}")
    ms.set_seed(0)
    net = network if network is not None else AuditNet()
    opt = makers[optimizer](net, inverse_method, host_calls)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                               opt)
    step.set_train()
    return step


def device_inverse_method(device):
    """The inversion path for ``device`` (what ``inverse_method="auto"`` picks there)."""
    from ..curvature.inverse import DEVICE_INVERSE_METHODS
    if device not in DEVICE_INVERSE_METHODS:
        raise ValueError(f"device must be one of {sorted(DEVICE_INVERSE_METHODS)}, got {device!r}")
    return DEVICE_INVERSE_METHODS[device]


def device_host_calls(device):
    """Whether the step calls back into Python on ``device`` (what ``host_calls="auto"`` picks there)."""
    from ..optim.status import DEVICE_HOST_CALLS
    if device not in DEVICE_HOST_CALLS:
        raise ValueError(f"device must be one of {sorted(DEVICE_HOST_CALLS)}, got {device!r}")
    return DEVICE_HOST_CALLS[device]


_BASELINE = {}


def baseline_primitives():
    """Primitives of the plain ``nn.Momentum`` training step of :class:`AuditNet` (cached per
    device target)."""
    key = ms.get_context("device_target")
    if key not in _BASELINE:
        _BASELINE[key] = compiled_primitives(build_train_step("momentum"), *audit_inputs())
    return _BASELINE[key]


_ADDED = {}


def optimizer_primitives(optimizer, inverse_method, host_calls=False):
    """Primitives the optimizer's training step adds over the plain momentum step: name -> sources.
    Each (device target, optimizer, inverse method, host calls) graph is compiled once per process."""
    key = (ms.get_context("device_target"), optimizer, inverse_method, bool(host_calls))
    if key not in _ADDED:
        graph = compiled_primitives(build_train_step(optimizer, inverse_method, host_calls=host_calls),
                                    *audit_inputs())
        base = baseline_primitives()
        _ADDED[key] = {name: sources for name, sources in graph.items() if name not in base}
    return _ADDED[key]


def audit_optimizer(optimizer, device, inverse_method=None, host_calls=None, strict=True):
    """Audit one optimizer's training step for ``device`` (kernel choice: ``inverse_method``, by
    default the device's :data:`DEVICE_INVERSE_METHODS` entry; ``host_calls``, by default the
    device's :data:`~mindspore_ngd.optim.status.DEVICE_HOST_CALLS` entry; ``strict``: host nodes fail
    on Ascend and GPU)."""
    method = inverse_method or device_inverse_method(device)
    host = device_host_calls(device) if host_calls is None else bool(host_calls)
    added = optimizer_primitives(optimizer, method, host)
    return audit_primitives(added, device, label=f"{optimizer} (inverse_method={method!r}, host_calls={host})",
                            strict=strict)


# ------------------------------------------------------------------ collectives
_COLLECTIVE_CLASS = {"ReduceScatter": "ReduceScatter", "AllReduce": "AllReduce", "AllGather": "AllGather",
                     "AllGather (owner group)": "AllGather", "AllReduce (owner group)": "AllReduce"}


def collectives_for(backend, world_size=4, grad_worker_fraction=None):
    """The collective primitives the distributed exchange issues on ``backend`` ("hccl", "nccl",
    "mccl") for ``world_size`` ranks, from :class:`mindspore_ngd.parallel.comm.Communicator`'s own
    choice: ``{primitive: [what it carries, ...]}``."""
    from ..parallel.comm import Communicator
    from ..parallel.plan import plan_ownership
    items = [("conv", 19, 4), ("fc", 101, 3), ("fc2", 8, 5), ("fc3", 30, 7)]
    plan = plan_ownership(items, world_size, grad_worker_fraction)
    comm = Communicator(plan, 0, backend)
    out = collections.defaultdict(list)
    out[comm.factor_collective].append("Kronecker factors (world)")
    if comm.factor_collective == "ReduceScatter":
        out["AllReduce"].append("replicated BatchNorm statistics (world)")
    if comm.gather_collective is not None:
        out[_COLLECTIVE_CLASS[comm.gather_collective]].append(f"preconditioned gradients ({comm.gather_collective})")
    out["AllReduce"].append("shared decisions (world)")
    return dict(out)


def audit_collectives(backend, device, world_size=4):
    """Audit the collectives of every ``grad_worker_fraction`` ``k/N`` on ``backend`` for ``device``."""
    used = collections.defaultdict(list)
    for k in [k for k in range(1, world_size + 1) if world_size % k == 0]:
        for name, roles in collectives_for(backend, world_size, k / world_size).items():
            used[name].extend(f"f={k}/{world_size}: {role}" for role in roles)
    return audit_primitives(dict(used), device, label=f"collectives on {backend} (world {world_size})")


# ------------------------------------------------------------------ script
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mindspore_ngd.audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", action="append", choices=["Ascend", "GPU"],
                        help="device to audit (repeatable; default: Ascend and GPU)")
    parser.add_argument("--optimizer", action="append", choices=sorted(OPTIMIZERS),
                        help="optimizer to audit (repeatable; default: all)")
    parser.add_argument("--inverse-method", default=None,
                        help="audit this inversion path instead of the device's default")
    parser.add_argument("--host-calls", action="store_true",
                        help="audit the graph with host calls (host_calls=True, the CPU default) instead of the "
                             "device's")
    parser.add_argument("--lenient", action="store_true",
                        help="accept host nodes (PyExecute, JoinedStr, scalar host ops) where mindspore.jit is "
                             "documented; the default (strict) fails them on Ascend and GPU")
    parser.add_argument("--verbose", action="store_true", help="one row per primitive with its documentation")
    parser.add_argument("--native", action="store_true",
                        help="compile on the audited device itself (ms.set_device); needs that device")
    args = parser.parse_args(argv)
    devices = args.device or ["Ascend", "GPU"]
    if args.native and len(devices) != 1:
        parser.error("--native audits one device: give exactly one --device")
    if args.native:
        ms.set_device(devices[0])
    ms.set_context(mode=ms.GRAPH_MODE)
    print(f"compiling on {ms.get_context('device_target')} with MindSpore {ms.__version__}; "
          f"{'lenient' if args.lenient else 'strict'}: host nodes {'accepted' if args.lenient else 'fail'}")
    failed = False
    for device in devices:
        for name in args.optimizer or sorted(OPTIMIZERS):
            report = audit_optimizer(name, device, args.inverse_method, True if args.host_calls else None,
                                     strict=not args.lenient)
            print(report.format(args.verbose))
            if not report.ok:
                print(report.failure_message())
                failed = True
        backend = {"Ascend": "hccl", "GPU": "nccl"}[device]
        report = audit_collectives(backend, device)
        print(report.format(args.verbose))
        failed |= not report.ok
    print("op audit:", "FAILED" if failed else "passed")
    return 1 if failed else 0
