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

Steps 1 to 3 and 6 belong to the curvature estimator the optimizer owns (``opt.curvature``,
:class:`~mindspore_ngd.curvature.estimator.BlockDiagonalCurvature`): the blocks, their counters and
capture flags, the exchange, the refresh rule and the fault and refresh counts. The other steps have
their own modules, mixed into :class:`NGDOptimizer`: the preconditioning and KL clipping in
:mod:`~mindspore_ngd.optim.precondition`, the update in :mod:`~mindspore_ngd.optim.update`; adaptive
damping is a controller Cell the optimizer owns (:mod:`~mindspore_ngd.optim.damping`), the divergence
rules are in :mod:`~mindspore_ngd.optim.divergence`, the step's watch and the status read on the host in
:mod:`~mindspore_ngd.optim.status`, wired together by :mod:`~mindspore_ngd.optim.guard`; this module
builds the optimizer and runs the step. K-FAC, SP-NGD and THOR differ only in their
:class:`~mindspore_ngd.Policy`. Each layer's state lives in its block
(:mod:`mindspore_ngd.curvature.kronecker`, :mod:`~mindspore_ngd.curvature.unitwise`), the collectives
in their one order in the exchange (:mod:`mindspore_ngd.parallel.exchange`).

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
from ..capture import attach
from ..curvature.estimator import BlockDiagonalCurvature
from ..curvature.state import FactorState, LayerCounts
from ..parallel import comm as parallel_comm
from ..schedule import as_schedule, as_unit_schedule
from .groups import parse_groups
from .layers import discover, parameter_roles, plain_layers, scale_batchnorm
from .argdocs import shared_arguments
from .policy import Policy, check_arguments, default_decay_filter, resolve_nesterov
from .divergence import check_divergence_growth
from .guard import Guard
from .status import refuse_compile_cache, resolve_host_calls
from .precondition import Precondition
from .report import Inspection, loss_refusal, not_training_message, register_for_loss_check, report_invisible
from .update import Update, flat_gradients

__all__ = ["NGDOptimizer"]

logger = logging.getLogger("mindspore_ngd")

# the attributes the optimizer held before the curvature estimator owned them (``opt.blocks`` is
# ``opt.curvature.blocks``), kept for the host-side readers: tests, benchmarks, callbacks, user code
_FORMER_NAMES = ("blocks", "norm_blocks", "norm_group", "counters", "capture_control", "exchange", "refresh_rule",
                 "factor_faults", "inverse_faults", "inverse_refreshes", "statistic_names", "factor_decay")


@shared_arguments
class NGDOptimizer(Precondition, Inspection, Update, Guard, nn.Optimizer):
    """Natural-gradient optimizer engine (an ``nn.Optimizer``); use :class:`mindspore_ngd.KFAC` etc.

    Two ways of training are refused on the first step, before any weight moves: a loss that is not the
    batch mean (``reduction="none"`` or ``"sum"``) in the training cell that runs the optimizer
    (ValueError naming ``reduction="mean"``), and gradient accumulation, several backward passes summed
    into one optimizer call (RuntimeError naming the working form; without host calls the run stops and
    :meth:`check_status` raises it). See docs/limitations.md, "Training modes".

    Args:
        network (nn.Cell): the network being trained. Its ``nn.Dense`` and ``nn.Conv2d`` cells are
            made to capture Kronecker factors in place (parameter names unchanged); all of its
            trainable parameters are optimised.
        learning_rate: float, per-step list / ndarray / 1-D Tensor, or ``LearningRateSchedule``; >= 0
            as for ``nn.Momentum`` (:func:`mindspore_ngd.schedule.check_learning_rate`), so warm-up
            schedules starting at 0 work; a step at lr 0 changes no weight.
        momentum: momentum in [0, 1]: a float, or a per-step list / ndarray / 1-D Tensor or a
            ``LearningRateSchedule`` cell (e.g. SP-NGD's momentum rescaled with the learning rate).
        weight_decay (float): >= 0, applied after preconditioning to parameters chosen by
            ``decay_filter``.
        loss_scale (float): a fixed loss scale (as ``FixedLossScaleManager``); gradients are divided
            by it and G by its square.
        use_nesterov (bool): Nesterov momentum, as ``nn.Momentum``'s.

        The arguments above take the positions of ``nn.Momentum``'s; every argument below is
        keyword-only.

        damping: Tikhonov damping, same forms as ``learning_rate``; > 0.
        factor_decay (float): moving-average decay of the factors in [0, 1); 0 uses each batch alone.
        policy (Policy): refresh rule, damping split, inversion and rescaling choices. Its
            ``inverse_method="auto"`` is resolved for the current device target when the optimizer is
            constructed: ``opt.policy`` and ``opt.inverse_method`` hold the path actually built.
        nesterov (bool): the former spelling of ``use_nesterov`` (None: not given).
        decay_filter (callable): ``Parameter -> bool``; default :func:`default_decay_filter`.
        skip_layers (iterable of str): cell names of Dense/Conv2d layers to leave un-preconditioned.
        verbose (bool or None): one INFO line naming the preconditioned layers and the plain-update
            parameters (and, distributed, one naming the collectives). None (default): logged at INFO,
            shown only when the application configured logging at INFO; True: always shown (on stderr
            when logging is not configured); False: never. The WARNING line naming every
            non-normalisation layer left to the plain update, with its reason, is logged either way.
        strict (bool): a preconditioned layer that captures nothing on its first capture step (its
            construct is never called: its owner reads its weight directly; or its output
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
            many consecutive steps with a non-finite gradient (>= 1), or this many consecutive finite
            steps that explode (see ``divergence_growth``). Default 10.
        divergence_growth (float): a finite step explodes when its gradient norm is more than this
            many times the gradient norm of the first finite step (> 1; None: only adaptive damping's
            multiplier pinned at ``max_damping_boost`` while the steps still overshoot counts).
            Default 1e3 (docs/algorithms.md, "Fault handling").
        @host_calls@
        @params@
    """

    def __init__(self, network, learning_rate, momentum=0.9, weight_decay=0.0, loss_scale=1.0, use_nesterov=False,
                 *, damping=1e-3, factor_decay=0.95, policy=Policy(),
                 decay_filter=None, skip_layers=(), verbose=None, distributed="auto", grad_worker_fraction=None,
                 balance="compute", divergence_patience=10, params=None, strict=False, nesterov=None,
                 divergence_growth=1e3, host_calls="auto"):
        learning_rate, momentum, weight_decay, factor_decay, loss_scale, policy = check_arguments(
            network, learning_rate, damping, momentum, weight_decay, factor_decay, loss_scale, policy, decay_filter,
            balance, type(self).__name__)
        # nesterov: the former spelling, still passed by subclasses (THOR maps nn.thor's use_nesterov onto it)
        nesterov = resolve_nesterov(use_nesterov, nesterov, warn=False)
        divergence_patience = _validate.positive_int("divergence_patience", divergence_patience)
        divergence_growth = check_divergence_growth(divergence_growth)
        host_calls = resolve_host_calls(host_calls)
        if host_calls:
            refuse_compile_cache(type(self).__name__)
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
        if not list(network.trainable_params()):
            raise ValueError("network has no trainable parameters (all requires_grad=False?): "
                             "nothing to optimise")
        groups = parse_groups(network, params)
        specs, cells, norm_specs, norm_cells, skipped = discover(network, skip_layers,
                                                                 policy.batchnorm_damping is not None, policy)
        comm = parallel_comm.resolve(distributed, specs, grad_worker_fraction, balance, policy.split_dim,
                                     owner=type(self).__name__)
        owned = comm.owned if comm is not None else (True,) * len(specs)

        super().__init__(learning_rate, groups.parameters, weight_decay=0.0, loss_scale=loss_scale)
        self.policy = policy
        self.inverse_method = policy.inverse_method
        self.layer_specs = tuple(specs)
        self.norm_specs = tuple(norm_specs)
        self.skipped_layers = tuple(skipped)
        self.num_layers, self.num_norms, self.num_params = len(specs), len(norm_specs), len(self._parameters)
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
        self.apply_momentum = ops.ApplyMomentum(use_nesterov=bool(nesterov))
        self.moments = self._parameters.clone(prefix=f"{prefix}.moments", init="zeros")

        # the blocks, their counters and capture flags, the exchange, the refresh rule and the fault and
        # refresh counts: the curvature estimator (curvature/estimator.py), which folds and refreshes
        self.communicator = comm
        self.parallel_plan = None if comm is None else comm.plan
        scale_norm, scale_cell = scale_batchnorm(network, norm_cells, index)
        self.curvature = BlockDiagonalCurvature(specs, norm_specs, index, owned, comm, policy, loss_scale,
                                                factor_decay, scale_norm)
        # the estimator's state under the optimizer's former attribute names, for host-side reads (plain
        # attributes: not registered a second time as the optimizer's own Cells and Parameters)
        for name in _FORMER_NAMES:
            object.__setattr__(self, name, getattr(self.curvature, name))
        blocks = self.curvature.blocks
        # gradient accumulation is refused (status.DeviceStatus._accumulated): one layer counts the backward passes
        # between two optimizer steps -- on one device the probe's layer, whose recorded bias gradient
        # tells a pass the training cell discarded (a loss-scale overflow) from one it summed; else (no
        # probe, or distributed) the first layer, the last one a backward pass reaches
        self._pass_layer = None
        if specs:
            probe_layer = self.curvature.probe_layer
            self._pass_layer = probe_layer if probe_layer is not None and comm is None else 0
            blocks[self._pass_layer].capture.count_passes()
        self.skipped_steps = Parameter(Tensor(0, ms.int32), name=f"{prefix}.skipped_steps", requires_grad=False)
        self.demoted_unreported = Parameter(Tensor(np.zeros(len(specs), np.bool_)), name=f"{prefix}.demoted_unreported",
                                            requires_grad=False)
        self._guard_name = type(self).__name__
        self._lean = False        # compile-time: set only by NGDTrainOneStepCell for its lean graph
        self._build_guard(prefix, policy.adaptive_damping, divergence_patience, policy.max_damping_boost, 0.9,
                          divergence_growth, host_calls)
        attach(cells, [b.capture for b in blocks])
        attach(norm_cells, [b.capture for b in self.curvature.norm_blocks])
        scale_probe = self.curvature.capture_control.scale_probe
        if scale_probe is not None and self.curvature.probe_layer is None:     # the probe sits at a BatchNorm
            attach([scale_cell], [scale_probe.capture])
        # the capturing cells, held outside the cell tree (not child cells of the optimizer): their
        # training flags are read when the step is compiled (graph mode) or called (PyNative)
        object.__setattr__(self, "_captured_cells", tuple(zip((s.name for s in specs), cells)))
        # the key under which the step finds this optimizer to check its training cell's loss (report.loss_refusal)
        self._loss_key = register_for_loss_check(self)
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
        buffers concatenated in ``{prefix}.damping.moments`` (:mod:`mindspore_ngd.optim.damping`).
        Returns a new dict with these entries; loading an old checkpoint without it leaves the counts
        at zero, and ``load_param_into_net`` lists them as not loaded::

            state = opt.upgrade_checkpoint(mindspore.load_checkpoint(path))
            mindspore.load_param_into_net(train_step, state)
        """
        curvature = self.curvature
        return self._upgrade_guard(curvature.capture_control.upgrade(curvature.counters.upgrade(param_dict)))

    def _set_lean(self, lean):
        """Compile-time switch of the lean graph: with ``lean`` the optimizer's step leaves out the fold
        and the network's capture cells their capture branches. Set only around a lean graph's call."""
        lean = bool(lean)
        object.__setattr__(self, "_lean", lean)
        for block in list(self.curvature.blocks) + list(self.curvature.norm_blocks):
            object.__setattr__(block.capture, "bypass", lean)

    def _stop_counting_passes(self):
        """Leave out the check for gradient accumulation (the backward-pass count): for a training cell
        that runs one backward pass per optimizer call by construction (:class:`NGDTrainOneStepCell`).
        Call before the step is compiled."""
        if self._pass_layer is not None:
            self.curvature.blocks[self._pass_layer].capture.counts_passes = False
            self._pass_layer = None

    @property
    def _layers_not_training(self):
        """Names of the preconditioned layers that are not in training mode (a Python value: read when the
        step is compiled in graph mode, at every call in PyNative). Their capture runs only in training
        mode, as BatchNorm's batch statistics do."""
        return tuple(name for name, cell in self._captured_cells if not cell.training)

    # ------------------------------------------------------------------ the step
    def construct(self, gradients):
        refusal = loss_refusal(self._loss_key)
        if refusal:
            raise ValueError(refusal)
        if self._layers_not_training:
            raise RuntimeError(not_training_message(type(self).__name__, self._layers_not_training,
                                                    len(self._captured_cells)))
        curvature = self.curvature
        if self.policy.fisher == "mc" and curvature.capture_control.driver is None:
            raise RuntimeError("fisher='mc' needs the Monte-Carlo training step: train with "
                               "Model(mindspore_ngd.MCFisherTrainStep(network, loss_fn, optimizer)) "
                               "instead of Model(network, loss_fn, optimizer)")
        gradients = self.scale_grad(self.flatten_gradients(gradients))
        lr = self.get_lr()
        step = self.global_step.reshape(())
        flat = flat_gradients(gradients)
        finite = ops.all(ops.isfinite(flat))
        accumulated = self._accumulated(gradients, finite)
        finite = self._watch(flat, finite, step, self.demoted_unreported, accumulated)
        token, boost = self._adapt(gradients, flat, finite)
        finite = ops.depend(finite, token)

        damping = self._damping(self.damping(self.global_step), boost)    # read in the main graph
        if self.policy.damping_floor > 0:
            damping = ops.maximum(damping, self.policy.damping_floor)

        # fold the statistics captured in this step's forward/backward pass (one run-time branch)
        factors = curvature.stored_factors()
        refreshed, changes = curvature.nothing_folded()
        scale = curvature.scale_seen(gradients, finite)
        # an op reads the flags now: a Parameter used after its assign would read the new value
        not_demoted_before = ops.logical_not(factors[FactorState.COUNTS][LayerCounts.DEMOTED])
        if not self._lean:        # the lean graph runs only on steps that capture nothing: no fold
            # written back layer by layer; from here on the factors are read from their Parameters (the
            # same values, loaded after the writes), so no fold output lives on through the refresh
            factors, refreshed, changes, scale = curvature.folded_and_stored(factors, finite, gradients, scale,
                                                                             damping)
        if curvature.measures_scale:
            curvature.store_scale(scale)
        # layers demoted this step are reported (warning, or error if strict) at the start of the next
        # step: a host call placed after the fold broke the reload of a checkpoint into the compiled
        # graph (measured, MindSpore 2.10); at the start of the step, like _watch's, it does not
        ops.assign(self.demoted_unreported, ops.logical_and(factors[FactorState.COUNTS][LayerCounts.DEMOTED],
                                                            not_demoted_before))

        # refresh the inverses the rule says are due
        due, layers = curvature.inverses_due(step, refreshed)
        # with adaptive damping only: a value or call that comes to nothing in the graph (a None, a
        # method without an op) is dropped by MindSpore with a warning about side effects
        inverted_boost = None
        if self.adaptive_damping:
            # whether the multiplier moved by more than 2x since the inverses were computed, and the
            # multiplier they were computed with; if it moved, every inverse is refreshed now
            redamp, inverted_boost = self.damping_controller.reinvert(boost)
            due = ops.logical_or(due, redamp)
            if layers is not None:
                layers = curvature.every_layer(layers, redamp)
        inverses = curvature.refreshed(factors, damping, layers, due)    # one branch per layer, each written at once
        if self.adaptive_damping:
            self.damping_controller.inverted_at(due, boost, inverted_boost)

        # precondition, gather and rescale; then update every parameter
        preconditioned = self._preconditioned(gradients, lr, inverses, factors)
        success = self._update(self._assemble(gradients, preconditioned), lr, finite)
        success = self._remember_step(gradients, flat, lr, finite, success)

        # plan the next step: the rule reads statistics written late in the backward pass (THOR's
        # traces) and, distributed, may hold a collective that must follow the gather
        curvature.plan_next(ops.depend(step, success), refreshed, changes)
        ops.assign_add(self.global_step, self.global_step_increase_tensor)
        return success
