"""Block-diagonal ("split") Kronecker factors, after THOR's hardware-driven splitting.

THOR (Chen et al., AAAI 2021) approximates a Kronecker factor whose size ``D`` exceeds a
hardware-friendly ``split_dim`` by its block-diagonal part and inverts every block on its own:
``count`` blocks of the uniform size ``size = split_dim`` run along the diagonal, the last one
covering only ``D - (count - 1) * size`` real rows/columns. Inverting ``count`` blocks of size
``s`` costs ``O(count * s^3)`` instead of ``O(D^3)`` and batches well.

Layout (``BlockLayout.of(D, s)``, ``nb = count``, ``P = padded = nb * s >= D``)::

    factor (D, D)              padded (P, P)                   blocks (nb, s, s)
    +----+----+---+            +----+----+-----+
    | B0 | .. | . |            | B0 |    |     |               blocks[0] = B0
    +----+----+---+    --->    +----+----+-----+    --->       blocks[1] = B1
    | .. | B1 | . |            |    | B1 |     |               blocks[2] = [B2 0]
    +----+----+---+            +----+----+-----+                           [0  I]
    | .  | .  |B2 |            |    |    |B2 0 |
    +----+----+---+            |    |    |0  I |   (pad = P - D rows/cols of identity)
                               +----+----+-----+

Only the diagonal blocks are kept; the off-diagonal entries (``..``, ``.``) are dropped. The
last block is padded up to ``s`` with the identity, which is decoupled from the real part, so
the inverse's real part is unchanged by the padding, and the padded part (``1 / (1 + shift)`` on
its diagonal) is positive, so it never fails the result check. ``apply_right`` / ``apply_left``
pad the operand with zeros and drop the padded rows/columns of the product again.

``split_dim=None`` or ``split_dim >= D`` means one block of size ``D`` (no padding). A single
block is kept as the plain (D, D) matrix, not a (1, D, D) stack, so a dense factor takes exactly
the same operations as before splitting existed: the dense factor is the one-block case of
everything here and of :func:`mindspore_ngd.curvature.inverse.damped_inverse`.

Everything below is graph-mode safe: shapes come from the (static, frozen) layout, and only
MindSpore ops are used on tensors (the gather positions of :func:`to_blocks` are computed with NumPy
at compile time, ``mindspore.ops.constexpr``). Batched ops used, as measured on MindSpore 2.10 CPU:
``ops.cholesky`` (3-D), ``mindspore.scipy.linalg.solve_triangular`` with equal batch dims of
``a`` and ``b``, ``ops.MatrixInverse`` (3-D). Batched ``ops.CholeskyInverse`` returns wrong
values on CPU and is not used.

Damping convention: every block is shifted by the same ``shift + jitter * relu(tr(m))`` with the
trace of the FULL factor (:func:`mindspore_ngd.curvature.inverse.trace_jitter`), so that one block
reproduces the dense inverse. With ``method="eigh"`` the blocks are decomposed one at a time in a
statically unrolled loop (``mindspore.scipy.linalg.eigh`` is 2-D only): graph size and compile time
grow with ``count``, so prefer ``"cholesky"`` or ``"lu"`` for many blocks.
"""
import dataclasses

import numpy as np

from mindspore import ops, Tensor
from mindspore.ops import constexpr

from .._graph import permuted, top_left

__all__ = ["BlockLayout", "to_blocks", "from_blocks", "apply_right", "apply_left", "identity_like", "block_layout",
           "inverse_cubes", "precondition_flops"]


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Static block structure of a (dim, dim) factor: ``count`` diagonal blocks of ``size``.

    Build it with :meth:`BlockLayout.of`. ``padded = count * size >= dim`` and
    ``pad = padded - dim < size`` identity rows/columns complete the last block.
    """

    dim: int
    size: int
    count: int

    @classmethod
    def of(cls, dim, split_dim=None):
        """Layout of a (dim, dim) factor split into blocks of ``split_dim``.

        ``split_dim=None`` or ``split_dim >= dim`` gives a single block of size ``dim``.
        Raises ValueError for a non-positive ``dim`` or ``split_dim``.
        """
        dim = int(dim)
        if dim < 1:
            raise ValueError(f"factor dimension must be >= 1, got {dim}")
        if split_dim is None or int(split_dim) >= dim:
            return cls(dim=dim, size=dim, count=1)
        split_dim = int(split_dim)
        if split_dim < 1:
            raise ValueError(f"split_dim must be None or >= 1, got {split_dim}")
        return cls(dim=dim, size=split_dim, count=-(-dim // split_dim))

    @property
    def padded(self):
        """``count * size``: the side of the padded block-diagonal matrix (>= dim)."""
        return self.count * self.size

    @property
    def pad(self):
        """``padded - dim``: identity rows/columns added to the last block."""
        return self.padded - self.dim


def block_layout(dim, split_dim=None):
    """``(count, size)`` of a factor of side ``dim`` split into ``split_dim`` blocks (:meth:`BlockLayout.of`)."""
    layout = BlockLayout.of(dim, split_dim)
    return layout.count, layout.size


def inverse_cubes(dim, split_dim=None):
    """``count * size^3``: the work of inverting a factor of side ``dim`` as :meth:`BlockLayout.of` splits it,
    in units of one ``size^3`` (dense: ``dim^3``). The one formula behind the cost model's inversion FLOPs
    (``registry.inverse_flops``) and the ownership plan's compute balance (``parallel.plan.factor_cost``)."""
    count, size = block_layout(dim, split_dim)
    return count * size ** 3


def precondition_flops(g_dim, a_dim, split_dim=None):
    """``G^-1 dW A^-1`` with dW of shape (g_dim, a_dim), dense or block-diagonal inverses."""
    g_count, g_size = block_layout(g_dim, split_dim)
    a_count, a_size = block_layout(a_dim, split_dim)
    return 2 * g_count * g_size ** 2 * a_dim + 2 * g_dim * a_count * a_size ** 2


def identity_like(blocks):
    """The identity with the shape of ``blocks``: (s, s), or (nb, s, s) for a stack of blocks."""
    size = blocks.shape[-1]
    eye = ops.eye(size, size, blocks.dtype)
    return eye if blocks.ndim == 2 else ops.broadcast_to(eye, blocks.shape)


@constexpr
def _gather_plan(count, size, dim):
    """Compile-time constants of :func:`to_blocks`: the flat position in the (dim, dim) factor of every
    entry of the (count, size, size) blocks (0 in the padding), whether the entry lies inside the
    factor, and the identity of the padding."""
    starts = np.arange(count).reshape(count, 1, 1) * size
    rows = starts + np.arange(size).reshape(1, size, 1)
    cols = starts + np.arange(size).reshape(1, 1, size)
    real = np.logical_and(rows < dim, cols < dim)
    flat = np.where(real, rows.astype(np.int64) * dim + cols, 0)
    flat = flat.astype(np.int32 if dim * dim < 2 ** 31 else np.int64)
    padding = np.logical_and(np.logical_not(real), rows == cols).astype(np.float32)
    return Tensor(flat), Tensor(real), Tensor(padding)


def to_blocks(m, layout):
    """(D, D) factor -> (nb, s, s) stack of its diagonal blocks, the padding set to the identity
    (the factor itself when the layout has one block).

    The off-diagonal blocks of ``m`` are discarded: the blocks' entries are gathered from ``m`` by
    their flat positions (compile-time constants), ``nb * s^2`` reads instead of the ``D^2`` copies
    of padding the whole factor. Check the blocks (``inverse.sanitized_blocks``) when they are going
    to be inverted: principal blocks of a PSD matrix are PSD.
    """
    nb, s, dim = layout.count, layout.size, layout.dim
    if nb == 1:
        return m
    flat, real, padding = _gather_plan(nb, s, dim)
    return ops.where(real, ops.gather(m.reshape(-1), flat, 0), ops.cast(padding, m.dtype))


def from_blocks(blocks, layout):
    """(nb, s, s) blocks (or one (D, D) block) -> dense (D, D) block-diagonal matrix, the padding dropped.

    Meant for tests and inspection: it materialises the (P, P) matrix.
    """
    nb, dim = layout.count, layout.dim
    if nb == 1:
        return blocks
    mask = ops.eye(nb, nb, blocks.dtype).reshape(nb, 1, nb, 1)
    full = (ops.expand_dims(blocks, 2) * mask).reshape(layout.padded, layout.padded)
    return top_left(full, dim, dim)


def apply_right(matrix, inv_blocks, layout):
    """``matrix @ blockdiag(inv_blocks)``: (rows, D) x (D, D) -> (rows, D).

    The columns are zero-padded to ``padded``, grouped per block and multiplied with one
    batched matmul; the padded columns of the product are dropped.
    """
    nb, s, dim = layout.count, layout.size, layout.dim
    if nb == 1:
        return ops.matmul(matrix, inv_blocks)
    rows = matrix.shape[0]
    if layout.pad:
        matrix = ops.concat((matrix, ops.zeros((rows, layout.pad), matrix.dtype)), axis=1)
    grouped = permuted(matrix.reshape(rows, nb, s), (1, 0, 2))          # (nb, rows, s)
    out = permuted(ops.bmm(grouped, inv_blocks), (1, 0, 2))              # (rows, nb, s)
    out = out.reshape(rows, layout.padded)
    return top_left(out, rows, dim) if layout.pad else out


def apply_left(inv_blocks, matrix, layout):
    """``blockdiag(inv_blocks) @ matrix``: (D, D) x (D, cols) -> (D, cols).

    The rows are zero-padded to ``padded``, grouped per block (a plain reshape) and multiplied
    with one batched matmul; the padded rows of the product are dropped.
    """
    nb, s, dim = layout.count, layout.size, layout.dim
    if nb == 1:
        return ops.matmul(inv_blocks, matrix)
    cols = matrix.shape[1]
    if layout.pad:
        matrix = ops.concat((matrix, ops.zeros((layout.pad, cols), matrix.dtype)), axis=0)
    out = ops.bmm(inv_blocks, matrix.reshape(nb, s, cols)).reshape(layout.padded, cols)
    return top_left(out, dim, cols) if layout.pad else out
