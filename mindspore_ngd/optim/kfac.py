"""K-FAC (Martens & Grosse 2015; convolutions: Grosse & Martens 2016) as a policy of the engine."""
from ..schedule.rules import FixedInterval
from .engine import NGDOptimizer
from .argdocs import shared_arguments
from .policy import Policy, resolve_nesterov

__all__ = ["KFAC"]


@shared_arguments
class KFAC(NGDOptimizer):
    r"""Kronecker-factored approximate curvature optimizer, an ``nn.Optimizer`` for ``Model.train``.

    The Fisher block of each ``nn.Dense``, ``nn.Linear``, ``nn.Conv2d`` and ``mint.nn`` Linear / Conv2d
    layer is approximated by ``A (x) G``, with A the covariance of the layer input (im2col patches for
    convolutions) and G that of the per-example output gradient, so its inverse needs only the two
    small damped factors:

    .. math::
        P = (G + \gamma_G I)^{-1}\, \nabla_W L\, (A + \gamma_A I)^{-1}, \qquad
        \gamma_A = \pi\sqrt{\lambda},\ \gamma_G = \sqrt{\lambda}/\pi,\
        \pi = \sqrt{\tfrac{\operatorname{tr}(A)/\dim A}{\operatorname{tr}(G)/\dim G}}

    (``damping_split="sqrt"`` uses ``pi = 1``). The update then is optional KL clipping,
    ``P <- nu P`` with ``nu = min(1, sqrt(kl_clip / (lr^2 sum <P, grad>)))``, followed by weight decay and
    ``nn.Momentum``'s update. ``nn.Embedding`` layers are preconditioned with a diagonal A, the tokens'
    frequencies (on one device). Other trainable parameters (BatchNorm, LayerNorm, grouped convolutions,
    ...) get the plain momentum update; one WARNING line at construction names every
    such layer that is not a normalisation layer, with the reason.

    Args:
        network (nn.Cell): the network to train. Its Dense/Conv2d/Embedding cells capture factors in place;
            parameter names and the network's checkpoint are unchanged.
        learning_rate (Union[float, list, numpy.ndarray, Tensor, LearningRateSchedule]): >= 0, the
            forms ``nn.Momentum`` accepts (warm-up schedules such as ``nn.warmup_lr`` start at 0).
        momentum (float): in [0, 1]. Default 0.9.
        weight_decay (float): >= 0, applied after preconditioning. Default 0.
        loss_scale (float): fixed loss scale of the training cell. Default 1.
        use_nesterov (bool): Nesterov momentum. Default False.

        The arguments above take the positions of ``nn.Momentum``'s (``params, learning_rate, momentum,
        weight_decay, loss_scale, use_nesterov``); every argument below is keyword-only.

        damping (Union[float, list, numpy.ndarray, Tensor, LearningRateSchedule]): Tikhonov damping
            lambda, > 0. Default 1e-3.
        factor_decay (float): moving-average decay of A and G in [0, 1). Default 0.95.
        factor_update_interval (int): capture factors every this many steps (>= 1). Default 1.
        inverse_update_interval (int): recompute inverses every this many steps (>= 1). Default 20.
        damping_split (str): "pi" or "sqrt". Default "pi".
        kl_clip (Optional[float]): KL-clipping bound > 0, or None. Default 1e-3.
        inverse_method (str): "auto" (default: the path of the device target when the optimizer is
            constructed -- CPU "cholesky", GPU "lu", Ascend "newton_split"; ``opt.inverse_method``
            holds the choice), "cholesky" (fastest measured on CPU), "lu", "eigh" (robust), "newton"
            (matrix products only, warm-started) or "newton_split" (the same with float16-exact split
            products, for devices that round products' inputs to float16; see docs/algorithms.md).
        split_dim (Optional[int]): invert factors larger than this as block-diagonal matrices of
            blocks of this size, as THOR does (e.g. 128 on Ascend for lightly damped factors of 1024
            and more); None (default) inverts whole factors.
        jitter (float): extra damping ``jitter * trace`` for float32 safety (>= 0). Default 1e-6.
        nesterov (bool): the former spelling of ``use_nesterov``, still accepted (DeprecationWarning).
        decay_filter (callable): ``Parameter -> bool`` choosing weight-decayed parameters; default
            excludes parameters with fewer than two dimensions (biases, BatchNorm gamma/beta).
        skip_layers (iterable of str): cell names to leave un-preconditioned.
        fisher (str): "empirical" (G from the training labels, default) or "mc" (G from labels sampled
            from the model's predictive distribution; train with
            :class:`mindspore_ngd.MCFisherTrainStep`).
        verbose (bool or None): the INFO line naming the preconditioned layers and plain parameters
            on the "mindspore_ngd" logger. None (default): logged at INFO, shown only when the
            application configured logging at INFO; True: always shown (on stderr if logging is not
            configured); False: never. The WARNING line about layers left to the plain update is
            logged either way.
        @all@

    Inputs:
        - **gradients** (tuple[Tensor]) - gradients of ``network.trainable_params()``.

    Outputs:
        tuple[bool], all elements are True.

    Raises:
        TypeError, ValueError: for a bad argument, naming it and its allowed range, before any
            graph is compiled.

    Examples:
        >>> import mindspore_ngd as ngd
        >>> opt = ngd.KFAC(net, learning_rate=0.05, damping=1e-3, momentum=0.9, weight_decay=5e-4)
        >>> model = ms.train.Model(net, loss_fn, opt, metrics={"acc"})
        >>> model.train(10, train_ds, dataset_sink_mode=False)
    """

    def __init__(self, network, learning_rate, momentum=0.9, weight_decay=0.0, loss_scale=1.0, use_nesterov=False,
                 *, damping=1e-3, factor_decay=0.95, factor_update_interval=1, inverse_update_interval=20,
                 damping_split="pi", kl_clip=1e-3, inverse_method="auto",
                 jitter=1e-6, decay_filter=None, skip_layers=(), fisher="empirical", verbose=None,
                 distributed="auto", grad_worker_fraction=None, balance="compute",
                 adaptive_damping=True, divergence_patience=10, divergence_growth=1e3, params=None, strict=False,
                 host_calls="auto",
                 stat_fraction=1.0, stat_stride=1, nesterov=None, split_dim=None, sequence_approx="expand",
                 precondition_embeddings=True):
        policy = Policy(name="kfac", refresh=FixedInterval(factor_update_interval, inverse_update_interval),
                        damping_split=damping_split, inverse_method=inverse_method, kl_clip=kl_clip, jitter=jitter,
                        split_dim=split_dim,
                        fisher=fisher, adaptive_damping=adaptive_damping, stat_fraction=stat_fraction,
                        stat_stride=stat_stride, sequence_approx=sequence_approx,
                        precondition_embeddings=precondition_embeddings)
        super().__init__(network, learning_rate, damping=damping, momentum=momentum,
                         weight_decay=weight_decay, factor_decay=factor_decay, loss_scale=loss_scale,
                         policy=policy, use_nesterov=resolve_nesterov(use_nesterov, nesterov), decay_filter=decay_filter,
                         skip_layers=skip_layers, verbose=verbose, distributed=distributed,
                         grad_worker_fraction=grad_worker_fraction, balance=balance,
                         divergence_patience=divergence_patience, divergence_growth=divergence_growth, params=params,
                         host_calls=host_calls,
                         strict=strict)
