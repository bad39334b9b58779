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

``split_dim=None`` or ``split_dim >= D`` means one block of size ``D`` (no padding): then every
function here reproduces the dense path of :mod:`mindspore_ngd.curvature.inverse` exactly.

Everything below is graph-mode safe: shapes come from the (static, frozen) layout, and only
MindSpore ops are used on tensors. Batched ops used, as measured on MindSpore 2.10 CPU:
``ops.cholesky`` (3-D), ``mindspore.scipy.linalg.solve_triangular`` with equal batch dims of
``a`` and ``b``, ``ops.MatrixInverse`` (3-D). Batched ``ops.CholeskyInverse`` returns wrong
values on CPU and is not used.

Damping convention: :func:`blocked_damped_inverse` takes one scalar ``jitter_shift`` computed by
the caller from the FULL factor (``trace_jitter(m, jitter) = jitter * relu(tr(m))``), not from
each block's trace, so that a single block reproduces ``damped_inverse(m, shift, method, jitter)``.

``method="eigh"``: ``mindspore.scipy.linalg.eigh`` is 2-D only, so the blocks are decomposed one
at a time in a statically unrolled Python loop (graph size and compile time grow with
``count``; use ``"cholesky"`` or ``"lu"`` for many blocks). The indefiniteness test of
``damped_inverse`` is applied to the block-diagonal matrix as a whole: its eigenvalues are the
union of the blocks' eigenvalues.
"""
import dataclasses

import mindspore as ms
from mindspore import ops
import mindspore.scipy.linalg as msla

__all__ = ["BlockLayout", "to_blocks", "from_blocks", "trace_jitter", "blocked_damped_inverse",
           "apply_right", "apply_left"]

_METHODS = ("cholesky", "lu", "eigh")


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


def _pad_square(m, layout):
    """(D, D) -> (P, P): ``m`` in the top-left corner, identity on the padded diagonal."""
    dim, pad = layout.dim, layout.pad
    if pad == 0:
        return m
    top = ops.concat((m, ops.zeros((dim, pad), m.dtype)), axis=1)
    bottom = ops.concat((ops.zeros((pad, dim), m.dtype), ops.eye(pad, pad, m.dtype)), axis=1)
    return ops.concat((top, bottom), axis=0)


def to_blocks(m, layout):
    """(D, D) factor -> (nb, s, s) stack of its diagonal blocks, the padding set to the identity.

    The off-diagonal blocks of ``m`` are discarded. Sanitize ``m`` (``inverse.sanitize``) first
    when it is going to be inverted: principal blocks of a PSD matrix are PSD.
    """
    nb, s = layout.count, layout.size
    if nb == 1:
        return ops.expand_dims(m, 0)
    full = _pad_square(m, layout).reshape(nb, s, nb, s)
    # diagonal over the two block axes -> (s, s, nb); block i is full[i, :, i, :]
    return ops.diagonal(full, 0, 0, 2).transpose(2, 0, 1)


def from_blocks(blocks, layout):
    """(nb, s, s) blocks -> dense (D, D) block-diagonal matrix, the padding dropped.

    Meant for tests and inspection: it materialises the (P, P) matrix.
    """
    nb, dim = layout.count, layout.dim
    if nb == 1:
        return blocks[0]
    mask = ops.eye(nb, nb, blocks.dtype).reshape(nb, 1, nb, 1)
    full = (ops.expand_dims(blocks, 2) * mask).reshape(layout.padded, layout.padded)
    return full[:dim, :dim]


def trace_jitter(m, jitter):
    """``jitter * relu(tr(m))`` of the FULL (D, D) factor: the ``jitter_shift`` that makes
    :func:`blocked_damped_inverse` match ``inverse.damped_inverse(m, shift, method, jitter)``."""
    return jitter * ops.relu(ops.trace(m))


def _batched_eye(count, size, dtype=ms.float32):
    return ops.broadcast_to(ops.eye(size, size, dtype), (count, size, size))


def blocked_damped_inverse(blocks, shift, method, jitter_shift):
    """``(inv_blocks, ok)``: ``inv_b = (sym(block_b) + (shift + jitter_shift) I)^-1`` per block.

    ``blocks``: (nb, s, s) float32 from :func:`to_blocks` of a sanitized factor. ``shift`` and
    ``jitter_shift`` are scalars (Python numbers or 0-D tensors) shared by all blocks; pass
    ``trace_jitter(m, jitter)`` of the full factor as ``jitter_shift``.

    ``method``: ``"cholesky"`` (batched Cholesky + batched triangular solve,
    ``inv = L^-T L^-1``), ``"lu"`` (batched ``MatrixInverse``, symmetrized) or ``"eigh"`` (one
    2-D ``eigh`` per block, unrolled; negative eigenvalues clamped to zero). Blocks of size 1
    are inverted as ``1 / x`` whatever the method. Raises ValueError for an unknown method.

    ``ok`` (0-D bool) is False when any entry is non-finite or any diagonal entry is <= 0; with
    ``"eigh"`` also when the block-diagonal matrix has an eigenvalue below
    ``-1e-4 * max |eigenvalue|``.
    """
    if method not in _METHODS:
        raise ValueError(f"unknown inverse method {method!r}; expected one of {_METHODS}")
    nb, s = blocks.shape[0], blocks.shape[1]
    sym = (blocks + blocks.transpose(0, 2, 1)) * 0.5
    total = shift + jitter_shift
    indefinite = ops.zeros((), ms.bool_)
    if s == 1:                           # scalar blocks: MatrixInverse rejects 1x1 inputs
        inv = 1.0 / (sym + total)
    elif method == "cholesky":
        eye = _batched_eye(nb, s, blocks.dtype)
        low = ops.cholesky(sym + total * eye)
        low_inv = msla.solve_triangular(low, eye, lower=True)
        inv = ops.bmm(low_inv.transpose(0, 2, 1), low_inv)
    elif method == "lu":
        eye = _batched_eye(nb, s, blocks.dtype)
        inv = ops.MatrixInverse()(sym + total * eye)
        inv = (inv + inv.transpose(0, 2, 1)) * 0.5
    else:
        invs = []
        lows = []
        highs = []
        for b in range(nb):              # static unroll: eigh is 2-D only
            values, vectors = msla.eigh(sym[b])
            lows.append(ops.reduce_min(values))
            highs.append(ops.reduce_max(ops.abs(values)))
            invs.append(ops.matmul(vectors / (ops.relu(values) + total),
                                   vectors.transpose(1, 0)))
        inv = ops.stack(invs, 0)
        if nb == 1:
            indefinite = lows[0] < -1e-4 * highs[0]
        else:
            indefinite = ops.reduce_min(ops.stack(lows)) < -1e-4 * ops.reduce_max(ops.stack(highs))
    diag = ops.diagonal(inv, 0, 1, 2)
    ok = ops.logical_and(ops.isfinite(inv).all(), (diag > 0).all())
    return inv, ops.logical_and(ok, ops.logical_not(indefinite))


def apply_right(matrix, inv_blocks, layout):
    """``matrix @ blockdiag(inv_blocks)``: (rows, D) x (D, D) -> (rows, D).

    The columns are zero-padded to ``padded``, grouped per block and multiplied with one
    batched matmul; the padded columns of the product are dropped.
    """
    nb, s, dim = layout.count, layout.size, layout.dim
    if nb == 1:
        return ops.matmul(matrix, inv_blocks[0])
    rows = matrix.shape[0]
    if layout.pad:
        matrix = ops.concat((matrix, ops.zeros((rows, layout.pad), matrix.dtype)), axis=1)
    grouped = matrix.reshape(rows, nb, s).transpose(1, 0, 2)           # (nb, rows, s)
    out = ops.bmm(grouped, inv_blocks).transpose(1, 0, 2)               # (rows, nb, s)
    out = out.reshape(rows, layout.padded)
    return out[:, :dim] if layout.pad else out


def apply_left(inv_blocks, matrix, layout):
    """``blockdiag(inv_blocks) @ matrix``: (D, D) x (D, cols) -> (D, cols).

    The rows are zero-padded to ``padded``, grouped per block (a plain reshape) and multiplied
    with one batched matmul; the padded rows of the product are dropped.
    """
    nb, s, dim = layout.count, layout.size, layout.dim
    if nb == 1:
        return ops.matmul(inv_blocks[0], matrix)
    cols = matrix.shape[1]
    if layout.pad:
        matrix = ops.concat((matrix, ops.zeros((layout.pad, cols), matrix.dtype)), axis=0)
    out = ops.bmm(inv_blocks, matrix.reshape(nb, s, cols)).reshape(layout.padded, cols)
    return out[:dim] if layout.pad else out
