"""The matrix-product-only inverse: a scaled Newton-Schulz iteration (``inverse_method="newton"``
and ``"newton_split"`` of :func:`mindspore_ngd.curvature.inverse.damped_inverse`).

* ``"newton"`` needs no factorisation at all: :func:`newton_inverse` is made of matrix products,
  additions, scalings and cheap reductions only, warm-started from the layer's previous inverse when
  that provably converges. It never raises; a run that did not converge is reported through
  ``converged``.
* ``"newton_split"`` is the same iteration with every matrix product made exact in float16 inputs
  (:func:`split_product`): each operand is scaled row- (left) or column-wise (right) to entries within
  [-1, 1] and split into a float16 high part and a float16 low part (Ozaki-style), and three products
  of float16-exact operands are summed with float32 accumulation. A device that rounds a product's
  inputs to float16 (Ascend's cube units, unless the product is kept in float32) then loses nothing.
  Ascend's ``"auto"``.
* Both paths end with :data:`NEWTON_REFINEMENTS` refinement steps whose residual ``I - M X`` is
  computed with split products, and accept the inverse only when the estimated relative error (the
  last correction) is below :data:`NEWTON_ACCEPT`; ``products="float16"`` emulates float16-input
  products on CPU (docs/algorithms.md, "Newton-Schulz in device precision").

The step count is static (:data:`NEWTON_STEPS`, from the scalar recurrence of
:func:`newton_steps_for`), so the iteration unrolls into the graph.
"""
import mindspore as ms
from mindspore import ops

from .._graph import divide, transposed
from .blocks import identity_like

__all__ = ["NEWTON_STEPS", "NEWTON_TOLERANCE", "NEWTON_MIN_LOW", "NEWTON_REFINEMENTS", "NEWTON_ACCEPT",
           "PRODUCT_PRECISIONS", "newton_steps_for", "split_product", "newton_inverse"]

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


def _matmul(a, b):
    return ops.bmm(a, b) if a.ndim == 3 else ops.matmul(a, b)


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

    eye = identity_like(sym)
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

