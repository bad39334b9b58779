"""Damped inverses of Kronecker factors and the factored damping split, in graph-mode ops.

Why the inversion is guarded the way it is (measured on MindSpore 2.10, see FACTS.md):

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

Every result is checked (finite, positive diagonal); the caller keeps the previous inverse when the
check fails.
"""
import mindspore as ms
from mindspore import ops
import mindspore.scipy.linalg as msla

__all__ = ["INVERSE_METHODS", "DAMPING_SPLITS", "sanitize", "split_damping", "damped_inverse",
           "precondition"]

INVERSE_METHODS = ("cholesky", "lu", "eigh")
DAMPING_SPLITS = ("pi", "sqrt")

# relative slack of the Cauchy-Schwarz test |m_ij| <= sqrt(m_ii m_jj) for float32 rounding
_CS_RELATIVE_SLACK = 1e-3


def _eye(n):
    return ops.eye(n, n, ms.float32)


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
    safe = ops.select(ops.broadcast_to(valid, m.shape), m, _eye(n))
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


def damped_inverse(m, shift, method, jitter):
    """``(inv, ok)`` with ``inv = (sym(m) + (shift + jitter * tr(m)) I)^-1``.

    ``m`` must already be sanitized. ``ok`` is False when the result is not finite or has a
    non-positive diagonal (the inverse of an SPD matrix has a positive diagonal); with
    ``method="eigh"`` also when ``m`` has an eigenvalue below ``-1e-4 * max |eigenvalue|``
    (an indefinite factor).
    """
    n = m.shape[0]
    eye = _eye(n)
    sym = (m + m.transpose(1, 0)) * 0.5
    total = shift + jitter * ops.relu(_trace(sym))
    indefinite = ops.zeros((), ms.bool_)
    if n == 1:                           # a scalar factor (e.g. a one-output layer's G)
        inv = 1.0 / (sym + total)
    elif method == "cholesky":
        low = ops.cholesky(sym + total * eye)
        low_inv = msla.solve_triangular(low, eye, lower=True)
        inv = ops.matmul(low_inv.transpose(1, 0), low_inv)
    elif method == "lu":
        inv = ops.MatrixInverse()(sym + total * eye)
        inv = (inv + inv.transpose(1, 0)) * 0.5
    else:
        values, vectors = msla.eigh(sym)
        indefinite = ops.reduce_min(values) < -1e-4 * ops.reduce_max(ops.abs(values))
        inv = ops.matmul(vectors / (ops.relu(values) + total), vectors.transpose(1, 0))
    ok = ops.logical_and(ops.isfinite(inv).all(), (ops.diagonal(inv) > 0).all())
    return inv, ops.logical_and(ok, ops.logical_not(indefinite))


def precondition(g_inv, grad_matrix, a_inv):
    """``G^-1 dW A^-1`` for a gradient matrix of shape (out, in[+1])."""
    return ops.matmul(ops.matmul(g_inv, grad_matrix), a_inv)
