"""Op audit: is every operator the optimizers add to a training graph documented for a device?

Run it as a script::

    python -m mindspore_ngd.audit --device Ascend --device GPU     # build each device's graph here
    python -m mindspore_ngd.audit --device GPU --native            # on a GPU machine: compile there

What it does, for each optimizer (K-FAC; SP-NGD with unit-wise BatchNorm; THOR with block splitting
and the trace rule) and each device:

1. builds the real training step, ``nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)``, of a
   small conv + BatchNorm + dense network, with the optimizer's kernel choice for that device
   (``inverse_method=DEVICE_INVERSE_METHODS[device]``, what ``inverse_method="auto"`` picks there);
2. compiles it and reads MindSpore's saved IR of the final front-end graph (the ``validate`` pass:
   the graph handed to the device back-end), and extracts every primitive in it;
3. subtracts the primitives of a plain ``nn.Momentum`` training step of the same network;
4. looks each remaining primitive up in the *installed* MindSpore's docstrings ("Supported
   Platforms"), following the docstrings' own "Refer to :func:`...`" / "Alias for" links; and fails,
   naming the primitive, where the device is not listed or no documentation can be found.

Primitives without documentation of their own are handled by explicit, commented tables below:
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
import glob
import importlib
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile

import numpy as np

import mindspore as ms
from mindspore import nn, ops, mint, Tensor

__all__ = ["DEVICES", "GRAPH_NODES", "COMPILER_INSERTED", "EMITTED_BY", "OPTIMIZERS", "Documentation",
           "AuditReport", "supported_platforms", "doc_reference", "ir_primitives", "read_ir_primitives",
           "compiled_primitives", "documentation", "audit_primitives", "AuditNet", "audit_inputs",
           "build_train_step", "audit_optimizer", "collectives_for", "audit_collectives", "main"]

DEVICES = ("Ascend", "GPU", "CPU")
_LOG = logging.getLogger("mindspore_ngd.audit")

# ------------------------------------------------------------------ explicit tables
# Nodes of MindSpore's IR that are graph structure, not operators: no kernel runs for them on any
# device, so MindSpore documents no platform for them. Keep this minimal.
GRAPH_NODES = {
    "MakeTuple": "packs values into a tuple (graph structure)",
    "TupleGetItem": "takes an element of a tuple (graph structure)",
    "Depend": "an ordering edge: returns its first input once the second is computed",
    "UpdateState": "auto-monad: orders side effects (parameter writes) in the graph",
    "Load": "auto-monad: reads a Parameter's value at a point of the side-effect order",
    "Switch": "a run-time `if` on a tensor: selects one of two subgraphs (graph-mode control flow)",
    "Partial": "binds arguments to a subgraph (the branches a Switch selects)",
    "Return": "a subgraph's output",
}

# Inserted by MindSpore's graph compiler, not by the code: a device-memory copy that keeps a value
# alive across a run-time branch or parameter write. It appears in every graph-mode program with
# such control flow; it has no public API and no documentation of its own.
COMPILER_INSERTED = {
    "TensorMove": "copy inserted by the compiler around side effects in run-time branches",
}


# Examples of documented public APIs, each compiled by the tests to prove that it emits the
# primitive it stands for in EMITTED_BY (tests/devices/test_audit.py). Plain functions: ms.jit
# needs their source.
def _tensor_times_scalar(x, i, m):
    return x * 2.0


def _mint_mul_scalar(x, i, m):
    return mint.mul(x, 2.0)


def _tensor_over_scalar(x, i, m):
    return x / 2.0


def _mint_div_scalar(x, i, m):
    return mint.div(x, 2.0)


def _mint_eq_scalar(x, i, m):
    return mint.eq(x, 0.0)


def _ops_less_scalar(x, i, m):
    return ops.less(x, 1.0)


def _mint_remainder_scalar(x, i, m):
    return mint.remainder(i, 3)


def _ops_matmul(x, i, m):
    return ops.matmul(x, m)


def _runtime_raise(x, i, m):
    if x.sum() > 1e30:
        raise RuntimeError(f"sum too large: {x.sum()}")
    return x + 1.0


def _runtime_python_call(x, i, m):
    if x.sum() > 1e30:
        _LOG.debug("sum too large: %s", x.sum())
    return x + 1.0


# Internal primitives with no documentation of their own -> documented public APIs that compile to
# them (the link is proven by compiling each example; the platforms are read from the API's
# docstring). A primitive counts as documented for a device if any of its APIs is. The JIT-fallback
# nodes (a run-time `raise`, a Python call inside a tensor branch) run in the host's Python
# interpreter during graph execution; MindSpore documents them as graph-mode syntax of
# `mindspore.jit` (fullgraph=False, the default LAX syntax level), not per operator.
EMITTED_BY = {
    "Muls": (("mindspore.Tensor.__mul__", _tensor_times_scalar), ("mindspore.mint.mul", _mint_mul_scalar)),
    "Divs": (("mindspore.Tensor.__truediv__", _tensor_over_scalar), ("mindspore.mint.div", _mint_div_scalar)),
    "EqScalar": (("mindspore.mint.eq", _mint_eq_scalar),),
    "LessScalar": (("mindspore.ops.less", _ops_less_scalar),),
    "RemainderTensorScalar": (("mindspore.mint.remainder", _mint_remainder_scalar),),
    "MatMulExt": (("mindspore.ops.matmul", _ops_matmul),),
    "raise": (("mindspore.jit", _runtime_raise),),
    "JoinedStr": (("mindspore.jit", _runtime_raise),),
    "PyExecute": (("mindspore.jit", _runtime_python_call),),
}
HOST_NODES = ("raise", "JoinedStr", "PyExecute")

# where Primitive classes live, searched in this order
_PRIMITIVE_MODULES = (
    "mindspore.ops.operations", "mindspore.ops.auto_generate.gen_ops_prim", "mindspore.ops.operations.nn_ops",
    "mindspore.ops.operations.math_ops", "mindspore.ops.operations.array_ops", "mindspore.ops.operations.linalg_ops",
    "mindspore.ops.operations.comm_ops", "mindspore.ops.operations.other_ops", "mindspore.ops.operations._grad_ops",
    "mindspore.ops.operations._inner_ops",
)
_IR_PREFIXES = ("PrimFunc_",)


# ------------------------------------------------------------------ docstrings
def supported_platforms(doc):
    """The platforms of a docstring's "Supported Platforms:" section, in :data:`DEVICES` order; ``()``
    when the section says "Deprecated" or lists none; None when there is no such section."""
    if not doc:
        return None
    match = re.search(r"Supported Platforms:[ \t]*\n(.*?)(?:\n[ \t]*\n|\Z)", doc, re.S)
    if match is None:
        return None
    named = set(re.findall(r"``(\w+)``", match.group(1)))
    return tuple(d for d in DEVICES if d in named)


def doc_reference(doc):
    """The documented API a docstring points to ("Refer to :func:`mindspore.ops.abs`", "Alias for
    :func:`mindspore.ops.cat()`", "please refer to :class:`...`"), or None."""
    if not doc:
        return None
    match = re.search(r"(?:[Rr]efer to|Alias for)\s+:(?:func|class|meth):`~?(mindspore\.[\w.]+?)(?:\(\))?`", doc)
    return match.group(1) if match else None


def _resolve(path):
    """The object at a dotted path (module prefix imported), or None."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
            if obj is None:
                return None
        return obj
    return None


def _documented_object(path):
    obj = _resolve(path)
    if obj is None and path.startswith("mindspore.ops."):
        # the Primitive docstrings refer to functional wrappers by their mindspore.ops name; the
        # wrappers that mindspore.ops does not export live in the generated module
        obj = _resolve("mindspore.ops.auto_generate.gen_ops_def." + path.rsplit(".", 1)[1])
    return obj


def _follow(path, seen=()):
    """``(chain, platforms)``: the docstring chain from ``path`` to a "Supported Platforms" section."""
    obj = _documented_object(path)
    if obj is None or path in seen or len(seen) > 5:
        return (path,), None
    doc = inspect.getdoc(obj) if not isinstance(obj, type) else obj.__doc__
    platforms = supported_platforms(doc)
    if platforms is not None:
        return (path,), platforms
    ref = doc_reference(doc)
    if ref is None:
        return (path,), None
    chain, platforms = _follow(ref, seen + (path,))
    return (path,) + chain, platforms


_PRIMITIVE_INDEX = None


def _primitive_classes(name):
    """Primitive classes named ``name`` in MindSpore's operator modules (public ones first)."""
    global _PRIMITIVE_INDEX
    if _PRIMITIVE_INDEX is None:
        from mindspore.ops import Primitive
        index = collections.defaultdict(list)
        for module_name in _PRIMITIVE_MODULES:
            module = importlib.import_module(module_name)
            for attr, value in vars(module).items():
                if isinstance(value, type) and issubclass(value, Primitive) and value not in index[attr]:
                    index[attr].append(value)
        _PRIMITIVE_INDEX = index
    return _PRIMITIVE_INDEX.get(name, [])


def _class_path(cls):
    public = getattr(ops, cls.__name__, None)
    return f"mindspore.ops.{cls.__name__}" if public is cls else f"{cls.__module__}.{cls.__name__}"


@dataclasses.dataclass(frozen=True)
class Documentation:
    """How one IR primitive is documented.

    ``kind``: "operator" (its Primitive class, or the API its docstring refers to), "emitted-by"
    (:data:`EMITTED_BY`), "backward-of" (``XGrad`` read as ``X``), "host" (JIT fallback, in
    :data:`EMITTED_BY`), "compiler" (:data:`COMPILER_INSERTED`), "graph" (:data:`GRAPH_NODES`) or
    "unmapped". ``platforms`` is None for graph/compiler/unmapped; ``source`` names the docstring(s)
    read, ``a -> b`` for a followed reference."""
    name: str
    kind: str
    platforms: tuple
    source: str

    def documented_for(self, device):
        if self.kind in ("graph", "compiler"):
            return True
        return self.platforms is not None and device in self.platforms


def _operator_documentation(base):
    for cls in _primitive_classes(base):
        chain, platforms = _follow(_class_path(cls))
        if platforms is not None:
            return " -> ".join(chain), platforms
    return None, None


def documentation(name):
    """:class:`Documentation` of an IR primitive name (``PrimFunc_`` prefix allowed)."""
    base = name
    for prefix in _IR_PREFIXES:
        if base.startswith(prefix):
            base = base[len(prefix):]
    if base in GRAPH_NODES:
        return Documentation(name, "graph", None, GRAPH_NODES[base])
    if base in COMPILER_INSERTED:
        return Documentation(name, "compiler", None, COMPILER_INSERTED[base])
    if base in EMITTED_BY:
        union, sources = set(), []
        for api, _ in EMITTED_BY[base]:
            chain, platforms = _follow(api)
            sources.append(" -> ".join(chain) + f" {list(platforms) if platforms is not None else '(none)'}")
            union |= set(platforms or ())
        kind = "host" if base in HOST_NODES else "emitted-by"
        return Documentation(name, kind, tuple(d for d in DEVICES if d in union), "; ".join(sources))
    source, platforms = _operator_documentation(base)
    if platforms is not None:
        return Documentation(name, "operator", platforms, source)
    if base.endswith("Grad") and len(base) > 4:
        forward = documentation(base[:-4])
        if forward.kind in ("operator", "emitted-by") and forward.platforms is not None:
            return Documentation(name, "backward-of", forward.platforms, f"backward of {forward.source}")
    return Documentation(name, "unmapped", None, "no Primitive class with documentation found")


# ------------------------------------------------------------------ IR
_NODE = re.compile(r"^\s+%\d+\(.*?\) = (.+)$")
_CALL = re.compile(r"^(?:%[\w.]+|@|call\s|Parameter_\d+\[)")
_PRIM = re.compile(r"^([A-Za-z_][\w]*)[(\[]")
_FILE = re.compile(r"#\s*In file (\S+?):(\d+)")
_MINDSPORE_DIR = os.path.dirname(os.path.abspath(ms.__file__)) + os.sep


def read_ir_primitives(text):
    """``{primitive name: [source "file:line", ...]}`` of every operator node of an IR dump.

    A node is ``%N(name) = OP(args)``; calls of subgraphs or of function values (``@g(...)``,
    ``call @g``, ``%5(...)``, ``Parameter_7[...](...)``) are not primitives. The source of a node
    is its innermost ``# In file`` line outside MindSpore's own package (the innermost line if all are
inside it). Raises ValueError on a node line it cannot classify."""
    out = collections.defaultdict(list)
    current = None
    for line in text.splitlines():
        node = _NODE.match(line)
        if node:
            body = node.group(1)
            current = None
            if _CALL.match(body):
                continue
            prim = _PRIM.match(body)
            if prim is None:
                raise ValueError(f"unrecognised IR node: {line.strip()[:120]}")
            current = out[prim.group(1)]
            current.append("?")
            continue
        if current is not None:
            where = _FILE.search(line)
            if where and not (current[-1] != "?" and where.group(1).startswith(_MINDSPORE_DIR)):
                current[-1] = f"{where.group(1)}:{where.group(2)}"
    return dict(out)


def ir_primitives(path):
    """:func:`read_ir_primitives` over every final front-end graph (``*validate*.ir``) in ``path``."""
    files = sorted(glob.glob(os.path.join(path, "**", "*validate*.ir"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no '*validate*.ir' graph was saved under {path}")
    merged = collections.defaultdict(list)
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as handle:
            for prim, sources in read_ir_primitives(handle.read()).items():
                merged[prim].extend(sources)
    return dict(merged)


def compiled_primitives(fn, *inputs, keep=None):
    """Compile ``fn`` (a Cell, compiled with ``cell.compile``, or a function, through ``ms.jit``) on
    ``inputs`` in graph mode, saving only its final front-end IR, and return
    :func:`ir_primitives` of it. ``keep``: a directory to keep the IR in (default: a temporary one)."""
    path = keep or tempfile.mkdtemp(prefix="ngd_audit_ir_")
    previous_env = os.environ.get("MS_DEV_DUMP_IR_PASSES")
    previous = (ms.get_context("save_graphs"), ms.get_context("save_graphs_path"))
    os.environ["MS_DEV_DUMP_IR_PASSES"] = "validate"
    try:
        # set_context(save_graphs) is read at each compilation, the MS_DEV_SAVE_GRAPHS variable only
        # when MindSpore starts
        ms.set_context(save_graphs=1, save_graphs_path=path)
        if isinstance(fn, nn.Cell):
            fn.compile(*inputs)
        else:
            ms.jit(fn)(*inputs)
        return ir_primitives(path)
    finally:
        ms.set_context(save_graphs=previous[0], save_graphs_path=previous[1])
        if previous_env is None:
            os.environ.pop("MS_DEV_DUMP_IR_PASSES", None)
        else:
            os.environ["MS_DEV_DUMP_IR_PASSES"] = previous_env
        if keep is None:
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ the audit
@dataclasses.dataclass
class AuditReport:
    """Result of :func:`audit_primitives` for one graph and one device."""
    label: str
    device: str
    added: dict                 # primitive -> sources, the primitives the optimizer adds
    entries: tuple              # Documentation of each added primitive, sorted by name

    @property
    def undocumented(self):
        """Names of added primitives not documented for the device (unmapped ones included)."""
        return tuple(e.name for e in self.entries if not e.documented_for(self.device))

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
            if e.documented_for(self.device):
                continue
            where = sorted({s for s in self.added.get(e.name, ()) if s != "?"})[:3]
            if e.kind == "unmapped":
                why = "no documentation found in the installed MindSpore (map it in mindspore_ngd.audit)"
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
            mark = "ok " if e.documented_for(self.device) else "NO "
            plat = "-" if e.platforms is None else ",".join(e.platforms) or "none"
            rows.append(f"  {mark}{e.name:32s} {e.kind:11s} {plat:18s} {e.source}")
        return "\n".join(rows)


def audit_primitives(added, device, label="graph"):
    """Check the primitives ``added`` (names, or a dict name -> sources) against the documentation
    for ``device``; return an :class:`AuditReport`."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if not isinstance(added, dict):
        added = {name: [] for name in added}
    entries = tuple(documentation(name) for name in sorted(added))
    return AuditReport(label=label, device=device, added=dict(added), entries=entries)


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


def _kfac(net, method):
    from .optim import KFAC
    return KFAC(net, 0.05, inverse_method=method, verbose=False)


def _spngd(net, method):
    from .optim import SPNGD
    return SPNGD(net, 0.05, inverse_method=method, verbose=False)


def _thor(net, method):
    from .optim import THOR
    # split_dim 8 < the A factors (19, 101): block splitting; trace_threshold: the trace rule
    return THOR(net, 0.05, 0.03, split_dim=8, trace_threshold=0.1, frequency=2, inverse_method=method,
                verbose=False)


def _momentum(net, method):
    return nn.Momentum(net.trainable_params(), 0.05, 0.9)


OPTIMIZERS = {"kfac": _kfac, "spngd": _spngd, "thor": _thor}


def build_train_step(optimizer, inverse_method=None, network=None):
    """The real training step ``TrainOneStepCell(WithLossCell(net, loss), opt)`` in training mode.
    ``optimizer``: "kfac", "spngd", "thor" or "momentum" (the baseline)."""
    makers = dict(OPTIMIZERS, momentum=_momentum)
    if optimizer not in makers:
        raise ValueError(f"optimizer must be one of {sorted(makers)}, got {optimizer!r}")
    ms.set_seed(0)
    net = network if network is not None else AuditNet()
    opt = makers[optimizer](net, inverse_method)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                               opt)
    step.set_train()
    return step


def device_inverse_method(device):
    """The inversion path for ``device`` (what ``inverse_method="auto"`` picks there)."""
    from .curvature.inverse import DEVICE_INVERSE_METHODS
    if device not in DEVICE_INVERSE_METHODS:
        raise ValueError(f"device must be one of {sorted(DEVICE_INVERSE_METHODS)}, got {device!r}")
    return DEVICE_INVERSE_METHODS[device]


_BASELINE = {}


def baseline_primitives():
    """Primitives of the plain ``nn.Momentum`` training step of :class:`AuditNet` (cached per
    device target)."""
    key = ms.get_context("device_target")
    if key not in _BASELINE:
        _BASELINE[key] = compiled_primitives(build_train_step("momentum"), *audit_inputs())
    return _BASELINE[key]


_ADDED = {}


def optimizer_primitives(optimizer, inverse_method):
    """Primitives the optimizer's training step adds over the plain momentum step: name -> sources.
    Each (device target, optimizer, inverse method) graph is compiled once per process."""
    key = (ms.get_context("device_target"), optimizer, inverse_method)
    if key not in _ADDED:
        graph = compiled_primitives(build_train_step(optimizer, inverse_method), *audit_inputs())
        base = baseline_primitives()
        _ADDED[key] = {name: sources for name, sources in graph.items() if name not in base}
    return _ADDED[key]


def audit_optimizer(optimizer, device, inverse_method=None):
    """Audit one optimizer's training step for ``device`` (kernel choice: ``inverse_method``, by
    default the device's :data:`DEVICE_INVERSE_METHODS` entry)."""
    method = inverse_method or device_inverse_method(device)
    added = optimizer_primitives(optimizer, method)
    return audit_primitives(added, device, label=f"{optimizer} (inverse_method={method!r})")


# ------------------------------------------------------------------ collectives
_COLLECTIVE_CLASS = {"ReduceScatter": "ReduceScatter", "AllReduce": "AllReduce", "AllGather": "AllGather",
                     "AllGather (owner group)": "AllGather", "AllReduce (owner group)": "AllReduce"}


def collectives_for(backend, world_size=4, grad_worker_fraction=None):
    """The collective primitives the distributed exchange issues on ``backend`` ("hccl", "nccl",
    "mccl") for ``world_size`` ranks, from :class:`mindspore_ngd.parallel.comm.Communicator`'s own
    choice: ``{primitive: [what it carries, ...]}``."""
    from .parallel.comm import Communicator
    from .parallel.plan import plan_ownership
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
    print(f"compiling on {ms.get_context('device_target')} with MindSpore {ms.__version__}")
    failed = False
    for device in devices:
        for name in args.optimizer or sorted(OPTIMIZERS):
            report = audit_optimizer(name, device, args.inverse_method)
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


if __name__ == "__main__":
    sys.exit(main())
