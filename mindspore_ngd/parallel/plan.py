"""Layer ownership for distributed natural-gradient training.

Pure Python: no device, no MindSpore import. Every rank builds the same plan from the same inputs,
so no communication is needed to agree on it. How the owners' factors and preconditioned gradients
are laid out in the collectives' flat buffers is :mod:`.packing` (:meth:`OwnershipPlan.factor_layout`,
:meth:`OwnershipPlan.gradient_layout`).

Ranks, owner groups and replicas
--------------------------------
``world_size = N`` ranks, ``grad_worker_fraction = f``, ``m = f * N`` ranks hold each layer's
factors and inverses ("gradient workers" in KAISA's terms, Pauloski et al. SC'21). ``m`` must
divide ``N``; the ranks are cut into ``m`` *owner groups* of ``s = N / m`` consecutive ranks::

    rank r  ->  owner group r // s,  position r % s

Within an owner group the layers are assigned to the ``s`` positions by greedy
longest-processing-time (LPT); the assignment is the same in every group, so layer ``l`` is owned
by position ``p(l)`` of every group, i.e. by ``m`` ranks: ``p(l), p(l) + s, ..., p(l) + (m-1) s``.
Ranks that share a position form a *replica group* (``m`` ranks that hold the same layers).

One step of the scheme this plan describes (per preconditioned layer ``l``):

1. factors: every rank's batch factors are summed at the owners of ``l``: a reduce-scatter inside
   each owner group (each position receives the group's sum of its layers' factors), then an
   all-reduce inside each replica group (sum over the ``m`` groups);
2. the owners update moving averages, invert and precondition ``l`` (identical on the ``m`` owners);
3. preconditioned gradients: an all-gather inside each owner group gives every rank every layer.

Effect of the knob (``n_layers`` layers, factor floats ``F``, gradient floats ``W``):

============  =========================  ==================================  ======================
f             factors+inverses per rank  communication per step              inversions per rank
============  =========================  ==================================  ======================
1/N (s = N)   ~ F / N (memory-optimal)   reduce-scatter(F) + all-gather(W)   ~ 1/N of the work
m/N           ~ F * m / N                RS(F) in s + AR(F/s) in m + AG(W)   ~ m/N of the work
1   (s = 1)   F (every rank, all)        all-reduce(F), no gather            all of it (redundant)
============  =========================  ==================================  ======================

Larger ``f`` replicates the inverses on more ranks: more memory and inversion work per rank, a
gather over fewer ranks, and at ``f = 1`` no gather at all (KAISA's COMM-OPT end). With more ranks
than layers (``s > n_layers``) some positions own nothing; the makespan is then bounded below by the
largest layer's cost whatever the plan.

Cost model of the planner
-------------------------
``balance="compute"``: inverting a ``d x d`` factor costs ``d^3`` (Cholesky/eigh are ``O(d^3)``);
a layer costs ``a_dim^3 + g_dim^3``. With ``split_dim`` (THOR-style block-diagonal inverses) a
factor costs ``count * size^3`` of its :func:`block_layout`. ``balance="memory"``: a layer costs
``a_dim^2 + g_dim^2`` (floats of the two factors; the inverses are as large again).
"""
from dataclasses import dataclass
from fractions import Fraction
import heapq
import numbers
from types import MappingProxyType
from typing import Tuple

from .._validate import int_at_least as _int
from ..curvature.blocks import inverse_cubes
from .packing import pack_layout, tri_size

__all__ = ["WorkItem", "OwnershipPlan", "plan_ownership", "lpt_assign", "grad_workers", "factor_cost"]

BALANCES = ("compute", "memory")


@dataclass(frozen=True)
class WorkItem:
    """One preconditioned layer: its name, the sides of its A and G factors, and whether A is diagonal
    (an embedding's, kept as its ``a_dim`` diagonal entries: it travels and inverts as a vector, and the
    layer's preconditioned matrix keeps the table's ``(a_dim, g_dim)`` orientation)."""
    name: str
    a_dim: int
    g_dim: int
    a_diagonal: bool = False

    @property
    def matrix_shape(self):
        """The shape of the layer's preconditioned gradient matrix: ``(g_dim, a_dim)``, or the table's
        ``(a_dim, g_dim)`` with a diagonal A."""
        return (self.a_dim, self.g_dim) if self.a_diagonal else (self.g_dim, self.a_dim)

    def costs(self, balance="compute", split_dim=None):
        """:func:`factor_cost` of A plus G; a diagonal A costs its ``a_dim`` entries either way."""
        a_cost = self.a_dim if self.a_diagonal else factor_cost(self.a_dim, balance, split_dim)
        return a_cost + factor_cost(self.g_dim, balance, split_dim)

    def factor_sizes(self, triangular=True):
        """Floats of (A, G) as packed: upper triangles (or whole squares), a diagonal A's entries."""
        size = tri_size if triangular else (lambda d: d * d)
        return [self.a_dim if self.a_diagonal else size(self.a_dim), size(self.g_dim)]

    @classmethod
    def of(cls, item):
        """A ``WorkItem`` from a ``WorkItem``, an object with ``name/a_dim/g_dim`` (e.g. the engine's
        ``LayerSpec``, whose ``a_diagonal`` is read too) or a ``(name, a_dim, g_dim)`` tuple."""
        if isinstance(item, cls):
            return item
        diagonal = False
        if all(hasattr(item, k) for k in ("name", "a_dim", "g_dim")):
            name, a_dim, g_dim = item.name, item.a_dim, item.g_dim
            diagonal = getattr(item, "a_diagonal", False)
        else:
            try:
                name, a_dim, g_dim = item
            except (TypeError, ValueError):
                raise TypeError(f"a work item must be (name, a_dim, g_dim) or have those attributes, "
                                f"got {item!r}") from None
        if not isinstance(name, str):
            raise TypeError(f"work item name must be a str, got {type(name).__name__} {name!r}")
        if not isinstance(diagonal, bool):
            raise TypeError(f"a_diagonal of {name!r} must be a bool, got {type(diagonal).__name__}")
        return cls(name, _int(f"a_dim of {name!r}", a_dim, 1), _int(f"g_dim of {name!r}", g_dim, 1), diagonal)


def factor_cost(dim, balance="compute", split_dim=None):
    """Cost of one ``dim x dim`` factor: ``dim^3`` (compute) or ``dim^2`` (memory).

    With ``split_dim`` and ``balance="compute"`` the factor is inverted as ``ceil(dim / split_dim)``
    diagonal blocks of ``split_dim`` (the last one padded, as the engine's ``BlockLayout``), costing
    ``count * split_dim^3``. The memory cost is always ``dim^2`` (the factor is stored whole).
    """
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {list(BALANCES)}, got {balance!r}")
    if balance == "memory":
        return dim * dim
    return inverse_cubes(dim, split_dim)


def grad_workers(world_size, grad_worker_fraction):
    """``m = f * N``, the number of ranks holding each layer, validated: ``m`` must divide ``N``.

    ``grad_worker_fraction`` may be a float, an int (1) or a ``fractions.Fraction``; ``None`` means
    ``1 / world_size``. Raises ValueError naming the allowed values otherwise.
    """
    world_size = _int("world_size", world_size, 1)
    if grad_worker_fraction is None:
        return 1
    divisors = [k for k in range(1, world_size + 1) if world_size % k == 0]
    allowed = ", ".join(str(Fraction(k, world_size)) for k in divisors)
    message = (f"grad_worker_fraction must be k/world_size where k divides world_size={world_size} "
               f"(k ranks hold each inverse), i.e. one of {{{allowed}}}; got {grad_worker_fraction!r}")
    if isinstance(grad_worker_fraction, bool) or not isinstance(grad_worker_fraction, numbers.Real):
        raise TypeError(message)
    value = grad_worker_fraction * world_size
    m = round(value)
    if abs(value - m) > 1e-9 * world_size or m not in divisors:
        raise ValueError(message)
    return int(m)


def lpt_assign(costs, bins):
    """Greedy longest-processing-time assignment of ``costs`` to ``bins`` bins.

    Items are taken by cost descending (ties: lower original index first) and each goes to the
    least-loaded bin (ties: lowest bin index). Returns the bin of every item, in input order.
    Graham (1969): makespan <= (4/3 - 1/(3 bins)) * optimal makespan.
    """
    bins = _int("bins", bins, 1)
    costs = list(costs)
    for c in costs:
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or c < 0:
            raise ValueError(f"costs must be numbers >= 0, got {c!r}")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(0, b) for b in range(bins)]        # (load, bin): the minimum is least loaded, lowest index
    where = [0] * len(costs)
    for i in order:
        load, b = heapq.heappop(heap)
        where[i] = b
        heapq.heappush(heap, (load + costs[i], b))
    return tuple(where)


@dataclass(frozen=True)
class OwnershipPlan:
    """Which ranks own (average, invert, precondition) which layers. Build with :func:`plan_ownership`.

    Attributes:
        items: the layers, in the caller's order.
        world_size: ``N``.
        grad_workers: ``m``, ranks per layer (= number of owner groups).
        balance: "compute" or "memory".
        split_dim: block size used for the compute cost, or None.
        costs: cost of every item, in item order.
        positions: owner position of every item, in item order.
    """
    items: Tuple[WorkItem, ...]
    world_size: int
    grad_workers: int
    balance: str
    split_dim: object
    costs: Tuple[int, ...]
    positions: Tuple[int, ...]

    # ----------------------------------------------------------------- structure
    @property
    def grad_worker_fraction(self):
        return Fraction(self.grad_workers, self.world_size)

    @property
    def group_size(self):
        """``s = N / m``: ranks that split the layers among themselves (positions 0 .. s-1)."""
        return self.world_size // self.grad_workers

    @property
    def layer_names(self):
        return tuple(item.name for item in self.items)

    @property
    def owner_position(self):
        """Read-only mapping ``layer name -> owner position``."""
        return MappingProxyType(dict(zip(self.layer_names, self.positions)))

    def _index(self, layer):
        for i, item in enumerate(self.items):
            if item.name == layer:
                return i
        raise KeyError(f"no layer named {layer!r} in the plan")

    def _check_rank(self, rank):
        rank = _int("rank", rank, 0)
        if rank >= self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return rank

    def position_of(self, rank):
        return self._check_rank(rank) % self.group_size

    def owners(self, layer):
        """Ranks that own ``layer``: its position in every owner group, ascending."""
        p = self.positions[self._index(layer)]
        return tuple(g * self.group_size + p for g in range(self.grad_workers))

    def layers_of(self, rank):
        """Names of the layers ``rank`` owns, in item order (empty for an idle position)."""
        p = self.position_of(rank)
        return tuple(item.name for item, q in zip(self.items, self.positions) if q == p)

    def items_at(self, position):
        """Indices (into ``items``) of the layers owned by ``position``, in item order."""
        return tuple(i for i, q in enumerate(self.positions) if q == position)

    @property
    def groups(self):
        """Owner groups: ``m`` tuples of ``s`` consecutive ranks (for reduce-scatter / all-gather)."""
        s = self.group_size
        return tuple(tuple(range(g * s, (g + 1) * s)) for g in range(self.grad_workers))

    def group_of(self, rank):
        """The owner group of ``rank``."""
        return self.groups[self._check_rank(rank) // self.group_size]

    @property
    def replica_groups(self):
        """``s`` tuples of ``m`` ranks sharing a position (they hold the same layers; all-reduce of
        the owners' partial factor sums)."""
        s = self.group_size
        return tuple(tuple(p + g * s for g in range(self.grad_workers)) for p in range(s))

    def replica_group_of(self, rank):
        return self.replica_groups[self.position_of(rank)]

    def group_name(self, ranks):
        """Deterministic communication-group name for an owner or replica group of this plan."""
        ranks = tuple(ranks)
        if ranks in self.groups:
            return f"ngd_owner_{self.grad_workers}x{self.group_size}_{self.groups.index(ranks)}"
        if ranks in self.replica_groups:
            return f"ngd_replica_{self.group_size}x{self.grad_workers}_{self.replica_groups.index(ranks)}"
        raise ValueError(f"{ranks} is not an owner or replica group of this plan")

    # ----------------------------------------------------------------- balance
    def load(self, position):
        """Total cost of the layers at ``position``."""
        return sum(c for c, q in zip(self.costs, self.positions) if q == position)

    @property
    def loads(self):
        return tuple(self.load(p) for p in range(self.group_size))

    @property
    def makespan(self):
        """Largest per-position cost (the step's inversion time is proportional to it)."""
        return max(self.loads) if self.items else 0

    @property
    def total_cost(self):
        return sum(self.costs)

    @property
    def lower_bound(self):
        """``max(largest cost, total / s)`` <= the optimal makespan."""
        if not self.items:
            return 0
        return max(max(self.costs), self.total_cost / self.group_size)

    @property
    def idle_positions(self):
        return tuple(p for p in range(self.group_size) if not self.items_at(p))

    # ----------------------------------------------------------------- packing layouts
    def factor_sizes(self, position, triangular=True):
        """Float counts of the A and G factors of the layers at ``position``: [A0, G0, A1, G1, ...]."""
        out = []
        for i in self.items_at(position):
            out += self.items[i].factor_sizes(triangular)
        return out

    def factor_layout(self, triangular=True):
        """:class:`PackLayout` of every position's factors (upper triangles by default)."""
        return pack_layout([self.factor_sizes(p, triangular) for p in range(self.group_size)])

    def gradient_layout(self):
        """:class:`PackLayout` of every position's preconditioned gradient matrices (``a_dim * g_dim`` floats
        each, shaped as :attr:`WorkItem.matrix_shape`)."""
        return pack_layout([[self.items[i].a_dim * self.items[i].g_dim for i in self.items_at(p)]
                            for p in range(self.group_size)])

    # ----------------------------------------------------------------- printing
    def __str__(self):
        s = self.group_size
        cost_name = "a^3+g^3" if self.balance == "compute" else "a^2+g^2"
        if self.balance == "compute" and self.split_dim is not None:
            cost_name += f" (blocks of {self.split_dim})"
        head = (f"OwnershipPlan: {len(self.items)} layers, world_size {self.world_size}, "
                f"grad_worker_fraction {self.grad_worker_fraction} -> {self.grad_workers} owner group(s) "
                f"of {s} position(s), each layer held by {self.grad_workers} rank(s); "
                f"balance={self.balance} (cost {cost_name})")
        total = self.total_cost or 1
        rows = [("pos", "ranks", "cost", "share", "layers")]
        for p in range(s):
            ranks = ",".join(str(r) for r in self.replica_groups[p])
            names = ", ".join(self.items[i].name for i in self.items_at(p)) or "-"
            rows.append((str(p), ranks, f"{self.load(p):,}", f"{100.0 * self.load(p) / total:.1f}%", names))
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        lines = [head]
        for r in rows:
            lines.append("  ".join([r[0].rjust(widths[0]), r[1].ljust(widths[1]), r[2].rjust(widths[2]),
                                    r[3].rjust(widths[3]), r[4]]))
        ratio = self.makespan / self.lower_bound if self.lower_bound else 1.0
        lines.append(f"makespan {self.makespan:,}, lower bound {self.lower_bound:,.0f} "
                     f"(ratio {ratio:.3f}; LPT guarantees <= {4 / 3 - 1 / (3 * s):.3f} x optimal)"
                     + (f"; {len(self.idle_positions)} idle position(s)" if self.idle_positions else ""))
        return "\n".join(lines)


def plan_ownership(items, world_size, grad_worker_fraction=None, balance="compute", split_dim=None):
    """Plan which ranks own which preconditioned layers.

    Args:
        items: sequence of ``(name, a_dim, g_dim)`` tuples, :class:`WorkItem` or objects with those
            attributes (the engine's ``LayerSpec``). Names must be unique.
        world_size (int): number of ranks ``N``.
        grad_worker_fraction: ``f`` in ``{k/N : k divides N}``; ``m = f N`` ranks hold each layer.
            ``None`` (default) is ``1/N``: one owner per layer, memory per rank ~1/N.
        balance (str): "compute" balances ``a^3 + g^3`` (inversion time), "memory" ``a^2 + g^2``.
        split_dim (int or None): block size of block-diagonal inverses (compute cost only).

    Returns:
        :class:`OwnershipPlan`, identical on every rank for identical inputs.
    """
    items = tuple(WorkItem.of(item) for item in items)
    names = [item.name for item in items]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"layer names must be unique, repeated: {duplicates}")
    world_size = _int("world_size", world_size, 1)
    m = grad_workers(world_size, grad_worker_fraction)
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {list(BALANCES)}, got {balance!r}")
    if split_dim is not None:
        split_dim = _int("split_dim", split_dim, 1)
    costs = tuple(it.costs(balance, split_dim) for it in items)
    positions = lpt_assign(costs, world_size // m)
    return OwnershipPlan(items=items, world_size=world_size, grad_workers=m, balance=balance,
                         split_dim=split_dim, costs=costs, positions=positions)
