"""THOR-style optimizer (Chen et al., AAAI 2021) as a policy of the shared engine.

What makes it THOR rather than K-FAC, all in the policy:

* statistics and inverses are refreshed together at refresh points: steps 0, f0, f0 + f1, ... with
  ``f0 = frequency`` and ``f_{i+1} = min(ceil(f_i * frequency_growth), max_frequency)`` (growth 1 is
  MindSpore's fixed ``frequency``); other steps only precondition with the stored inverses;
* trace-based refresh (``trace_threshold`` set): the first step captures every factor; after that
  a refresh point only computes the traces of the batch's A and G, *without forming them* (a sum of
  squares; for a convolution a one-output-channel convolution of the squared input), and the next
  step captures just the statistics whose trace moved by more than ``trace_threshold`` (relative)
  from the trace of the factor in use. Layers with a recaptured statistic get new inverses; the
  others keep theirs and pay no im2col or covariance. With dense factors (``split_dim=None``) they
  pay no inversion either (a run-time branch per layer); block-split factors are all inverted under
  one branch, which compiles faster, and only the new inverses of the recaptured layers are kept.
  ``trace_threshold=None`` captures and inverts everything at every refresh point;
* hardware-driven block splitting: factors larger than ``split_dim`` are inverted as block-diagonal
  matrices of ``split_dim`` blocks (128 matches the Ascend cube unit); ``split_dim=None`` disables;
* damping split as MindSpore's THOR (``damping_split="positions"``): ``A + sqrt(damping T) I`` and
  ``G + sqrt(damping / T) I`` with T a Conv2d's output positions (1 for a Dense), which is nn.thor's
  ``A/T + sqrt(damping/T) I`` with A summed over positions as here (docs/algorithms.md, "THOR and
  mindspore.nn.thor"); no moving average of the factors;
* KL clipping (``kl_clip=1e-3``) by default, which nn.thor does not have: with nn.thor's published
  ResNet-50 values and no clip, the preconditioned step grows to tens of times Momentum's within a few
  steps and the run falls behind or diverges (docs/algorithms.md, "THOR and mindspore.nn.thor");
  ``kl_clip=None`` gives nn.thor's bare step.
"""
from .. import _validate
from ..schedule.rules import GrowingInterval
from .engine import NGDOptimizer
from .policy import Policy

__all__ = ["THOR"]


def _decay_all(param):
    return True


class THOR(NGDOptimizer):
    r"""THOR: trace-based, hardware-driven, layer-oriented natural gradient, for ``Model.train``.

    Accepts the argument set of ``mindspore.nn.thor`` so that switching is a change of import:

    ============================  ==============================================================
    ``mindspore.nn.thor``          here
    ============================  ==============================================================
    ``net``                        ``network`` (same object; trained in place)
    ``learning_rate`` (Tensor)     float, per-step list/array/Tensor or LearningRateSchedule
    ``damping`` (Tensor)           same forms and meaning: ``A + sqrt(damping T) I``, ``G + sqrt(damping / T) I``
    ``momentum``                   same
    ``weight_decay``               same, after preconditioning (as the built-in)
    ``loss_scale``                 same (fixed loss scale; G is divided by its square)
    ``batch_size``                 accepted and not needed: factors use the actual batch size
    ``use_nesterov``               same
    ``decay_filter``               same callable; default decays every parameter, as the built-in
    ``split_indices``              accepted, no effect: gradient all-reduce fusion is MindSpore's
    ``enable_clip_grad``           clip every final gradient tensor to L2 norm 1, as the built-in
    ``frequency``                  first refresh interval (steps); need not divide an epoch
    ============================  ==============================================================

    Extra arguments: ``split_dim`` (int >= 1 or None, default 128), ``trace_threshold`` (float > 0 or
    None, default None), ``frequency_growth`` (float >= 1, default 1), ``max_frequency`` (int or
    None), ``damping_split`` ("positions"; "sqrt" or "pi" as :class:`mindspore_ngd.KFAC`), ``factor_decay`` (0: each refresh uses its own batch),
    ``kl_clip`` (1e-3; None: nn.thor's step, unclipped), ``inverse_method`` ("auto": the device target's path, as :class:`mindspore_ngd.KFAC`; or
    "cholesky", "lu", "eigh", "newton", "newton_split"), ``jitter`` (1e-6), ``verbose`` (None), ``strict`` (False: a layer that
    captures nothing is demoted to the plain update with a WARNING), ``adaptive_damping`` (True),
    ``divergence_patience`` (10), ``divergence_growth`` (1e3) and ``host_calls`` ("auto": True on CPU,
    False on Ascend and GPU) as :class:`mindspore_ngd.KFAC`, and the
    distributed knobs ``distributed`` ("auto"), ``grad_worker_fraction`` (None: 1/N) and ``balance``
    ("compute"; ownership balanced on the block-split inversion cost), and ``params`` (parameter groups as
    ``nn.Momentum``'s, see :mod:`mindspore_ngd.optim.groups`), as :class:`mindspore_ngd.NGDOptimizer`.
    ``stat_fraction`` (float in (0, 1], default 1) and ``stat_stride`` (int >= 1, default 1) compute the
    captured A and G from the first ``max(1, ceil(stat_fraction * B))`` examples of the batch and, for
    a Conv2d, from every ``stat_stride``-th output position per spatial direction, rescaled to estimate
    the full-batch factors (as :class:`mindspore_ngd.KFAC`); the trace probes of ``trace_threshold``
    always use the whole batch. ``sequence_approx`` ("expand" or "reduce") is as :class:`mindspore_ngd.KFAC`'s.
    ``fisher`` ("empirical", default; or "mc") is as :class:`mindspore_ngd.KFAC`'s: with "mc" the G of each
    refresh comes from labels sampled from the model (train with :class:`mindspore_ngd.MCFisherTrainStep`,
    whose extra forward and backward pass runs only on the steps that capture a statistic), and needs
    ``trace_threshold=None``.
    Distributed with ``trace_threshold``, the batch traces are
    averaged over the ranks and the owners of a layer decide whether its statistics moved; the
    decisions are shared so that every rank captures the same statistics.

    Raises:
        TypeError, ValueError: for a bad argument, naming it and its allowed range.
    """

    def __init__(self, network, learning_rate, damping, momentum=0.9, weight_decay=0.0, loss_scale=1.0,
                 batch_size=None, use_nesterov=False, decay_filter=_decay_all, split_indices=None,
                 enable_clip_grad=False, frequency=100, split_dim=128, trace_threshold=None,
                 frequency_growth=1.0, max_frequency=None, damping_split="positions", factor_decay=0.0,
                 kl_clip=1e-3, inverse_method="auto", jitter=1e-6, verbose=None, distributed="auto",
                 grad_worker_fraction=None, balance="compute",
                 adaptive_damping=True, divergence_patience=10, divergence_growth=1e3, params=None, strict=False,
                 host_calls="auto",
                 stat_fraction=1.0, stat_stride=1, sequence_approx="expand", precondition_embeddings=True,
                 fisher="empirical"):
        if batch_size is not None:
            _validate.positive_int("batch_size", batch_size)
        if split_indices is not None and not isinstance(split_indices, (list, tuple)):
            raise TypeError(f"split_indices must be a list of ints or None, got {type(split_indices).__name__}")
        if not isinstance(enable_clip_grad, bool):
            raise TypeError(f"enable_clip_grad must be a bool, got {type(enable_clip_grad).__name__}")
        # block-split factors invert cheaply: every layer under one branch at a refresh compiles faster
        # than a branch per layer (GrowingInterval.layer_branches)
        rule = GrowingInterval(frequency, frequency_growth, max_frequency, trace_threshold,
                               layer_branches=split_dim is None)
        policy = Policy(name="thor", refresh=rule, damping_split=damping_split, inverse_method=inverse_method,
                        kl_clip=kl_clip, jitter=jitter, split_dim=split_dim,
                        clip_norm=1.0 if enable_clip_grad else None, adaptive_damping=adaptive_damping,
                        stat_fraction=stat_fraction, stat_stride=stat_stride, sequence_approx=sequence_approx,
                        precondition_embeddings=precondition_embeddings, fisher=fisher)
        super().__init__(network, learning_rate, damping=damping, momentum=momentum,
                         weight_decay=weight_decay, factor_decay=factor_decay, loss_scale=loss_scale,
                         policy=policy, nesterov=use_nesterov, decay_filter=decay_filter, verbose=verbose,
                         distributed=distributed, grad_worker_fraction=grad_worker_fraction, balance=balance,
                         divergence_patience=divergence_patience, divergence_growth=divergence_growth, params=params,
                         host_calls=host_calls,
                         strict=strict)
