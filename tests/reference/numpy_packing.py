"""NumPy reference packers for the distributed engine's flat buffers (test oracles).

The engine packs in graph mode (:mod:`mindspore_ngd.parallel.comm`): the upper triangles of the
symmetric factors, row by row, and every owner position's items laid out in one buffer as a
``PackLayout`` of :mod:`mindspore_ngd.parallel.plan` describes. These are the plain NumPy versions
the tests compare it with. A layout is read through its attributes only (``positions``, ``sizes``,
``offsets``, ``chunk``, ``total``, ``global_offset``); nothing here imports mindspore_ngd.
"""
import numpy as np

__all__ = ["symmetric_from_triu_indices", "pack_symmetric", "unpack_symmetric", "pack_buffer", "unpack_buffer"]


def symmetric_from_triu_indices(dim):
    """``(dim, dim)`` indices into the packed triangle: ``matrix = packed[symmetric_from_triu_indices(dim)]``
    rebuilds the symmetric matrix (entry ``(i, j)`` reads the packed ``(min, max)``)."""
    i, j = np.meshgrid(np.arange(dim), np.arange(dim), indexing="ij")
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    # row lo of the upper triangle starts at lo*dim - lo*(lo-1)/2
    return (lo * dim - lo * (lo - 1) // 2 + (hi - lo)).astype(np.int64)


def pack_symmetric(matrix):
    """Upper triangle (diagonal included) of a square matrix, row by row."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"pack_symmetric needs a square matrix, got shape {matrix.shape}")
    return matrix[np.triu_indices(matrix.shape[0])]


def unpack_symmetric(packed, dim):
    """The symmetric ``dim x dim`` matrix whose upper triangle is ``packed``."""
    packed = np.asarray(packed).reshape(-1)
    size = dim * (dim + 1) // 2
    if packed.size != size:
        raise ValueError(f"a packed {dim}x{dim} triangle has {size} values, got {packed.size}")
    return packed[symmetric_from_triu_indices(dim)]


def pack_buffer(layout, values_per_position, dtype=np.float32):
    """One flat buffer (``layout.total``) with every position's items, zero padded.
    ``values_per_position[p][j]`` is any array of ``layout.sizes[p][j]`` elements."""
    if len(values_per_position) != layout.positions:
        raise ValueError(f"expected values for {layout.positions} positions, got {len(values_per_position)}")
    buf = np.zeros(layout.total, dtype)
    for p, values in enumerate(values_per_position):
        if len(values) != len(layout.sizes[p]):
            raise ValueError(f"position {p}: expected {len(layout.sizes[p])} items, got {len(values)}")
        for j, v in enumerate(values):
            v = np.asarray(v).reshape(-1)
            if v.size != layout.sizes[p][j]:
                raise ValueError(f"position {p} item {j}: expected {layout.sizes[p][j]} values, got {v.size}")
            start = layout.global_offset(p, j)
            buf[start:start + v.size] = v
    return buf


def unpack_buffer(layout, buffer, position=None):
    """The items of one position (from its chunk, or from the full buffer when the buffer has
    ``layout.total`` values), or of every position when ``position`` is None."""
    buffer = np.asarray(buffer).reshape(-1)
    if position is None:
        if buffer.size != layout.total:
            raise ValueError(f"the full buffer has {layout.total} values, got {buffer.size}")
        return [unpack_buffer(layout, buffer, p) for p in range(layout.positions)]
    if buffer.size == layout.total:
        chunk = buffer[position * layout.chunk:(position + 1) * layout.chunk]
    elif buffer.size == layout.chunk:
        chunk = buffer
    else:
        raise ValueError(f"expected a chunk of {layout.chunk} or a buffer of {layout.total} values, "
                         f"got {buffer.size}")
    return [chunk[o:o + s] for o, s in zip(layout.offsets[position], layout.sizes[position])]
