"""The natural-gradient engine shared by every optimizer of the package.

One training step, in the order of :meth:`NGDOptimizer.construct`:

1. capture -- done by the network itself during forward/backward (see :mod:`mindspore_ngd.capture`),
   only for the statistics whose capture flag was set at the end of the previous step;
2. factors -- batch factors folded into moving averages, ``X <- d X + (1 - d) X_batch`` (the first
   capture of a statistic initialises it), non-finite batches rejected and counted;
3. inverses -- on refresh steps, damped inverses of every layer's factors (damping split between A
   and G by the policy), kept from the last good refresh when a check fails;
4. precondition -- ``G^-1 dW A^-1`` per layer (bias as the last column of dW);
5. rescale -- optional KL clipping (Ba et al. 2017) over the preconditioned layers;
6. update -- weight decay on the parameters the decay filter selects, then ``nn.Momentum``'s
   update (``ApplyMomentum``) for every parameter; a step with a non-finite gradient changes no
   weight and no moment and is counted;
7. schedule -- the policy decides which statistics the next step captures.

K-FAC, SP-NGD and THOR differ only in the :class:`Policy` and in the two refresh hooks
(:meth:`NGDOptimizer._capture_next` and :meth:`NGDOptimizer._inverse_due`).

Distributed (``msrun`` + ``DATA_PARALLEL``; see :mod:`mindspore_ngd.parallel.comm`): the gradients
reach the optimizer already averaged over the ranks; each preconditioned layer is owned by
``grad_worker_fraction * N`` ranks (:func:`mindspore_ngd.parallel.plan_ownership`, a Python constant
per layer). Step 2 packs every layer's batch factors into one buffer, sums it across the ranks and
divides by N (the factors are per-rank means over equal local batches), and only the owners fold,
invert (step 3) and precondition (step 4) a layer; the preconditioned gradients are then gathered so
that every rank has every layer and steps 5-7 run identically everywhere (same weights on every
rank). Non-owned layers hold (1, 1) placeholder factors and inverses. Every run-time decision
(which statistic was taken, relative changes, THOR's trace test) is made identical on all ranks by
summing the owners' values (``share``) -- a rank entering a branch with a collective that another
rank skips would deadlock. With one rank, or without ``mindspore.communication.init()``, none of this
is in the graph.
"""
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, ParameterTuple, Tensor

from .. import _validate
from ..capture import LayerCapture, NormCapture, attach, find_batchnorms, find_layers
from ..parallel import comm as parallel_comm
from ..parallel.plan import BALANCES
from ..curvature import factors as fac
from ..curvature import blocks as blk
from ..curvature import inverse as inv_ops
from ..schedule import as_schedule, as_unit_schedule, check_positive_schedule

__all__ = ["Policy", "NGDOptimizer", "default_decay_filter"]

logger = logging.getLogger("mindspore_ngd")


@dataclass(frozen=True)
class Policy:
    """What distinguishes one natural-gradient optimizer from another.

    Attributes:
        name: prefix of every state Parameter ("kfac", "spngd", "thor").
        factor_update_interval: capture statistics every this many steps.
        inverse_update_interval: recompute damped inverses every this many steps.
        damping_split: "pi" (factored Tikhonov, Martens & Grosse 2015 sec. 6.3) or "sqrt".
        inverse_method: "cholesky", "lu" or "eigh" (see :mod:`mindspore_ngd.curvature.inverse`).
        kl_clip: KL-clipping bound, or None for no rescaling.
        jitter: extra damping ``jitter * trace(factor)`` that keeps float32 Cholesky safe.
        split_dim: invert factors larger than this as block-diagonal with blocks of this size
            (THOR's hardware-driven splitting); None inverts whole factors.
        clip_norm: clip every final gradient tensor (after preconditioning and weight decay) to this
            L2 norm, as MindSpore's THOR ``enable_clip_grad`` does; None disables.
        batchnorm_damping: precondition BatchNorm gamma/beta unit-wise (one damped 2x2 Fisher per
            channel, SP-NGD) with this damping; None gives them the plain update.
        damping_floor: the damping used is ``max(damping, damping_floor)`` (SP-NGD floors it at the
            weight-decay coefficient).
        fisher: "empirical" (G from the training labels) or "mc" (G from labels sampled from the
            model's predictive distribution; needs :class:`mindspore_ngd.MCFisherTrainStep`).
        track_changes: measure the relative change of every statistic when it is refreshed (the
            input of SP-NGD's adaptive intervals).
    """
    name: str = "kfac"
    factor_update_interval: int = 1
    inverse_update_interval: int = 20
    damping_split: str = "pi"
    inverse_method: str = "cholesky"
    kl_clip: Optional[float] = 1e-3
    jitter: float = 1e-6
    split_dim: Optional[int] = None
    clip_norm: Optional[float] = None
    batchnorm_damping: Optional[float] = None
    damping_floor: float = 0.0
    fisher: str = "empirical"
    track_changes: bool = False

    def validated(self):
        _validate.positive_int("factor_update_interval", self.factor_update_interval)
        _validate.positive_int("inverse_update_interval", self.inverse_update_interval)
        _validate.one_of("damping_split", self.damping_split, inv_ops.DAMPING_SPLITS)
        _validate.one_of("inverse_method", self.inverse_method, inv_ops.INVERSE_METHODS)
        _validate.optional_positive_float("kl_clip", self.kl_clip)
        _validate.non_negative_float("jitter", self.jitter)
        if self.split_dim is not None:
            _validate.positive_int("split_dim", self.split_dim)
        _validate.optional_positive_float("clip_norm", self.clip_norm)
        _validate.optional_positive_float("batchnorm_damping", self.batchnorm_damping)
        _validate.non_negative_float("damping_floor", self.damping_floor)
        _validate.one_of("fisher", self.fisher, FISHER_KINDS)
        return self


FISHER_KINDS = ("empirical", "mc")


def default_decay_filter(param):
    """Weight decay applies to parameters with more than one dimension (weights of Dense/Conv and
    embeddings), not to biases and normalisation scales/shifts (BatchNorm/LayerNorm gamma, beta)."""
    return len(param.shape) > 1


class NGDOptimizer(nn.Optimizer):
    """Natural-gradient optimizer engine (an ``nn.Optimizer``); use :class:`mindspore_ngd.KFAC` etc.

    Args:
        network (nn.Cell): the network being trained. Its ``nn.Dense`` and ``nn.Conv2d`` cells are
            made to capture Kronecker factors in place (parameter names unchanged); all of its
            trainable parameters are optimised.
        learning_rate: float, per-step list / ndarray / 1-D Tensor, or ``LearningRateSchedule``; > 0.
        damping: Tikhonov damping, same forms as ``learning_rate``; > 0.
        momentum: momentum in [0, 1]: a float, or a per-step list / ndarray / 1-D Tensor or a
            ``LearningRateSchedule`` cell (e.g. SP-NGD's momentum rescaled with the learning rate).
        weight_decay (float): >= 0, applied after preconditioning to parameters chosen by
            ``decay_filter``.
        factor_decay (float): moving-average decay of the factors in [0, 1); 0 uses each batch alone.
        loss_scale (float): a fixed loss scale (as ``FixedLossScaleManager``); gradients are divided
            by it and G by its square.
        policy (Policy): refresh, damping split, inversion and rescaling choices.
        nesterov (bool): Nesterov momentum, as ``nn.Momentum(use_nesterov=...)``.
        decay_filter (callable): ``Parameter -> bool``; default :func:`default_decay_filter`.
        skip_layers (iterable of str): cell names of Dense/Conv2d layers to leave un-preconditioned.
        verbose (bool): log one line naming the preconditioned and the plain-update layers (and,
            distributed, one naming the collectives).
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
    """

    def __init__(self, network, learning_rate, damping=1e-3, momentum=0.9, weight_decay=0.0,
                 factor_decay=0.95, loss_scale=1.0, policy=Policy(), nesterov=False,
                 decay_filter=None, skip_layers=(), verbose=True, distributed="auto", grad_worker_fraction=None,
                 balance="compute"):
        if not isinstance(network, nn.Cell):
            raise TypeError(f"network must be a mindspore.nn.Cell, got {type(network).__name__}")
        learning_rate = check_positive_schedule("learning_rate", learning_rate)
        check_positive_schedule("damping", damping)
        if isinstance(momentum, (int, float)) and not isinstance(momentum, bool):
            momentum = _validate.float_in_range("momentum", momentum, 0.0, 1.0, high_inclusive=True)
        weight_decay = _validate.non_negative_float("weight_decay", weight_decay)
        factor_decay = _validate.float_in_range("factor_decay", factor_decay, 0.0, 1.0)
        loss_scale = _validate.positive_float("loss_scale", loss_scale)
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a mindspore_ngd.Policy, got {type(policy).__name__}")
        policy = policy.validated()
        if decay_filter is not None and not callable(decay_filter):
            raise TypeError("decay_filter must be a callable Parameter -> bool")
        skip_layers = set(skip_layers)

        params = list(network.trainable_params())
        if not params:
            raise ValueError("network has no trainable parameters (all requires_grad=False?): "
                             "nothing to optimise")
        specs, cells, skipped = find_layers(network)
        unknown = skip_layers - {s.name for s in specs} - {n for n, _ in skipped}
        if unknown:
            raise ValueError(f"skip_layers names no Dense/Conv2d cell of the network: {sorted(unknown)}")
        keep = [i for i, s in enumerate(specs) if s.name not in skip_layers]
        skipped += [(specs[i].name, "skip_layers") for i in range(len(specs)) if i not in keep]
        specs, cells = [specs[i] for i in keep], [cells[i] for i in keep]
        norm_specs, norm_cells = [], []
        if policy.batchnorm_damping is not None:
            norm_specs, norm_cells, norm_skipped = find_batchnorms(network)
            skipped += norm_skipped
        if not specs:
            raise ValueError("network has no nn.Dense or nn.Conv2d layer that can be preconditioned"
                             + (f" (skipped: {skipped})" if skipped else ""))
        _validate.one_of("balance", balance, BALANCES)
        comm = parallel_comm.resolve(distributed, specs, grad_worker_fraction, balance, policy.split_dim,
                                     owner=type(self).__name__)
        owned = comm.owned if comm is not None else (True,) * len(specs)

        super().__init__(learning_rate, params, weight_decay=0.0, loss_scale=loss_scale)
        self.policy = policy
        self.layer_specs = tuple(specs)
        self.skipped_layers = tuple(skipped)
        prefix = policy.name

        # which gradient belongs to which layer (Python constants unrolled in the graph)
        index = {p.name: i for i, p in enumerate(self._parameters)}
        self._weight_index = tuple(index[s.weight_name] for s in specs)
        self._bias_index = tuple(index[s.bias_name] if s.has_bias else -1 for s in specs)
        roles = [(-1, False)] * len(params)
        for k, s in enumerate(specs):
            roles[index[s.weight_name]] = (k, False)
            if s.has_bias:
                roles[index[s.bias_name]] = (k, True)
        self._roles = tuple(roles)
        # unit-wise BatchNorm: parameter index -> (norm index, 0 gamma / 1 beta)
        norm_roles = [(-1, 0)] * len(params)
        for j, s in enumerate(norm_specs):
            norm_roles[index[s.gamma_name]] = (j, 0)
            norm_roles[index[s.beta_name]] = (j, 1)
        self._norm_roles = tuple(norm_roles)
        self._gamma_index = tuple(index[s.gamma_name] for s in norm_specs)
        self._beta_index = tuple(index[s.beta_name] for s in norm_specs)
        decay_filter = decay_filter or default_decay_filter
        self._decay = tuple(bool(decay_filter(p)) and weight_decay > 0 for p in self._parameters)

        # hyper-parameters
        self.damping = as_schedule(damping, f"{prefix}.damping")
        if isinstance(momentum, float):
            self.momentum = Parameter(Tensor(np.float32(momentum)), name=f"{prefix}.momentum",
                                      requires_grad=False)
            self.momentum_schedule = None
        else:
            self.momentum_schedule = as_unit_schedule(momentum, f"{prefix}.momentum", "momentum")
        self.weight_decay_value = Tensor(np.float32(weight_decay))
        self.factor_decay = float(factor_decay)
        self.kl_clip = policy.kl_clip
        self.apply_momentum = ops.ApplyMomentum(use_nesterov=bool(nesterov))

        # state: moments, factors, inverses, counters -- all Parameters with deterministic names
        self.moments = self._parameters.clone(prefix=f"{prefix}.moments", init="zeros")
        self.captures = nn.CellList([LayerCapture(s, prefix, loss_scale) for s in specs], auto_prefix=False)

        # a layer this rank does not own (distributed) keeps (1, 1) placeholders of its factors and inverses
        self._owned = owned

        def square(dim, name, fill=0.0, mine=True):
            dim = dim if mine else 1
            return Parameter(Tensor(np.eye(dim, dtype=np.float32) * fill), name=name, requires_grad=False)

        self.a_factors = ParameterTuple([square(s.a_dim, f"{prefix}.{s.name}.A", mine=o) for s, o in zip(specs, owned)])
        self.g_factors = ParameterTuple([square(s.g_dim, f"{prefix}.{s.name}.G", mine=o) for s, o in zip(specs, owned)])
        self._a_layouts = tuple(blk.BlockLayout.of(s.a_dim, policy.split_dim) for s in specs)
        self._g_layouts = tuple(blk.BlockLayout.of(s.g_dim, policy.split_dim) for s in specs)

        def identity_inverse(layout, name, mine):
            if layout.count == 1 or not mine:
                return square(layout.dim, name, 1.0, mine)
            eye = np.broadcast_to(np.eye(layout.size, dtype=np.float32), (layout.count, layout.size, layout.size))
            return Parameter(Tensor(np.ascontiguousarray(eye)), name=name, requires_grad=False)

        self.a_inverses = ParameterTuple([identity_inverse(lay, f"{prefix}.{s.name}.A_inv", o)
                                          for s, lay, o in zip(specs, self._a_layouts, owned)])
        self.g_inverses = ParameterTuple([identity_inverse(lay, f"{prefix}.{s.name}.G_inv", o)
                                          for s, lay, o in zip(specs, self._g_layouts, owned)])
        self.a_updates = ParameterTuple([Parameter(Tensor(0, ms.int32), name=f"{prefix}.{s.name}.A_updates",
                                                   requires_grad=False) for s in specs])
        self.g_updates = ParameterTuple([Parameter(Tensor(0, ms.int32), name=f"{prefix}.{s.name}.G_updates",
                                                   requires_grad=False) for s in specs])
        self.norm_specs = tuple(norm_specs)
        self.norm_captures = nn.CellList([NormCapture(s, prefix, loss_scale) for s in norm_specs],
                                         auto_prefix=False)
        self.norm_factors = ParameterTuple([
            Parameter(Tensor(np.zeros((s.channels, 3), np.float32)), name=f"{prefix}.{s.name}.F",
                      requires_grad=False) for s in norm_specs])
        self.norm_updates = ParameterTuple([Parameter(Tensor(0, ms.int32), name=f"{prefix}.{s.name}.F_updates",
                                                      requires_grad=False) for s in norm_specs])
        self.num_norms = len(norm_specs)
        self.num_statistics = 2 * len(specs) + len(norm_specs)
        self.has_inverse = ParameterTuple([Parameter(Tensor(False), name=f"{prefix}.{s.name}.has_inverse",
                                                     requires_grad=False) for s in specs])
        self.factor_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.factor_faults", requires_grad=False)
        self.inverse_faults = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_faults", requires_grad=False)
        self.skipped_steps = Parameter(Tensor(0, ms.int32), name=f"{prefix}.skipped_steps", requires_grad=False)
        self.inverse_refreshes = Parameter(Tensor(0, ms.int32), name=f"{prefix}.inverse_refreshes",
                                           requires_grad=False)
        self.num_layers = len(specs)
        self.num_params = len(params)
        self._init_parallel(comm, prefix, verbose)

        # MCFisherTrainStep sets this (Python side) before the training graph compiles
        self.mc_driver = False
        # policies whose layers refresh at different steps invert layer by layer (see _refreshed_per_layer)
        self.per_layer_inverses = False
        attach(cells, list(self.captures))
        attach(norm_cells, list(self.norm_captures))
        if verbose:
            plain = [p.name for i, p in enumerate(self._parameters)
                     if self._roles[i][0] < 0 and self._norm_roles[i][0] < 0]
            if norm_specs:
                skipped_norms = f"; unit-wise BatchNorm: {', '.join(s.name for s in norm_specs)}"
            else:
                skipped_norms = ""
            skipped_text = "; not preconditioned: " + ", ".join(f"{n} ({r})" for n, r in skipped) if skipped else ""
            logger.info("%s: preconditioning %d layers [%s]; plain momentum update for %d parameters [%s]%s",
                        type(self).__name__, len(specs), ", ".join(s.name for s in specs), len(plain),
                        ", ".join(plain), skipped_text + skipped_norms)

    def _init_parallel(self, comm, prefix, verbose):
        """Distributed state: the collectives cell, the ownership record checked by
        :func:`mindspore_ngd.parallel.check_checkpoint`, and per-layer inversion counts."""
        self.communicator = comm
        self.parallel_plan = None if comm is None else comm.plan
        self._parallel = None
        self._gather = False
        if comm is None:
            return
        plan = comm.plan

        def record(value, name):
            return Parameter(Tensor(np.asarray(value, np.int32)), name=f"{prefix}.parallel.{name}", requires_grad=False)

        self.parallel_world_size = record(plan.world_size, "world_size")
        self.parallel_grad_workers = record(plan.grad_workers, "grad_workers")
        self.parallel_position = record(comm.position, "position")
        self.parallel_owner_positions = record(plan.positions, "owner_positions")
        # how many times this rank computed each layer's inverses (0 for the layers it does not own)
        self.inversions = record(np.zeros(self.num_layers), "inversions")
        self._owned_mask = Tensor(np.asarray(self._owned, np.int32))
        self._parallel = comm.ops(replicated=sum(3 * s.channels for s in self.norm_specs))
        self._gather = comm.gather_collective is not None
        if verbose:
            logger.info("%s: %s", type(self).__name__, comm.describe())

    @property
    def owned_layers(self):
        """Names of the preconditioned layers this rank owns (all of them on a single device)."""
        return tuple(s.name for s, mine in zip(self.layer_specs, self._owned) if mine)

    # ------------------------------------------------------------------ refresh policy hooks
    def _capture_next(self, next_step):
        """Set the capture flags of every statistic for step ``next_step`` (a scalar int32)."""
        due = (next_step % self.policy.factor_update_interval) == 0
        for capture in self.captures:
            ops.assign(capture.capture_a, due)
            ops.assign(capture.capture_g, due)
        for capture in self.norm_captures:
            ops.assign(capture.capture_f, due)
        return due

    def _fold_masks(self, factor_state):
        """Which captured batch statistics enter the averages: per layer (take A?, take G?) and per
        unit-wise BatchNorm layer (take F?)."""
        masks = ()
        for capture in self.captures:
            masks += ((capture.capture_a, capture.capture_g),)
        norm_masks = ()
        for capture in self.norm_captures:
            norm_masks += (capture.capture_f,)
        return masks, norm_masks

    def _inverse_due(self, step, refreshed):
        """Whether this step recomputes inverses (``refreshed``: per-layer 'a factor changed')."""
        return (step % self.policy.inverse_update_interval) == 0

    def _inverse_layers(self, step, refreshed):
        """Per-layer mask of the layers whose inverses are recomputed when due; None means all."""
        return None

    def _after_step(self, step, refreshed, changes):
        """Policy state updates at the end of a step (main graph); nothing for K-FAC.

        ``changes``: with ``policy.track_changes``, a float vector over the statistics (A of every
        layer, G of every layer, F of every unit-wise BatchNorm layer, in that order) holding the
        relative change ``|X_new - X_old|_F / |X_old|_F`` of each statistic taken this step, +inf
        for its first capture and -1 for a statistic not taken.
        """
        return step

    # ------------------------------------------------------------------ pipeline stages
    # Every state Parameter is written in the main graph, never inside a run-time branch: the
    # branches below return new values. MindSpore 2.10 (graph mode) disconnects a Parameter that
    # is assigned inside an ``if`` on a tensor from its host value, so ``load_param_into_net`` after
    # the first step would silently not reach the graph (measured; see tests/test_optimizer.py).

    def _factor_state(self):
        """(A factors, G factors, A update counts, G update counts, fault count, BatchNorm Fishers,
        BatchNorm update counts; only with unit-wise BatchNorm layers) as stored.

        No empty tuples: MindSpore 2.10 miscounts the outputs of a run-time branch that returns one."""
        state = (tuple(self.a_factors), tuple(self.g_factors), tuple(self.a_updates), tuple(self.g_updates),
                 self.factor_faults)
        if self.num_norms:
            state += (tuple(self.norm_factors), tuple(self.norm_updates))
        return state

    def _no_changes(self):
        size = self.num_statistics if self.policy.track_changes else 1
        return -ops.ones((size,), ms.float32)

    @staticmethod
    def _relative_change(new, old, take):
        """``|new - old|_F / |old|_F`` if taken (+inf when old is zero: a first capture), else -1."""
        old_norm = (old * old).sum()
        diff = new - old
        has_old = old_norm > 0
        change = ops.sqrt((diff * diff).sum() / ops.select(has_old, old_norm, ops.ones_like(old_norm)))
        change = ops.select(has_old, change, ops.fill(ms.float32, (), float("inf")))
        return ops.select(take, change, -ops.ones_like(change))

    def _fold(self, average, updates, batch, captured):
        """Moving average of one statistic: (new average, new update count, 1 if rejected, change)."""
        finite = ops.isfinite(batch).all()
        take = ops.logical_and(captured, finite)
        blended = self.factor_decay * average + (1.0 - self.factor_decay) * batch
        # the first accepted batch of a statistic initialises it
        blended = ops.select(ops.broadcast_to(updates == 0, average.shape), batch, blended)
        new = ops.select(ops.broadcast_to(take, average.shape), blended, average)
        rejected = ops.cast(ops.logical_and(captured, ops.logical_not(finite)), ms.int32)
        change = self._relative_change(new, average, take) if self.policy.track_changes else None
        return new, updates + ops.cast(take, ms.int32), rejected, change

    def _folded_state(self, state, token):
        """(new factor state, per-layer flag 'A or G of this layer was updated', changes).

        ``token``: a value computed from every gradient. The batch statistics are read after it: the
        first layer's G is written by the last hook of the backward pass, and without this data
        dependency the fold read the previous step's G (measured, MindSpore 2.10 CPU). Distributed,
        it also puts the factor collectives after the data-parallel gradient all-reduce on every rank."""
        a_batches, g_batches, f_batches = self._batch_statistics(token)
        if self._parallel is not None:
            return self._folded_state_parallel(state, a_batches, g_batches, f_batches)
        a_factors, g_factors, a_updates, g_updates, faults = state[:5]
        masks, norm_masks = self._fold_masks(state)
        new_a, new_g, new_au, new_gu, refreshed = (), (), (), (), ()
        a_changes, g_changes, f_changes = (), (), ()
        for k in range(self.num_layers):
            take_a, take_g = masks[k]
            a, au, a_bad, a_change = self._fold(a_factors[k], a_updates[k], a_batches[k], take_a)
            g, gu, g_bad, g_change = self._fold(g_factors[k], g_updates[k], g_batches[k], take_g)
            new_a += (a,)
            new_g += (g,)
            new_au += (au,)
            new_gu += (gu,)
            a_changes += (a_change,)
            g_changes += (g_change,)
            refreshed += (ops.logical_or(au > a_updates[k], gu > g_updates[k]),)
            faults = faults + a_bad + g_bad
        new_norms, f_changes, faults = self._folded_norms(state, norm_masks, f_batches, faults)
        changes = ops.stack(a_changes + g_changes + f_changes) if self.policy.track_changes else self._no_changes()
        return (new_a, new_g, new_au, new_gu, faults) + new_norms, refreshed, changes

    def _batch_statistics(self, token):
        """The captured batch A, G and BatchNorm F buffers, read after ``token``."""
        a_batches, g_batches, f_batches = (), (), ()
        for capture in self.captures:
            a_batches += (ops.depend(capture.a_batch, token),)
            g_batches += (ops.depend(capture.g_batch, token),)
        for capture in self.norm_captures:
            f_batches += (ops.depend(capture.f_batch, token),)
        return a_batches, g_batches, f_batches

    def _folded_norms(self, state, norm_masks, batches, faults):
        """Fold the BatchNorm unit-wise Fishers: (new (F, F updates) or (), changes, faults)."""
        if not self.num_norms:
            return (), (), faults
        norm_factors, norm_updates = state[5], state[6]
        new_f, new_fu, f_changes = (), (), ()
        for j in range(self.num_norms):
            f, fu, f_bad, f_change = self._fold(norm_factors[j], norm_updates[j], batches[j], norm_masks[j])
            new_f += (f,)
            new_fu += (fu,)
            f_changes += (f_change,)
            faults = faults + f_bad
        return (new_f, new_fu), f_changes, faults

    def _folded_state_parallel(self, state, a_batches, g_batches, f_batches):
        """Distributed fold: all ranks' batch factors summed (packed triangles, one collective), the
        owned layers folded, then the per-statistic outcome (taken, rejected, relative change) shared
        so that update counts, ``refreshed`` and ``changes`` are identical on every rank. BatchNorm
        Fishers are small: summed whole and folded by every rank."""
        a_factors, g_factors, a_updates, g_updates, faults = state[:5]
        masks, norm_masks = self._fold_masks(state)
        par = self._parallel
        layers = self.num_layers
        flat = par.pack_factors(a_batches, g_batches)
        scale = 1.0 / par.world_size            # per-rank means over equal local batches -> global mean
        norm_batches = ()
        if self.num_norms:
            pieces = ()
            for f_batch in f_batches:
                pieces += (f_batch.reshape(-1),)
            chunk, replicated = par.reduce_factors(flat, ops.concat(pieces))
            replicated = replicated * scale
            start = 0
            for spec in self.norm_specs:
                norm_batches += (replicated[start:start + 3 * spec.channels].reshape(spec.channels, 3),)
                start += 3 * spec.channels
        else:
            chunk = par.reduce_factors(flat, None)
        chunk = chunk * scale
        zero = ops.zeros((), ms.float32)
        new_a, new_g, a_changes, g_changes = (), (), (), ()
        a_taken, g_taken, a_rejected, g_rejected = (), (), (), ()
        for k in range(layers):
            if self._owned[k]:
                take_a, take_g = masks[k]
                a, au, a_bad, a_change = self._fold(a_factors[k], a_updates[k], par.unpack_factor(chunk, k, 0), take_a)
                g, gu, g_bad, g_change = self._fold(g_factors[k], g_updates[k], par.unpack_factor(chunk, k, 1), take_g)
                a_taken += (ops.cast(au - a_updates[k], ms.float32),)
                g_taken += (ops.cast(gu - g_updates[k], ms.float32),)
                a_rejected += (ops.cast(a_bad, ms.float32),)
                g_rejected += (ops.cast(g_bad, ms.float32),)
            else:
                a, g, a_change, g_change = a_factors[k], g_factors[k], zero, zero
                a_taken += (zero,)
                g_taken += (zero,)
                a_rejected += (zero,)
                g_rejected += (zero,)
            new_a += (a,)
            new_g += (g,)
            a_changes += (a_change,)
            g_changes += (g_change,)
        status = a_taken + g_taken + a_rejected + g_rejected
        if self.policy.track_changes:
            status += a_changes + g_changes
        # every statistic has grad_workers owners, all computing the same values; the share waits for
        # the factor collective (a rank owning nothing would otherwise issue it first: size mismatch)
        shared = par.share(ops.depend(ops.stack(status), chunk)) / par.grad_workers
        stats = 2 * layers
        took = shared[:stats] > 0.5
        new_au, new_gu, refreshed = (), (), ()
        for k in range(layers):
            new_au += (a_updates[k] + ops.cast(took[k], ms.int32),)
            new_gu += (g_updates[k] + ops.cast(took[layers + k], ms.int32),)
            refreshed += (ops.logical_or(took[k], took[layers + k]),)
        faults = faults + ops.cast(shared[stats:2 * stats].sum() + 0.5, ms.int32)
        new_norms, f_changes, faults = self._folded_norms(state, norm_masks, norm_batches, faults)
        if self.policy.track_changes:
            changes = shared[2 * stats:]
            if self.num_norms:
                changes = ops.concat((changes, ops.stack(f_changes)))
        else:
            changes = self._no_changes()
        return (new_a, new_g, new_au, new_gu, faults) + new_norms, refreshed, changes

    def _nothing_refreshed(self):
        flags = ()
        for _ in range(self.num_layers):
            flags += (ops.zeros((), ms.bool_),)
        return flags

    def _store_factor_state(self, state):
        a_factors, g_factors, a_updates, g_updates, faults = state[:5]
        for k in range(self.num_layers):
            ops.assign(self.a_factors[k], a_factors[k])
            ops.assign(self.g_factors[k], g_factors[k])
            ops.assign(self.a_updates[k], a_updates[k])
            ops.assign(self.g_updates[k], g_updates[k])
        for j in range(self.num_norms):
            ops.assign(self.norm_factors[j], state[5][j])
            ops.assign(self.norm_updates[j], state[6][j])
        ops.assign(self.factor_faults, faults)

    def _any_captured(self):
        # one Stack + ReduceAny instead of 2 LogicalOr per layer (each kernel costs ~10 us of dispatch)
        flags = ()
        for capture in self.captures:
            flags += (capture.capture_a, capture.capture_g)
        for capture in self.norm_captures:
            flags += (capture.capture_f,)
        return ops.stack(flags).any()

    def _inverse_state(self):
        """(A inverses, G inverses, has-inverse flags, fault count, refresh count[, per-layer inversion
        counts when distributed]) as stored."""
        state = (tuple(self.a_inverses), tuple(self.g_inverses), tuple(self.has_inverse), self.inverse_faults,
                 self.inverse_refreshes)
        if self._parallel is not None:
            state += (self.inversions,)
        return state

    def _invert(self, factor, shift, layout):
        """Damped inverse of a sanitized factor: dense, or block-diagonal when the layout splits."""
        policy = self.policy
        if layout.count == 1:
            return inv_ops.damped_inverse(factor, shift, policy.inverse_method, policy.jitter)
        return blk.blocked_damped_inverse(blk.to_blocks(factor, layout), shift, policy.inverse_method,
                                          blk.trace_jitter(factor, policy.jitter))

    def _refreshed_layer(self, k, a_factor, g_factor, ready, damping, a_inverse, g_inverse):
        """New (A inverse, G inverse, taken, fault) of layer k; the old inverses unless it is ready
        and every check passes."""
        policy = self.policy
        a_safe, a_valid = inv_ops.sanitize(a_factor)
        g_safe, g_valid = inv_ops.sanitize(g_factor)
        a_shift, g_shift = inv_ops.split_damping(a_safe, g_safe, damping, policy.damping_split)
        a_inv, a_ok = self._invert(a_safe, a_shift, self._a_layouts[k])
        g_inv, g_ok = self._invert(g_safe, g_shift, self._g_layouts[k])
        ok = ops.logical_and(ops.logical_and(a_valid, g_valid), ops.logical_and(a_ok, g_ok))
        take = ops.logical_and(ok, ready)
        new_a = ops.select(ops.broadcast_to(take, a_inv.shape), a_inv, a_inverse)
        new_g = ops.select(ops.broadcast_to(take, g_inv.shape), g_inv, g_inverse)
        fault = ops.cast(ops.logical_and(ready, ops.logical_not(ok)), ms.int32)
        return new_a, new_g, take, fault

    def _layer_ready(self, factor_state, layers, k):
        ready = ops.logical_and(factor_state[2][k] > 0, factor_state[3][k] > 0)
        if layers is not None:
            ready = ops.logical_and(ready, layers[k])
        return ready

    def _refreshed_state(self, state, factor_state, damping, layers):
        a_inverses, g_inverses, has_inverse, faults, refreshes = state[:5]
        a_factors, g_factors = factor_state[:2]
        new_a, new_g, new_has = (), (), ()
        for k in range(self.num_layers):
            if self._owned[k]:
                a_inv, g_inv, take, fault = self._refreshed_layer(k, a_factors[k], g_factors[k],
                                                                  self._layer_ready(factor_state, layers, k),
                                                                  damping, a_inverses[k], g_inverses[k])
                has = ops.logical_or(has_inverse[k], take)
                faults = faults + fault
            else:                           # distributed: another rank inverts it
                a_inv, g_inv, has = a_inverses[k], g_inverses[k], has_inverse[k]
            new_a += (a_inv,)
            new_g += (g_inv,)
            new_has += (has,)
        if self._parallel is not None:
            return new_a, new_g, new_has, faults, refreshes + 1, state[5] + self._owned_mask
        return new_a, new_g, new_has, faults, refreshes + 1

    def _refreshed_per_layer(self, state, factor_state, damping, layers):
        """Like :meth:`_refreshed_state`, but each layer's inversion is its own single-level run-time
        branch, so a step that refreshes one layer's statistics inverts only that layer (SP-NGD,
        THOR's trace rule). Costs one branch dispatch per owned layer per step."""
        a_inverses, g_inverses, has_inverse, faults, refreshes = state[:5]
        a_factors, g_factors = factor_state[:2]
        new_a, new_g, new_has, counts = (), (), (), ()
        for k in range(self.num_layers):
            a_inv, g_inv, has = a_inverses[k], g_inverses[k], has_inverse[k]
            inverted = ops.zeros((), ms.int32)
            if self._owned[k]:
                take, fault = ops.zeros((), ms.bool_), ops.zeros((), ms.int32)
                ready = self._layer_ready(factor_state, layers, k)
                if ready:
                    a_inv, g_inv, take, fault = self._refreshed_layer(k, a_factors[k], g_factors[k], ready,
                                                                      damping, a_inv, g_inv)
                has = ops.logical_or(has, take)
                faults = faults + fault
                inverted = ops.cast(ready, ms.int32)
            new_a += (a_inv,)
            new_g += (g_inv,)
            new_has += (has,)
            counts += (inverted,)
        refreshes = refreshes + ops.cast(ops.stack(layers).any(), ms.int32)
        if self._parallel is not None:
            return new_a, new_g, new_has, faults, refreshes, state[5] + ops.stack(counts)
        return new_a, new_g, new_has, faults, refreshes

    def _store_inverse_state(self, state):
        a_inverses, g_inverses, has_inverse, faults, refreshes = state[:5]
        for k in range(self.num_layers):
            ops.assign(self.a_inverses[k], a_inverses[k])
            ops.assign(self.g_inverses[k], g_inverses[k])
            ops.assign(self.has_inverse[k], has_inverse[k])
        ops.assign(self.inverse_faults, faults)
        ops.assign(self.inverse_refreshes, refreshes)
        if self._parallel is not None:
            ops.assign(self.inversions, state[5])

    def _layer_gradient(self, gradients, k):
        grad = gradients[self._weight_index[k]]
        matrix = ops.cast(grad, ms.float32).reshape(grad.shape[0], -1)
        if self._bias_index[k] >= 0:
            bias = ops.cast(gradients[self._bias_index[k]], ms.float32)
            matrix = ops.concat((matrix, bias.reshape(-1, 1)), 1)
        return matrix

    def _apply_inverses(self, g_inv, matrix, a_inv, k):
        a_layout, g_layout = self._a_layouts[k], self._g_layouts[k]
        if a_layout.count == 1 and g_layout.count == 1:
            return inv_ops.precondition(g_inv, matrix, a_inv)
        left = ops.matmul(g_inv, matrix) if g_layout.count == 1 else blk.apply_left(g_inv, matrix, g_layout)
        return ops.matmul(left, a_inv) if a_layout.count == 1 else blk.apply_right(left, a_inv, a_layout)

    def _precondition_norms(self, gradients, factor_state):
        """Unit-wise natural gradients (gamma, beta) of the BatchNorm layers, float32.

        A layer whose Fisher was never captured keeps its plain gradient."""
        pairs = ()
        for j in range(self.num_norms):
            norm_factors, norm_updates = factor_state[5], factor_state[6]
            grad_gamma = ops.cast(gradients[self._gamma_index[j]], ms.float32)
            grad_beta = ops.cast(gradients[self._beta_index[j]], ms.float32)
            pre_gamma, pre_beta = fac.unit_natural_gradient(norm_factors[j], grad_gamma, grad_beta,
                                                            self.policy.batchnorm_damping)
            known = ops.broadcast_to(norm_updates[j] > 0, grad_gamma.shape)
            pairs += ((ops.select(known, pre_gamma, grad_gamma), ops.select(known, pre_beta, grad_beta)),)
        return pairs

    def _layer_matrices(self, gradients, inverse_state, token):
        """Preconditioned ``(g_dim, a_dim)`` matrix of every layer.

        Distributed: the owned layers are preconditioned here, packed into this rank's chunk and
        gathered (the gather waits for ``token``, the outcome of the factor collectives)."""
        # No select on has_inverse: until a layer's first accepted refresh its inverses are still the
        # identity they were initialised to (a refresh that is not taken keeps the old value), and
        # I @ dW @ I == dW exactly for a finite dW (a non-finite step is discarded anyway).
        a_inverses, g_inverses = inverse_state[0], inverse_state[1]
        own = ()
        for k in range(self.num_layers):
            if self._owned[k]:
                own += (self._apply_inverses(g_inverses[k], self._layer_gradient(gradients, k), a_inverses[k], k),)
        if not self._gather:
            return own
        par = self._parallel
        chunk = ops.depend(par.pack_preconditioned(own), token)
        return par.unpack_preconditioned(par.gather_preconditioned(chunk))

    def _precondition(self, gradients, lr, inverse_state, factor_state):
        """Preconditioned gradient matrices of all layers and BatchNorm (gamma, beta) pairs, KL-clipped.

        Distributed, every rank ends with the same matrices (and the same gradients), so the KL
        clipping factor is identical on every rank."""
        matrices = self._layer_matrices(gradients, inverse_state, factor_state[4])
        dots = ()
        for k in range(self.num_layers):
            dots += ((matrices[k] * self._layer_gradient(gradients, k)).sum(),)
        pairs = self._precondition_norms(gradients, factor_state)
        for j in range(self.num_norms):
            grad_gamma = ops.cast(gradients[self._gamma_index[j]], ms.float32)
            grad_beta = ops.cast(gradients[self._beta_index[j]], ms.float32)
            dots += ((pairs[j][0] * grad_gamma).sum() + (pairs[j][1] * grad_beta).sum(),)
        if self.kl_clip is not None:
            vg = ops.addn(dots) * lr * lr
            usable = ops.logical_and(vg > 0, ops.isfinite(vg))
            nu = ops.minimum(ops.sqrt(self.kl_clip / ops.select(usable, vg, ops.ones_like(vg))), 1.0)
            nu = ops.select(usable, nu, ops.ones_like(nu))
            scaled = ()
            for pre in matrices:
                scaled += (pre * nu,)
            matrices = scaled
            scaled_pairs = ()
            for pair in pairs:
                scaled_pairs += ((pair[0] * nu, pair[1] * nu),)
            pairs = scaled_pairs
        return matrices, pairs

    def _assemble(self, gradients, preconditioned):
        """Gradient tuple with each preconditioned layer's weight/bias replaced, dtypes kept."""
        matrices, pairs = preconditioned
        out = ()
        for i in range(self.num_params):
            layer, is_bias = self._roles[i]
            norm, which = self._norm_roles[i]
            grad = gradients[i]
            if norm >= 0:
                grad = ops.cast(pairs[norm][which].reshape(grad.shape), grad.dtype)
            if layer >= 0:
                matrix = matrices[layer]
                columns = matrix.shape[1]
                if is_bias:
                    part = ops.narrow(matrix, 1, columns - 1, 1)
                elif self._bias_index[layer] >= 0:
                    part = ops.narrow(matrix, 1, 0, columns - 1)
                else:
                    part = matrix
                grad = ops.cast(part.reshape(grad.shape), grad.dtype)
            out += (grad,)
        return out

    @staticmethod
    def _all_finite(gradients):
        # one Concat + IsFinite + ReduceAll instead of 3 kernels per parameter
        flat = ()
        for grad in gradients:
            flat += (ops.cast(grad, ms.float32).reshape(-1),)
        return ops.isfinite(ops.concat(flat)).all()

    def construct(self, gradients):
        if self.policy.fisher == "mc" and not self.mc_driver:
            raise RuntimeError("fisher='mc' needs the Monte-Carlo training step: train with "
                               "Model(mindspore_ngd.MCFisherTrainStep(network, loss_fn, optimizer)) "
                               "instead of Model(network, loss_fn, optimizer)")
        gradients = self.flatten_gradients(gradients)
        gradients = self.scale_grad(gradients)
        lr = self.get_lr()
        step = self.global_step.reshape(())
        finite = self._all_finite(gradients)

        factor_state = self._factor_state()
        refreshed = self._nothing_refreshed()
        changes = self._no_changes()
        if self._any_captured():
            factor_state, refreshed, changes = self._folded_state(factor_state, finite)
        self._store_factor_state(factor_state)
        damping = self.damping(self.global_step)          # read in the main graph (see above)
        if self.policy.damping_floor > 0:
            damping = ops.maximum(damping, self.policy.damping_floor)
        inverse_state = self._inverse_state()
        if self.per_layer_inverses:
            inverse_state = self._refreshed_per_layer(inverse_state, factor_state, damping,
                                                      self._inverse_layers(step, refreshed))
        elif self._inverse_due(step, refreshed):
            inverse_state = self._refreshed_state(inverse_state, factor_state, damping,
                                                  self._inverse_layers(step, refreshed))
        self._store_inverse_state(inverse_state)
        gradients = self._assemble(gradients, self._precondition(gradients, lr, inverse_state, factor_state))

        # a non-finite gradient leaves weights and moments untouched: lr 0, momentum 1, gradient 0
        lr_eff = ops.select(finite, ops.cast(lr, ms.float32), ops.zeros((), ms.float32))
        momentum = self.momentum if self.momentum_schedule is None else self.momentum_schedule(self.global_step)
        momentum_eff = ops.select(finite, momentum, ops.ones((), ms.float32))
        success = ()
        for i in range(self.num_params):
            param = self._parameters[i]
            grad = gradients[i]
            if self._decay[i]:
                grad = grad + ops.cast(self.weight_decay_value, grad.dtype) * param
            if self.policy.clip_norm is not None:
                norm = ops.sqrt(ops.reduce_sum(ops.cast(grad, ms.float32) ** 2))
                scale = ops.minimum(self.policy.clip_norm / ops.maximum(norm, 1e-30), 1.0)
                grad = grad * ops.cast(scale, grad.dtype)
            grad = ops.select(ops.broadcast_to(finite, grad.shape), grad, ops.zeros_like(grad))
            success += (self.apply_momentum(param, self.moments[i], ops.cast(lr_eff, param.dtype), grad,
                                            ops.cast(momentum_eff, param.dtype)),)
        ops.assign_add(self.skipped_steps, ops.cast(ops.logical_not(finite), ms.int32))
        # the policy's decisions read statistics written late in the backward pass (THOR's traces) and,
        # distributed, may hold a collective that must follow the gather: after every update
        step = ops.depend(step, success)
        step = self._after_step(step, refreshed, changes)
        self._capture_next(step + 1)
        ops.assign_add(self.global_step, self.global_step_increase_tensor)
        return success

    # ------------------------------------------------------------------ inspection (Python side)
    def kronecker_factors(self):
        """``{layer_name: (A, G)}``: the current moving-average factors as NumPy arrays (distributed:
        of the layers this rank owns)."""
        return {s.name: (self.a_factors[k].asnumpy(), self.g_factors[k].asnumpy())
                for k, s in enumerate(self.layer_specs) if self._owned[k]}

    def parallel_state(self):
        """Distributed: ``{"world_size", "rank", "position", "owned_layers", "inversions": {layer: count}}``
        (inversions: how many times this rank computed each layer's inverses); None on one device."""
        if self.communicator is None:
            return None
        counts = self.inversions.asnumpy()
        return {"world_size": self.communicator.world_size, "rank": self.communicator.rank,
                "position": self.communicator.position, "owned_layers": list(self.owned_layers),
                "inversions": {s.name: int(counts[k]) for k, s in enumerate(self.layer_specs)}}

    def decayed_parameters(self):
        """Names of the parameters that receive weight decay."""
        return [p.name for p, flag in zip(self._parameters, self._decay) if flag]

    def state_counters(self):
        """Fault and refresh counters as Python ints."""
        return {"step": int(self.global_step.asnumpy().reshape(-1)[0]),
                "inverse_refreshes": int(self.inverse_refreshes.asnumpy()),
                "factor_faults": int(self.factor_faults.asnumpy()),
                "inverse_faults": int(self.inverse_faults.asnumpy()),
                "skipped_steps": int(self.skipped_steps.asnumpy())}

    def summary(self):
        """A printable table of the preconditioned layers and their factor sizes."""
        rows = [("layer", "kind", "weight", "bias", "A", "G")]
        for s in self.layer_specs:
            rows.append((s.name, s.kind, "x".join(map(str, s.weight_shape)), "yes" if s.has_bias else "no",
                         f"{s.a_dim}x{s.a_dim}", f"{s.g_dim}x{s.g_dim}"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        floats = sum(s.a_dim ** 2 + s.g_dim ** 2 for s in self.layer_specs)
        lines.append(f"{len(self.layer_specs)} preconditioned layers, {floats:,} floats per factor set "
                     f"({4 * floats / 2 ** 20:.1f} MiB; factors, inverses and batch buffers hold 3 sets)")
        for name, reason in self.skipped_layers:
            lines.append(f"not preconditioned: {name} ({reason})")
        if self.communicator is not None:
            owned = sum(s.a_dim ** 2 + s.g_dim ** 2 for s, mine in zip(self.layer_specs, self._owned) if mine)
            lines.append(f"distributed: rank {self.communicator.rank} of {self.communicator.world_size} owns "
                         f"{len(self.owned_layers)} layers [{', '.join(self.owned_layers)}], {owned:,} floats per "
                         "factor set (the others hold 1x1 placeholders; batch buffers stay whole)")
        return "\n".join(lines)
