"""Step 2 of the engine, the fold: the statistics captured in this step's forward and backward pass
enter each block's moving averages (a mixin of :class:`~mindspore_ngd.optim.engine.NGDOptimizer`).

The batch statistics are read after the gradients, reduced to their owners when distributed, unscaled
by the measured loss scale, and folded by each owned :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`
and :class:`~mindspore_ngd.curvature.unitwise.UnitBatchNormBlock` (non-finite batches rejected and
counted). A layer whose capture never ran is marked demoted here. The new state is written back in the
main graph by :meth:`Fold._store_factors` (MindSpore 2.10 disconnects a Parameter assigned inside a
run-time branch from its host value)."""
import mindspore as ms
from mindspore import ops

from ..curvature.state import FactorState, FoldOutcome, LayerCounts, factor_state, fold_outcome

__all__ = ["Fold"]


class Fold:
    """Graph-mode fold of :class:`~mindspore_ngd.optim.engine.NGDOptimizer` (see the module docstring)."""

    def _change_size(self):
        return len(self.statistic_names) if self.policy.refresh.track_changes else 1

    def _nothing_refreshed(self):
        flags = ()
        for _ in range(self.num_layers):
            flags += (ops.zeros((), ms.bool_),)
        return flags

    def _stored_factors(self):
        """The factor state as stored (:class:`~mindspore_ngd.curvature.state.FactorState`): per layer
        (A, G), the counts and demoted flags, the factor fault count[, per BatchNorm layer F, F counts]."""
        layers, norms = (), ()
        for block in self.blocks:
            layers += (block.factors(),)
        if not self.num_norms:
            return factor_state(layers, self.counters.factor_counts(), self.factor_faults)
        for block in self.norm_blocks:
            norms += (block.factors(),)
        return factor_state(layers, self.counters.factor_counts(), self.factor_faults, norms, self.counters.f_updates)

    def _folded(self, state, finite, gradients, scale, damping):
        """(new factor state, per-layer flag 'A or G of this layer was taken', relative changes, loss
        scale seen). ``damping`` is this step's; a rule that measures changes against the damped
        statistics (SP-NGD's default) gets them so.

        A step with a non-finite gradient (a loss-scale overflow, or divergence) folds nothing and is
        no fault of the curvature: it is counted once, as a skipped step. G and the unit-wise Fishers
        are unscaled by the loss scale measured in this step (:mod:`mindspore_ngd.capture.loss_scale`),
        or the last one measured when this step's cannot be.

        A layer whose captured statistic still holds the UNSEEN mark is demoted (see
        :class:`~mindspore_ngd.curvature.kronecker.KroneckerBlock`): it is judged on this rank's own
        buffers, before any reduction, so every rank decides alike (the capture runs the same graph on
        every rank) without a collective."""
        token = finite
        a_batches, g_batches, f_batches, unseen = (), (), (), ()
        for k in range(self.num_layers):
            a_batch, g_batch = self.blocks[k].batch(token)
            take_a, take_g = self.capture_control.layer_flags(k)
            unseen += (self.blocks[k].unseen(a_batch, g_batch, take_a, take_g),)
            a_batches += (a_batch,)
            g_batches += (g_batch,)
        for block in self.norm_blocks:
            f_batches += (block.batch(token),)
        probe = self.capture_control.scale_probe
        distributed = self.exchange.distributed
        extra = probe.probe(token) if probe is not None and distributed else None
        a_batches, g_batches, f_batches, token, extra = self.exchange.reduce_statistics(
            a_batches, g_batches, f_batches, token, extra)
        if probe is not None:
            if distributed:          # the ranks' mean probe against the ranks' mean gradient
                scale = probe.scale_after(extra, gradients, finite, scale)
            elif not self._probe_every_step:
                scale = probe.scale_after(probe.probe(token), gradients, finite, scale)
            correction = probe.correction(scale)
            unscaled, unscaled_f = (), ()
            for g_batch in g_batches:
                unscaled += (g_batch * correction,)
            for f_batch in f_batches:
                unscaled_f += (f_batch * correction,)
            g_batches, f_batches = unscaled, unscaled_f
        track = self.policy.refresh.track_changes
        # what the changes are measured against (StaleIntervals.measure): the damped statistics, or None
        fold_damping = damping if self._damped_changes else None
        norm_damping = self.policy.batchnorm_damping if self._damped_changes else None
        zero = ops.zeros((), ms.float32)
        stored_counts = state[FactorState.COUNTS]
        a_counts, g_counts = stored_counts[LayerCounts.A_UPDATES], stored_counts[LayerCounts.G_UPDATES]
        was_demoted = stored_counts[LayerCounts.DEMOTED]
        demoted = ops.logical_or(was_demoted, ops.stack(unseen))
        demoted_each, a_each, g_each = ops.unstack(demoted), ops.unstack(a_counts), ops.unstack(g_counts)
        # an owner's fold that took nothing: nothing taken or rejected, no change (-1, as block.fold
        # reports it); a rank that does not own the layer contributes zeros to the agreement
        unchanged = -ops.ones((), ms.float32)
        idle = fold_outcome(zero, zero, zero, zero, (unchanged, unchanged) if track else None)
        absent = fold_outcome(zero, zero, zero, zero, (zero, zero) if track else None)
        stored = state[FactorState.LAYERS]
        folded, outcomes = (), ()
        for k in range(self.num_layers):
            block = self.blocks[k]
            a, g = stored[k]
            outcome = absent
            if block.owned:
                outcome = idle
                take_a, take_g = self.capture_control.layer_flags(k)
                keep = ops.logical_and(ops.logical_not(demoted_each[k]), finite)
                take_a, take_g = ops.logical_and(take_a, keep), ops.logical_and(take_g, keep)
                if self.refresh_rule.per_layer:
                    # per-statistic intervals: most steps fold a few layers, so each layer's fold is a
                    # run-time branch of its own (nested in the fold's; like the per-layer inversions)
                    if ops.logical_or(take_a, take_g):
                        a, g, outcome = block.fold(stored[k], (a_each[k], g_each[k]), a_batches[k],
                                                   g_batches[k], take_a, take_g, self.factor_decay, track,
                                                   fold_damping)
                else:
                    a, g, outcome = block.fold(stored[k], (a_each[k], g_each[k]), a_batches[k], g_batches[k],
                                               take_a, take_g, self.factor_decay, track, fold_damping)
            folded += ((a, g),)
            outcomes += (outcome,)
        # what each statistic's fold did, made identical on every rank (distributed: the owners' outcome)
        outcomes = self.exchange.agree(outcomes, token)
        refreshed, took_a, took_g, rejected, a_changes, g_changes = (), (), (), (), (), ()
        for k in range(self.num_layers):
            outcome = outcomes[k]
            took_a += (outcome[FoldOutcome.TOOK_A],)
            took_g += (outcome[FoldOutcome.TOOK_G],)
            rejected += (outcome[FoldOutcome.REJECTED_A] + outcome[FoldOutcome.REJECTED_G],)
            refreshed += (ops.logical_or(outcome[FoldOutcome.TOOK_A] > 0.5, outcome[FoldOutcome.TOOK_G] > 0.5),)
            if track:
                a_changes += (outcome[FoldOutcome.CHANGE_A],)
                g_changes += (outcome[FoldOutcome.CHANGE_G],)
        counts = (a_counts + ops.cast(ops.stack(took_a) > 0.5, ms.int32),      # in LayerCounts' order
                  g_counts + ops.cast(ops.stack(took_g) > 0.5, ms.int32), demoted)
        faults = state[FactorState.FAULTS] + ops.cast(ops.reduce_sum(ops.stack(rejected)) + 0.5, ms.int32)
        changes = ops.stack(a_changes + g_changes) if track else -ops.ones((1,), ms.float32)
        if not self.num_norms:
            return factor_state(folded, counts, faults), refreshed, changes, scale
        norms, norm_counts, norm_changes = (), (), ()
        fishers, f_each = state[FactorState.NORM_FISHERS], ops.unstack(state[FactorState.NORM_COUNTS])
        for j in range(self.num_norms):
            fisher, count, bad, change = self.norm_blocks[j].fold(
                fishers[j], f_each[j], f_batches[j], ops.logical_and(self.capture_control.norm_flag(j), finite),
                self.factor_decay, track, norm_damping)
            norms += (fisher,)
            norm_counts += (count,)
            norm_changes += (change,)
            faults = faults + bad
        if track:
            changes = ops.concat((changes, ops.stack(norm_changes)))
        return factor_state(folded, counts, faults, norms, ops.stack(norm_counts)), refreshed, changes, scale

    def _store_factors(self, state):
        layers = state[FactorState.LAYERS]
        for k in range(self.num_layers):
            self.blocks[k].write_factors(layers[k])
        self.counters.write_factor_counts(state[FactorState.COUNTS])
        ops.assign(self.factor_faults, state[FactorState.FAULTS])
        if self.num_norms:
            fishers = state[FactorState.NORM_FISHERS]
            for j in range(self.num_norms):
                self.norm_blocks[j].write_factors(fishers[j])
            self.counters.write_norm_counts(state[FactorState.NORM_COUNTS])
