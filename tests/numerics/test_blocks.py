"""Block-diagonal (THOR split) factor inverses against NumPy float64 references, in graph mode."""
import numpy as np
import pytest

from mindspore import nn, ops, Tensor

from mindspore_ngd.curvature import blocks as blk
from mindspore_ngd.curvature import inverse as inv_mod
from mindspore_ngd.curvature.blocks import BlockLayout

RTOL = 2e-4          # max-abs error relative to the reference's max-abs, float32 vs float64
EXACT = 1e-6         # single block against the dense path of inverse.py


def rel_err(got, ref):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)


def spd(rng, n, samples=None):
    """A well-conditioned float32 Gram matrix (n, n)."""
    samples = samples or 2 * n + 3
    a = rng.standard_normal((n, samples)).astype(np.float32)
    return (a @ a.T / samples).astype(np.float32)


def block_diag(rng, dim, size):
    """A (dim, dim) SPD block-diagonal matrix with blocks of ``size`` (last one smaller)."""
    m = np.zeros((dim, dim), np.float32)
    for start in range(0, dim, size):
        stop = min(start + size, dim)
        m[start:stop, start:stop] = spd(rng, stop - start)
    return m


def np_block_diag_part(m, size):
    out = np.zeros_like(m, dtype=np.float64)
    for start in range(0, m.shape[0], size):
        stop = min(start + size, m.shape[0])
        out[start:stop, start:stop] = m[start:stop, start:stop]
    return out


class Blocks(nn.Cell):
    """to_blocks -> from_blocks."""

    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def construct(self, m):
        b = blk.to_blocks(m, self.layout)
        return b, blk.from_blocks(b, self.layout)


class BlockedInverse(nn.Cell):
    """Full pipeline on one factor: blocks, damped inverse, apply on both sides, dense view."""

    def __init__(self, layout, method, shift, jitter):
        super().__init__()
        self.layout = layout
        self.method = method
        self.shift = shift
        self.jitter = jitter

    def construct(self, m, right_operand, left_operand):
        b = blk.to_blocks(m, self.layout)
        inv, ok = inv_mod.damped_inverse(b, self.shift, self.method,
                                             inv_mod.trace_jitter(m, self.jitter))
        return (inv, ok, blk.apply_right(right_operand, inv, self.layout),
                blk.apply_left(inv, left_operand, self.layout), blk.from_blocks(inv, self.layout))


class InverseOfBlocks(nn.Cell):
    def __init__(self, method, shift):
        super().__init__()
        self.method = method
        self.shift = shift

    def construct(self, blocks):
        return inv_mod.damped_inverse(blocks, self.shift, self.method, 0.0)


class ApplyLeft(nn.Cell):
    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def construct(self, blocks, matrix):
        return blk.apply_left(blocks, matrix, self.layout)


class Dense(nn.Cell):
    def __init__(self, method, shift, jitter):
        super().__init__()
        self.method = method
        self.shift = shift
        self.jitter = jitter

    def construct(self, m):
        return inv_mod.damped_inverse(m, self.shift, self.method, inv_mod.trace_jitter(m, self.jitter))


def run(cell, *arrays):
    out = cell(*[Tensor(a) for a in arrays])
    return [o.asnumpy() for o in out] if isinstance(out, tuple) else out.asnumpy()


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="unknown inverse method"):
        inv_mod.damped_inverse(None, 0.0, "qr", 0.0)


# ------------------------------------------------------------------------- to/from blocks

def test_blocks_round_trip_and_identity_padding():
    rng = np.random.default_rng(1)
    dim, size = 10, 4
    lay = BlockLayout.of(dim, size)
    m = block_diag(rng, dim, size)
    b, back = run(Blocks(lay), m)
    assert b.shape == (3, 4, 4)
    np.testing.assert_array_equal(back, m)
    np.testing.assert_array_equal(b[0], m[0:4, 0:4])
    np.testing.assert_array_equal(b[1], m[4:8, 4:8])
    np.testing.assert_array_equal(b[2][:2, :2], m[8:10, 8:10])
    # padded region: zeros off the diagonal, ones on the padded diagonal
    np.testing.assert_array_equal(b[2][2:, 2:], np.eye(2, dtype=np.float32))
    np.testing.assert_array_equal(b[2][:2, 2:], 0)
    np.testing.assert_array_equal(b[2][2:, :2], 0)


def test_to_blocks_drops_off_diagonal_blocks():
    rng = np.random.default_rng(2)
    dim, size = 11, 3
    m = rng.standard_normal((dim, dim)).astype(np.float32)
    _, back = run(Blocks(BlockLayout.of(dim, size)), m)
    np.testing.assert_array_equal(back, np_block_diag_part(m, size).astype(np.float32))


class SanitizedBlocks(nn.Cell):
    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def construct(self, m):
        return inv_mod.sanitized_blocks(m, self.layout)


class SanitizedWhole(nn.Cell):
    """What KroneckerBlock.refreshed did before: sanitize the whole factor, then cut it into blocks."""

    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def construct(self, m):
        safe, valid = inv_mod.sanitize(m)
        return blk.to_blocks(safe, self.layout), valid, ops.trace(safe)


@pytest.mark.parametrize("dim,size", [(10, 4), (12, 4), (7, 7), (9, 16)])
def test_sanitized_blocks_match_the_whole_factor_check(dim, size):
    """Only the diagonal blocks are checked, and they are gathered from the factor; on a PSD factor,
    and on one with a non-finite entry in a diagonal block, blocks, verdict and trace are bit-identical
    to sanitizing the whole factor first."""
    rng = np.random.default_rng(5)
    lay = BlockLayout.of(dim, size)
    m = spd(rng, dim)
    bad = m.copy()
    bad[dim - 1, dim - 2] = np.nan          # inside the last diagonal block
    blocks_cell, whole_cell = SanitizedBlocks(lay), SanitizedWhole(lay)
    good_out, bad_out = run(blocks_cell, m), run(blocks_cell, bad)
    for factor, got in ((m, good_out), (bad, bad_out)):
        for g, w in zip(got, run(whole_cell, factor)):
            np.testing.assert_array_equal(g, w)
    assert good_out[1] and not bad_out[1]
    np.testing.assert_array_equal(bad_out[0],
                                  np.broadcast_to(np.eye(lay.size, dtype=np.float32), (lay.count, lay.size, lay.size))
                                  if lay.count > 1 else np.eye(dim, dtype=np.float32))
    assert bad_out[2] == dim      # the identity's trace


def test_sanitized_blocks_ignore_the_discarded_off_diagonal_blocks():
    """An entry outside every diagonal block is never inverted, so it no longer rejects the factor."""
    rng = np.random.default_rng(6)
    lay = BlockLayout.of(10, 4)
    m = spd(rng, 10)
    m[0, 9] = m[9, 0] = np.inf
    blocks, valid, trace = run(SanitizedBlocks(lay), m)
    assert valid
    np.testing.assert_array_equal(blocks[0], m[0:4, 0:4])
    np.testing.assert_allclose(trace, np.trace(m.astype(np.float64)), rtol=1e-6)


# ------------------------------------------------------------- exact inverse of split factor

@pytest.mark.parametrize("method", ["cholesky", "lu", "eigh"])
def test_block_diagonal_factor_exact_inverse(method):
    rng = np.random.default_rng(3)
    dim, size, shift, jitter = 10, 4, 0.05, 1e-4      # 10 is not a multiple of 4
    m = block_diag(rng, dim, size)
    right = rng.standard_normal((6, dim)).astype(np.float32)
    left = rng.standard_normal((dim, 5)).astype(np.float32)
    inv, ok, got_right, got_left, dense = run(
        BlockedInverse(BlockLayout.of(dim, size), method, shift, jitter), m, right, left)
    total = shift + jitter * np.trace(m.astype(np.float64))   # jitter from the FULL trace
    ref = np.linalg.inv(m.astype(np.float64) + total * np.eye(dim))
    assert ok
    assert inv.shape == (3, 4, 4)
    assert rel_err(dense, ref) < RTOL
    assert rel_err(got_right, right.astype(np.float64) @ ref) < RTOL
    assert rel_err(got_left, ref @ left.astype(np.float64)) < RTOL
    # the padded part of the last block is the inverse of (1 + total)
    np.testing.assert_allclose(np.diag(inv[2])[2:], 1.0 / (1.0 + total), rtol=RTOL)


@pytest.mark.parametrize("method", ["cholesky", "lu"])
def test_dense_factor_uses_block_diagonal_part(method):
    rng = np.random.default_rng(4)
    dim, size, shift = 13, 5, 0.1
    m = spd(rng, dim)
    right = rng.standard_normal((4, dim)).astype(np.float32)
    left = rng.standard_normal((dim, 3)).astype(np.float32)
    _, ok, got_right, got_left, dense = run(
        BlockedInverse(BlockLayout.of(dim, size), method, shift, 0.0), m, right, left)
    ref = np.linalg.inv(np_block_diag_part(m, size) + shift * np.eye(dim))
    assert ok
    assert rel_err(dense, ref) < RTOL
    assert rel_err(got_right, right @ ref) < RTOL
    assert rel_err(got_left, ref @ left) < RTOL


# ------------------------------------------------------------ single block == dense path

@pytest.mark.parametrize("method", ["cholesky", "lu", "eigh"])
@pytest.mark.parametrize("dim, split", [(9, None), (9, 16), (1, None)])
def test_single_block_matches_damped_inverse(method, dim, split):
    rng = np.random.default_rng(5)
    shift, jitter = 0.03, 1e-5
    m = spd(rng, dim)
    right = rng.standard_normal((7, dim)).astype(np.float32)
    left = rng.standard_normal((dim, 2)).astype(np.float32)
    lay = BlockLayout.of(dim, split)
    assert lay.count == 1 and lay.size == dim
    inv, ok, got_right, got_left, dense = run(BlockedInverse(lay, method, shift, jitter),
                                              m, right, left)
    ref_inv, ref_ok = run(Dense(method, shift, jitter), m)
    assert ok and ref_ok
    assert inv.shape == (dim, dim)                  # one block is the plain matrix, not a (1, D, D) stack
    np.testing.assert_array_equal(inv, ref_inv)     # the same operations as the dense inverse
    np.testing.assert_array_equal(dense, inv)
    assert rel_err(got_right, right.astype(np.float64) @ ref_inv.astype(np.float64)) < EXACT
    assert rel_err(got_left, ref_inv.astype(np.float64) @ left.astype(np.float64)) < EXACT


# ------------------------------------------------------------------------------ apply_left

@pytest.mark.parametrize("dim, size, cols", [(10, 4, 3), (12, 4, 1), (7, 2, 5), (6, None, 4)])
def test_apply_left_against_numpy(dim, size, cols):
    rng = np.random.default_rng(6)
    lay = BlockLayout.of(dim, size)
    b = rng.standard_normal((lay.count, lay.size, lay.size)).astype(np.float32)
    matrix = rng.standard_normal((dim, cols)).astype(np.float32)
    dense = np.zeros((lay.padded, lay.padded))
    for i in range(lay.count):
        dense[i * lay.size:(i + 1) * lay.size, i * lay.size:(i + 1) * lay.size] = b[i]
    ref = dense[:dim, :dim] @ matrix.astype(np.float64)
    got = run(ApplyLeft(lay), b if lay.count > 1 else b[0], matrix)     # one block: the plain matrix
    assert got.shape == (dim, cols)
    assert rel_err(got, ref) < 1e-5


# ----------------------------------------------------------------- many blocks, scalar blocks

def test_36_blocks_of_128_cholesky():
    """Guards the batched path: batched CholeskyInverse is wrong on CPU and must not be used."""
    rng = np.random.default_rng(7)
    nb, s, shift = 36, 128, 0.01
    a = rng.standard_normal((nb, s, 2 * s)).astype(np.float32)
    scale = rng.uniform(0.1, 10.0, (nb, 1, 1)).astype(np.float32)      # blocks of unlike scale
    b = (a @ a.transpose(0, 2, 1) / (2 * s) * scale).astype(np.float32)
    inv, ok = run(InverseOfBlocks("cholesky", shift), b)
    assert ok and inv.shape == (nb, s, s)
    ref = np.linalg.inv(b.astype(np.float64) + shift * np.eye(s))
    for i in range(nb):
        assert rel_err(inv[i], ref[i]) < RTOL, i
    assert rel_err(inv, inv.transpose(0, 2, 1)) < 1e-6              # L^-T L^-1 is symmetric


@pytest.mark.parametrize("method", ["cholesky", "lu", "eigh"])
def test_scalar_blocks(method):
    b = np.array([[[2.0]], [[0.5]], [[0.0]]], np.float32)
    inv, ok = run(InverseOfBlocks(method, 0.5), b)
    assert ok
    np.testing.assert_allclose(inv.ravel(), 1.0 / (b.ravel() + 0.5), rtol=1e-6)


@pytest.mark.parametrize("method", ["cholesky", "lu"])
def test_pynative_split_pipeline(pynative, method):
    rng = np.random.default_rng(10)
    dim, size, shift = 10, 4, 0.05
    m = block_diag(rng, dim, size)
    right = rng.standard_normal((3, dim)).astype(np.float32)
    left = rng.standard_normal((dim, 2)).astype(np.float32)
    _, ok, got_right, got_left, dense = run(
        BlockedInverse(BlockLayout.of(dim, size), method, shift, 0.0), m, right, left)
    ref = np.linalg.inv(m.astype(np.float64) + shift * np.eye(dim))
    assert ok
    assert rel_err(dense, ref) < RTOL
    assert rel_err(got_right, right @ ref) < RTOL
    assert rel_err(got_left, ref @ left) < RTOL


# ---------------------------------------------------------------------------- result check

def test_lu_flags_non_finite_block():
    rng = np.random.default_rng(8)
    b = np.stack([spd(rng, 4), spd(rng, 4)])
    b[1, 0, 0] = np.nan
    _, ok = run(InverseOfBlocks("lu", 0.1), b)
    assert not ok


def test_eigh_flags_indefinite_block():
    rng = np.random.default_rng(9)
    good = spd(rng, 4)
    bad = np.diag([1.0, 1.0, 1.0, -0.5]).astype(np.float32)
    _, ok_good = run(InverseOfBlocks("eigh", 0.1), np.stack([good, good]))
    _, ok_bad = run(InverseOfBlocks("eigh", 0.1), np.stack([good, bad]))
    assert ok_good and not ok_bad
