"""The THOR flow of MindSpore's models repository, by a change of import.

``official/cv/ResNet/train.py`` builds ``Model(net, ..., optimizer=nn.Momentum(...))`` first; its THOR
branch then builds ``nn.thor(...)`` and calls
``ConvertModelUtils().convert_to_thor_model(model=model, network=net, optimizer=opt, ...)``. MindSpore's
``convert_to_thor_model`` converts only its own ``ThorAscend`` / ``ThorGpu`` optimizers: for any other
optimizer it returns the Momentum ``Model`` unchanged, so ``nn.thor -> mindspore_ngd.THOR`` alone
silently trains with Momentum. Importing both names from here instead::

    from mindspore_ngd import thor, ConvertModelUtils      # instead of mindspore.nn / mindspore.train

gives a ``Model`` that trains with the natural-gradient optimizer, with the same arguments, and
stops a run whose loss explodes while staying finite (:class:`GuardedModel`).
"""
import mindspore as ms
from mindspore import nn

from .._validate import check_mean_loss
from ..optim.engine import NGDOptimizer
from ..optim.thor import THOR
from .divergence import with_divergence_stops

__all__ = ["thor", "ConvertModelUtils", "GuardedModel"]


def thor(net, learning_rate, damping, momentum, *args, **kwargs):
    """``mindspore.nn.thor``'s call form: returns :class:`mindspore_ngd.THOR` built with the same
    arguments, in the same order (``net, learning_rate, damping, momentum, weight_decay, loss_scale,
    batch_size, use_nesterov, decay_filter, split_indices, enable_clip_grad, frequency``, then THOR's
    own keywords)."""
    return THOR(net, learning_rate, damping, momentum, *args, **kwargs)


class ConvertModelUtils:
    """``mindspore.train.ConvertModelUtils`` for the optimizers of this package."""

    @staticmethod
    def convert_to_thor_model(model, network, loss_fn=None, optimizer=None, metrics=None, amp_level="O0",
                              loss_scale_manager=None, keep_batchnorm_fp32=False):
        """A ``Model`` that trains ``network`` with ``optimizer``, the arguments as MindSpore's.

        Args:
            model (Model): the model built before the optimizer (with ``nn.Momentum`` in the models
                repository); replaced, not modified.
            network (nn.Cell): the network ``optimizer`` was built on.
            loss_fn (nn.Cell): the loss; it must reduce to the batch mean (``reduction="mean"``).
            optimizer: a :class:`mindspore_ngd.NGDOptimizer` (``thor``, ``THOR``, ``KFAC``, ``SPNGD``).
                MindSpore's own ``ThorAscend`` / ``ThorGpu`` are handed to MindSpore's converter.
            metrics, amp_level, loss_scale_manager, keep_batchnorm_fp32: passed to ``Model``.

        Returns:
            Model: a :class:`GuardedModel` (``Model(network, loss_fn, optimizer, metrics=metrics,
            amp_level=amp_level, loss_scale_manager=loss_scale_manager,
            keep_batchnorm_fp32=keep_batchnorm_fp32)`` whose ``train`` and ``fit`` add a
            :class:`mindspore_ngd.DivergenceMonitor`).

        Raises:
            TypeError: for any other optimizer (MindSpore's converter would return ``model`` unchanged and
                train with its optimizer, silently), or an optimizer built on another network.
            ValueError: for a loss that is not a batch mean.
        """
        if type(optimizer).__name__ in ("ThorAscend", "ThorGpu"):
            return ms.train.ConvertModelUtils.convert_to_thor_model(
                model, network, loss_fn=loss_fn, optimizer=optimizer, metrics=metrics, amp_level=amp_level,
                loss_scale_manager=loss_scale_manager, keep_batchnorm_fp32=keep_batchnorm_fp32)
        if not isinstance(optimizer, NGDOptimizer):
            raise TypeError(
                "convert_to_thor_model needs the natural-gradient optimizer, e.g. "
                "optimizer=mindspore_ngd.thor(net, lr, damping, momentum, ...); got "
                f"{type(optimizer).__name__}. Returning the model unchanged would train with its own optimizer.")
        if not isinstance(network, nn.Cell):
            raise TypeError(f"network must be the mindspore.nn.Cell the optimizer was built on, got "
                            f"{type(network).__name__}")
        mine = {id(p) for p in network.trainable_params()}
        if not all(id(p) in mine for p in optimizer.parameters):
            raise TypeError(f"the {type(optimizer).__name__} optimizer was built on another network than "
                            "network: pass the network given to the optimizer")
        if loss_fn is not None:
            check_mean_loss(loss_fn, "convert_to_thor_model")
        return GuardedModel(network, loss_fn=loss_fn, optimizer=optimizer, metrics=metrics, amp_level=amp_level,
                            loss_scale_manager=loss_scale_manager, keep_batchnorm_fp32=keep_batchnorm_fp32)


class GuardedModel(ms.train.Model):
    """The ``Model`` that :meth:`ConvertModelUtils.convert_to_thor_model` returns: MindSpore's ``Model``
    whose ``train`` and ``fit`` add a :class:`mindspore_ngd.DivergenceMonitor` to the callbacks (unless
    the caller passed one), and a :class:`mindspore_ngd.TrainingGuard` when the optimizer runs without
    host calls (Ascend, GPU), so that a run whose loss explodes while staying finite stops with a reason
    in the models repository's flow too, whose ``train.py`` passes its own callback list."""

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        return super().train(epoch, train_dataset, with_divergence_stops(callbacks, self._optimizer),
                             dataset_sink_mode=dataset_sink_mode, sink_size=sink_size, initial_epoch=initial_epoch)

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        return super().fit(epoch, train_dataset, valid_dataset, valid_frequency,
                           with_divergence_stops(callbacks, self._optimizer), dataset_sink_mode=dataset_sink_mode,
                           valid_dataset_sink_mode=valid_dataset_sink_mode, sink_size=sink_size,
                           initial_epoch=initial_epoch)
