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
        """(per layer (A, G), (A counts, G counts, demoted flags), factor fault count[, per BatchNorm layer
        F, F counts]); counts and flags are (layers,) / (BatchNorm layers,) vectors."""
        layers, norms = (), ()
        for block in self.blocks:
            layers += (block.factors(),)
        state = (layers, self.counters.factor_counts(), self.factor_faults)
        if not self.num_norms:
            return state
        for block in self.norm_blocks:
            norms += (block.factors(),)
        return state + (norms, self.counters.f_updates)

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
        a_counts, g_counts, was_demoted = state[1]
        demoted = ops.logical_or(was_demoted, ops.stack(unseen))
        demoted_each, a_each, g_each = ops.unstack(demoted), ops.unstack(a_counts), ops.unstack(g_counts)
        # an owner's fold that took nothing: nothing taken or rejected, no change (-1, as block.fold
        # reports it); a rank that does not own the layer contributes zeros to the agreement
        idle = (zero,) * 4 + ((-ops.ones((), ms.float32),) * 2 if track else ())
        folded, outcomes = (), ()
        for k in range(self.num_layers):
            block = self.blocks[k]
            a, g, outcome = state[0][k][0], state[0][k][1], (zero,) * (6 if track else 4)
            if block.owned:
                outcome = idle
                take_a, take_g = self.capture_control.layer_flags(k)
                keep = ops.logical_and(ops.logical_not(demoted_each[k]), finite)
                take_a, take_g = ops.logical_and(take_a, keep), ops.logical_and(take_g, keep)
                if self.refresh_rule.per_layer:
                    # per-statistic intervals: most steps fold a few layers, so each layer's fold is a
                    # run-time branch of its own (nested in the fold's; like the per-layer inversions)
                    if ops.logical_or(take_a, take_g):
                        a, g, outcome = block.fold(state[0][k], (a_each[k], g_each[k]), a_batches[k],
                                                   g_batches[k], take_a, take_g, self.factor_decay, track,
                                                   fold_damping)
                else:
                    a, g, outcome = block.fold(state[0][k], (a_each[k], g_each[k]), a_batches[k], g_batches[k],
                                               take_a, take_g, self.factor_decay, track, fold_damping)
            folded += ((a, g),)
            outcomes += (outcome,)
        # what each statistic's fold did, made identical on every rank (distributed: the owners' outcome)
        outcomes = self.exchange.agree(outcomes, token)
        refreshed, took_a, took_g, rejected, a_changes, g_changes = (), (), (), (), (), ()
        for k in range(self.num_layers):
            outcome = outcomes[k]
            took_a += (outcome[0],)
            took_g += (outcome[1],)
            rejected += (outcome[2] + outcome[3],)
            refreshed += (ops.logical_or(outcome[0] > 0.5, outcome[1] > 0.5),)
            if track:
                a_changes += (outcome[4],)
                g_changes += (outcome[5],)
        counts = (a_counts + ops.cast(ops.stack(took_a) > 0.5, ms.int32),
                  g_counts + ops.cast(ops.stack(took_g) > 0.5, ms.int32), demoted)
        faults = state[2] + ops.cast(ops.reduce_sum(ops.stack(rejected)) + 0.5, ms.int32)
        changes = ops.stack(a_changes + g_changes) if track else -ops.ones((1,), ms.float32)
        if not self.num_norms:
            return (folded, counts, faults), refreshed, changes, scale
        norms, norm_counts, norm_changes = (), (), ()
        f_each = ops.unstack(state[4])
        for j in range(self.num_norms):
            fisher, count, bad, change = self.norm_blocks[j].fold(
                state[3][j], f_each[j], f_batches[j], ops.logical_and(self.capture_control.norm_flag(j), finite),
                self.factor_decay, track, norm_damping)
            norms += (fisher,)
            norm_counts += (count,)
            norm_changes += (change,)
            faults = faults + bad
        if track:
            changes = ops.concat((changes, ops.stack(norm_changes)))
        return (folded, counts, faults, norms, ops.stack(norm_counts)), refreshed, changes, scale

    def _store_factors(self, state):
        for k in range(self.num_layers):
            self.blocks[k].write_factors(state[0][k])
        self.counters.write_factor_counts(state[1])
        ops.assign(self.factor_faults, state[2])
        if self.num_norms:
            for j in range(self.num_norms):
                self.norm_blocks[j].write_factors(state[3][j])
            self.counters.write_norm_counts(state[4])
