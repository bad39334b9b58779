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
* ``method="newton"`` needs no factorisation at all: a scaled Newton-Schulz iteration made of
  matrix products, additions and scalings only (:func:`newton_inverse`), warm-started from the
  layer's previous inverse when that provably converges. It never raises either; a run that did not
  converge is reported through ``ok``.
* ``method="newton_split"`` is the same iteration with every matrix product made exact in float16
  inputs: each operand is scaled row- (left) or column-wise (right) to entries within [-1, 1] and split into
  a float16 high part and a float16 low part (Ozaki-style), and three products of float16-exact
  operands are summed with float32 accumulation. A device that rounds a product's inputs to float16
  (Ascend's cube units, unless the product is kept in float32) then loses nothing. Ascend's ``"auto"``.
* Both Newton paths end with :data:`NEWTON_REFINEMENTS` refinement steps whose residual ``I - M X``
  is computed with split products, and accept the inverse only when the estimated relative error
  (the last correction) is below :data:`NEWTON_ACCEPT`; :func:`newton_inverse` with
  ``products="float16"`` emulates float16-input products on CPU (docs/algorithms.md, "Newton-Schulz
  in device precision").
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
from .blocks import to_blocks

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

# what a product's inputs are rounded to: "float32" (as given), or "float16" (float32 accumulation),
# the emulation of a cube unit that multiplies float16 inputs
PRODUCT_PRECISIONS = ("float32", "float16")


def newton_steps_for(low, rate_squared=1e-3):
    """Steps of the scaled iteration (:func:`newton_inverse`, cold start) after which
    ``||I - M X||`` is below ``rate_squared`` in exact arithmetic, for the smallest relative
    eigenvalue ``low = total / ||M||_inf``: the scalar recurrence ``l <- 1 - ((1 - l) / (1 + l))^2``."""
    if not 0 < low <= 1:
        raise ValueError(f"low must be in (0, 1], got {low!r}")
    lower, steps = low, 0
    while True:
        rate = (1 - lower) / (1 + lower)
        steps += 1
        lower = 1 - rate * rate
        if rate * rate < rate_squared:
            return steps


# Newton-Schulz: the smallest relative eigenvalue ``total / ||M||_inf`` the unrolled steps reach
# (D = 2048 at damping 1e-4 relative to the mean eigenvalue is ~5e-8); the step count it needs (16);
# the convergence tolerance of the last step; refinement steps with a split residual; the accepted
# estimated relative error per product precision.
NEWTON_MIN_LOW = 1e-8
NEWTON_STEPS = newton_steps_for(NEWTON_MIN_LOW)
NEWTON_TOLERANCE = 0.25
NEWTON_REFINEMENTS = 2
NEWTON_ACCEPT = {"float32": 1e-4, "float16": 1e-3}

# relative slack of the Cauchy-Schwarz test |m_ij| <= sqrt(m_ii m_jj) for float32 rounding
_CS_RELATIVE_SLACK = 1e-3


def _trace(m):
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

    One block: :func:`sanitize`. Several: only the diagonal blocks, the part that is inverted, are
    checked (``nb * s^2`` entries instead of ``D^2``; an off-diagonal entry of the factor no longer
    rejects it). The trace is the full factor's, as :func:`trace_jitter` and the damping split use it.
    """
    if layout.count == 1:
        safe, valid = sanitize(m)
        return safe, valid, _trace(safe)
    blocks = to_blocks(m, layout)
    valid = _plausible(blocks, ops.diagonal(blocks, 0, 1, 2), ops.diagonal(m))
    safe = choose(valid, blocks, _identity_like(blocks))
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
        invs.append(ops.matmul(divide(vectors, ops.relu(values) + total), transposed(vectors)))
    if len(mats) == 1:
        inv = invs[0] if sym.ndim == 2 else ops.stack(invs, 0)
        return inv, lows[0] < -1e-4 * highs[0]
    indefinite = ops.reduce_min(ops.stack(lows)) < -1e-4 * ops.reduce_max(ops.stack(highs))
    return ops.stack(invs, 0), indefinite


def _frobenius(e):
    """Frobenius norm of each matrix of ``e``, shaped (1, 1) or (nb, 1, 1) to broadcast."""
    return ops.sqrt((e * e).sum((-2, -1), keepdims=True))


def _inf_norm(e):
    """Maximum absolute row sum of each matrix of ``e``, shaped (1, 1) or (nb, 1, 1)."""
    return ops.amax(ops.abs(e).sum(-1, keepdims=True), -2, keepdims=True)


def _round16(a):
    """``a`` with every entry rounded to float16 (and back): what a float16-input product sees."""
    return ops.cast(ops.cast(a, ms.float16), ms.float32)


def _product(a, b, products):
    """``a @ b`` with inputs as given (``"float32"``) or rounded to float16 first (``"float16"``),
    the accumulation in float32 either way."""
    if products == "float16":
        a, b = _round16(a), _round16(b)
    return _matmul(a, b)


def _row_scale(a, axis):
    """Per-row (``axis=-1``) or per-column (``axis=-2``) largest absolute entry (1 for an all-zero
    row), so that ``a / scale`` has entries within [-1, 1]. Not rounded to a power of two: dividing
    and multiplying back cost 2^-24 each, far below the split's 2^-21, and keep the graph to
    reductions and arithmetic."""
    peak = ops.amax(ops.abs(a), axis, keepdims=True)
    return ops.where(peak > 0, peak, ops.ones_like(peak))


def _split16(a):
    """``(hi, lo)``: float16-exact parts with ``a ~ hi + lo`` to about 22 bits (for entries above
    float16's normal range relative to the row's scale)."""
    hi = _round16(a)
    return hi, _round16(a - hi)


def split_product(a, b, products="float32"):
    """``a @ b`` from float16-exact operands: ``a`` scaled row-wise and ``b`` column-wise by their
    largest entries, each split into float16 high and low parts, and ``hi hi + (hi lo + lo hi)``
    accumulated in float32. Rounding the inputs to float16 changes none of the three products, so the
    result does not depend on ``products``; its error is about ``2^-21`` of ``|a| |b|`` row by column."""
    row, col = _row_scale(a, -1), _row_scale(b, -2)
    a_hi, a_lo = _split16(divide(a, row))
    b_hi, b_lo = _split16(divide(b, col))
    mixed = _product(a_hi, b_lo, products) + _product(a_lo, b_hi, products)
    return (_product(a_hi, b_hi, products) + mixed) * row * col


def newton_inverse(sym, total, warm=None, trust_warm=None, steps=None, tolerance=None, products="float32",
                   split=False, refinements=None, accept=None):
    """``(inv, converged, warm_used)``: ``(sym + total I)^-1`` of a (D, D) matrix or of each matrix of
    a (nb, s, s) stack by a scaled Newton-Schulz iteration, using matrix products, additions,
    scalings and cheap reductions only.

    With ``M = sym + total I`` and ``R_k = M X_k``, one step is

        gamma_k = 2 / (l_k + u_k),   X_{k+1} = gamma_k X_k (2 I - gamma_k R_k),

    where ``[l_k, u_k]`` encloses the eigenvalues of ``R_k``. Then ``I - R_{k+1} = (I - gamma_k R_k)^2``
    (Schulz 1933; it converges iff the spectral radius of ``I - gamma_0 R_0`` is below 1), and the
    scaling centres the interval on 1, so that ``[l, u]`` maps onto ``[1 - c^2, 1]`` with
    ``c = (u - l) / (u + l)``: in the first phase the smallest eigenvalue grows about 4x per step
    instead of 2x (the acceleration of Pan & Schreiber 1991). The interval follows in scalars.

    Start (per matrix of the stack):

    * cold: ``X_0 = I / b`` with ``b = ||M||_inf >= lambda_max(M)`` (Gershgorin), so the eigenvalues of
      ``R_0 = M / b`` lie in ``[total / b, 1]`` when ``sym`` is positive semi-definite;
    * warm, only if ``trust_warm`` and the residual ``rho = min(||I - M W||_F, ||I - M W||_inf)`` of
      the previous inverse ``W`` (a bound on the spectral radius) is finite and below the cold start's
      rate ``(b - total) / (b + total)``: ``X_0 = W`` with the interval ``[1 - rho, 1 + rho]`` (``M W``
      is similar to the symmetric ``M^1/2 W M^1/2``, so its eigenvalues are real).

    ``steps`` (default :data:`NEWTON_STEPS`, enough from ``total / b`` down to :data:`NEWTON_MIN_LOW`,
    :func:`newton_steps_for`) products ``M X`` and ``steps`` updates are unrolled (the first product
    is free: ``M / b`` cold, reused from the residual warm). Products run as ``products`` says
    (``"float16"``: inputs rounded to float16, the emulation of a cube unit), or, with ``split``, as
    :func:`split_product`, exact in float16 inputs.

    Then ``refinements`` (default :data:`NEWTON_REFINEMENTS`) steps ``X <- X + X (I - M X)`` with the
    residual from :func:`split_product` (accurate whatever the products' precision). The estimated
    relative error ``||X R||_F / ||X||_F`` of the last correction (the error of the iterate before
    it, ``R = I - M X`` being ``M E`` for the error ``E``) must be finite and below ``accept`` (default
    :data:`NEWTON_ACCEPT` of ``products``) for ``converged``. An indefinite ``sym`` (an eigenvalue
    below ``-total``) makes the iteration diverge and fails the test. With ``refinements=0`` the test
    is the old one: the last step's ``||I - gamma R||_F`` below ``tolerance`` (default
    :data:`NEWTON_TOLERANCE`), which bounds the relative error by ``tolerance^2``.
    """
    if products not in PRODUCT_PRECISIONS:
        raise ValueError(f"products must be one of {PRODUCT_PRECISIONS}, got {products!r}")
    steps = NEWTON_STEPS if steps is None else steps
    tolerance = NEWTON_TOLERANCE if tolerance is None else tolerance
    refinements = NEWTON_REFINEMENTS if refinements is None else refinements
    accept = NEWTON_ACCEPT[products] if accept is None else accept

    def product(a, b):
        return split_product(a, b, products) if split else _product(a, b, products)

    eye = _identity_like(sym)
    m = sym + total * eye
    bound = _inf_norm(m)
    low = total / bound
    one = ops.ones_like(low)
    x, r, lower, upper = divide(eye, bound), divide(m, bound), low, one
    warm_used = ops.zeros_like(low) > 1
    if warm is not None:
        r_warm = product(m, warm)
        residual = eye - r_warm
        rho = ops.minimum(_frobenius(residual), _inf_norm(residual))
        use = ops.logical_and(ops.isfinite(rho), rho < (1 - low) / (1 + low))
        if trust_warm is not None:
            use = ops.logical_and(use, trust_warm)
        wide = ops.broadcast_to(use, x.shape)
        x, r = ops.where(wide, warm, x), ops.where(wide, r_warm, r)
        lower, upper = ops.where(use, 1 - rho, lower), ops.where(use, 1 + rho, upper)
        warm_used = use
    for k in range(steps):
        gamma = 2 / (lower + upper)
        rate = (upper - lower) / (upper + lower)
        r = r * gamma
        x = product(x * gamma, 2 * eye - r)
        lower, upper = 1 - rate * rate, one
        if k < steps - 1:
            r = product(m, x)
    last = _frobenius(eye - r)
    converged = ops.logical_and(ops.all(ops.isfinite(last)), ops.all(last < tolerance))
    estimate = ops.zeros_like(low)
    for _ in range(refinements):
        x = (x + transposed(x)) * 0.5
        correction = product(x, eye - split_product(m, x, products))
        estimate = _frobenius(correction) / _frobenius(x)
        x = x + correction
    if refinements:
        # the estimate replaces the step test: ||I - M X|| can stay O(1) while X is accurate (the
        # residual is M E, large along M's large eigenvalues; measured 0.32 with split products at
        # D = 1024, shift 1e-3, for an error of 6e-6), whereas ||X R|| / ||X|| ~ ||E|| / ||X||
        converged = ops.logical_and(ops.all(ops.isfinite(estimate)), ops.all(estimate < accept))
    return (x + transposed(x)) * 0.5, converged, warm_used


def damped_inverse(blocks, shift, method, jitter_shift, warm=None, trust_warm=None, products="float32"):
    """``(inv, ok)`` with ``inv = (sym(blocks) + (shift + jitter_shift) I)^-1``.

    ``blocks`` is one sanitized (D, D) factor or a (nb, s, s) stack of its diagonal blocks
    (:func:`mindspore_ngd.curvature.blocks.to_blocks`): a dense factor is the one-block case, and
    both go through the same code. ``jitter_shift`` is :func:`trace_jitter` of the full factor,
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
    sym = (blocks + transposed(blocks)) * 0.5
    total = shift + jitter_shift
    failed = ops.zeros((), ms.bool_)
    if blocks.shape[-1] == 1:           # scalar blocks (a one-output layer's G): MatrixInverse rejects 1x1
        inv = 1.0 / (sym + total)
    elif method == "cholesky":
        eye = _identity_like(blocks)
        low_inv = msla.solve_triangular(ops.cholesky(sym + total * eye), eye, lower=True)
        inv = gram(low_inv)
    elif method == "lu":
        inv = ops.MatrixInverse()(sym + total * _identity_like(blocks))
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
