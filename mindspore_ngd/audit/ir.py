"""The primitives of a compiled graph, read from MindSpore's saved IR (the final front-end graph).

Used by :mod:`mindspore_ngd.audit`; :func:`compiled_primitives` compiles a Cell or function in graph
mode with only the ``validate`` pass saved, and :func:`read_ir_primitives` parses the dump.
"""
import collections
import glob
import os
import re
import shutil
import tempfile

import mindspore as ms
from mindspore import nn

__all__ = ["read_ir_primitives", "ir_primitives", "compiled_primitives", "read_ir_copies", "ir_copies"]

# ------------------------------------------------------------------ IR
_CALL = re.compile(r"^(?:%[\w.]+|@|call\s|Parameter_\d+\[)")
_PRIM = re.compile(r"^([A-Za-z_][\w]*)[(\[]")
_FILE = re.compile(r"#\s*In file (\S+?):(\d+)")
_NUMBERED = re.compile(r"^\s+(%\d+)\(.*?\) = (.+)$")
_MOVE = re.compile(r"^(?:PrimFunc_)?TensorMove\((%\d+)")
_LOAD = re.compile(r"^Load\(%para\d+_([^,\s)]+)")
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
        node = _NUMBERED.match(line)
        if node:
            body = node.group(2)
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


def read_ir_copies(text):
    """The Parameters an IR dump copies: for every ``TensorMove`` node whose input is the ``Load`` of a
    Parameter, that Parameter's name ("?" when the input is not a Load), in graph order. MindSpore
    inserts such a copy where a Parameter's loaded value must outlive a later write of it."""
    copies, nodes = [], {}
    for line in text.splitlines():
        if line.startswith("subgraph @"):
            nodes = {}                      # node numbers restart in every graph
            continue
        node = _NUMBERED.match(line)
        if not node:
            continue
        nodes[node.group(1)] = node.group(2)
        move = _MOVE.match(node.group(2))
        if move:
            load = _LOAD.match(nodes.get(move.group(1), ""))
            copies.append(load.group(1) if load else "?")
    return copies


def _final_graphs(path):
    """The text of every final front-end graph (``*validate*.ir``) saved under ``path``, in name order."""
    texts = []
    for name in sorted(glob.glob(os.path.join(path, "**", "*validate*.ir"), recursive=True)):
        with open(name, encoding="utf-8", errors="replace") as handle:
            texts.append(handle.read())
    return texts


def ir_copies(path):
    """:func:`read_ir_copies` over every final front-end graph (``*validate*.ir``) in ``path``."""
    copies = []
    for text in _final_graphs(path):
        copies.extend(read_ir_copies(text))
    return copies


def ir_primitives(path):
    """:func:`read_ir_primitives` over every final front-end graph (``*validate*.ir``) in ``path``."""
    texts = _final_graphs(path)
    if not texts:
        raise FileNotFoundError(f"no '*validate*.ir' graph was saved under {path}")
    merged = collections.defaultdict(list)
    for text in texts:
        for prim, sources in read_ir_primitives(text).items():
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
