"""Damped inverses of Kronecker factors and the factored damping split, in graph-mode ops.

Why the inversion is guarded the way it is (measured on MindSpore 2.10, docs/cpu_notes.md):

* ``ops.cholesky`` raises ``RuntimeError: Cholesky expects symmetric positive definite matrices``
  for a non-positive-definite or NaN input, and the executor then fails every later call too.
  A graph cannot catch that, so a retry *after* a failed Cholesky is impossible. We therefore
  prevent the failure: (1) :func:`sanitize` rejects factors that cannot be positive semi-definite
  (non-finite entries, a negative diagonal, or ``|m_ij| > sqrt(m_ii m_jj)``) and substitutes the
  identity, so nothing downstream sees them; (2) the damped matrix gets an extra trace-relative
  shift ``jitter * trace(M)``, which covers the float32 rounding of a Gram matrix (measured:
  eigenvalues down to -1e-7 * trace on ResNet-sized factors).
* ``ops.MatrixInverse`` (LU) never raises: a singular or NaN input gives zeros or NaN, which the
  result check catches. ``method="lu"`` uses it.
* ``mindspore.scipy.linalg.eigh`` (2-D only) clamps negative eigenvalues to zero and so tolerates a
  slightly indefinite factor: ``method="eigh"`` is the robust (and slowest) path.
* Batched (3-D) ``ops.CholeskyInverse`` returns wrong values on CPU: it is not used anywhere.

A dense factor and THOR's block-split factor (:mod:`.blocks`) are inverted by the same function:
a dense factor is the one-block case.

Every result is checked (finite, positive diagonal); the caller keeps the previous inverse when the
check fails.
"""
import mindspore as ms
from mindspore import ops
import mindspore.scipy.linalg as msla

__all__ = ["INVERSE_METHODS", "DEVICE_INVERSE_METHODS", "DAMPING_SPLITS", "sanitize", "split_damping", "trace_jitter", "damped_inverse"]

INVERSE_METHODS = ("cholesky", "lu", "eigh")
DAMPING_SPLITS = ("pi", "sqrt")

# per ``mindspore.get_context("device_target")``: the inversion path whose every operator MindSpore
# documents for that device ("Supported Platforms" of the installed docstrings)
DEVICE_INVERSE_METHODS = {"Ascend": "lu", "GPU": "lu", "CPU": "cholesky"}

# relative slack of the Cauchy-Schwarz test |m_ij| <= sqrt(m_ii m_jj) for float32 rounding
_CS_RELATIVE_SLACK = 1e-3


def _trace(m):
    return ops.trace(m)


def sanitize(m):
    """Return ``(safe, valid)``: ``m`` if it can be a PSD factor, else the identity; and the verdict.

    The test is necessary, not sufficient, for positive semi-definiteness: all entries finite,
    diagonal >= 0 and every off-diagonal entry within the Cauchy-Schwarz bound.
    """
    n = m.shape[0]
    diag = ops.diagonal(m)
    finite = ops.isfinite(m).all()
    bound = ops.sqrt(ops.relu(ops.outer(diag, diag))) * (1.0 + _CS_RELATIVE_SLACK)
    tiny = 1e-7 * ops.reduce_max(ops.abs(diag)) + 1e-30
    plausible = ops.logical_and((diag >= 0).all(), (ops.abs(m) <= bound + tiny).all())
    valid = ops.logical_and(finite, plausible)
    safe = ops.select(ops.broadcast_to(valid, m.shape), m, ops.eye(n, n, ms.float32))
    return safe, valid


def split_damping(a, g, damping, split):
    """Damping added to (A, G) for a Tikhonov damping ``damping`` on the Kronecker product.

    ``"sqrt"``: (sqrt(l), sqrt(l)). ``"pi"``: factored Tikhonov damping of Martens & Grosse 2015
    (section 6.3), ``pi = sqrt((tr(A)/dim A) / (tr(G)/dim G))`` and (pi sqrt(l), sqrt(l)/pi);
    pi falls back to 1 when either trace is zero.
    """
    root = ops.sqrt(damping)
    if split == "sqrt":
        return root, root
    mean_a = _trace(a) / a.shape[0]
    mean_g = _trace(g) / g.shape[0]
    usable = ops.logical_and(mean_a > 0, mean_g > 0)
    ratio = ops.select(usable, mean_a / ops.select(usable, mean_g, ops.ones_like(mean_g)),
                       ops.ones_like(mean_a))
    pi = ops.sqrt(ratio)
    return pi * root, root / pi


def trace_jitter(m, jitter):
    """``jitter * relu(tr(m))`` of the FULL (D, D) factor: the extra shift of every block."""
    return jitter * ops.relu(_trace(m))


def _transposed(x):
    return x.swapaxes(-1, -2)


def _matmul(a, b):
    return ops.bmm(a, b) if a.ndim == 3 else ops.matmul(a, b)


def _identity_like(blocks):
    """The identity with the shape of ``blocks``: (s, s), or (nb, s, s) for a stack of blocks."""
    size = blocks.shape[-1]
    eye = ops.eye(size, size, blocks.dtype)
    return eye if blocks.ndim == 2 else ops.broadcast_to(eye, blocks.shape)


def _eigh_inverse(sym, total):
    """Inverse through the eigendecomposition, block by block (``mindspore.scipy.linalg.eigh`` is
    2-D only: a static loop), negative eigenvalues clamped to zero; and the indefiniteness verdict
    of the whole block-diagonal matrix (its eigenvalues are the union of the blocks')."""
    mats = [sym] if sym.ndim == 2 else [sym[b] for b in range(sym.shape[0])]
    invs, lows, highs = [], [], []
    for mat in mats:
        values, vectors = msla.eigh(mat)
        lows.append(ops.reduce_min(values))
        highs.append(ops.reduce_max(ops.abs(values)))
        invs.append(ops.matmul(vectors / (ops.relu(values) + total), vectors.transpose(1, 0)))
    if len(mats) == 1:
        inv = invs[0] if sym.ndim == 2 else ops.stack(invs, 0)
        return inv, lows[0] < -1e-4 * highs[0]
    indefinite = ops.reduce_min(ops.stack(lows)) < -1e-4 * ops.reduce_max(ops.stack(highs))
    return ops.stack(invs, 0), indefinite


def damped_inverse(blocks, shift, method, jitter_shift):
    """``(inv, ok)`` with ``inv = (sym(blocks) + (shift + jitter_shift) I)^-1``.

    ``blocks`` is one sanitized (D, D) factor or a (nb, s, s) stack of its diagonal blocks
    (:func:`mindspore_ngd.curvature.blocks.to_blocks`): a dense factor is the one-block case, and
    both go through the same code. ``jitter_shift`` is :func:`trace_jitter` of the full factor,
    shared by all blocks. ``ok`` is False when the result is not finite or has a non-positive
    diagonal (the inverse of an SPD matrix has a positive diagonal); with ``method="eigh"`` also
    when an eigenvalue lies below ``-1e-4 * max |eigenvalue|`` (an indefinite factor).
    """
    if method not in INVERSE_METHODS:
        raise ValueError(f"unknown inverse method {method!r}; expected one of {INVERSE_METHODS}")
    sym = (blocks + _transposed(blocks)) * 0.5
    total = shift + jitter_shift
    indefinite = ops.zeros((), ms.bool_)
    if blocks.shape[-1] == 1:           # scalar blocks (a one-output layer's G): MatrixInverse rejects 1x1
        inv = 1.0 / (sym + total)
    elif method == "cholesky":
        eye = _identity_like(blocks)
        low_inv = msla.solve_triangular(ops.cholesky(sym + total * eye), eye, lower=True)
        inv = _matmul(_transposed(low_inv), low_inv)
    elif method == "lu":
        inv = ops.MatrixInverse()(sym + total * _identity_like(blocks))
        inv = (inv + _transposed(inv)) * 0.5
    else:
        inv, indefinite = _eigh_inverse(sym, total)
    ok = ops.logical_and(ops.isfinite(inv).all(), (ops.diagonal(inv, 0, -2, -1) > 0).all())
    return inv, ops.logical_and(ok, ops.logical_not(indefinite))
