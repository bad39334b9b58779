"""Refresh rules: when statistics are captured and inverses recomputed.

A rule is a frozen description (part of a :class:`mindspore_ngd.Policy`) with a plain-Python planner
twin, and builds the graph-side cell (:meth:`build`) that owns the rule's Parameters and makes its
decisions inside the optimizer's step. The arithmetic of each rule is written once, in a function
that runs on MindSpore tensors in the graph and on NumPy values in the twin (``_xp`` helpers pick
the library from the argument's type at compile time), so the two cannot drift apart.

Every rule cell offers the same four decisions to the engine:

* ``inverse_due(step, refreshed)``: a bool scalar, "recompute inverses this step";
* ``inverse_layers(step, refreshed)``: per-layer bool flags of the layers to re-invert, or None (all);
* ``plan_next(step, refreshed, changes)``: update the rule's state from what this step folded, and set
  which statistics the next step captures, written through the optimizer's
  :class:`mindspore_ngd.capture.CaptureControl` (the only writer of the capture flags). One method,
  so that the capture decision uses the state just computed instead of reading its Parameter a
  second time (MindSpore 2.10 copies every read of a Parameter that a graph reads twice).

``per_layer`` rules invert layer by layer, each layer in its own run-time branch (all of them under
one branch taken when any layer is due), so a step that refreshed one layer's statistics inverts
only that layer; the others invert every layer under one branch when due.
"""
import dataclasses
from typing import ClassVar, Optional

import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .. import _validate
from ..curvature.statistics import relative_changes

__all__ = ["FixedInterval", "StaleIntervals", "GrowingInterval", "interval_due", "stale_intervals",
           "grown_interval"]


# ------------------------------------------------------------------ one formula, two libraries
def _where(cond, a, b):
    return ops.where(cond, a, b) if isinstance(cond, Tensor) else np.where(cond, a, b)


def _minimum(a, b):
    return ops.minimum(a, b) if isinstance(a, Tensor) else np.minimum(a, b)


def _maximum(a, b):
    return ops.maximum(a, b) if isinstance(a, Tensor) else np.maximum(a, b)


def interval_due(step, interval):
    """Fixed interval: a statistic (or inverse) is due at steps 0, ``interval``, ``2 interval``, ...

    On a tensor step ``ops.floor_mod``: the ``%`` operator compiles to ``RemainderTensorScalar``,
    documented for Ascend only (the op audit, :mod:`mindspore_ngd.audit`)."""
    if isinstance(step, Tensor):
        return ops.floor_mod(step, interval) == 0
    return (step % interval) == 0


def stale_intervals(intervals, changes, threshold, max_interval):
    """SP-NGD's stale-statistics rule (Osawa et al. 2020, sec. 4.1) for the statistics recomputed now.

    ``changes`` is the relative change of each statistic against the value it replaced (-1: not
    recomputed; +inf: its first capture). A recomputed statistic with ``change < threshold`` is
    stable and is looked at again twice as late (interval doubled, capped at ``max_interval``);
    otherwise twice as soon (halved, never below 1); a first capture keeps its interval. Doubling
    and halving are our concrete form of the paper's grow-while-stable, shrink-when-moving rule.
    Returns ``(new intervals, taken)``.
    """
    taken = changes >= 0
    grown = _minimum(intervals * 2, max_interval)
    shrunk = _maximum(intervals // 2, 1)
    adjusted = _where(changes < threshold, grown, shrunk)
    first = changes == float("inf")
    adjusted = _where(first, intervals, adjusted)
    return _where(taken, adjusted, intervals), taken


_GROWTH_SLACK = 1e-6    # float32 slack so that e.g. 2 * 1.5 stays 3, not 4, after rounding


def grown_interval(interval, growth, max_interval):
    """THOR's growing frequency: ``min(ceil(interval * growth), max_interval)``, at least 1, computed
    in float32 (int32 in, int32 out)."""
    if isinstance(interval, Tensor):
        grown = ops.cast(ops.ceil(ops.cast(interval, ms.float32) * growth - _GROWTH_SLACK), ms.int32)
    else:
        grown = np.int32(np.ceil(np.float32(interval) * np.float32(growth) - np.float32(_GROWTH_SLACK)))
    if max_interval is not None:
        grown = _minimum(grown, max_interval)
    return _maximum(grown, 1)


# ------------------------------------------------------------------ rule descriptions (policy side)
@dataclasses.dataclass(frozen=True)
class FixedInterval:
    """K-FAC's rule: every statistic every ``factor_interval`` steps, every inverse every
    ``inverse_interval`` steps (both counted from step 0)."""
    factor_interval: int = 1
    inverse_interval: int = 20
    per_layer: ClassVar[bool] = False
    track_changes: ClassVar[bool] = False
    per_statistic: ClassVar[bool] = False

    def validated(self):
        _validate.positive_int("factor_update_interval", self.factor_interval)
        _validate.positive_int("inverse_update_interval", self.inverse_interval)
        return self

    @property
    def captures_every_step(self):
        """Whether every statistic is captured on every step (then the capture needs no run-time branch)."""
        return self.factor_interval == 1

    def plan(self, total_steps):
        """``[(step, statistics captured, inverses recomputed)]`` for steps ``0 .. total_steps - 1``."""
        return [(step, bool(interval_due(step, self.factor_interval)),
                 bool(interval_due(step, self.inverse_interval))) for step in range(total_steps)]

    def build(self, prefix, control, blocks, counters, exchange):
        return _FixedIntervalCell(self, control)


@dataclasses.dataclass(frozen=True)
class StaleIntervals:
    """SP-NGD's rule: every statistic (each layer's A and G, each BatchNorm layer's unit-wise Fisher)
    has its own interval, adapted by :func:`stale_intervals`; a layer is re-inverted when one of its
    statistics was recomputed. ``adaptive=False`` recomputes every statistic and inverse every step.

    ``measure`` is what a statistic's change is relative to: ``"damped"`` the damped statistic whose
    inverse the optimizer uses (``|X_new - X_old|_F / |X_old + shift I|_F``, the shift being the
    damping the inversion adds to it), ``"raw"`` the statistic itself (``/ |X_old|_F``). A statistic
    far smaller than its damping -- G once the loss is near zero -- moves the preconditioner little
    however much it moves relative to itself; ``"raw"`` keeps refreshing it."""
    threshold: float = 0.1
    max_interval: int = 64
    adaptive: bool = True
    measure: str = "damped"
    per_statistic: ClassVar[bool] = True
    MEASURES: ClassVar[tuple] = ("damped", "raw")

    @property
    def per_layer(self):
        return self.adaptive

    @property
    def track_changes(self):
        return self.adaptive

    def validated(self):
        _validate.positive_float("refresh_threshold", self.threshold)
        _validate.positive_int("max_interval", self.max_interval)
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"stale must be a bool, got {type(self.adaptive).__name__}")
        if self.measure not in self.MEASURES:
            raise ValueError(f"refresh_measure must be one of {self.MEASURES}, got {self.measure!r}")
        return self

    @property
    def damped_changes(self):
        """Whether the optimizer measures changes against the damped statistics."""
        return self.adaptive and self.measure == "damped"

    @property
    def captures_every_step(self):
        """Whether every statistic is captured on every step (``adaptive=False``)."""
        return not self.adaptive

    def plan(self, changes_at, total_steps):
        """Twin of the graph rule for one statistic: ``[(step, interval after the refresh)]``.

        ``changes_at(step, refresh_index)`` gives the relative change measured at a refresh (not
        called for the first capture)."""
        plan, interval, step, index = [], np.int32(1), 0, 0
        while step < total_steps:
            change = np.float32(changes_at(step, index)) if index else np.float32(np.inf)
            interval, _ = stale_intervals(interval, change, self.threshold, self.max_interval)
            interval = np.int32(interval)
            plan.append((step, int(interval)))
            step += int(interval)
            index += 1
        return plan

    def build(self, prefix, control, blocks, counters, exchange):
        return _StaleCell(self, prefix, control)


@dataclasses.dataclass(frozen=True)
class GrowingInterval:
    """THOR's rule: statistics and inverses together at refresh points 0, f0, f0 + f1, ... with
    ``f_{i+1} = grown_interval(f_i)``; with ``trace_threshold`` a refresh point only probes the
    traces of the batch factors and the next step captures (and re-inverts) just the statistics
    whose trace moved by more than ``trace_threshold`` (relative) from the factor in use.

    ``layer_branches``: with traces, fold and invert each layer in a run-time branch of its own, so
    that a refresh inverts only the layers whose statistics moved. False (what THOR chooses for
    block-split factors, whose inversions are cheap) folds and inverts every layer under one branch,
    keeping the new inverses of those layers only: the same result, a faster compile (measured 0.5 s
    of 7.3 s on the Fashion-MNIST MLP) and more arithmetic at a refresh."""
    frequency: int = 100
    growth: float = 1.0
    max_frequency: Optional[int] = None
    trace_threshold: Optional[float] = None
    layer_branches: bool = True

    @property
    def per_layer(self):
        return self.trace_threshold is not None and self.layer_branches

    track_changes: ClassVar[bool] = False
    per_statistic: ClassVar[bool] = False
    captures_every_step: ClassVar[bool] = False      # statistics at refresh points only

    def validated(self):
        _validate.positive_int("frequency", self.frequency)
        _validate.float_in_range("frequency_growth", self.growth, 1.0, float("inf"))
        if self.max_frequency is not None:
            _validate.positive_int("max_frequency", self.max_frequency)
            if self.max_frequency < self.frequency:
                raise ValueError(f"max_frequency must be >= frequency ({self.frequency}), got {self.max_frequency}")
        _validate.optional_positive_float("trace_threshold", self.trace_threshold)
        if not isinstance(self.layer_branches, bool):
            raise TypeError(f"layer_branches must be a bool, got {type(self.layer_branches).__name__}")
        return self

    def plan(self, total_steps):
        """The refresh points below ``total_steps``: 0, f0, f0 + f1, ..."""
        steps, step, interval = [], 0, np.int32(self.frequency)
        while step < total_steps:
            steps.append(step)
            step += int(interval)
            interval = grown_interval(interval, self.growth, self.max_frequency)
        return steps

    def build(self, prefix, control, blocks, counters, exchange):
        return _GrowingCell(self, prefix, control, blocks, counters, exchange)


# ------------------------------------------------------------------ graph side
class _RuleCell(nn.Cell):
    """Defaults: re-invert every layer when due."""

    def __init__(self, rule, control):
        super().__init__(auto_prefix=False)
        self.per_layer = rule.per_layer
        self.control = control

    def inverse_layers(self, step, refreshed):
        return refreshed

    def inverse_due(self, step, refreshed):
        return ops.any(ops.stack(refreshed))

    def counters(self):
        return {}


class _FixedIntervalCell(_RuleCell):
    def __init__(self, rule, control):
        super().__init__(rule, control)
        self.factor_interval = rule.factor_interval
        self.inverse_interval = rule.inverse_interval

    def inverse_layers(self, step, refreshed):
        return None

    def inverse_due(self, step, refreshed):
        return interval_due(step, self.inverse_interval)

    def plan_next(self, step, refreshed, changes):
        self.control.set_all(interval_due(step + 1, self.factor_interval))


class _StaleCell(_RuleCell):
    def __init__(self, rule, prefix, control):
        super().__init__(rule, control)
        self.adaptive = rule.adaptive
        self.threshold = rule.threshold
        self.max_interval = rule.max_interval
        count = control.statistics
        self.intervals = Parameter(Tensor(np.ones(count, np.int32)), name=f"{prefix}.intervals", requires_grad=False)
        self.next_refresh = Parameter(Tensor(np.zeros(count, np.int32)), name=f"{prefix}.next_refresh",
                                      requires_grad=False)
        self.refreshes = Parameter(Tensor(np.zeros(count, np.int32)), name=f"{prefix}.refreshes", requires_grad=False)

    def plan_next(self, step, refreshed, changes):
        if not self.adaptive:
            ops.assign_add(self.refreshes, ops.ones_like(self.refreshes))
            self.control.set_all(ops.ones((), ms.bool_))
            return
        intervals, taken = stale_intervals(self.intervals, changes, self.threshold, self.max_interval)
        upcoming = ops.where(taken, step + intervals, self.next_refresh)
        ops.assign(self.intervals, intervals)
        ops.assign(self.next_refresh, upcoming)
        ops.assign_add(self.refreshes, ops.cast(taken, ms.int32))
        self.control.set_each(upcoming <= step + 1)

    def refresh_state(self, names):
        intervals, upcoming, counts = self.intervals.asnumpy(), self.next_refresh.asnumpy(), self.refreshes.asnumpy()
        return {name: (int(intervals[i]), int(upcoming[i]), int(counts[i])) for i, name in enumerate(names)}

    def counters(self):
        return {"statistic_refreshes": int(self.refreshes.asnumpy().sum())}


class _GrowingCell(_RuleCell):
    def __init__(self, rule, prefix, control, blocks, counters, exchange):
        super().__init__(rule, control)
        self.growth = rule.growth
        self.max_frequency = rule.max_frequency
        self.trace_threshold = rule.trace_threshold
        self.blocks = blocks
        self.layer_counters = counters
        self.exchange = exchange
        self.interval = Parameter(Tensor(np.int32(rule.frequency)), name=f"{prefix}.interval", requires_grad=False)
        self.next_refresh = Parameter(Tensor(np.int32(0)), name=f"{prefix}.next_refresh", requires_grad=False)
        self.layer_refreshes = Parameter(Tensor(np.zeros(len(blocks), np.int32)), name=f"{prefix}.layer_refreshes",
                                         requires_grad=False)

    def plan_next(self, step, refreshed, changes):
        current = self.next_refresh
        captured = step >= current
        interval = self.interval
        upcoming = ops.where(captured, step + interval, current)
        ops.assign(self.next_refresh, upcoming)
        ops.assign(self.interval, ops.where(captured, grown_interval(interval, self.growth, self.max_frequency),
                                             interval))
        ops.assign_add(self.layer_refreshes, ops.cast(ops.stack(refreshed), ms.int32))
        next_step = step + 1
        due = next_step >= upcoming
        if self.trace_threshold is None:
            self.control.set_all(due)
            return
        # a refresh point only probes traces; the next step captures the statistics whose trace moved
        # (every statistic before its first capture)
        flags = ops.logical_and(self.control.probing(), self._trace_moves(next_step))
        # the probe flags are overwritten only after every capture flag has used ``probing()``: the
        # read of the probe flag is not a snapshot (measured: without this, layers after the first read
        # the flag already set for the next step and captured on the probe step itself)
        self.control.set_each(ops.unstack(flags))
        self.control.set_probes(ops.depend(due, flags))

    def _trace_moves(self, token):
        """A bool vector, per statistic (A of every layer, then G of every layer): did the batch trace
        move by more than the threshold from the trace of the factor in use (or was it never captured)?
        Computed on the vectors of all statistics at once.

        Distributed, the batch traces are averaged over the ranks and compared with the owners'
        factor traces (one sum over the ranks of [batch traces, owners' factor traces or 0]), so
        that every rank takes the same decision."""
        layers = len(self.blocks)
        zero = ops.zeros((), ms.float32)
        batch, stored = (), ()
        updates = ops.concat((self.layer_counters.a_updates, self.layer_counters.g_updates))
        for which in range(2):
            for k in range(layers):
                block = self.blocks[k]
                trace = ops.depend(block.batch_trace(which), token) * 1.0       # a value, not the Parameter
                batch += (trace * self.control.g_correction() if which else trace,)
                stored += (block.factor_trace(which) if block.owned else zero,)
        total = self.exchange.share_traces(ops.stack(batch + stored))
        count = 2 * layers
        change = relative_changes(total[:count] / self.exchange.world_size,
                                  total[count:] / self.exchange.grad_workers)
        return ops.logical_or(updates == 0, change > self.trace_threshold)

    def counters(self):
        return {"interval": int(self.interval.asnumpy()), "next_refresh": int(self.next_refresh.asnumpy()),
                "layer_refreshes": self.layer_refreshes.asnumpy().tolist()}
