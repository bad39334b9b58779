"""The natural-gradient engine shared by every optimizer of the package.

One training step, as :meth:`NGDOptimizer.construct` reads:

1. capture -- done by the network during forward/backward (:mod:`mindspore_ngd.capture`), only for
   the statistics whose capture flag the refresh rule set at the end of the previous step;
2. fold -- the captured batch statistics enter each block's moving averages (non-finite batches
   rejected and counted); distributed, they are first reduced to the layers' owners. A layer whose
   capture never ran is demoted to the plain update here, with a WARNING (``strict``: an error);
3. refresh -- the rule says which inverses are due; the owned blocks recompute their damped
   inverses, keeping the last good ones when a check fails;
4. precondition -- ``G^-1 dW A^-1`` per owned layer and unit-wise BatchNorm, gathered to every rank,
   then optional KL clipping (Ba et al. 2017);
5. update -- weight decay, optional gradient clipping and ``nn.Momentum``'s update for every
   parameter; a step with a non-finite gradient changes no weight and no moment and is counted;
6. plan -- the rule updates its state and sets the capture flags of the next step.

:class:`~mindspore_ngd.NGDTrainOneStepCell` compiles the same step a second time with ``_lean`` set
(no fold, no factor write-backs; the capture cells without their branches) and runs that graph on the
steps whose capture flags are all off, where the two compute the same values.

K-FAC, SP-NGD and THOR differ only in their :class:`~mindspore_ngd.Policy`. Each layer's state lives
in its block (:mod:`mindspore_ngd.curvature.kronecker`, :mod:`~mindspore_ngd.curvature.unitwise`),
the collectives in their one order in the exchange (:mod:`mindspore_ngd.parallel.exchange`).

MindSpore 2.10 constraints that shape this code (each measured): state Parameters are written only
in the main graph, never inside a run-time branch (a Parameter assigned inside an ``if`` on a
tensor is disconnected from its host value, so a later ``load_param_into_net`` would not reach the
graph; the capture's batch buffers, used only inside branches, are therefore not Parameters of the
optimizer); run-time branches are single-level in the capture (a nested one was seen to hang the
CPU graph scheduler there), and nested only for SP-NGD's per-layer folds and inversions, under the
fold's branch and one taken when any layer is due (tested with every inverse method and on two
msrun ranks); the batch statistics are read after the gradients (data dependency on a value
computed from every gradient); a branch never returns an empty tuple (MindSpore miscounts its
outputs).
"""
import functools
import logging

import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

from .. import _validate
from .._graph import columns as matrix_columns
from ..capture import CaptureControl, attach
from ..capture.loss_scale import LossScaleProbe, reference_layer
from ..curvature.counters import LayerCounters
from ..curvature.kronecker import KroneckerBlock
from ..curvature.unitwise import UnitBatchNormBlock, UnitBatchNormStack
from ..parallel import comm as parallel_comm
from ..parallel.exchange import DistributedExchange, LocalExchange
from ..schedule import as_schedule, as_unit_schedule
from .groups import parse_groups
from .layers import discover, parameter_roles, plain_layers
from .argdocs import shared_arguments
from .policy import Policy, check_arguments, default_decay_filter
from .guard import Guard, refuse_compile_cache
from .report import Inspection, report_invisible
from .update import Update, flat_gradients

__all__ = ["NGDOptimizer"]

logger = logging.getLogger("mindspore_ngd")


@shared_arguments
class NGDOptimizer(Inspection, Update, Guard, nn.Optimizer):
    """Natural-gradient optimizer engine (an ``nn.Optimizer``); use :class:`mindspore_ngd.KFAC` etc.

    Args:
        network (nn.Cell): the network being trained. Its ``nn.Dense`` and ``nn.Conv2d`` cells are
            made to capture Kronecker factors in place (parameter names unchanged); all of its
            trainable parameters are optimised.
        learning_rate: float, per-step list / ndarray / 1-D Tensor, or ``LearningRateSchedule``; >= 0
            as for ``nn.Momentum`` (:func:`mindspore_ngd.schedule.check_learning_rate`), so warm-up
            schedules starting at 0 work; a step at lr 0 changes no weight.
        damping: Tikhonov damping, same forms as ``learning_rate``; > 0.
        momentum: momentum in [0, 1]: a float, or a per-step list / ndarray / 1-D Tensor or a
            ``LearningRateSchedule`` cell (e.g. SP-NGD's momentum rescaled with the learning rate).
        weight_decay (float): >= 0, applied after preconditioning to parameters chosen by
            ``decay_filter``.
        factor_decay (float): moving-average decay of the factors in [0, 1); 0 uses each batch alone.
        loss_scale (float): a fixed loss scale (as ``FixedLossScaleManager``); gradients are divided
            by it and G by its square.
        policy (Policy): refresh rule, damping split, inversion and rescaling choices. Its
            ``inverse_method="auto"`` is resolved for the current device target when the optimizer is
            constructed: ``opt.policy`` and ``opt.inverse_method`` hold the path actually built.
        nesterov (bool): Nesterov momentum, as ``nn.Momentum(use_nesterov=...)``.
        decay_filter (callable): ``Parameter -> bool``; default :func:`default_decay_filter`.
        skip_layers (iterable of str): cell names of Dense/Conv2d layers to leave un-preconditioned.
        verbose (bool): log one INFO line naming the preconditioned layers and the plain-update
            parameters (and, distributed, one naming the collectives). The WARNING line naming every
            non-normalisation layer left to the plain update, with its reason, is logged either way.
        strict (bool): a preconditioned layer that captures nothing on its first capture step (its
            construct is never called, e.g. ``out_proj`` of ``nn.MultiheadAttention``, or its output
            never reaches the loss) raises a RuntimeError naming it; False (default) demotes it to the
            plain update with a WARNING.
        distributed: "auto" (default) -- distributed when ``mindspore.communication`` is initialised
            with more than one rank and the parallel mode is ``DATA_PARALLEL`` (single-device
            behaviour otherwise); True -- distributed, raising if communication is not initialised or
            the mode is not ``DATA_PARALLEL``; False -- never communicate (each rank's own factors;
            raises under ``DATA_PARALLEL``, where the ranks' weights would drift apart).
        grad_worker_fraction: fraction ``f`` of the ranks that own (fold, invert, precondition)
            each layer, ``k / N`` with ``k`` dividing N; None is ``1/N`` (one owner per layer: factor
            and inverse memory ~1/N per rank); 1 makes every rank invert every layer (no gather).
        balance (str): "compute" balances the owners' inversion work (``a^3 + g^3`` per layer),
            "memory" their factor memory (``a^2 + g^2``).
        divergence_patience (int): stop with ``RuntimeError("... diverged at step ...")`` after this
            many consecutive steps with a non-finite gradient (>= 1). Default 10.
        @params@
    """

    def __init__(self, network, learning_rate, damping=1e-3, momentum=0.9, weight_decay=0.0,
                 factor_decay=0.95, loss_scale=1.0, policy=Policy(), nesterov=False,
                 decay_filter=None, skip_layers=(), verbose=True, distributed="auto", grad_worker_fraction=None,
                 balance="compute", divergence_patience=10, params=None, strict=False):
        learning_rate, momentum, weight_decay, factor_decay, loss_scale, policy = check_arguments(
            network, learning_rate, damping, momentum, weight_decay, factor_decay, loss_scale, policy, decay_filter,
            balance)
        divergence_patience = _validate.positive_int("divergence_patience", divergence_patience)
        refuse_compile_cache(type(self).__name__)
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
        if not list(network.trainable_params()):
            raise ValueError("network has no trainable parameters (all requires_grad=False?): "
                             "nothing to optimise")
        groups = parse_groups(network, params)
        specs, cells, norm_specs, norm_cells, skipped = discover(network, skip_layers,
                                                                 policy.batchnorm_damping is not None)
        comm = parallel_comm.resolve(distributed, specs, grad_worker_fraction, balance, policy.split_dim,
                                     owner=type(self).__name__)
        owned = comm.owned if comm is not None else (True,) * len(specs)

        super().__init__(learning_rate, groups.parameters, weight_decay=0.0, loss_scale=loss_scale)
        self.policy = policy
        # SP-NGD's changes measured against the damped statistics (StaleIntervals.measure)
        self._damped_changes = bool(getattr(policy.refresh, "damped_changes", False))
        self.inverse_method = policy.inverse_method
        self.layer_specs = tuple(specs)
        self.norm_specs = tuple(norm_specs)
        self.skipped_layers = tuple(skipped)
        self.num_layers, self.num_norms, self.num_params = len(specs), len(norm_specs), len(self._parameters)
        self.statistic_names = tuple([f"{s.name}.A" for s in specs] + [f"{s.name}.G" for s in specs]
                                     + [f"{s.name}.F" for s in norm_specs])
        prefix = policy.name
        self._roles, index = parameter_roles(self._parameters, specs, norm_specs)
        decay_filter = decay_filter or default_decay_filter
        decay = [groups.weight_decay.get(p.name, weight_decay if decay_filter(p) else 0.0) for p in self._parameters]
        self._decay = tuple(value > 0 for value in decay)
        self.weight_decay_values = tuple(Tensor(np.float32(value)) for value in decay)
        self._centralize = tuple(groups.centralize.get(p.name, False) for p in self._parameters)

        # hyper-parameters
        self.damping = as_schedule(damping, f"{prefix}.damping")
        if isinstance(momentum, float):
            self.momentum = Parameter(Tensor(np.float32(momentum)), name=f"{prefix}.momentum",
                                      requires_grad=False)
            self.momentum_schedule = None
        else:
            self.momentum_schedule = as_unit_schedule(momentum, f"{prefix}.momentum", "momentum")
        self.factor_decay = float(factor_decay)
        self.apply_momentum = ops.ApplyMomentum(use_nesterov=bool(nesterov))
        self.moments = self._parameters.clone(prefix=f"{prefix}.moments", init="zeros")

        # one block per preconditioned layer; the capture control, the exchange and the refresh rule
        traces = getattr(policy.refresh, "trace_threshold", None) is not None
        # the loss scale of each step is measured at one layer with a bias (capture/loss_scale.py); the
        # Monte-Carlo step captures G in its own backward pass at its own fixed scale
        reference = reference_layer(specs) if policy.fisher == "empirical" else None
        self.blocks = nn.CellList([
            KroneckerBlock(s, prefix, index[s.weight_name], index[s.bias_name] if s.has_bias else -1, mine,
                           policy.split_dim, loss_scale, traces, policy.damping_split, policy.inverse_method,
                           policy.jitter, k == reference, policy.stat_fraction, policy.stat_stride)
            for k, (s, mine) in enumerate(zip(specs, owned))],
            auto_prefix=False)
        self.norm_blocks = nn.CellList([
            UnitBatchNormBlock(s, prefix, index[s.gamma_name], index[s.beta_name], loss_scale) for s in norm_specs],
            auto_prefix=False)
        self.norm_stack = UnitBatchNormStack(list(self.norm_blocks)) if norm_specs else None
        self.counters = LayerCounters(prefix, [s.name for s in specs], [s.name for s in norm_specs])
        probe = None if reference is None else LossScaleProbe(self.blocks[reference].capture,
                                                               self.blocks[reference].bias_index, loss_scale, prefix)
        self.capture_control = CaptureControl([b.capture for b in self.blocks], [b.capture for b in self.norm_blocks],
                                              probe, prefix)
        # the loss scale is measured on every step only for THOR's trace probes, which read it between
        # folds (on a single device); otherwise in the fold's branch, on the steps whose statistics use it
        self._probe_every_step = traces and comm is None
        self.communicator = comm
        self.parallel_plan = None if comm is None else comm.plan
        self.exchange = LocalExchange() if comm is None else \
            DistributedExchange(comm, prefix, [s.channels for s in norm_specs],
                                0 if probe is None else specs[reference].g_dim)
        self.refresh_rule = policy.refresh.build(prefix, self.capture_control, self.blocks, self.counters,
                                                 self.exchange)
        self.factor_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.factor_faults", requires_grad=False)
        self.inverse_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_faults", requires_grad=False)
        self.skipped_steps = Parameter(Tensor(0, ms.int32), name=f"{prefix}.skipped_steps", requires_grad=False)
        self.inverse_refreshes = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_refreshes",
                                           requires_grad=False)
        self.demoted_unreported = Parameter(Tensor(np.zeros(len(specs), np.bool_)), name=f"{prefix}.demoted_unreported",
                                            requires_grad=False)
        self._guard_name = type(self).__name__
        self._lean = False        # compile-time: set only by NGDTrainOneStepCell for its lean graph
        self._build_guard(prefix, policy.adaptive_damping, divergence_patience, policy.max_damping_boost, 0.9)
        attach(cells, [b.capture for b in self.blocks])
        attach(norm_cells, [b.capture for b in self.norm_blocks])
        handled = {n for s in specs for n in (s.weight_name, s.bias_name) if n} \
            | {n for s in norm_specs for n in (s.gamma_name, s.beta_name)}
        self.plain_layers, self.normalisation_layers = plain_layers(network, handled, skipped)
        self.strict = bool(strict)
        # called from the compiled step (JIT fallback) on the step that demotes invisible layers
        self._report_invisible = functools.partial(report_invisible, type(self).__name__,
                                                   tuple(s.name for s in specs), self.strict)
        self._log_layers(verbose)

    def upgrade_checkpoint(self, param_dict):
        """Convert a checkpoint written by mindspore_ngd 0.1 for ``mindspore.load_param_into_net``.

        Such checkpoints hold each layer's update counts and flags as separate scalars
        (``{prefix}.{layer}.A_updates``, ``.G_updates``, ``.has_inverse``, ``.demoted``, ``.F_updates``);
        this optimizer stacks them per family (:mod:`mindspore_ngd.curvature.counters`), and keeps
        whether the next step captures anything in ``{prefix}.capturing``
        (:class:`~mindspore_ngd.capture.CaptureControl`) and, with adaptive damping, the momentum
        buffers concatenated in ``{prefix}.damping.moments`` (:mod:`mindspore_ngd.optim.guard`).
        Returns a new dict with these entries; loading an old checkpoint without it leaves the counts
        at zero, and ``load_param_into_net`` lists them as not loaded::

            state = opt.upgrade_checkpoint(mindspore.load_checkpoint(path))
            mindspore.load_param_into_net(train_step, state)
        """
        return self._upgrade_guard(self.capture_control.upgrade(self.counters.upgrade(param_dict)))

    def _set_lean(self, lean):
        """Compile-time switch of the lean graph: with ``lean`` the optimizer's step leaves out the fold
        and the network's capture cells their capture branches. Set only around a lean graph's call."""
        lean = bool(lean)
        object.__setattr__(self, "_lean", lean)
        for block in list(self.blocks) + list(self.norm_blocks):
            object.__setattr__(block.capture, "bypass", lean)

    # ------------------------------------------------------------------ the step
    def construct(self, gradients):
        if self.policy.fisher == "mc" and self.capture_control.driver is None:
            raise RuntimeError("fisher='mc' needs the Monte-Carlo training step: train with "
                               "Model(mindspore_ngd.MCFisherTrainStep(network, loss_fn, optimizer)) "
                               "instead of Model(network, loss_fn, optimizer)")
        gradients = self.scale_grad(self.flatten_gradients(gradients))
        lr = self.get_lr()
        step = self.global_step.reshape(())
        flat = flat_gradients(gradients)
        finite = self._watch(gradients, ops.all(ops.isfinite(flat)), step, self.demoted_unreported)
        token, boost = self._adapt(gradients, flat, finite)
        finite = ops.depend(finite, token)

        damping = self._damping(self.damping(self.global_step), boost)    # read in the main graph
        if self.policy.damping_floor > 0:
            damping = ops.maximum(damping, self.policy.damping_floor)

        # fold the statistics captured in this step's forward/backward pass (one run-time branch)
        factors = self._stored_factors()
        refreshed, changes = self._nothing_refreshed(), -ops.ones((self._change_size(),), ms.float32)
        probe = self.capture_control.scale_probe
        scale = ops.zeros((), ms.float32) if probe is None else probe.scale_seen
        if probe is not None and self._probe_every_step:
            scale = probe.scale_after(probe.probe(finite), gradients, finite, scale)
        # an op reads the flags now: a Parameter used after its assign would read the new value
        not_demoted_before = ops.logical_not(factors[1][2])
        if not self._lean:        # the lean graph runs only on steps that capture nothing: no fold
            if self.capture_control.any():
                factors, refreshed, changes, scale = self._folded(factors, finite, gradients, scale, damping)
            self._store_factors(factors)
        if probe is not None:
            ops.assign(probe.scale_seen, scale)
        # layers demoted this step are reported (warning, or error if strict) at the start of the next
        # step: a host call placed after the fold broke the reload of a checkpoint into the compiled
        # graph (measured, MindSpore 2.10); at the start of the step, like _watch's, it does not
        ops.assign(self.demoted_unreported, ops.logical_and(factors[1][2], not_demoted_before))

        # refresh the inverses the rule says are due
        due = self.refresh_rule.inverse_due(step, refreshed)
        layers = self.refresh_rule.inverse_layers(step, refreshed)
        redamp, inverted_boost = self._reinvert(boost)
        if self.policy.adaptive_damping:                  # the damping moved: refresh every inverse now
            due = ops.logical_or(due, redamp)
            if layers is not None:
                layers = self._all_layers(layers, redamp)
        inverses = self._stored_inverses()
        if self.refresh_rule.per_layer:                   # one branch per layer inside
            if due:
                inverses = self._inverted(inverses, factors, damping, layers)
        elif due:
            inverses = self._inverted(inverses, factors, damping, layers)
        self._store_inverses(inverses, due)
        self._inverted_at(due, boost, inverted_boost)

        # precondition, gather and rescale; then update every parameter
        preconditioned = self._preconditioned(gradients, lr, inverses, factors)
        success = self._update(self._assemble(gradients, preconditioned), lr, finite)
        success = self._remember_step(gradients, flat, lr, finite, success)

        # plan the next step: the rule reads statistics written late in the backward pass (THOR's
        # traces) and, distributed, may hold a collective that must follow the gather
        self.refresh_rule.plan_next(ops.depend(step, success), refreshed, changes)
        ops.assign_add(self.global_step, self.global_step_increase_tensor)
        return success

    @staticmethod
    def _all_layers(layers, every):
        out = ()
        for flag in layers:
            out += (ops.logical_or(flag, every),)
        return out

    # ------------------------------------------------------------------ fold
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

    # ------------------------------------------------------------------ refresh
    def _stored_inverses(self):
        """(per layer (A inverse, G inverse), has-inverse flags (layers,), inverse fault count[, per-layer
        inversion counts of this step when distributed])."""
        layers = ()
        for block in self.blocks:
            layers += (block.inverses(),)
        if self.exchange.distributed:
            return layers, self.counters.has_inverse, self.inverse_faults, ops.zeros((self.num_layers,), ms.int32)
        return layers, self.counters.has_inverse, self.inverse_faults

    def _inverted(self, state, factors, damping, layers):
        """New inverse state: every owned layer that is ready (and selected by ``layers``) re-inverted.

        With a per-layer rule each layer's inversion is its own run-time branch, so a step that
        refreshed one layer inverts only that layer; the caller runs this under one outer branch,
        taken when any layer is due, so that a step which refreshed nothing dispatches one branch
        instead of one per layer. Otherwise the caller runs this under one branch for all layers."""
        ready = LayerCounters.ready(factors[1])
        if layers is not None:
            ready = ops.logical_and(ready, ops.stack(layers))
        ready, trusted = ops.unstack(ready), ops.unstack(state[1])
        faults, new, taken, counts = state[2], (), (), ()
        for k in range(self.num_layers):
            block = self.blocks[k]
            a_inv, g_inv = state[0][k]
            take, inverted = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
            if block.owned:
                if self.refresh_rule.per_layer:
                    fault = ops.zeros((), ms.int32)
                    if ready[k]:
                        a_inv, g_inv, take, fault = block.refreshed(factors[0][k], ready[k], damping, (a_inv, g_inv),
                                                                    trusted[k])
                    inverted = ops.cast(ready[k], ms.int32)
                else:
                    a_inv, g_inv, take, fault = block.refreshed(factors[0][k], ready[k], damping, (a_inv, g_inv),
                                                                trusted[k])
                    inverted = ops.ones((), ms.int32)
                faults = faults + fault
            new += ((a_inv, g_inv),)
            taken += (take,)
            counts += (inverted,)
        has = ops.logical_or(state[1], ops.stack(taken))
        if self.exchange.distributed:
            return new, has, faults, ops.stack(counts)
        return new, has, faults

    def _store_inverses(self, state, due):
        for k in range(self.num_layers):
            self.blocks[k].write_inverses(state[0][k])
        self.counters.write_has_inverse(state[1])
        ops.assign(self.inverse_faults, state[2])
        ops.assign_add(self.inverse_refreshes, ops.cast(due, ms.int32))
        if self.exchange.distributed:
            self.exchange.count_inversions(state[3])

    # ------------------------------------------------------------------ precondition and update
    def _preconditioned(self, gradients, lr, inverses, factors):
        """Preconditioned gradient matrices of all layers and BatchNorm (gamma, beta) pairs, KL-clipped.

        Distributed, every rank ends with the same matrices, so the KL factor is identical on every
        rank; the gather waits for the fault count of the fold (collective 3 after 2)."""
        own = ()
        for k in range(self.num_layers):
            block = self.blocks[k]
            if block.owned:
                own += (block.precondition(inverses[0][k], block.gradient(gradients)),)
        matrices = self.exchange.gather(own, factors[2])
        # a demoted layer's update is the plain one: outside the KL budget and never rescaled
        demoted = factors[1][2]
        stacked, norm_grads = None, None
        if self.num_norms:      # every BatchNorm layer's channels at once, cut into layers where needed
            norm_grads = self.norm_stack.gradients(gradients)
            stacked = self.norm_stack.precondition(factors[3], factors[4], norm_grads,
                                                   self.policy.batchnorm_damping)
        if self.policy.kl_clip is None:
            return matrices, self._norm_pairs(stacked)
        if self.is_group_lr:
            vg = self._group_vg(matrices, self._norm_pairs(stacked), self._norm_pairs(norm_grads), gradients, lr)
        else:
            dots, norm_dots = (), ()
            for k in range(self.num_layers):
                dots += (ops.reduce_sum(matrices[k] * self.blocks[k].gradient(gradients)),)
            if self.num_norms:
                norm_dots = self.norm_stack.dots(stacked, norm_grads)
            kept = ops.unstack(ops.where(demoted, ops.zeros((self.num_layers,), ms.float32), ops.stack(dots)))
            vg = ops.addn(kept + norm_dots) * lr * lr
        usable = ops.logical_and(vg > 0, ops.isfinite(vg))
        nu = ops.minimum(ops.sqrt(self.policy.kl_clip / ops.where(usable, vg, ops.ones_like(vg))), 1.0)
        nu = ops.where(usable, nu, ops.ones_like(nu))
        factor = ops.unstack(ops.where(demoted, ops.ones((self.num_layers,), ms.float32), nu))
        scaled, scaled_pairs = (), ()
        for k in range(self.num_layers):
            scaled += (matrices[k] * factor[k],)
        if self.num_norms:
            scaled_pairs = self._norm_pairs((stacked[0] * nu, stacked[1] * nu))
        return scaled, scaled_pairs

    def _norm_pairs(self, stacked):
        """A stacked BatchNorm (gamma, beta) pair cut into per-layer pairs; () without BatchNorm layers."""
        if self.num_norms:
            return self.norm_stack.layer_pairs(stacked)
        return ()

    def _group_vg(self, matrices, pairs, norm_grads, gradients, lr):
        """``sum_i lr_i^2 <P_i, g_i>`` over the preconditioned parameters, each with its own learning
        rate (parameter groups): a layer's weight and bias columns may belong to different groups.
        ``pairs`` and ``norm_grads`` are the BatchNorm layers' preconditioned and plain (gamma, beta)."""
        terms = ()
        for k in range(self.num_layers):
            block = self.blocks[k]
            product = matrices[k] * block.gradient(gradients)
            lr_w = self._lr_of(lr, block.weight_index)
            if block.bias_index >= 0:
                columns = product.shape[1]
                lr_b = self._lr_of(lr, block.bias_index)
                terms += (ops.reduce_sum(matrix_columns(product, 0, columns - 1)) * lr_w * lr_w,
                          ops.reduce_sum(matrix_columns(product, columns - 1, 1)) * lr_b * lr_b)
            else:
                terms += (ops.reduce_sum(product) * lr_w * lr_w,)
        for j in range(self.num_norms):
            block = self.norm_blocks[j]
            grads = norm_grads[j]
            lr_g, lr_b = self._lr_of(lr, block.gamma_index), self._lr_of(lr, block.beta_index)
            terms += (ops.reduce_sum(pairs[j][0] * grads[0]) * lr_g * lr_g,
                      ops.reduce_sum(pairs[j][1] * grads[1]) * lr_b * lr_b)
        return ops.addn(terms)
