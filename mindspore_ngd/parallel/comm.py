"""Collectives of distributed natural-gradient training; the only module that touches
``mindspore.communication``.

:func:`resolve` decides, once per optimizer, whether the engine runs distributed and returns a
:class:`Communicator` (plain Python: world size, rank, backend, :class:`OwnershipPlan`, the chosen
collectives) or None (single device: the engine is exactly the single-device one). The communicator
builds :class:`ParallelOps`, the ``nn.Cell`` the optimizer calls inside its graph:

* ``pack_factors`` / ``reduce_factors`` / ``unpack_factor`` -- every rank's batch A and G of every
  layer, packed as upper triangles into one flat buffer laid out by owner position
  (:meth:`OwnershipPlan.factor_layout`), summed across all ranks; each rank keeps and unpacks
  (symmetrising) its own part. ``ReduceScatter`` of equal zero-padded chunks when the backend has
  it and ``grad_worker_fraction = 1/N``; otherwise one ``AllReduce`` of the unpadded buffer (the
  positions' parts back to back), a mathematically equivalent fallback that moves ~2x the bytes
  (always on CPU: MindSpore 2.10's MCCL has no ReduceScatter kernel). Small replicated statistics (BatchNorm unit-wise Fishers) ride
  along: appended to the AllReduce, or a separate AllReduce after a ReduceScatter;
* ``pack_preconditioned`` / ``gather_preconditioned`` / ``unpack_preconditioned`` -- each rank's
  owned layers' preconditioned gradients, one zero-padded chunk per rank, gathered so that every
  rank has every layer: a world ``AllGather`` when each layer has one owner (``f = 1/N``); for
  ``1/N < f < 1`` an ``AllGather`` inside the owner group where the backend supports subgroup
  AllGather, else (CPU) an ``AllReduce`` over the owner group of a zero buffer holding the rank's
  chunk at its position; nothing at ``f = 1``;
* ``share`` -- ``AllReduce`` (sum) of a small vector over the world: decisions only owners can
  compute (refresh status, relative changes, trace tests) made identical on every rank.

Every collective's input is made to depend on a token from the previous one (see the engine):
the ranks' graphs differ (each holds its own layers), so the order of collectives must be forced
by data dependencies, not left to the scheduler.

Backend support: MCCL (CPU) measured here -- AllReduce(sum) on the world and on subgroups,
AllGather / Broadcast on the world group only, no ReduceScatter. NCCL (GPU) and HCCL (Ascend):
ReduceScatter and subgroup AllGather from MindSpore's documentation, not verified here.
"""
import logging
from fractions import Fraction

import numpy as np

import mindspore as ms
from mindspore import nn, ops, Tensor

from .._graph import transposed
from .packing import tri_size, triu_flat_indices
from .plan import plan_ownership

__all__ = ["Communicator", "ParallelOps", "resolve", "communication_state", "BACKEND_SUPPORT",
           "DISTRIBUTED_CHOICES"]

logger = logging.getLogger("mindspore_ngd")

DISTRIBUTED_CHOICES = ("auto", True, False)

# what each backend can do (MindSpore 2.10): measured on CPU (tests/distributed/test_mccl_collectives.py),
# from the documentation for GPU and Ascend
BACKEND_SUPPORT = {
    "mccl": {"reduce_scatter": False, "subgroup_all_gather": False},
    "nccl": {"reduce_scatter": True, "subgroup_all_gather": True},
    "hccl": {"reduce_scatter": True, "subgroup_all_gather": True},
}

_CREATED_GROUPS = set()


def communication_state():
    """``(initialised, world size, rank, backend)`` of ``mindspore.communication`` (1, 0, None when
    ``init()`` was not called)."""
    from mindspore.communication import management
    if not management.GlobalComm.INITED:
        return False, 1, 0, None
    return True, management.get_group_size(), management.get_rank(), str(management.GlobalComm.BACKEND).lower()


def _backend_name(backend):
    """'mccl' / 'nccl' / 'hccl' from ``GlobalComm.BACKEND`` (``Backend.MCCL``, 'mccl', ...)."""
    text = str(backend).lower()
    for name in BACKEND_SUPPORT:
        if name in text:
            return name
    return text


def resolve(distributed, items, grad_worker_fraction=None, balance="compute", split_dim=None, owner="optimizer"):
    """The :class:`Communicator` for an optimizer, or None to run as on a single device.

    Args:
        distributed: "auto" -- distributed when ``mindspore.communication`` is initialised with more
            than one rank and the parallel mode is ``DATA_PARALLEL``; with more than one rank in
            ``stand_alone`` mode (ranks training independently) a warning and single-device
            behaviour. True -- distributed, raising if communication is not initialised or the
            parallel mode is not ``DATA_PARALLEL``. False -- never communicate: every rank uses its
            own local factors. Not equivalent to large-batch K-FAC, and under ``DATA_PARALLEL`` the
            ranks' weights would drift apart, so that combination raises (use
            ``grad_worker_fraction=1`` for "every rank inverts every layer").
        items: the preconditioned layers (objects with ``name``, ``a_dim``, ``g_dim``).
        grad_worker_fraction, balance, split_dim: as :func:`plan_ownership`.
        owner: name used in messages (the optimizer's class name).
    """
    if distributed not in DISTRIBUTED_CHOICES or not isinstance(distributed, (bool, str)):
        raise ValueError(f"distributed must be 'auto', True or False, got {distributed!r}")
    _check_fraction(grad_worker_fraction)
    initialised, world, rank, backend = communication_state()
    mode = ms.get_auto_parallel_context("parallel_mode")
    if distributed is False:
        if initialised and world > 1 and mode == "data_parallel":
            raise ValueError(
                f"{owner}: distributed=False under DATA_PARALLEL with {world} ranks would precondition the "
                "averaged gradients with each rank's local factors, so the ranks' weights drift apart. Use "
                "distributed='auto' (factors summed across ranks), with grad_worker_fraction=1 if every rank "
                "should invert every layer.")
        return None
    if not initialised:
        if distributed is True:
            raise RuntimeError(f"{owner}: distributed=True needs mindspore.communication.init() to have been "
                               "called (launch with msrun), before the optimizer is built")
        return None
    if world == 1:
        return None
    if mode != "data_parallel":
        if distributed is True or mode != "stand_alone":
            raise ValueError(
                f"{owner}: distributed natural-gradient training needs ms.set_auto_parallel_context("
                f"parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True) before the optimizer is built; "
                f"the parallel mode is {mode!r}")
        logger.warning("%s: %d ranks in stand_alone mode (gradients not averaged): each rank trains alone "
                       "with its own factors; set parallel_mode=DATA_PARALLEL for data-parallel training",
                       owner, world)
        return None
    if not ms.get_auto_parallel_context("gradients_mean"):
        logger.warning("%s: gradients_mean=False: the optimizer receives the SUM of the ranks' gradients "
                       "(the factors are still averaged)", owner)
    plan = plan_ownership(items, world, grad_worker_fraction, balance, split_dim)
    return Communicator(plan, rank, _backend_name(backend))


def _check_fraction(value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise TypeError(f"grad_worker_fraction must be None or a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"grad_worker_fraction must be None or a number in (0, 1], got {value!r}")


class Communicator:
    """World size, rank, backend, ownership plan and the collectives chosen for them.

    Attributes:
        plan (OwnershipPlan): identical on every rank.
        rank, world_size, backend, position (this rank's owner position), owned (per-layer bool),
        factor_collective ("ReduceScatter" or "AllReduce"), gather_collective ("AllGather",
        "AllGather (owner group)", "AllReduce (owner group)" or None).
    """

    def __init__(self, plan, rank, backend):
        self.plan = plan
        self.rank = int(rank)
        self.world_size = plan.world_size
        self.backend = backend
        self.position = plan.position_of(self.rank)
        self.owned = tuple(p == self.position for p in plan.positions)
        support = BACKEND_SUPPORT.get(backend, BACKEND_SUPPORT["mccl"])
        s, m = plan.group_size, plan.grad_workers
        self.factor_collective = "ReduceScatter" if support["reduce_scatter"] and m == 1 else "AllReduce"
        if s == 1:
            self.gather_collective = None
        elif m == 1:
            self.gather_collective = "AllGather"
        elif support["subgroup_all_gather"]:
            self.gather_collective = "AllGather (owner group)"
        else:
            self.gather_collective = "AllReduce (owner group)"
        self.owner_group = plan.group_of(self.rank)
        self.owner_group_name = plan.group_name(self.owner_group) if 1 < s < self.world_size else None

    @property
    def owned_layers(self):
        return self.plan.layers_of(self.rank)

    def describe(self):
        """One line naming the collectives (logged once per optimizer)."""
        if self.factor_collective == "ReduceScatter":
            factors = "factors ReduceScatter"
        elif self.plan.group_size == 1:
            factors = "factors AllReduce (every rank owns every layer)"
        elif BACKEND_SUPPORT.get(self.backend, {}).get("reduce_scatter") is False:
            device = {"mccl": "CPU", "nccl": "GPU", "hccl": "Ascend"}.get(self.backend, self.backend)
            factors = f"factors AllReduce fallback (no ReduceScatter on {device})"
        else:
            factors = "factors AllReduce (ReduceScatter only at grad_worker_fraction 1/N)"
        gather = ("no gather (every rank preconditions every layer)" if self.gather_collective is None
                  else f"preconditioned gradients {self.gather_collective}")
        return (f"parallel: world {self.world_size}, rank {self.rank}, backend {self.backend}, {factors}, "
                f"{gather}, grad_worker_fraction {self.plan.grad_worker_fraction}; this rank owns "
                f"{len(self.owned_layers)} of {len(self.plan.items)} layers")

    def factor_bytes(self):
        """Bytes this rank sends for the packed factors per capture step (ring model): AllReduce
        ``2 (N-1)/N * total``, ReduceScatter ``(N-1)/N * total``."""
        n, layout = self.world_size, self.plan.factor_layout()
        if self.factor_collective == "AllReduce":
            return 2 * (n - 1) / n * sum(layout.used) * 4
        return (n - 1) / n * layout.total * 4

    def ops(self, replicated=0, create_groups=True):
        """The graph-mode :class:`ParallelOps` cell; ``replicated``: floats of statistics every rank
        needs in full (BatchNorm Fishers). ``create_groups=False`` skips creating the owner group
        (packing tests without communication)."""
        if create_groups and self.owner_group_name is not None and self.gather_collective != "AllGather":
            _create_group(self.owner_group_name, self.owner_group)
        return ParallelOps(self, replicated)


def _create_group(name, ranks):
    if name in _CREATED_GROUPS:
        return
    from mindspore.communication import create_group
    create_group(name, list(ranks))
    _CREATED_GROUPS.add(name)


def _world_group():
    from mindspore.communication import GlobalComm
    return GlobalComm.WORLD_COMM_GROUP


class ParallelOps(nn.Cell):
    """Packing and collectives called from the optimizer's graph (see the module docstring).

    Layers are numbered as in the plan (the optimizer's ``layer_specs``)."""

    def __init__(self, comm, replicated=0):
        super().__init__(auto_prefix=False)
        plan = comm.plan
        world = _world_group()
        self.world_size = comm.world_size
        self.grad_workers = plan.grad_workers
        self.num_layers = len(plan.items)
        self.positions = plan.group_size
        self.position = comm.position
        self.owned = comm.owned
        self.a_dims = tuple(item.a_dim for item in plan.items)
        self.g_dims = tuple(item.g_dim for item in plan.items)
        # a diagonal A (an embedding's) travels as its entries, and its layer's matrix is (a_dim, g_dim)
        self.a_diagonal = tuple(item.a_diagonal for item in plan.items)
        self.matrix_shapes = tuple(item.matrix_shape for item in plan.items)
        self.items_at = tuple(plan.items_at(p) for p in range(plan.group_size))
        # where layer k sits: its position and its index among that position's items
        slot = [0] * self.num_layers
        for p in range(plan.group_size):
            for j, k in enumerate(self.items_at[p]):
                slot[k] = j
        self.slot = tuple(slot)
        self.layer_position = tuple(plan.positions)
        self.factor_layout = plan.factor_layout(triangular=True)
        self.scatter = comm.factor_collective == "ReduceScatter"
        # where each position's part starts in the factor buffer: equal chunks for ReduceScatter,
        # back to back (no padding) for AllReduce
        used = self.factor_layout.used
        self.factor_starts = tuple(p * self.factor_layout.chunk if self.scatter else sum(used[:p])
                                   for p in range(plan.group_size))
        self.factor_total = self.factor_layout.total if self.scatter else sum(used)
        self.gradient_layout = plan.gradient_layout()
        # upper-triangle indices, one constant per distinct side of a square factor (int32: sides up to 46340)
        squares = {d for d, diagonal in zip(self.a_dims, self.a_diagonal) if not diagonal}
        dims = sorted(squares | set(self.g_dims))
        self.a_slots = tuple(-1 if diagonal else dims.index(d) for d, diagonal in zip(self.a_dims, self.a_diagonal))
        self.g_slots = tuple(dims.index(d) for d in self.g_dims)
        self.tri_gather = tuple(Tensor(triu_flat_indices(d).astype(np.int32)) for d in dims)
        self.tri_scatter = tuple(Tensor(triu_flat_indices(d).astype(np.int32).reshape(-1, 1)) for d in dims)
        self.replicated = int(replicated)
        if self.scatter:
            self.reduce_op = ops.ReduceScatter(ops.ReduceOp.SUM, world)
            self.replicate_op = ops.AllReduce(ops.ReduceOp.SUM, world)
        else:
            self.reduce_op = ops.AllReduce(ops.ReduceOp.SUM, world)
        self.gather_mode = comm.gather_collective
        if self.gather_mode == "AllGather":
            self.gather_op = ops.AllGather(world)
        elif self.gather_mode == "AllGather (owner group)":
            self.gather_op = ops.AllGather(comm.owner_group_name)
        elif self.gather_mode == "AllReduce (owner group)":
            self.gather_op = ops.AllReduce(ops.ReduceOp.SUM, comm.owner_group_name)
        self.share_op = ops.AllReduce(ops.ReduceOp.SUM, world)

    # ------------------------------------------------------------------ symmetric packing
    def triu(self, matrix, slot):
        """Upper triangle (diagonal included) of a square matrix, row by row (``slot``: its side's
        index constants)."""
        return ops.gather(matrix.reshape(-1), self.tri_gather[slot], 0)

    def symmetric(self, packed, slot, dim):
        """The symmetric ``dim x dim`` matrix whose upper triangle is ``packed``: scatter into the
        triangle, then ``U + U^T - diag(U)`` (no ``dim^2`` index array)."""
        upper = ops.scatter_nd(self.tri_scatter[slot], packed, (dim * dim,)).reshape(dim, dim)
        return upper + transposed(upper) - ops.diag(ops.diagonal(upper))

    @staticmethod
    def _padded(pieces, used, chunk):
        if chunk > used:
            pieces += (ops.zeros((chunk - used,), ms.float32),)
        return ops.concat(pieces) if len(pieces) > 1 else pieces[0]

    # ------------------------------------------------------------------ factors
    def pack_factors(self, a_batches, g_batches):
        """Every layer's batch (A, G) triangles (a diagonal A: its entries) in one buffer of
        ``factor_total`` floats, by position."""
        layout = self.factor_layout
        pieces = ()
        for p in range(self.positions):
            for k in self.items_at[p]:
                a_piece = a_batches[k] if self.a_diagonal[k] else self.triu(a_batches[k], self.a_slots[k])
                pieces += (a_piece, self.triu(g_batches[k], self.g_slots[k]))
            if self.scatter and layout.chunk > layout.used[p]:
                pieces += (ops.zeros((layout.chunk - layout.used[p],), ms.float32),)
        return ops.concat(pieces) if len(pieces) > 1 else pieces[0]

    def reduce_factors(self, flat, replicated):
        """(this rank's part of the sum of ``flat`` over all ranks, sum of ``replicated``); with no
        replicated statistics pass ``replicated=None`` and get the part alone."""
        if self.scatter:
            own = self.reduce_op(flat)
            if replicated is None:
                return own
            return own, self.replicate_op(ops.depend(replicated, own))
        start = self.factor_starts[self.position]
        stop = start + self.factor_layout.used[self.position]
        if stop == start:               # a position that owns nothing: any non-empty slice will do
            start, stop = 0, 1
        if replicated is None:
            return self.reduce_op(flat)[start:stop]
        total = self.reduce_op(ops.concat((flat, replicated)))
        return total[start:stop], total[self.factor_total:]

    def unpack_factor(self, chunk, k, which):
        """The symmetric A (``which=0``) or G (1) of owned layer ``k`` from this rank's part (a diagonal A
        as its (a_dim,) entries)."""
        j = 2 * self.slot[k] + which
        dim = self.g_dims[k] if which else self.a_dims[k]
        slot = self.g_slots[k] if which else self.a_slots[k]
        offset = self.factor_layout.offsets[self.position][j]
        if not which and self.a_diagonal[k]:
            return chunk[offset:offset + dim]
        return self.symmetric(chunk[offset:offset + tri_size(dim)], slot, dim)

    # ------------------------------------------------------------------ preconditioned gradients
    def pack_preconditioned(self, matrices):
        """This rank's chunk: its owned layers' matrices (``matrices``: owned layers in layer order)."""
        layout = self.gradient_layout
        pieces = ()
        for matrix in matrices:
            pieces += (matrix.reshape(-1),)
        if not pieces:
            return ops.zeros((layout.chunk,), ms.float32)
        return self._padded(pieces, layout.used[self.position], layout.chunk)

    def placed(self, chunk):
        """A zero buffer of ``s`` chunks holding ``chunk`` at this rank's position (the input of the
        owner-group AllReduce that stands in for AllGather on CPU)."""
        pieces = ()
        size = self.gradient_layout.chunk
        if self.position:
            pieces += (ops.zeros((self.position * size,), ms.float32),)
        pieces += (chunk,)
        if self.position < self.positions - 1:
            pieces += (ops.zeros(((self.positions - 1 - self.position) * size,), ms.float32),)
        return ops.concat(pieces) if len(pieces) > 1 else chunk

    def gather_preconditioned(self, chunk):
        """Every position's chunk, position order (``s * chunk`` floats)."""
        if self.gather_mode == "AllReduce (owner group)":
            return self.gather_op(self.placed(chunk))
        return self.gather_op(chunk)

    def unpack_preconditioned(self, gathered):
        """Every layer's preconditioned matrix (``WorkItem.matrix_shape``) from the gathered buffer."""
        layout = self.gradient_layout
        out = ()
        for k in range(self.num_layers):
            p = self.layer_position[k]
            start = p * layout.chunk + layout.offsets[p][self.slot[k]]
            size = self.g_dims[k] * self.a_dims[k]
            out += (gathered[start:start + size].reshape(self.matrix_shapes[k]),)
        return out

    # ------------------------------------------------------------------ decisions
    def share(self, vector):
        """Sum of a small float vector over all ranks."""
        return self.share_op(vector)
