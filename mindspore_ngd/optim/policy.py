"""What distinguishes one natural-gradient optimizer from another: a frozen :class:`Policy`."""
import dataclasses
import types
import warnings
from typing import Optional, Union

from mindspore import nn

from .. import _validate
from ..curvature.inverse import DAMPING_SPLITS, INVERSE_METHOD_CHOICES, resolve_inverse_method
from ..parallel.plan import BALANCES
from ..schedule import check_learning_rate, check_positive_schedule
from ..schedule.rules import FixedInterval, GrowingInterval, StaleIntervals

__all__ = ["Policy", "FISHER_KINDS", "default_decay_filter", "check_arguments"]

FISHER_KINDS = ("empirical", "mc")
SEQUENCE_APPROXIMATIONS = ("expand", "reduce")
RULES = (FixedInterval, StaleIntervals, GrowingInterval)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Every choice that makes K-FAC, SP-NGD or THOR; the engine's machinery is the same for all.

    Attributes:
        name: prefix of every state Parameter ("kfac", "spngd", "thor").
        refresh: the refresh rule -- :class:`mindspore_ngd.schedule.FixedInterval` (K-FAC),
            :class:`~mindspore_ngd.schedule.StaleIntervals` (SP-NGD) or
            :class:`~mindspore_ngd.schedule.GrowingInterval` (THOR, optionally with the trace rule).
        damping_split: "pi" (factored Tikhonov, Martens & Grosse 2015 sec. 6.3), "sqrt" (sqrt(damping)
            on each factor) or "positions" (MindSpore's THOR: ``sqrt(damping T)`` on A and
            ``sqrt(damping / T)`` on G, T the output positions of a Conv2d, 1 for a Dense; see
            :func:`mindspore_ngd.curvature.inverse.split_damping`).
        inverse_method: "auto" (default), "cholesky", "lu", "eigh", "newton" or "newton_split" (see
            :mod:`mindspore_ngd.curvature.inverse`). "auto" is resolved when the optimizer is
            constructed, from ``mindspore.get_context("device_target")``, through
            ``mindspore_ngd.curvature.inverse.DEVICE_INVERSE_METHODS`` (CPU: "cholesky", GPU: "lu",
            Ascend: "newton_split"); the optimizer's ``policy`` holds the resolved name.
        kl_clip: KL-clipping bound, or None for no rescaling.
        jitter: extra damping ``jitter * trace(factor)`` that keeps float32 Cholesky safe.
        split_dim: invert factors larger than this as block-diagonal with blocks of this size
            (THOR's hardware-driven splitting); None inverts whole factors.
        clip_norm: clip every final gradient tensor (after preconditioning and weight decay) to this
            L2 norm, as MindSpore's THOR ``enable_clip_grad`` does; None disables.
        batchnorm_damping: precondition BatchNorm and LayerNorm gamma/beta unit-wise (one damped 2x2
            Fisher per channel, SP-NGD; a LayerNorm's channels are the features of its last axis) with
            this damping; None gives them the plain update.
        damping_floor: the damping used is ``max(damping, damping_floor)`` (SP-NGD floors it at the
            weight-decay coefficient).
        fisher: "empirical" (G from the training labels) or "mc" (G from labels sampled from the
            model's predictive distribution; needs :class:`mindspore_ngd.MCFisherTrainStep`, and a refresh
            rule without trace probes: ``trace_threshold`` None).
        adaptive_damping: multiply the damping by a factor >= 1 that rises when steps overshoot and
            falls back when they undershoot (:mod:`mindspore_ngd.optim.damping`); the given damping is
            the start and the floor.
        max_damping_boost: the largest factor adaptive damping may reach (>= 1). A multiplier pinned
            there while the reduction ratio stays below 1/4 (the steps still overshoot) for
            ``divergence_patience`` steps stops the run (a finite divergence; if > 1).
        stat_fraction: float in (0, 1]; the batch A and G of every Dense/Conv2d layer are computed
            from the first ``m = max(1, ceil(stat_fraction * B))`` examples of the batch (rows, for a
            Dense input flattened to rows), rescaled to estimate the full-batch factors (see
            :mod:`mindspore_ngd.curvature.factors`). 1 (default) uses the whole batch.
        stat_stride: int >= 1; Conv2d A and G use only the output positions in rows 0, s, 2s, ...
            and columns 0, s, 2s, ... (``dy[:, :, ::s, ::s]`` and the im2col patches of those
            positions), A rescaled by ``T / T'``; Dense layers ignore it. 1 (default) uses every
            position. Neither option subsamples THOR's trace probes, the loss-scale probe or the
            unit-wise BatchNorm Fisher.
        sequence_approx: "expand" (default) or "reduce": the Kronecker factors of a Dense layer (or of
            an nn.MultiheadAttention's packed input projection) whose input has more than two
            dimensions, (B, R, ..., features). "expand" counts each of the B R
            rows as an example, "reduce" each of the B examples once, its rows averaged on the input
            side and summed on the output side (K-FAC-expand and K-FAC-reduce, Eschenhagen et al.
            2023; :mod:`mindspore_ngd.curvature.factors`). Two-dimensional inputs are the same either way.
        precondition_embeddings: bool; precondition ``nn.Embedding`` layers, with a diagonal A (the
            tokens' frequencies; :mod:`mindspore_ngd.curvature.embedding`). True (default); False gives
            them the plain update, named in the WARNING line.
    """
    name: str = "kfac"
    refresh: Union[FixedInterval, StaleIntervals, GrowingInterval] = FixedInterval()
    damping_split: str = "pi"
    inverse_method: str = "auto"
    kl_clip: Optional[float] = 1e-3
    jitter: float = 1e-6
    split_dim: Optional[int] = None
    clip_norm: Optional[float] = None
    batchnorm_damping: Optional[float] = None
    damping_floor: float = 0.0
    fisher: str = "empirical"
    adaptive_damping: bool = True
    max_damping_boost: float = 1e4
    stat_fraction: float = 1.0
    stat_stride: int = 1
    sequence_approx: str = "expand"
    precondition_embeddings: bool = True

    def validated(self):
        """The policy itself, after checking every field (TypeError/ValueError naming the field)."""
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name must be an identifier-like prefix, got {self.name!r}")
        if not isinstance(self.refresh, RULES):
            raise TypeError(f"refresh must be one of {[r.__name__ for r in RULES]}, got {type(self.refresh).__name__}")
        self.refresh.validated()
        _validate.one_of("damping_split", self.damping_split, DAMPING_SPLITS)
        _validate.one_of("inverse_method", self.inverse_method, INVERSE_METHOD_CHOICES)
        _validate.optional_positive_float("kl_clip", self.kl_clip)
        _validate.non_negative_float("jitter", self.jitter)
        if self.split_dim is not None:
            _validate.positive_int("split_dim", self.split_dim)
        _validate.optional_positive_float("clip_norm", self.clip_norm)
        _validate.optional_positive_float("batchnorm_damping", self.batchnorm_damping)
        _validate.non_negative_float("damping_floor", self.damping_floor)
        _validate.one_of("fisher", self.fisher, FISHER_KINDS)
        if self.fisher == "mc" and getattr(self.refresh, "trace_threshold", None) is not None:
            raise ValueError("fisher='mc' needs trace_threshold=None: the trace probes measure G from the training "
                             "labels, so they would compare it with a Monte-Carlo factor")
        if not isinstance(self.adaptive_damping, bool):
            raise TypeError(f"adaptive_damping must be a bool, got {type(self.adaptive_damping).__name__}")
        _validate.float_in_range("max_damping_boost", self.max_damping_boost, 1.0, float("inf"),
                                 high_inclusive=True)
        _validate.fraction("stat_fraction", self.stat_fraction)
        _validate.positive_int("stat_stride", self.stat_stride)
        _validate.one_of("sequence_approx", self.sequence_approx, SEQUENCE_APPROXIMATIONS)
        if not isinstance(self.precondition_embeddings, bool):
            raise TypeError(f"precondition_embeddings must be a bool, got {type(self.precondition_embeddings).__name__}")
        return self

    def resolved(self, device_target=None):
        """The validated policy with ``inverse_method="auto"`` replaced by the path of
        ``device_target`` (default: the current ``mindspore.get_context("device_target")``)."""
        policy = self.validated()
        method = resolve_inverse_method(policy.inverse_method, device_target)
        return policy if method == policy.inverse_method else dataclasses.replace(policy, inverse_method=method)


def default_decay_filter(param):
    """Weight decay applies to parameters with more than one dimension (weights of Dense/Conv and
    embeddings), not to biases and normalisation scales/shifts (BatchNorm/LayerNorm gamma, beta)."""
    return len(param.shape) > 1


def check_arguments(network, learning_rate, damping, momentum, weight_decay, factor_decay, loss_scale, policy,
                    decay_filter, balance, owner="NGDOptimizer"):
    """The engine's arguments checked before anything is built (TypeError/ValueError naming the
    argument and its allowed range); returns the normalised ``(learning_rate, momentum,
    weight_decay, factor_decay, loss_scale, policy)``."""
    check_network(network, owner)
    learning_rate = check_learning_rate("learning_rate", learning_rate)
    check_positive_schedule("damping", damping)
    if isinstance(momentum, (int, float)) and not isinstance(momentum, bool):
        momentum = _validate.float_in_range("momentum", momentum, 0.0, 1.0, high_inclusive=True)
    weight_decay = _validate.non_negative_float("weight_decay", weight_decay)
    factor_decay = _validate.float_in_range("factor_decay", factor_decay, 0.0, 1.0)
    loss_scale = _validate.positive_float("loss_scale", loss_scale)
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a mindspore_ngd.Policy, got {type(policy).__name__}")
    policy = policy.resolved()
    if decay_filter is not None and not callable(decay_filter):
        raise TypeError("decay_filter must be a callable Parameter -> bool")
    _validate.one_of("balance", balance, BALANCES)
    return learning_rate, momentum, weight_decay, factor_decay, loss_scale, policy


def check_network(network, owner):
    """TypeError unless ``network`` is an ``nn.Cell``; for a parameter list (the argument of every other
    MindSpore optimizer) the message shows the one-line fix."""
    if isinstance(network, nn.Cell):
        return
    if isinstance(network, (list, tuple, types.GeneratorType)) or type(network).__name__ == "ParameterTuple":
        raise TypeError(
            f"{owner} takes the network itself, not its parameters: write {owner}(net, ...) instead of "
            f"{owner}(net.trainable_params(), ...). Its Dense/Conv2d layers capture the curvature statistics, so "
            "the optimizer needs the cells; parameter groups (as nn.Momentum's params) go in the keyword "
            f"argument params=[...]. Got a {type(network).__name__}.")
    raise TypeError(f"network must be a mindspore.nn.Cell (the network to train, as in {owner}(net, ...)), "
                    f"got {type(network).__name__}")


def resolve_nesterov(use_nesterov, nesterov=None, warn=True):
    """The Nesterov switch from ``use_nesterov`` (``nn.Momentum``'s spelling) or its former spelling
    ``nesterov`` (a DeprecationWarning with ``warn``); a ValueError when both are given and differ."""
    if not isinstance(use_nesterov, bool):
        raise TypeError(f"use_nesterov must be a bool, got {type(use_nesterov).__name__}")
    if nesterov is None:
        return use_nesterov
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
    if use_nesterov and not nesterov:
        raise ValueError("use_nesterov=True and nesterov=False contradict each other: pass use_nesterov only")
    if warn:
        warnings.warn("nesterov= is the former spelling of use_nesterov= (nn.Momentum's); pass use_nesterov",
                      DeprecationWarning, stacklevel=3)
    return nesterov
