"""Inspection helpers: the Kronecker factors of one batch, without an optimizer."""
import logging

import numpy as np

from mindspore import nn, ops, Tensor

from .capture import UNSEEN, LayerCapture, attach, current_capture, detach, find_layers

__all__ = ["kronecker_factors"]

logger = logging.getLogger("mindspore_ngd")


class _FactorProbe(nn.Cell):
    """Forward + backward of ``loss_fn(network(x), y)`` so that the capture hooks run."""

    def __init__(self, network, loss_fn, weights):
        super().__init__(auto_prefix=False)
        self.net_with_loss = nn.WithLossCell(network, loss_fn)
        self.weights = weights
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, inputs, labels):
        loss = self.net_with_loss(inputs, labels)
        grads = self.grad(self.net_with_loss, self.weights)(inputs, labels)
        return ops.depend(loss, grads)


def kronecker_factors(network, loss_fn, inputs, labels):
    """Kronecker factors of one batch: ``{layer_name: (A, G)}`` as float32 NumPy arrays.

    The factors follow the package's numerical contract (see :mod:`mindspore_ngd.curvature.factors`):
    one batch, no moving average, no damping, G from the gradient of ``loss_fn`` (which must average
    over the batch) with the given labels. Layer names are the cells' names in ``network``. The
    network is left as it was: its training flag, its parameters (BatchNorm statistics included)
    and any capture an optimizer attached. A layer that captured nothing (its construct is never
    called, or its output does not reach the loss) is left out of the result, with a WARNING.
    """
    specs, cells, _ = find_layers(network)
    if not specs:
        raise ValueError("network has no nn.Dense or nn.Conv2d layer with trainable weights")
    previous = [current_capture(cell) for cell in cells]
    captures = [LayerCapture(spec, "inspect") for spec in specs]
    was_training = network.training
    snapshot = {p.name: p.asnumpy().copy() for p in network.get_parameters()}
    weights = network.trainable_params()
    attach(cells, captures)
    try:
        network.set_train(True)
        _FactorProbe(network, loss_fn, weights)(inputs, labels)
        result, unseen = {}, []
        for spec, cap in zip(specs, captures):
            a, g = np.array(cap.a_batch.asnumpy()), np.array(cap.g_batch.asnumpy())
            if a[0, 0] == UNSEEN or g[0, 0] == UNSEEN:
                unseen.append(spec.name)
            else:
                result[spec.name] = (a, g)
        if unseen:
            logger.warning("kronecker_factors: no factors for %s: captured nothing (construct never called, "
                           "or output not reaching the loss)", ", ".join(unseen))
    finally:
        for cell, old in zip(cells, previous):
            if old is None:
                detach([cell])
            else:
                attach([cell], [old])
        network.set_train(was_training)
        for param in network.get_parameters():
            value = snapshot[param.name]
            if not np.array_equal(param.asnumpy(), value):
                param.set_data(Tensor(value))
    return result

