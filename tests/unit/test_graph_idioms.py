"""The single-primitive idioms of ``mindspore_ngd._graph`` give exactly the values of the indexing,
``swapaxes``, ``ops.outer`` and ``ops.narrow`` forms they replace, in graph mode."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

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
