"""What the installed MindSpore documents: the "Supported Platforms" of each IR primitive.

:func:`documentation` maps a primitive name of a saved IR graph to the docstring that documents it,
following the docstrings' own "Refer to" / "Alias for" links, with the explicit tables below for the
nodes that have no documentation of their own. Used by :mod:`mindspore_ngd.audit`.
"""
import collections
import dataclasses
import importlib
import inspect
import logging
import re

from mindspore import ops, mint

__all__ = ["DEVICES", "GRAPH_NODES", "COMPILER_INSERTED", "EMITTED_BY", "HOST_NODES", "Documentation",
           "supported_platforms", "doc_reference", "documentation", "is_host_node"]

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


def _mint_permute(x, i, m):
    return mint.permute(x, (1, 0)) * 2.0


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
    # ops.TransposeView's own docstring lists Ascend only; the public mint.permute, which the package's
    # transposes use (mindspore_ngd._graph.permuted), is documented for Ascend, GPU and CPU
    "TransposeView": (("mindspore.mint.permute", _mint_permute),),
    "raise": (("mindspore.jit", _runtime_raise),),
    "JoinedStr": (("mindspore.jit", _runtime_raise),),
    "PyExecute": (("mindspore.jit", _runtime_python_call),),
}
HOST_NODES = ("raise", "JoinedStr", "PyExecute")
# Scalar operations of graph-mode Python (``not x``, ``a + b`` on Python scalars and their results):
# computed by the host's graph executor, no documented device kernel. ``bool_not`` and MindSpore's
# ``_scalar_ops`` primitives, under their IR names.
_HOST_SCALAR = re.compile(r"^(Scalar[A-Z]\w*|bool_not|scalar_\w+)$")


def is_host_node(name):
    """Whether an IR primitive runs on the host, in Python or the graph executor, not as a device
    kernel: the JIT-fallback nodes (:data:`HOST_NODES`) and the scalar operations of graph-mode Python
    (``ScalarBoolNot``, ``ScalarAdd``, ...). The strict audit fails every one of them on Ascend and GPU."""
    base = name[len("PrimFunc_"):] if name.startswith("PrimFunc_") else name
    return base in HOST_NODES or bool(_HOST_SCALAR.match(base))

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

    def documented_for(self, device, strict=True):
        """Whether the node may be in a graph for ``device``. ``strict`` (default): a host node (kind
        "host": JIT-fallback Python, scalar host operations) passes on CPU only -- Ascend's GE and GPU
        graphs run whole on the device, with no host round trip inside a step; not strict, it passes
        where its documentation (``mindspore.jit``'s) lists the device."""
        if self.kind in ("graph", "compiler"):
            return True
        if self.kind == "host" and strict and device != "CPU":
            return False
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
    if _HOST_SCALAR.match(base):
        return Documentation(name, "host", ("CPU",), "scalar operation of graph-mode Python, run by the host's "
                             "graph executor (no device kernel documented)")
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
