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
* ``method="newton"`` and ``"newton_split"`` need no factorisation at all: a scaled Newton-Schulz
  iteration made of matrix products, additions and scalings only, the second with its products made
  exact in float16 inputs (Ascend's ``"auto"``). It never raises either; a run that did not converge
  is reported through ``ok``. The iteration, its warm start and its convergence tests live in
  :mod:`.newton`; its constants and :func:`~.newton.newton_inverse` are re-exported here.
* Batched (3-D) ``ops.CholeskyInverse`` returns wrong values on CPU: it is not used anywhere.

A dense factor and THOR's block-split factor (:mod:`.blocks`) are inverted by the same function:
a dense factor is the one-block case.

Every result is checked (finite, positive diagonal); the caller keeps the previous inverse when the
check fails.
"""
import warnings

import mindspore as ms
from mindspore import ops
import mindspore.scipy.linalg as msla

from .._graph import choose, divide, gram, outer, transposed
from .blocks import identity_like, to_blocks
from .newton import (NEWTON_ACCEPT, NEWTON_MIN_LOW, NEWTON_REFINEMENTS, NEWTON_STEPS, NEWTON_TOLERANCE,
                     PRODUCT_PRECISIONS, newton_inverse, newton_steps_for)

__all__ = ["INVERSE_METHODS", "INVERSE_METHOD_CHOICES", "DEVICE_INVERSE_METHODS", "DAMPING_SPLITS",
           "NEWTON_STEPS", "NEWTON_TOLERANCE", "NEWTON_MIN_LOW", "NEWTON_REFINEMENTS", "NEWTON_ACCEPT",
           "PRODUCT_PRECISIONS", "newton_steps_for", "ascend_precision_warning", "resolve_inverse_method", "sanitize", "sanitized_blocks",
           "split_damping", "split_damping_traces", "trace_jitter", "jitter_of_trace", "damped_inverse",
           "newton_inverse"]

INVERSE_METHODS = ("cholesky", "lu", "eigh", "newton", "newton_split")
INVERSE_METHOD_CHOICES = ("auto",) + INVERSE_METHODS
DAMPING_SPLITS = ("pi", "sqrt", "positions")

# per ``mindspore.get_context("device_target")``: the path ``inverse_method="auto"`` resolves to. Every
# operator of each path is documented for its device ("Supported Platforms" of the installed
# docstrings). Why these (docs/algorithms.md, "Which path on which device"):
# - CPU: Cholesky, the fastest measured here (benchmarks/inverse_cost.py); the golden tests pin it.
# - GPU: LU (ops.MatrixInverse), documented for GPU, a direct method with no iteration count to
#   tune, and about 2 D^3 flops against (2 NEWTON_STEPS - 1) D^3 for the iteration.
# - Ascend: the Newton-Schulz iteration with split (float16-exact) products: MatMul/BatchMatMul run
#   on the AI Core's cube units, while MatrixInverse's only kernel registration in the installed
#   package is an AI CPU one (mindspore/ops/_op_impl/aicpu/matrix_inverse.py); the split keeps the
#   inverse within 1e-4 of float64 even when the cube rounds the products' inputs to float16
#   (benchmarks/newton_precision.py).
DEVICE_INVERSE_METHODS = {"Ascend": "newton_split", "GPU": "lu", "CPU": "cholesky"}

# relative slack of the Cauchy-Schwarz test |m_ij| <= sqrt(m_ii m_jj) for float32 rounding
_CS_RELATIVE_SLACK = 1e-3


def _trace(m):
    """The trace of a factor: of a (D, D) matrix, or of a diagonal factor kept as its (D,) diagonal."""
    if m.ndim == 1:
        return ops.reduce_sum(m)
    return ops.trace(m)


def resolve_inverse_method(method, device_target=None):
    """The inversion path for ``method``: itself when named, else (``"auto"``) the entry of
    :data:`DEVICE_INVERSE_METHODS` for ``device_target`` (default: ``mindspore.get_context("device_target")``).

    Raises:
        ValueError: ``method`` is not one of :data:`INVERSE_METHOD_CHOICES`, or ``"auto"`` on a
            device without an entry.
    """
    if not isinstance(method, str) or method not in INVERSE_METHOD_CHOICES:
        raise ValueError(f"inverse_method must be one of {list(INVERSE_METHOD_CHOICES)}, got {method!r}")
    device = device_target if device_target is not None else ms.get_context("device_target")
    if method != "auto":
        if device == "Ascend":
            message = ascend_precision_warning(method)
            if message:
                warnings.warn(message, stacklevel=3)
        return method
    if device not in DEVICE_INVERSE_METHODS:
        raise ValueError(f"inverse_method='auto' has no path for device_target {device!r}; name one of "
                         f"{list(INVERSE_METHODS)}")
    return DEVICE_INVERSE_METHODS[device]


def ascend_precision_warning(method, dims=(), split_dim=None):
    """The reason an inverse of ``method`` for factors of sizes ``dims`` (inverted as blocks of
    ``split_dim`` when larger) cannot be certified on Ascend, or None.

    Certified (benchmarks/newton_precision.py, emulated float16-input products): ``"newton_split"``
    at every size measured, the other direct methods by MindSpore's own kernels. Not certified:
    ``"newton"`` (its products round the factor to float16 when the device does: measured NaN on
    power-law spectra below shift ~fp16 eps x lambda_max), and any Newton path on a dense factor
    above 2048 (the largest size measured).
    """
    if method == "newton":
        return ("inverse_method='newton' on Ascend: its products may run with float16 inputs, which makes "
                "lightly damped factors indefinite (no inverse; the layer keeps its previous one). Use "
                "'newton_split' (the 'auto' choice), which is certified within 1e-4 of float64.")
    if method == "newton_split":
        big = sorted({d for d in dims if d > 2048 and (split_dim is None or split_dim > 2048)})
        if big:
            return (f"inverse_method='newton_split' on Ascend is certified for factors up to 2048 only; factors "
                    f"of size {big} are inverted whole. Pass split_dim (e.g. 128) to invert them as blocks.")
    return None


def _plausible(m, diag, full_diag):
    """Whether ``m`` (a (D, D) factor, or a (nb, s, s) stack of its diagonal blocks) can be positive
    semi-definite: all entries finite, diagonal ``diag`` >= 0 and every off-diagonal entry within the
    Cauchy-Schwarz bound, up to a tolerance relative to the largest entry of the factor's diagonal
    ``full_diag``."""
    finite = ops.all(ops.isfinite(m))
    # the products d_i d_j as matrix products with one inner term (no broadcast kernel: mindspore_ngd._graph)
    if m.ndim == 2:
        products = outer(diag, diag)
    else:
        products = ops.bmm(ops.expand_dims(diag, 2), ops.expand_dims(diag, 1))
    bound = ops.sqrt(ops.relu(products)) * (1.0 + _CS_RELATIVE_SLACK)
    tiny = 1e-7 * ops.reduce_max(ops.abs(full_diag)) + 1e-30
    plausible = ops.logical_and(ops.all(diag >= 0), ops.all(ops.abs(m) <= bound + tiny))
    return ops.logical_and(finite, plausible)


def sanitize(m):
    """Return ``(safe, valid)``: ``m`` if it can be a PSD factor, else the identity; and the verdict.

    The test is necessary, not sufficient, for positive semi-definiteness: all entries finite,
    diagonal >= 0 and every off-diagonal entry within the Cauchy-Schwarz bound.
    """
    n = m.shape[0]
    diag = ops.diagonal(m)
    valid = _plausible(m, diag, diag)
    safe = choose(valid, m, ops.eye(n, n, ms.float32))
    return safe, valid


def sanitized_blocks(m, layout):
    """``(blocks, valid, trace)`` of a factor ``m`` about to be inverted in ``layout``
    (:class:`~mindspore_ngd.curvature.blocks.BlockLayout`): what to invert (:func:`to_blocks` of ``m``,
    or of the identity when ``m`` cannot be PSD), the verdict, and the trace of the factor inverted
    (``m``'s, or ``D``).

    A diagonal factor kept as its (D,) diagonal is valid when finite and >= 0 (the identity's diagonal
    replaces it otherwise). One block: :func:`sanitize`. Several: only the diagonal blocks, the part that is inverted, are
    checked (``nb * s^2`` entries instead of ``D^2``; an off-diagonal entry of the factor no longer
    rejects it). The trace is the full factor's, as :func:`trace_jitter` and the damping split use it.
    """
    if m.ndim == 1:                     # a diagonal factor (an Embedding's A): PSD iff finite and >= 0
        valid = ops.logical_and(ops.all(ops.isfinite(m)), ops.all(m >= 0))
        safe = choose(valid, m, ops.ones_like(m))
        return safe, valid, _trace(safe)
    if layout.count == 1:
        safe, valid = sanitize(m)
        return safe, valid, _trace(safe)
    blocks = to_blocks(m, layout)
    valid = _plausible(blocks, ops.diagonal(blocks, 0, 1, 2), ops.diagonal(m))
    safe = choose(valid, blocks, identity_like(blocks))
    return safe, valid, ops.where(valid, _trace(m), float(layout.dim))


def split_damping(a, g, damping, split, positions=None):
    """Damping added to (A, G) for a Tikhonov damping ``damping`` on the Kronecker product.

    ``"sqrt"``: (sqrt(l), sqrt(l)). ``"pi"``: factored Tikhonov damping of Martens & Grosse 2015
    (section 6.3), ``pi = sqrt((tr(A)/dim A) / (tr(G)/dim G))`` and (pi sqrt(l), sqrt(l)/pi);
    pi falls back to 1 when either trace is zero. ``"positions"``: MindSpore's THOR, ``pi = sqrt(T)``
    with ``T`` = ``positions``, the output positions a Conv2d's A sums over (1 for a Dense):
    (sqrt(l T), sqrt(l / T)). It is nn.thor's ``A/T + sqrt(l/T) I`` and ``G + sqrt(l/T) I`` (A averaged
    over positions, docs/algorithms.md) written for A summed over them, as this package keeps it.
    """
    if split == "pi":
        return split_damping_traces(_trace(a), a.shape[0], _trace(g), g.shape[0], damping, split)
    return split_damping_traces(None, a.shape[0], None, g.shape[0], damping, split, positions)


def split_damping_traces(a_trace, a_dim, g_trace, g_dim, damping, split, positions=None):
    """:func:`split_damping` from the factors' traces and sizes (the traces are read only for "pi",
    ``positions`` only for "positions", where None means 1)."""
    root = ops.sqrt(damping)
    if split == "sqrt":
        return root, root
    if split == "positions":
        if positions is None:
            return root, root
        pi = ops.sqrt(ops.cast(positions, ms.float32))
        return pi * root, root / pi
    mean_a = a_trace / a_dim
    mean_g = g_trace / g_dim
    usable = ops.logical_and(mean_a > 0, mean_g > 0)
    ratio = ops.where(usable, mean_a / ops.where(usable, mean_g, ops.ones_like(mean_g)),
                       ops.ones_like(mean_a))
    pi = ops.sqrt(ratio)
    return pi * root, root / pi


def trace_jitter(m, jitter):
    """``jitter * relu(tr(m))`` of the FULL (D, D) factor: the extra shift of every block."""
    return jitter_of_trace(_trace(m), jitter)


def jitter_of_trace(trace, jitter):
    """:func:`trace_jitter` from the factor's trace."""
    return jitter * ops.relu(trace)


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
        invs.append(ops.matmul(divide(vectors, ops.relu(values) + total), transposed(vectors)))
    if len(mats) == 1:
        inv = invs[0] if sym.ndim == 2 else ops.stack(invs, 0)
        return inv, lows[0] < -1e-4 * highs[0]
    indefinite = ops.reduce_min(ops.stack(lows)) < -1e-4 * ops.reduce_max(ops.stack(highs))
    return ops.stack(invs, 0), indefinite


def damped_inverse(blocks, shift, method, jitter_shift, warm=None, trust_warm=None, products="float32"):
    """``(inv, ok)`` with ``inv = (sym(blocks) + (shift + jitter_shift) I)^-1``.

    ``blocks`` is one sanitized (D, D) factor or a (nb, s, s) stack of its diagonal blocks
    (:func:`mindspore_ngd.curvature.blocks.to_blocks`): a dense factor is the one-block case, and
    both go through the same code. A diagonal factor kept as its (D,) diagonal (an Embedding's A) is
    inverted entrywise, whatever ``method``, into its inverse's diagonal. ``jitter_shift`` is :func:`trace_jitter` of the full factor,
    shared by all blocks. ``ok`` is False when the result is not finite or has a non-positive
    diagonal (the inverse of an SPD matrix has a positive diagonal); with ``method="eigh"`` also
    when an eigenvalue lies below ``-1e-4 * max |eigenvalue|`` (an indefinite factor); with
    ``method="newton"`` or ``"newton_split"`` also when the iteration did not converge or its
    estimated error is too large (:func:`newton_inverse`, which may start from ``warm``, the previous
    inverse of the same shape, if ``trust_warm``). ``products`` ("float16": emulated float16-input
    products) applies to the Newton paths only.
    """
    if method not in INVERSE_METHODS:
        raise ValueError(f"unknown inverse method {method!r}; expected one of {INVERSE_METHODS}")
    if blocks.ndim == 1:                # a diagonal factor kept as its (D,) diagonal: every method agrees
        inv = divide(ops.ones_like(blocks), blocks + (shift + jitter_shift))
        return inv, ops.logical_and(ops.all(ops.isfinite(inv)), ops.all(inv > 0))
    sym = (blocks + transposed(blocks)) * 0.5
    total = shift + jitter_shift
    failed = ops.zeros((), ms.bool_)
    if blocks.shape[-1] == 1:           # scalar blocks (a one-output layer's G): MatrixInverse rejects 1x1
        inv = 1.0 / (sym + total)
    elif method == "cholesky":
        eye = identity_like(blocks)
        low_inv = msla.solve_triangular(ops.cholesky(sym + total * eye), eye, lower=True)
        inv = gram(low_inv)
    elif method == "lu":
        inv = ops.MatrixInverse()(sym + total * identity_like(blocks))
        inv = (inv + transposed(inv)) * 0.5
    elif method in ("newton", "newton_split"):
        usable = warm is not None and tuple(warm.shape) == tuple(blocks.shape)
        inv, converged, _ = newton_inverse(sym, total, warm if usable else None, trust_warm, products=products,
                                           split=method == "newton_split")
        failed = ops.logical_not(converged)
    else:
        inv, failed = _eigh_inverse(sym, total)
    ok = ops.logical_and(ops.all(ops.isfinite(inv)), ops.all(ops.diagonal(inv, 0, -2, -1) > 0))
    return inv, ops.logical_and(ok, ops.logical_not(failed))
