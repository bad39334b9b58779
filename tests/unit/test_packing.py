"""Buffer packing (parallel/packing.py; pure Python, no device): triangle sizes and indices, the
per-position layout of a flat buffer, and a reduce-scatter emulated with a plan's layouts, against
the NumPy reference packers (tests/reference/numpy_packing.py)."""
import numpy as np
import pytest

from mindspore_ngd.parallel import packing as P
from mindspore_ngd.parallel.packing import pack_layout, tri_size
from mindspore_ngd.parallel.plan import plan_ownership
from reference import numpy_packing as packers


def test_tri_size():
    assert [tri_size(d) for d in (1, 2, 3, 4, 2049)] == [1, 3, 6, 10, 2049 * 2050 // 2]


def test_pack_layout_exact():
    layout = pack_layout([[3, 6], [10], []])
    assert layout.chunk == 10 and layout.total == 30
    assert layout.offsets == ((0, 3), (0,), ())
    assert layout.used == (9, 10, 0) and layout.padding == 11
    assert layout.global_offset(0, 1) == 3 and layout.global_offset(1, 0) == 10
    assert pack_layout([]).chunk == 0 and pack_layout([[], []]).total == 0


def test_pack_and_unpack_buffer_round_trip():
    layout = pack_layout([[3, 6], [10], []])
    values = [[np.arange(3), np.arange(6) + 10], [np.arange(10) + 100], []]
    buf = packers.pack_buffer(layout, values)
    expected = np.zeros(30, np.float32)
    expected[0:3] = [0, 1, 2]
    expected[3:9] = np.arange(6) + 10
    expected[10:20] = np.arange(10) + 100
    np.testing.assert_array_equal(buf, expected)
    back = packers.unpack_buffer(layout, buf)
    for p in range(3):
        for got, want in zip(back[p], values[p]):
            np.testing.assert_array_equal(got, want)
    # a reduce-scatter gives rank p the chunk; unpacking the chunk alone works too
    np.testing.assert_array_equal(packers.unpack_buffer(layout, buf[10:20], 1)[0], values[1][0])
    with pytest.raises(ValueError, match="expected 6 values"):
        packers.pack_buffer(layout, [[np.arange(3), np.arange(5)], [np.arange(10)], []])


def test_pack_symmetric_round_trip_and_indices():
    rng = np.random.default_rng(0)
    for d in (1, 2, 3, 7):
        x = rng.standard_normal((d, d))
        s = x + x.T
        packed = packers.pack_symmetric(s)
        assert packed.shape == (tri_size(d),)
        np.testing.assert_array_equal(packers.unpack_symmetric(packed, d), s)
        np.testing.assert_array_equal(s.reshape(-1)[P.triu_flat_indices(d)], packed)
        np.testing.assert_array_equal(packed[packers.symmetric_from_triu_indices(d)], s)
    np.testing.assert_array_equal(packers.pack_symmetric(np.arange(9).reshape(3, 3)), [0, 1, 2, 4, 5, 8])
    with pytest.raises(ValueError, match="square"):
        packers.pack_symmetric(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="has 6 values"):
        packers.unpack_symmetric(np.zeros(5), 3)


def test_reduce_scatter_emulation_with_plan_layouts():
    """Sum of every rank's packed factors, sliced to each owner, equals the summed factors."""
    rng = np.random.default_rng(1)
    layers = [("a", 5, 3), ("b", 4, 4), ("c", 2, 6), ("d", 3, 2)]
    world = 3
    plan = plan_ownership(layers, world)
    layout = plan.factor_layout()
    assert layout.positions == plan.group_size
    per_rank = []
    for r in range(world):
        facs = {n: tuple(rng.standard_normal((d, d)) for d in (a, g)) for n, a, g in layers}
        facs = {n: tuple(x @ x.T for x in pair) for n, pair in facs.items()}
        per_rank.append(facs)
    buffers = []
    for facs in per_rank:
        values = [[packers.pack_symmetric(facs[plan.items[i].name][k]) for i in plan.items_at(p) for k in (0, 1)]
                  for p in range(plan.group_size)]
        buffers.append(packers.pack_buffer(layout, values, np.float64))
    total = np.sum(buffers, axis=0)                                   # AllReduce(sum) ...
    for r in range(world):
        chunk = total[r * layout.chunk:(r + 1) * layout.chunk]        # ... + local slice
        parts = packers.unpack_buffer(layout, chunk, r)
        for j, i in enumerate(plan.items_at(r)):
            item = plan.items[i]
            for k, dim in enumerate((item.a_dim, item.g_dim)):
                want = sum(per_rank[q][item.name][k] for q in range(world))
                np.testing.assert_allclose(packers.unpack_symmetric(parts[2 * j + k], dim), want, rtol=1e-12)
    grads = plan.gradient_layout()
    assert grads.sizes == tuple(tuple(plan.items[i].a_dim * plan.items[i].g_dim for i in plan.items_at(p))
                                for p in range(plan.group_size))
    assert plan.factor_layout(triangular=False).sizes[0][0] == plan.items[plan.items_at(0)[0]].a_dim ** 2
