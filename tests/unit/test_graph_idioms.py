"""The single-primitive idioms of ``mindspore_ngd._graph`` give exactly the values of the indexing,
``swapaxes``, ``ops.outer`` and ``ops.narrow`` forms they replace, in graph mode."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops, Tensor

from mindspore_ngd import _graph


class _Idioms(nn.Cell):
    def construct(self, v, m, b):
        return (_graph.first(v), _graph.corner(m), _graph.top_left(m, 2, 3),
                _graph.transposed(m), _graph.transposed(b), _graph.columns(m, 1, 2), _graph.outer(v, v))


def test_idioms_match_numpy_indexing_in_graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(0)
    v = rng.standard_normal(5).astype(np.float32)
    m = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 2, 4)).astype(np.float32)
    got = [x.asnumpy() for x in _Idioms()(Tensor(v), Tensor(m), Tensor(b))]
    expected = [v[0], m[0, 0], m[:2, :3], m.T, b.swapaxes(-1, -2), m[:, 1:3], np.outer(v, v)]
    for value, ref in zip(got, expected):
        assert value.shape == np.shape(ref)
        np.testing.assert_array_equal(value, ref)


class _Quotients(nn.Cell):
    def construct(self, m, row, s):
        return _graph.divide(m, row), _graph.divide(m, s), _graph.divide(m, 7), m / row, m / s, m / 7


def test_divide_is_the_division_operator_bit_for_bit_in_graph_mode():
    """``divide`` (RealDiv, kept for its memory) gives exactly what ``/`` (Div) gives: a matrix by a
    broadcast row, by a 0-d tensor and by a Python int."""
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(1)
    m = rng.standard_normal((6, 5)).astype(np.float32)
    row = (rng.random((1, 5)) + 0.5).astype(np.float32)
    s = np.float32(3.0)
    got = [x.asnumpy() for x in _Quotients()(Tensor(m), Tensor(row), Tensor(s))]
    for value, ref in zip(got[:3], got[3:]):
        assert value.dtype == np.float32 and value.shape == m.shape
        np.testing.assert_array_equal(value, ref)
    np.testing.assert_array_equal(got[0], m / row)


class _Permuted(nn.Cell):
    """The transposes as the engine uses them: consumed by arithmetic (the symmetrised factor, the
    unpacked symmetric matrix), reshaped (conv patches) and fed to a batched product (block splits)."""

    def construct(self, m, stack, blocks):
        sym = (m + _graph.transposed(m)) * 0.5
        cols = _graph.permuted(stack, (1, 0, 2)).reshape(stack.shape[1], -1)
        grouped = _graph.permuted(blocks, (1, 0, 2))
        return sym, cols, grouped * 2.0, _graph.transposed(m * 3.0)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("dim", [5, 2049])
def test_permute_transposes_give_exactly_the_transposed_values(mode, dim):
    """``transposed`` and ``permuted`` (``mint.permute``, kept for its memory) give exactly NumPy's
    transposes where the engine consumes them, small and factor-sized, in both modes."""
    ms.set_context(mode=mode)
    try:
        rng = np.random.default_rng(dim)
        m = rng.standard_normal((dim, dim)).astype(np.float32)
        stack = rng.standard_normal((3, 7, 4)).astype(np.float32)
        blocks = rng.standard_normal((6, 2, 5)).astype(np.float32)
        got = [x.asnumpy() for x in _Permuted()(Tensor(m), Tensor(stack), Tensor(blocks))]
        expected = [(m + m.T) * np.float32(0.5), stack.transpose(1, 0, 2).reshape(7, -1),
                    blocks.transpose(1, 0, 2) * np.float32(2.0), (m * np.float32(3.0)).T]
        for value, ref in zip(got, expected):
            assert value.shape == ref.shape
            np.testing.assert_array_equal(value, ref)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def _damped_square(m, shift):
    """A per-layer computation with a branch-free check, as the fold and refresh are."""
    out = ops.matmul(m, m) + shift * ops.eye(m.shape[0], m.shape[0], m.dtype)
    ok = ops.isfinite(out).all()
    return _graph.choose(ok, out, m), ok


class _PerLayer(nn.Cell):
    def __init__(self, fn, count, dim):
        super().__init__()
        rng = np.random.default_rng(1)
        self.fn = fn
        self.mats = ms.ParameterTuple([ms.Parameter(Tensor(rng.standard_normal((dim, dim)).astype(np.float32)),
                                                    name=f"m{k}") for k in range(count)])

    def construct(self, shift):
        out = ()
        for m in self.mats:
            value, ok = self.fn(m, shift)
            out += (value, ok)
        return out


def test_a_per_shape_subgraph_is_a_no_inline_copy_on_cpu_and_ascend_and_the_function_itself_on_gpu():
    reused = _graph.per_shape_subgraph(_damped_square, "CPU")
    assert reused is not _damped_square and reused.no_inline is True
    assert not hasattr(_damped_square, "no_inline")          # the inlined original is left as it was
    assert _graph.per_shape_subgraph(_damped_square, "Ascend") is reused
    assert _graph.per_shape_subgraph(_damped_square, "GPU") is _damped_square


def test_a_per_shape_subgraph_gives_the_inlined_values_bit_for_bit_in_graph_mode():
    """Eight layers of two shapes through one subgraph each, against the same function inlined."""
    ms.set_context(mode=ms.GRAPH_MODE)
    shift = Tensor(np.float32(0.1))
    for dim in (4, 6):
        inlined = [x.asnumpy() for x in _PerLayer(_damped_square, 4, dim)(shift)]
        reused = [x.asnumpy() for x in _PerLayer(_graph.per_shape_subgraph(_damped_square, "CPU"), 4, dim)(shift)]
        assert len(inlined) == len(reused) == 8
        for a, b in zip(inlined, reused):
            np.testing.assert_array_equal(a, b)
