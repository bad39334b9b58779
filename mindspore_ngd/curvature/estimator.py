"""The curvature estimator: every preconditioned layer's curvature block and the state around them,
kept apart from the optimizer that uses their inverses.

:class:`BlockDiagonalCurvature` owns
- the blocks (:class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock` per Dense/Conv2d layer,
  :class:`~mindspore_ngd.curvature.unitwise.UnitBatchNormBlock` per unit-wise BatchNorm layer), each
  built by the block type registered for its layer's kind (:mod:`mindspore_ngd.curvature.registry`),
  and run in two groups, one per family: the Kronecker blocks layer by layer
  (:class:`~mindspore_ngd.curvature.kronecker_group.KroneckerGroup`, ``layer_group``), the unit-wise
  blocks all at once (:class:`~mindspore_ngd.curvature.unitwise.UnitWiseGroup`, ``norm_group``). A
  group reads, folds, writes (and, Kronecker, re-inverts) its blocks; the estimator hands each group
  its part of the step state and adds up what they did;
- their counters (:class:`~mindspore_ngd.curvature.counters.LayerCounters`) and capture flags
  (:class:`~mindspore_ngd.capture.CaptureControl`, with the loss-scale probe);
- the exchange of their statistics between ranks (:mod:`mindspore_ngd.parallel.exchange`);
- the refresh rule (:mod:`mindspore_ngd.schedule.rules`);
- the fault and refresh counts;

and runs steps 2 and 3 of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`'s step on them, in this
order each step::

    factors = curvature.stored_factors()
    factors, refreshed, changes, scale = curvature.folded_and_stored(factors, finite, gradients, scale, damping)
    due, layers = curvature.inverses_due(step, refreshed)
    inverses = curvature.refreshed(factors, damping, layers, due)
    ...
    curvature.plan_next(step, refreshed, changes)

The optimizer keeps the parameters, the moments, the learning rate, the update and the damping
controller. The step state travels as the tuples :mod:`mindspore_ngd.curvature.state` names.

Every Parameter keeps the name it had when the optimizer held it (``{prefix}.factor_faults``,
``{prefix}.{layer}.A`` ...): the estimator and its children are built with ``auto_prefix=False`` and
the optimizer (an ``nn.Optimizer``) adds no prefix to its own children, so checkpoints load unchanged.

The fold: the batch statistics are read after the gradients, reduced to their owners when
distributed, unscaled by the measured loss scale, and folded by each owned block (non-finite batches
rejected and counted). A layer whose capture never ran is marked demoted here. On one device each
layer's fold is a run-time branch of its own, written back as soon as it returns (one layer's new
factors live at a time); distributed, the fold is one branch around the collectives. The refresh: every
owned layer that is due is re-inverted by its block, each in a run-time branch of its own (with a
per-layer rule, SP-NGD's, only the layers that are ready), and its new inverses are written back in
the main graph as soon as that branch returns; a layer keeps its last good inverses when a check
fails. New state is always written back in the main graph (:meth:`store_factors`,
:meth:`refreshed`): MindSpore 2.10 disconnects a Parameter assigned inside a run-time branch from its
host value.
"""
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from ..capture import CaptureControl
from ..capture.loss_scale import BatchNormScaleCapture, LossScaleProbe, reference_layer
from ..parallel.exchange import DistributedExchange, LocalExchange
from .counters import LayerCounters
from .registry import BlockContext, block_type_of
from .kronecker_group import KroneckerGroup
from .state import FactorState, factor_state, inverse_state
from .unitwise import UnitWiseGroup

__all__ = ["BlockDiagonalCurvature"]


class BlockDiagonalCurvature(nn.Cell):
    """The block-diagonal curvature of the preconditioned layers (see the module docstring).

    Args:
        specs (sequence of LayerSpec): the preconditioned Dense/Conv2d layers, in layer order.
        norm_specs (sequence of NormSpec): the unit-wise BatchNorm layers (may be empty).
        index (dict): parameter name -> position in the optimizer's parameters.
        owned (sequence of bool): per layer, whether this rank owns it (folds, inverts, preconditions).
        comm: the resolved :class:`~mindspore_ngd.parallel.comm.ParallelOps`, or None on one device.
        policy (Policy): the optimizer's policy (refresh rule, inversion, damping split, Fisher ...).
        loss_scale (float): the fixed loss scale.
        factor_decay (float): moving-average decay of the factors.
        scale_norm (NormSpec): a BatchNorm layer (not preconditioned unit-wise) for the loss-scale probe
            when no preconditioned layer has a bias, or None; the caller attaches its capture
            (``capture_control.scale_probe.capture``) to that layer's cell.
    """

    def __init__(self, specs, norm_specs, index, owned, comm, policy, loss_scale, factor_decay, scale_norm=None):
        super().__init__(auto_prefix=False)
        prefix = policy.name
        self.num_layers, self.num_norms = len(specs), len(norm_specs)
        self.statistic_names = tuple([f"{s.name}.A" for s in specs] + [f"{s.name}.G" for s in specs]
                                     + [f"{s.name}.F" for s in norm_specs])
        self.factor_decay = float(factor_decay)
        self.track_changes = policy.refresh.track_changes
        # SP-NGD's changes measured against the damped statistics (StaleIntervals.measure)
        self.damped_changes = bool(getattr(policy.refresh, "damped_changes", False))
        self.batchnorm_damping = policy.batchnorm_damping
        traces = getattr(policy.refresh, "trace_threshold", None) is not None
        # the loss scale of each step is measured at one layer with a bias, else at a BatchNorm layer
        # (``scale_norm``; capture/loss_scale.py); the Monte-Carlo step captures G in its own backward pass
        # at its own fixed scale
        reference = reference_layer(specs) if policy.fisher == "empirical" else None
        self.probe_layer = reference
        # every block is built by the block type of its layer's kind (curvature/registry.py)
        context = BlockContext(prefix, index, policy, loss_scale, traces)
        self.blocks = nn.CellList([block_type_of(s).build(s, context, mine, k == reference)
                                   for k, (s, mine) in enumerate(zip(specs, owned))], auto_prefix=False)
        # a rule that captures every statistic on every step (K-FAC's factors on every step) needs no run-time
        # branch in the capture; the Monte-Carlo step captures G in a backward pass of its own
        if policy.refresh.captures_every_step and policy.fisher == "empirical":
            for block in self.blocks:
                block.capture.every_step = True
        # the unit-wise blocks, run as one group (None without unit-wise BatchNorm layers); changes are
        # measured against the damped 2x2 blocks under a rule that asks for it (SP-NGD's)
        self.norm_group = UnitWiseGroup([block_type_of(s).build(s, context) for s in norm_specs], factor_decay,
                                        self.track_changes, self.batchnorm_damping if self.damped_changes else None) \
            if norm_specs else None
        self.counters = LayerCounters(prefix, [s.name for s in specs], [s.name for s in norm_specs])
        probe = None
        if reference is not None:
            probe = LossScaleProbe(self.blocks[reference].capture, self.blocks[reference].bias_index, loss_scale,
                                   prefix)
        elif scale_norm is not None and policy.fisher == "empirical":   # no bias: a BatchNorm's beta
            probe = LossScaleProbe(BatchNormScaleCapture(scale_norm, prefix), index[scale_norm.beta_name],
                                   loss_scale, prefix)
        # whether a probe measures the loss scale (compile-time): not without a layer with a bias or a
        # BatchNorm layer, nor with fisher="mc"
        self.measures_scale = probe is not None
        self.capture_control = CaptureControl([b.capture for b in self.blocks], [b.capture for b in self.norm_blocks],
                                              probe, prefix)
        # the Kronecker blocks, run layer by layer as one group
        self.layer_group = KroneckerGroup(self.blocks, self.capture_control, factor_decay, policy.refresh.per_layer,
                                          self.track_changes)
        # the loss scale is measured on every step only for THOR's trace probes, which read it between
        # folds (on a single device); otherwise in the fold's branch, on the steps whose statistics use it
        self.probe_every_step = traces and comm is None
        self.exchange = LocalExchange() if comm is None else \
            DistributedExchange(comm, prefix, [s.channels for s in norm_specs],
                                0 if probe is None else probe.size)
        self.refresh_rule = policy.refresh.build(prefix, self.capture_control, self.blocks, self.counters,
                                                 self.exchange)
        self.factor_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.factor_faults", requires_grad=False)
        self.inverse_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_faults", requires_grad=False)
        self.inverse_refreshes = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_refreshes",
                                           requires_grad=False)

    @property
    def norm_blocks(self):
        """The unit-wise BatchNorm blocks, in order (host side; the step reaches them through
        ``norm_group``)."""
        return () if self.norm_group is None else tuple(self.norm_group.blocks)

    # ------------------------------------------------------------------ the capture
    def capturing(self):
        """Whether this step captured any statistic (a bool scalar: the fold's branch is taken)."""
        return self.capture_control.any()

    def scale_seen(self, gradients, finite):
        """The loss scale as known before the fold: measured now when it is measured every step (THOR's
        trace probes), else the last one measured; zero without a probe."""
        probe = self.capture_control.scale_probe
        scale = ops.zeros((), ms.float32) if probe is None else probe.scale_seen
        if probe is not None and self.probe_every_step:
            scale = probe.scale_after(probe.probe(finite), gradients, finite, scale)
        return scale

    def store_scale(self, scale):
        """Write the loss scale seen this step (in the main graph, also in the lean graph). Only when
        :attr:`measures_scale` (without a probe there is nothing to write, and a call that does nothing
        is dropped by MindSpore with a warning about side effects)."""
        ops.assign(self.capture_control.scale_probe.scale_seen, scale)

    # ------------------------------------------------------------------ the fold
    def nothing_folded(self):
        """(per-layer flags 'refreshed', relative changes) of a step that folds nothing: all False, -1."""
        return self.layer_group.nothing_folded(), \
            -ops.ones((len(self.statistic_names) if self.track_changes else 1,), ms.float32)

    def stored_factors(self):
        """The factor state as stored (:class:`~mindspore_ngd.curvature.state.FactorState`): per layer
        (A, G), the counts and demoted flags, the factor fault count[, per BatchNorm layer F, F counts]."""
        layers = self.layer_group.factors()
        if not self.num_norms:
            return factor_state(layers, self.counters.factor_counts(), self.factor_faults)
        return factor_state(layers, self.counters.factor_counts(), self.factor_faults, self.norm_group.fishers(),
                            self.counters.f_updates)

    def _read_back(self, state):
        """``state`` with every layer's (A, G) read back from its Parameters after their writes: what
        the fold computed is then released, not kept live through the refresh."""
        norms = norm_counts = None
        if self.num_norms:
            norms, norm_counts = state[FactorState.NORM_FISHERS], state[FactorState.NORM_COUNTS]
        return factor_state(self.layer_group.factors(), state[FactorState.COUNTS], state[FactorState.FAULTS], norms,
                            norm_counts)

    def folded(self, state, finite, gradients, scale, damping):
        """The distributed fold, one run-time branch of :meth:`folded_and_stored` on capture steps: (new
        factor state, per-layer flag 'A or G of this layer was taken', relative changes, loss scale
        seen). ``damping`` is this step's; a rule that measures changes against the damped statistics
        (SP-NGD's default) gets them so.

        A step with a non-finite gradient (a loss-scale overflow, or divergence) folds nothing and is
        no fault of the curvature: it is counted once, as a skipped step. G and the unit-wise Fishers
        are unscaled by the loss scale measured in this step (:mod:`mindspore_ngd.capture.loss_scale`),
        or the last one measured when this step's cannot be.

        A layer whose captured statistic still holds the UNSEEN mark is demoted (see
        :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`): it is judged on this rank's own
        buffers, before any reduction, so every rank decides alike (the capture runs the same graph on
        every rank) without a collective."""
        token = finite
        f_batches = self.norm_group.batches(token) if self.num_norms else ()
        a_batches, g_batches, unseen = self.layer_group.batches(token)
        probe = self.capture_control.scale_probe
        extra = None if probe is None else probe.probe(token)
        a_batches, g_batches, f_batches, token, extra = self.exchange.reduce_statistics(
            a_batches, g_batches, f_batches, token, extra)
        if probe is not None:            # the ranks' mean probe against the ranks' mean gradient
            scale = probe.scale_after(extra, gradients, finite, scale)
            correction = probe.correction(scale)
            unscaled, unscaled_f = (), ()
            for g_batch in g_batches:
                unscaled += (g_batch * correction,)
            for f_batch in f_batches:
                unscaled_f += (f_batch * correction,)
            g_batches, f_batches = unscaled, unscaled_f
        track = self.track_changes
        # what the changes are measured against (StaleIntervals.measure): the damped statistics, or None
        fold_damping = damping if self.damped_changes else None
        folded, outcomes, demoted = self.layer_group.folded(state, a_batches, g_batches, unseen, finite, fold_damping)
        # what each statistic's fold did, made identical on every rank (distributed: the owners' outcome)
        outcomes = self.exchange.agree(outcomes, token)
        counts, faults, refreshed, changes = self.layer_group.totals(state, outcomes, demoted)
        if not self.num_norms:
            return factor_state(folded, counts, faults), refreshed, changes, scale
        norms, norm_counts, norm_faults, norm_changes = self._fold_norms(state, f_batches, finite)
        if track:
            changes = ops.concat((changes, norm_changes))
        return factor_state(folded, counts, faults + norm_faults, norms, norm_counts), refreshed, changes, scale

    def folded_and_stored(self, state, finite, gradients, scale, damping):
        """Fold this step's captured statistics into ``state`` (:meth:`stored_factors`) and write the
        result to the Parameters. Returns (the factor state as stored after the writes, per-layer flags
        'refreshed', relative changes, loss scale seen), as :meth:`folded` does.

        Distributed, the fold is one run-time branch, taken on capture steps (its collectives reduce
        every statistic at once), and its result is written after it. On one device each layer's fold
        is a run-time branch of its own, taken when the layer captured a statistic, and its new A and G
        are written as soon as it returns, before the next layer's branch starts, as :meth:`refreshed`
        does with the inverses: a branch's outputs stay live until the main graph consumes them, so the
        fold holds one layer's new factors (and its unscaled G) at a time instead of every layer's.
        The arithmetic is the same as :meth:`folded`'s, layer by layer, and so are the results."""
        if self.exchange.distributed:
            refreshed, changes = self.nothing_folded()
            if self.capturing():
                state, refreshed, changes, scale = self.folded(state, finite, gradients, scale, damping)
            self.store_factors(state)
            return self._read_back(state), refreshed, changes, scale
        # Every Parameter is read once in the main graph (MindSpore 2.10 copies a Parameter read twice
        # in one graph, TensorMove): ``capturing`` once, the counts through ``state``; the capture flags
        # and batch buffers only inside the branches.
        token = finite
        # the capture flag as a computed value: the Load itself, the condition of every layer's branch,
        # was copied once per branch (TensorMove)
        capturing = ops.logical_or(self.capturing(), ops.zeros((), ms.bool_))
        if self.capture_control.scale_probe is not None and not self.probe_every_step:
            scale = self._scale_when(capturing, token, gradients, finite, scale)
        track = self.track_changes
        fold_damping = damping if self.damped_changes else None
        outcomes, demoted = self.layer_group.folded_and_written(state, capturing, token, scale, fold_damping)
        counts, faults, refreshed, changes = self.layer_group.totals(state, outcomes, demoted)
        self.counters.write_factor_counts(counts)
        norms = norm_counts = None
        if self.num_norms:
            norms, norm_counts, norm_faults, norm_changes = self._norms_when(capturing, state, finite, token, scale)
            self.norm_group.write(norms)
            self.counters.write_norm_counts(norm_counts)
            faults = faults + norm_faults
            if track:
                changes = ops.concat((changes, norm_changes))
        ops.assign(self.factor_faults, faults)
        return self._read_back(factor_state(state[FactorState.LAYERS], counts, faults, norms, norm_counts)), \
            refreshed, changes, scale

    def _scale_when(self, capturing, token, gradients, finite, scale):
        """The loss scale the probe measures on a capture step (a branch), else ``scale``."""
        if capturing:
            probe = self.capture_control.scale_probe
            scale = probe.scale_after(probe.probe(token), gradients, finite, scale)
        return scale

    def _norms_when(self, capturing, state, finite, token, scale):
        """On a capture step (a branch): every unit-wise BatchNorm layer's batch, unscaled, folded by
        :meth:`_fold_norms`; else the stored Fishers and counts, no fault and no change."""
        norms, norm_counts = state[FactorState.NORM_FISHERS], state[FactorState.NORM_COUNTS]
        norm_faults, norm_changes = self.norm_group.unchanged()
        if capturing:
            probe = self.capture_control.scale_probe
            correction = None if probe is None else probe.correction(scale)
            norms, norm_counts, norm_faults, norm_changes = self._fold_norms(
                state, self.norm_group.batches(token, correction), finite)
        return norms, norm_counts, norm_faults, norm_changes

    def _fold_norms(self, state, f_batches, finite):
        """Every unit-wise BatchNorm layer's fold of its (unscaled) batch in ``f_batches``, by the group,
        each under its capture flag: (new Fishers, new counts as a vector, rejected count, changes as a
        vector or -1s)."""
        return self.norm_group.folded(state[FactorState.NORM_FISHERS], state[FactorState.NORM_COUNTS], f_batches,
                                      self.capture_control.norm_flags(), finite)

    def store_factors(self, state):
        """Write the factor state (:meth:`folded`'s) to the Parameters, in the main graph."""
        self.layer_group.write(state[FactorState.LAYERS])
        self.counters.write_factor_counts(state[FactorState.COUNTS])
        ops.assign(self.factor_faults, state[FactorState.FAULTS])
        if self.num_norms:
            self.norm_group.write(state[FactorState.NORM_FISHERS])
            self.counters.write_norm_counts(state[FactorState.NORM_COUNTS])

    # ------------------------------------------------------------------ the refresh
    def inverses_due(self, step, refreshed):
        """(whether the refresh rule has inverses due this step, which layers: a per-layer flag tuple,
        or None when every owned layer is)."""
        return self.refresh_rule.inverse_due(step, refreshed), self.refresh_rule.inverse_layers(step, refreshed)

    @staticmethod
    def every_layer(layers, every):
        """``layers`` (a per-layer flag tuple) with every flag set where ``every`` is."""
        out = ()
        for flag in layers:
            out += (ops.logical_or(flag, every),)
        return out

    def stored_inverses(self):
        """The inverse state as stored (:class:`~mindspore_ngd.curvature.state.InverseState`): per layer
        (A inverse, G inverse), the has-inverse flags, the inverse fault count[, when distributed, the
        per-layer inversion counts of this step, zero]."""
        layers = self.layer_group.inverses()
        inversions = ops.zeros((self.num_layers,), ms.int32) if self.exchange.distributed else None
        return inverse_state(layers, self.counters.has_inverse, self.inverse_faults, inversions)

    def refreshed(self, factors, damping, layers, due):
        """Re-invert every owned layer that is due and ready (and selected by ``layers``), write each
        layer's inverses back at once, and return the inverse state as stored after the writes
        (:meth:`stored_inverses`).

        Each owned layer's inversion is a run-time branch of its own (taken when ``due``; with a
        per-layer rule also only when that layer is ready), and its result is written to the layer's
        Parameters in the main graph before the next layer's branch starts. A branch's outputs stay
        live until the main graph consumes them, so writing each layer as soon as it is inverted holds
        one layer's new inverses at a time instead of every layer's (measured on eight 2048 x 2048
        inversions: 0.8 against 1.6 copies per layer at the peak). The writes stay in the main graph:
        MindSpore 2.10 disconnects a Parameter assigned inside a run-time branch from its host value.
        A layer that is not refreshed has its stored inverses written back unchanged, as before."""
        ready = LayerCounters.ready(factors[FactorState.COUNTS])
        if layers is not None:
            ready = ops.logical_and(ready, ops.stack(layers))
        ready, trusted = ops.unstack(ready), ops.unstack(self.counters.has_inverse)
        faults, taken, counts, after = self.layer_group.refreshed(factors[FactorState.LAYERS], damping, ready, trusted,
                                                                  due, self.inverse_faults)
        has = ops.logical_or(self.counters.has_inverse, ops.stack(taken))
        faults = ops.depend(faults, after)
        self.counters.write_has_inverse(has)
        ops.assign(self.inverse_faults, faults)
        ops.assign_add(self.inverse_refreshes, ops.cast(due, ms.int32))
        if self.exchange.distributed:
            self.exchange.count_inversions(ops.stack(counts))
        return self.stored_inverses()

    def plan_next(self, step, refreshed, changes):
        """The refresh rule's plan of the next step: its state and the next step's capture flags. Call
        after the update (``step`` depending on it): the rule reads statistics written late in the
        backward pass (THOR's traces) and, distributed, may hold a collective that must follow the gather."""
        self.refresh_rule.plan_next(step, refreshed, changes)
