"""Every Kronecker-factored block of one optimizer, run as one group.

A block of this group has two statistics, A and G, each with its own capture flag and update count,
and a pair of inverses (:class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`, one per Dense or
Conv2d layer, built by the block type of its layer's kind in :mod:`mindspore_ngd.curvature.registry`).
:class:`KroneckerGroup` runs them layer by layer:

- the fold of the captured batches into each layer's A and G, which marks a layer that captured
  nothing as demoted (:meth:`KroneckerGroup.folded`, distributed, after the exchange;
  :meth:`KroneckerGroup.folded_and_written`, on one device, each layer a run-time branch written back
  as soon as it returns), and what the folds add up to (:meth:`KroneckerGroup.totals`);
- the refresh of the inverses, each owned layer a run-time branch written back as soon as it returns
  (:meth:`KroneckerGroup.refreshed`).

The unit-wise BatchNorm blocks are the other group
(:class:`~mindspore_ngd.curvature.unitwise.UnitWiseGroup`). The estimator
(:class:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature`) owns both groups, the counters,
the exchange and the refresh rule, and hands each group its part of the step state
(:mod:`mindspore_ngd.curvature.state`). A group keeps no state of its own: the factors and inverses
are its blocks' Parameters, and the counts are passed in and returned.

New state is written back in the main graph (MindSpore 2.10 disconnects a Parameter assigned inside a
run-time branch from its host value), and every Parameter is read once in the main graph (MindSpore
2.10 copies a Parameter read twice in one graph, ``TensorMove``).
"""
import mindspore as ms
from mindspore import nn, ops

from .state import FactorState, FoldOutcome, LayerCounts, fold_outcome, idle_outcome

__all__ = ["KroneckerGroup"]


class KroneckerGroup(nn.Cell):
    """The Kronecker-factored blocks of one optimizer, layer by layer (see the module docstring).

    Args:
        blocks (nn.CellList): the blocks, in layer order (the estimator's list, shared).
        capture_control (CaptureControl): the owner of the capture flags and the loss-scale probe.
        factor_decay (float): moving-average decay of the factors.
        per_layer (bool): the refresh rule decides layer by layer (SP-NGD's, THOR's trace rule): each
            layer's fold and inversion is then a run-time branch taken only when that layer needs it.
        track_changes (bool): the folds measure each factor's relative change (the refresh rule reads it).
    """

    def __init__(self, blocks, capture_control, factor_decay, per_layer, track_changes):
        super().__init__(auto_prefix=False)
        self.blocks = blocks
        self.capture_control = capture_control
        self.count = len(blocks)
        self.factor_decay = float(factor_decay)
        self.per_layer = bool(per_layer)
        self.track_changes = bool(track_changes)

    # ------------------------------------------------------------------ the factors
    def factors(self):
        """Every layer's (A, G) as stored (read after any write before it)."""
        layers = ()
        for block in self.blocks:
            layers += (block.factors(),)
        return layers

    def write(self, layers):
        """Write every layer's (A, G) (in the main graph)."""
        for k in range(self.count):
            self.blocks[k].write_factors(layers[k])

    def nothing_folded(self):
        """Per-layer flags 'refreshed' of a step that folds nothing: all False."""
        flags = ()
        for _ in range(self.count):
            flags += (ops.zeros((), ms.bool_),)
        return flags

    def batches(self, token):
        """(A batches, G batches, per-layer flags 'the capture shows the layer unseen'), read after
        ``token``: each layer is judged on this rank's own buffers, before any reduction, so every rank
        decides alike (the capture runs the same graph on every rank) without a collective."""
        a_batches, g_batches, unseen = (), (), ()
        for k in range(self.count):
            a_batch, g_batch = self.blocks[k].batch(token)
            take_a, take_g = self.capture_control.layer_flags(k)
            unseen += (self.blocks[k].unseen(a_batch, g_batch, take_a, take_g),)
            a_batches += (a_batch,)
            g_batches += (g_batch,)
        return a_batches, g_batches, unseen

    # ------------------------------------------------------------------ the fold
    def folded(self, state, a_batches, g_batches, unseen, finite, fold_damping):
        """The distributed fold of the (reduced, unscaled) batches into the factor ``state``: (new
        (A, G) per layer, each layer's outcome, the demoted flags after this step). A layer this rank does
        not own keeps its placeholders and contributes zeros to the outcomes' agreement."""
        track = self.track_changes
        zero = ops.zeros((), ms.float32)
        stored_counts = state[FactorState.COUNTS]
        demoted = ops.logical_or(stored_counts[LayerCounts.DEMOTED], ops.stack(unseen))
        demoted_each = ops.unstack(demoted)
        a_each = ops.unstack(stored_counts[LayerCounts.A_UPDATES])
        g_each = ops.unstack(stored_counts[LayerCounts.G_UPDATES])
        absent = fold_outcome(zero, zero, zero, zero, (zero, zero) if track else None)
        stored = state[FactorState.LAYERS]
        folded, outcomes = (), ()
        for k in range(self.count):
            block = self.blocks[k]
            a, g = stored[k]
            outcome = absent
            if block.owned:
                a, g, outcome = self._fold_taken(block, stored[k], (a_each[k], g_each[k]), (a_batches[k], g_batches[k]),
                                                 self.capture_control.layer_flags(k), demoted_each[k], finite,
                                                 fold_damping)
            folded += ((a, g),)
            outcomes += (outcome,)
        return folded, outcomes, demoted

    def folded_and_written(self, state, capturing, token, scale, fold_damping):
        """The fold on one device: each layer's fold is a run-time branch of its own, taken on capture
        steps, and its new A and G are written as soon as it returns, before the next layer's branch
        starts (a branch's outputs stay live until the main graph consumes them, so the fold holds one
        layer's new factors, and its unscaled G, at a time). Returns (each layer's outcome, the
        demoted flags after this step); the arithmetic is :meth:`folded`'s, layer by layer. The
        capture flags and batch buffers are read only inside the branches."""
        stored_counts = state[FactorState.COUNTS]
        was_demoted = stored_counts[LayerCounts.DEMOTED]
        was_each = ops.unstack(was_demoted)
        a_each = ops.unstack(stored_counts[LayerCounts.A_UPDATES])
        g_each = ops.unstack(stored_counts[LayerCounts.G_UPDATES])
        idle = idle_outcome(self.track_changes)
        stored = state[FactorState.LAYERS]
        outcomes, unseen = (), ()
        after = None
        for k in range(self.count):
            block = self.blocks[k]
            a, g = stored[k]
            if after is not None:          # one layer's fold at a time, after the last write
                a, g = ops.depend(a, after), ops.depend(g, after)
            outcome, unseen_here = idle, ops.zeros((), ms.bool_)
            if capturing:
                a, g, outcome, unseen_here = self._fold_layer(k, (a, g), (a_each[k], g_each[k]), was_each[k], token,
                                                              scale, fold_damping)
            after = block.write_factors((a, g))
            outcomes += (outcome,)
            unseen += (unseen_here,)
        return outcomes, ops.logical_or(was_demoted, ops.stack(unseen))

    def _fold_layer(self, k, stored, updates, was_demoted, token, scale, fold_damping):
        """Layer ``k``'s fold on one device on a capture step (a branch of :meth:`folded_and_written`):
        (new A, new G, outcome, whether the capture shows the layer unseen)."""
        block = self.blocks[k]
        flags = self.capture_control.layer_flags(k)
        a_batch, g_batch = block.batch(token)
        unseen = block.unseen(a_batch, g_batch, flags[0], flags[1])
        probe = self.capture_control.scale_probe
        if probe is not None:
            g_batch = g_batch * probe.correction(scale)
        a, g, outcome = self._fold_taken(block, stored, updates, (a_batch, g_batch), flags,
                                         ops.logical_or(was_demoted, unseen), token, fold_damping)
        return a, g, outcome, unseen

    def _fold_taken(self, block, stored, updates, batches, flags, demoted, finite, fold_damping):
        """One owned layer's fold of its (unscaled) batch ``batches`` = (A, G) into ``stored`` = (A, G),
        each statistic taken when its capture flag in ``flags`` is set, the layer is not ``demoted`` and
        the step is ``finite``: (new A, new G, outcome). With per-statistic intervals (a per-layer
        refresh rule, SP-NGD's) most steps fold a few layers, so the fold is a run-time branch of its
        own, like the per-layer inversions."""
        track = self.track_changes
        keep = ops.logical_and(ops.logical_not(demoted), finite)
        take_a, take_g = ops.logical_and(flags[0], keep), ops.logical_and(flags[1], keep)
        a_batch, g_batch = batches
        if not self.per_layer:
            return block.fold(stored, updates, a_batch, g_batch, take_a, take_g, self.factor_decay, track,
                              fold_damping)
        a, g = stored
        outcome = idle_outcome(track)
        if ops.logical_or(take_a, take_g):
            a, g, outcome = block.fold(stored, updates, a_batch, g_batch, take_a, take_g, self.factor_decay, track,
                                       fold_damping)
        return a, g, outcome

    def totals(self, state, outcomes, demoted):
        """What the layers' folds add up to: (counts in :class:`~mindspore_ngd.curvature.state.LayerCounts`'
        order, the factor fault count, per-layer flags 'A or G was taken', the A and G changes or -1),
        from the stored factor ``state``, each layer's outcome and the demoted flags after this step."""
        track = self.track_changes
        refreshed, took_a, took_g, rejected, a_changes, g_changes = (), (), (), (), (), ()
        for outcome in outcomes:
            took_a += (outcome[FoldOutcome.TOOK_A],)
            took_g += (outcome[FoldOutcome.TOOK_G],)
            rejected += (outcome[FoldOutcome.REJECTED_A] + outcome[FoldOutcome.REJECTED_G],)
            refreshed += (ops.logical_or(outcome[FoldOutcome.TOOK_A] > 0.5, outcome[FoldOutcome.TOOK_G] > 0.5),)
            if track:
                a_changes += (outcome[FoldOutcome.CHANGE_A],)
                g_changes += (outcome[FoldOutcome.CHANGE_G],)
        stored_counts = state[FactorState.COUNTS]
        counts = (stored_counts[LayerCounts.A_UPDATES] + ops.cast(ops.stack(took_a) > 0.5, ms.int32),
                  stored_counts[LayerCounts.G_UPDATES] + ops.cast(ops.stack(took_g) > 0.5, ms.int32), demoted)
        faults = state[FactorState.FAULTS] + ops.cast(ops.reduce_sum(ops.stack(rejected)) + 0.5, ms.int32)
        changes = ops.stack(a_changes + g_changes) if track else -ops.ones((1,), ms.float32)
        return counts, faults, refreshed, changes

    # ------------------------------------------------------------------ the refresh
    def inverses(self):
        """Every layer's (A inverse, G inverse) as stored."""
        layers = ()
        for block in self.blocks:
            layers += (block.inverses(),)
        return layers

    def refreshed(self, layers, damping, ready, trusted, due, faults):
        """Re-invert every owned layer that is due (with a per-layer rule: and ``ready``), each in a
        run-time branch of its own, and write its inverses back in the main graph before the next
        layer's branch starts (a branch's outputs stay live until the main graph consumes them, so one
        layer's new inverses live at a time). ``layers``: the stored (A, G) per layer; ``ready`` and
        ``trusted``: per-layer flags (both factors have taken a batch; the stored inverses are
        accepted ones); ``faults``: the inverse fault count so far. Returns (the fault count, per-layer
        flags 'a new inverse was accepted', per-layer inversion counts of this step, the last write)."""
        taken, counts = (), ()
        after = None
        for k in range(self.count):
            block = self.blocks[k]
            take, inverted = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
            if block.owned:
                a_factor, g_factor = layers[k]
                if after is not None:          # one layer's inversion at a time, after the last write
                    a_factor, g_factor = ops.depend(a_factor, after), ops.depend(g_factor, after)
                go = ops.logical_and(due, ready[k]) if self.per_layer else due
                a_inv, g_inv = block.inverses()
                fault = ops.zeros((), ms.int32)
                if go:
                    a_inv, g_inv, take, fault = block.refreshed((a_factor, g_factor), ready[k], damping,
                                                                (a_inv, g_inv), trusted[k])
                inverted = ops.cast(go, ms.int32)
                faults = faults + fault
                after = block.write_inverses((a_inv, g_inv))
            taken += (take,)
            counts += (inverted,)
        return faults, taken, counts, after
