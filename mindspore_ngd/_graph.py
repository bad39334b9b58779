"""Graph-mode idioms written with single primitives, because they compile cheaper.

MindSpore 2.10 expands tensor indexing (``v[0]``, ``m[0, 0]``), ``Tensor.swapaxes``, ``ops.outer``
and ``ops.narrow`` into function graphs of their own at every call site, and type inference then
specialises each one. ``v[0]`` alone produced 42 nodes in 26 function graphs of the type-inferred
IR, against 4 nodes in 3 graphs for the same value taken with ``Slice`` and ``Reshape``. The engine's
per-layer code calls these on every layer, so the difference is paid once per layer. The helpers
below give the same values as the idioms they replace.

Not every indexing form is dear: a slice of the leading axis, ``x[:n]``, compiles as cheaply as a
``Slice`` (measured with ``python -m benchmarks.compile_patterns --family idioms``), and is kept as it
is. What costs is an integer index, a slice of a second axis, and shape arithmetic on tuples
(``x.shape[1:]``, ``(0,) * rank``) inside a helper, so the helpers take their sizes as arguments.

Five helpers exist because of memory, not compile time. MindSpore 2.10's CPU kernels below hold
buffers of several times their tensor's size for the process's life (measured on eight 2048 x 2048
float32 matrices, docs/performance.md): ``ops.where`` with a 0-d condition and matrix operands, about six
(at compile time); a Transpose, about 2.25 (at compile time); a broadcast product such as
``u[:, None] * v[None, :]``, four to five (from the first run). Summed over the factors, inverses and
conv patches of ResNet-50 they were most of the memory a K-FAC step needed. So :func:`choose`
broadcasts the condition first, :func:`outer` is a matrix product with one inner term,
:func:`gram` uses MatMul's transpose flag, and :func:`transposed` and :func:`permuted` go through
``mint.permute``, which has no such buffers; each gives the same values as the form it replaces.
The ``/`` operator (``Div``) holds about six buffers of its output's size from the first run, and
``RealDiv``, the same IEEE division, none (measured on six 2048 x 2048 float32 quotients: 384 MB
against 0 of growth, 2026-11-27), so :func:`divide` is ``RealDiv``.
"""
import types

import mindspore as ms
from mindspore import mint, ops

__all__ = ["first", "corner", "top_left", "transposed", "permuted", "columns", "outer", "gram", "choose", "divide",
           "per_shape_subgraph", "SUBGRAPH_DEVICES"]

# the devices on which a ``mindspore.no_inline`` function is a subgraph compiled once per input shapes and
# called from every use: CPU measured here (MindSpore 2.10: the training step compiles and the golden
# tests stay bit-identical), Ascend documented (its docstring's "Supported Platforms"). The GPU build's
# documentation does not list it, so there the function stays inlined at every call
SUBGRAPH_DEVICES = ("CPU", "Ascend")
_SUBGRAPHS = {}

_SLICE = ops.Slice()
_RESHAPE = ops.Reshape()
_MATMUL_TA = ops.MatMul(transpose_a=True)
_BATCH_MATMUL_TA = ops.BatchMatMul(transpose_a=True)
_REAL_DIV = ops.RealDiv()


def first(vector):
    """``vector[0]`` of a 1-D tensor, as a 0-d tensor."""
    return _RESHAPE(_SLICE(vector, (0,), (1,)), ())


def corner(matrix):
    """``matrix[0, 0]`` of a 2-D tensor, as a 0-d tensor."""
    return _RESHAPE(_SLICE(matrix, (0, 0), (1, 1)), ())


def top_left(matrix, rows, cols):
    """``matrix[:rows, :cols]`` of a 2-D tensor."""
    return _SLICE(matrix, (0, 0), (rows, cols))


def permuted(x, axes):
    """``x.transpose(axes)``, through ``mint.permute`` (documented for Ascend, GPU and CPU).

    MindSpore 2.10's CPU Transpose kernel (``ops.transpose``, ``Tensor.T``, ``Tensor.transpose``,
    ``swapaxes``, ``ops.t``) holds about 2.5 copies of its tensor from compile time for the process's
    life; ``mint.permute`` gives the same values and holds nothing (measured on eight 2048 x 2048
    float32 matrices: 299 MB against 1 MB of compile growth, 2026-11-27; values bit-identical,
    tests/unit/test_graph_idioms.py).

    The same-shape ``Reshape`` first is not a copy: MindSpore 2.10 fails to compile ``mint.permute``
    applied directly to an element of a tuple that is a graph input ("Illegal AnfNode for evaluating",
    measured), as the optimizer's gradients are when it is called alone in graph mode."""
    return mint.permute(_RESHAPE(x, x.shape), axes)


def transposed(x):
    """``x`` with its last two axes swapped (``x.swapaxes(-1, -2)``)."""
    rank = len(x.shape)
    return permuted(x, tuple(range(rank - 2)) + (rank - 1, rank - 2))


def columns(matrix, start, count):
    """Columns ``start .. start + count - 1`` of a 2-D tensor (``ops.narrow(matrix, 1, start, count)``)."""
    return _SLICE(matrix, (0, start), (matrix.shape[0], count))


def outer(u, v):
    """``u v'`` of two 1-D tensors (``ops.outer``), as a matrix product with one inner term (no broadcast
    kernel: module docstring)."""
    return ops.matmul(_RESHAPE(u, (-1, 1)), _RESHAPE(v, (1, -1)))


def gram(x):
    """``x^T x`` of a matrix, or of each matrix of a (n, r, c) stack, without a Transpose kernel."""
    return _BATCH_MATMUL_TA(x, x) if x.ndim == 3 else _MATMUL_TA(x, x)


def choose(condition, on_true, on_false):
    """``ops.where(condition, on_true, on_false)`` for two tensors of one shape and a condition of that
    shape or a 0-d one, which is broadcast first (see the module docstring)."""
    if tuple(condition.shape) != tuple(on_true.shape):
        condition = ops.broadcast_to(condition, on_true.shape)
    return ops.where(condition, on_true, on_false)


def divide(x, y):
    """``x / y`` (broadcasting as ``/`` does) with the ``RealDiv`` kernel (module docstring): for a
    quotient the size of a factor, never ``/``. ``y`` may be a Python number (cast to ``x``'s dtype)."""
    if isinstance(y, (int, float)):
        y = ops.scalar_to_tensor(y, x.dtype)
    return _REAL_DIV(x, y)


def per_shape_subgraph(fn, device_target=None):
    """``fn`` (a graph-mode function of tensors and constants) as MindSpore compiles it on
    ``device_target`` (default: the context's): on :data:`SUBGRAPH_DEVICES` a ``mindspore.no_inline``
    copy, a subgraph compiled once for each distinct set of input shapes and constants and called
    from every use, so that a step with many layers of one shape holds one copy of their per-layer
    work; elsewhere ``fn`` itself, inlined at every call. The values are the same either way."""
    device = device_target if device_target is not None else ms.get_context("device_target")
    if device not in SUBGRAPH_DEVICES:
        return fn
    if fn not in _SUBGRAPHS:
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__doc__, copy.__module__, copy.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__
        _SUBGRAPHS[fn] = ms.no_inline(copy)
    return _SUBGRAPHS[fn]
