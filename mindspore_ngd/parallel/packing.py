"""Flat buffers of the distributed engine's collectives: which float of a buffer holds what.

Pure Python (NumPy for index arrays): no device, no MindSpore import. A symmetric ``d x d`` factor
travels as its upper triangle, row by row (:func:`tri_size` floats, gathered from the matrix with
:func:`triu_flat_indices`); the items of every owner position are laid out by a :class:`PackLayout`
(:meth:`~mindspore_ngd.parallel.plan.OwnershipPlan.factor_layout` and ``gradient_layout`` build
them from an ownership plan). :mod:`.comm` packs and unpacks with these offsets inside the graph.
"""
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from .._validate import int_at_least

__all__ = ["tri_size", "PackLayout", "pack_layout", "triu_flat_indices"]


def tri_size(dim):
    """Floats in the upper triangle (diagonal included) of a ``dim x dim`` matrix."""
    return dim * (dim + 1) // 2


@dataclass(frozen=True)
class PackLayout:
    """Every position's items packed into one equal-size chunk (padded to the largest).

    Position ``p``'s chunk is ``buffer[p * chunk:(p + 1) * chunk]`` of a buffer of ``total``
    floats; its item ``j`` is at ``offsets[p][j]`` inside the chunk, ``sizes[p][j]`` long, and
    ``chunk - used[p]`` padding floats end the chunk. A reduce-scatter of the buffer gives rank
    ``p`` (of the group) its chunk; an all-gather of the chunks rebuilds the buffer on every rank.
    """
    sizes: Tuple[Tuple[int, ...], ...]
    offsets: Tuple[Tuple[int, ...], ...]
    chunk: int

    @property
    def positions(self):
        return len(self.sizes)

    @property
    def used(self):
        return tuple(sum(s) for s in self.sizes)

    @property
    def total(self):
        return self.chunk * self.positions

    @property
    def padding(self):
        """Padding floats over all chunks (``total - sum(used)``)."""
        return self.total - sum(self.used)

    def global_offset(self, position, j):
        """Offset of item ``j`` of ``position`` in the full buffer."""
        return position * self.chunk + self.offsets[position][j]


def pack_layout(sizes_per_position):
    """:class:`PackLayout` for ``sizes_per_position[p] = [floats of each item of position p]``.

    Items keep their order; the chunk size is the largest per-position total (0 if all are empty).
    """
    sizes, offsets = [], []
    for p, row in enumerate(sizes_per_position):
        row = tuple(int_at_least(f"size {j} of position {p}", s, 0) for j, s in enumerate(row))
        starts, at = [], 0
        for s in row:
            starts.append(at)
            at += s
        sizes.append(row)
        offsets.append(tuple(starts))
    chunk = max((sum(r) for r in sizes), default=0)
    return PackLayout(sizes=tuple(sizes), offsets=tuple(offsets), chunk=chunk)


def triu_flat_indices(dim):
    """Flat (row-major) indices of the upper triangle of a ``dim x dim`` matrix, row by row:
    ``pack = matrix.reshape(-1)[triu_flat_indices(dim)]`` (usable with a gather op)."""
    rows, cols = np.triu_indices(dim)
    return (rows * dim + cols).astype(np.int64)
