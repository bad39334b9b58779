"""The damped inverse of one factor (curvature/inverse.py: sanitize + damped_inverse) against NumPy
for every method, and its validity flag on an indefinite factor that the cheap checks miss.
Block-diagonal inverses are test_blocks.py."""
import numpy as np
import pytest

from mindspore import nn, ops, Tensor

from mindspore_ngd.curvature import inverse as inv_ops


class _Inverse(nn.Cell):
    def __init__(self, method, jitter):
        super().__init__()
        self.method, self.jitter = method, jitter

    def construct(self, m, shift):
        safe, valid = inv_ops.sanitize(m)
        inv, ok = inv_ops.damped_inverse(safe, shift, self.method, inv_ops.trace_jitter(safe, self.jitter))
        return inv, ops.logical_and(ok, valid)


@pytest.mark.parametrize("method", ["cholesky", "lu", "eigh"])
@pytest.mark.parametrize("n", [1, 7, 64])
def test_inverse_paths_match_numpy(method, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3 * n))
    m = (x @ x.T / (3 * n)).astype(np.float32)
    inv, ok = _Inverse(method, 1e-6)(Tensor(m), Tensor(np.float32(0.05)))
    expected = np.linalg.inv(m.astype(np.float64) + (0.05 + 1e-6 * np.trace(m)) * np.eye(n))
    assert bool(ok.asnumpy())
    np.testing.assert_allclose(inv.asnumpy(), expected, rtol=2e-4, atol=2e-5 * np.abs(expected).max())


def test_eigh_path_flags_an_indefinite_factor_that_passes_the_cheap_checks():
    # diagonal >= 0 and |m_ij| <= sqrt(m_ii m_jj), but eigenvalues (1 + 2*0.9, 1 - 0.9 - 0.9 < 0)
    m = np.array([[1, 0.9, 0.9], [0.9, 1, -0.9], [0.9, -0.9, 1]], np.float32)
    assert np.linalg.eigvalsh(m)[0] < 0
    _, ok = _Inverse("eigh", 0.0)(Tensor(m), Tensor(np.float32(1e-3)))
    assert not bool(ok.asnumpy())
