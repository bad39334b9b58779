"""SP-NGD (Osawa et al., CVPR 2019 and TPAMI 2020) as a policy of the shared engine.

What makes it SP-NGD rather than K-FAC, all in the policy:

* stale statistics: every statistic (each layer's A, each layer's G, each BatchNorm layer's unit-wise
  Fisher) has its own refresh interval that doubles while the statistic stays within
  ``refresh_threshold`` (relative Frobenius change) of the value it replaces and halves when it
  moves more (:func:`mindspore_ngd.schedule.rules.stale_intervals`). Between refreshes the statistic
  is not captured at all (no im2col, no covariance matmul, no probe) and its layer's inverses are
  reused; a layer is re-inverted only when one of its statistics was refreshed;
* unit-wise natural gradient for BatchNorm and LayerNorm: one damped 2x2 Fisher of (gamma_c, beta_c)
  per channel (a LayerNorm's: per feature of its last axis), inverted in closed form;
* damping: pi-adjusted factored Tikhonov damping, floored at the weight-decay coefficient;
* a moving average over refreshes (``factor_decay=0.9``) and KL clipping (1e-3) by default, for
  the small per-device batches of CPU/GPU users (see the arguments).
"""
from .. import _validate
from ..schedule.rules import StaleIntervals
from .engine import NGDOptimizer
from .argdocs import shared_arguments
from .policy import Policy, resolve_nesterov

__all__ = ["SPNGD"]


@shared_arguments
class SPNGD(NGDOptimizer):
    r"""Scalable and practical natural gradient descent, an ``nn.Optimizer`` for ``Model.train``.

    Layers are preconditioned as in :class:`mindspore_ngd.KFAC` (``G^-1 dW A^-1`` with pi-split
    damping); BatchNorm layers unit-wise; statistics are refreshed on adaptive, per-statistic
    intervals.

    Args:
        network (nn.Cell): the network to train (Dense/Conv2d/BatchNorm cells capture in place).
        learning_rate: float, per-step list / ndarray / 1-D Tensor, or ``LearningRateSchedule``; >= 0
            (as ``nn.Momentum``).
            :func:`mindspore_ngd.schedule.polynomial_lr` gives SP-NGD's polynomial decay.
        momentum: float in [0, 1] or a per-step sequence / schedule cell
            (:func:`mindspore_ngd.schedule.rescaled_momentum`). Default 0.9.
        weight_decay (float): >= 0, added after preconditioning; also the damping floor. Default 0.
        loss_scale (float): fixed loss scale of the training cell. Default 1.
        use_nesterov (bool): Nesterov momentum. Default False.

        The arguments above take the positions of ``nn.Momentum``'s (``params, learning_rate, momentum,
        weight_decay, loss_scale, use_nesterov``); every argument below is keyword-only.

        damping: Tikhonov damping of the Kronecker factors, same forms as ``learning_rate``; > 0. The
            value used is ``max(damping, weight_decay)``. Default 1e-3.
        factor_decay (float): moving-average decay in [0, 1) applied at each refresh. Default 0.9:
            with small per-device batches a single batch's G is so noisy that its relative change
            never falls below the threshold (measured on digits: refresh ratio 0.84 with 0, 0.02-0.05
            with 0.9, same accuracy); with very large batches, as in the paper, 0 works.
        stale (bool): adaptive per-statistic intervals; False recomputes every statistic and every
            inverse at every step (then SP-NGD is K-FAC with intervals 1 plus unit-wise BatchNorm).
            Default True.
        refresh_threshold (float): relative change below which a statistic counts as stable, > 0.
            Default 0.1.
        max_interval (int): cap of the refresh interval (steps), >= 1. Default 64.
        refresh_measure (str): what a statistic's change is measured against. "damped" (default): the
            damped statistic the inverse is taken of, ``|X_new - X_old|_F / |X_old + shift I|_F``
            with the damping the inversion adds (A and G split as ``damping_split`` splits it; the
            BatchNorm blocks' ``batchnorm_damping``), so that a statistic much smaller than its
            damping -- G once the training loss is near zero -- is left to rest. "raw":
            ``/ |X_old|_F``, the statistic alone (the rule before this option existed).
        batchnorm_damping (Optional[float]): damping of the unit-wise BatchNorm and LayerNorm Fisher,
            > 0; None gives their gamma/beta the plain momentum update. Default 1e-3.
        fisher (str): "empirical" (G from the training labels) or "mc" (labels sampled from the
            model's predictive distribution, one sample; train with
            :class:`mindspore_ngd.MCFisherTrainStep`). Default "empirical".
        damping_split (str): "pi" (default) or "sqrt".
        kl_clip (Optional[float]): KL-clipping bound > 0, or None. Default 1e-3 (the paper uses none;
            without it SP-NGD and K-FAC diverge on the digits CNN at lr 0.05, damping 1e-2).
        inverse_method (str): "auto" (default: the device target's path, as :class:`KFAC`),
            "cholesky", "lu", "eigh", "newton" or "newton_split".
        split_dim (Optional[int]): block-split inversion of large factors, as :class:`KFAC`. Default None.
        jitter (float): extra damping ``jitter * trace`` for float32 safety. Default 1e-6.
        nesterov (bool): the former spelling of ``use_nesterov``, still accepted (DeprecationWarning).
        decay_filter (callable): ``Parameter -> bool``; default decays parameters with 2+ dimensions.
        skip_layers (iterable of str): Dense/Conv2d cell names to leave un-preconditioned.
        verbose (bool or None): the INFO layer report, as :class:`mindspore_ngd.KFAC` (default None: only when logging is configured at INFO).
        @all@

    State (Parameters, checkpointed): ``spngd.intervals``, ``spngd.next_refresh`` and
    ``spngd.refreshes`` are int32 vectors over :attr:`statistic_names` (A of every layer, G of every
    layer, F of every BatchNorm layer); :meth:`refresh_state` reads them.

    Raises:
        TypeError, ValueError: for a bad argument, naming it and its allowed range.

    Examples:
        >>> opt = ngd.SPNGD(net, learning_rate=0.05, damping=1e-3, momentum=0.9, weight_decay=5e-4)
        >>> model = ms.train.Model(net, loss_fn, opt, metrics={"acc"})
        >>> model.train(10, train_ds, callbacks=[ngd.RefreshMonitor(opt)], dataset_sink_mode=False)
    """

    def __init__(self, network, learning_rate, momentum=0.9, weight_decay=0.0, loss_scale=1.0, use_nesterov=False,
                 *, damping=1e-3, factor_decay=0.9,
                 stale=True, refresh_threshold=0.1, max_interval=64, batchnorm_damping=1e-3, fisher="empirical",
                 damping_split="pi", kl_clip=1e-3, inverse_method="auto", jitter=1e-6,
                 decay_filter=None, skip_layers=(), verbose=None, distributed="auto",
                 grad_worker_fraction=None, balance="compute",
                 adaptive_damping=True, divergence_patience=10, divergence_growth=1e3, params=None, strict=False,
                 host_calls="auto",
                 stat_fraction=1.0, stat_stride=1, refresh_measure="damped", nesterov=None, split_dim=None,
                 sequence_approx="expand", precondition_embeddings=True):
        floor = _validate.non_negative_float("weight_decay", weight_decay)
        policy = Policy(name="spngd", refresh=StaleIntervals(refresh_threshold, max_interval, stale, refresh_measure),
                        damping_split=damping_split, inverse_method=inverse_method, kl_clip=kl_clip,
                        jitter=jitter, batchnorm_damping=batchnorm_damping, damping_floor=floor, fisher=fisher,
                        split_dim=split_dim,
                        adaptive_damping=adaptive_damping, stat_fraction=stat_fraction, stat_stride=stat_stride,
                        sequence_approx=sequence_approx, precondition_embeddings=precondition_embeddings)
        super().__init__(network, learning_rate, damping=damping, momentum=momentum,
                         weight_decay=weight_decay, factor_decay=factor_decay, loss_scale=loss_scale,
                         policy=policy, use_nesterov=resolve_nesterov(use_nesterov, nesterov), decay_filter=decay_filter,
                         skip_layers=skip_layers, verbose=verbose, distributed=distributed,
                         grad_worker_fraction=grad_worker_fraction, balance=balance,
                         divergence_patience=divergence_patience, divergence_growth=divergence_growth, params=params,
                         host_calls=host_calls,
                         strict=strict)
