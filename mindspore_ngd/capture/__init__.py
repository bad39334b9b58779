"""Capture of Kronecker-factor statistics inside the user's own Dense and Conv2d cells.

The layers captured: ``nn.Dense``, ``nn.Linear`` (the same class as ``mindspore.mint.nn.Linear``),
``nn.Conv2d`` and ``mindspore.mint.nn.Conv2d`` (zero padding, ``groups=1``), and subclasses that keep
their ``construct``. ``find_layers`` returns the supported ones; ``attach`` turns each into a
capturing cell *in place*: the cell object, its parameters and their names
stay exactly as they were (``ms.save_checkpoint(net, ...)`` writes the same keys as before), only
its class becomes a subclass whose ``construct`` also

* computes the batch A factor from the layer input in the forward pass, and
* registers ``ops.InsertGradientOf`` on the layer output (before any fused activation) to compute
  the batch G factor from the output gradient in the backward pass,

each guarded by a boolean flag Parameter so that a step that refreshes nothing runs neither the
im2col nor the covariance matmul (the branch is a run-time ``if`` in the compiled graph). Capture
only runs while the network is in training mode (``set_train(True)``); evaluation graphs do not
contain it. The statistics buffers live in :class:`LayerCapture` cells owned by the optimizer, so
they never enter the network's checkpoint.

Layer discovery lives in :mod:`.discover`, the capture cells in :mod:`.cells`, the flags in
:mod:`.control`. What depends on the kind of layer (its classes, LayerSpec fields, capturing
construct and factor formulas) is one :class:`~.layer_types.LayerType` per kind, in the registry of
:mod:`.layer_types`: a new kind of layer is one more registered type.
"""
from .cells import UNSEEN, LayerCapture, NormCapture, attach, current_capture, detach, never_captured
from .control import CaptureControl
from .discover import (CONV_CLASSES, DENSE_CLASSES, LAYER_CLASSES, LayerSpec, NormSpec, find_batchnorms,
                       find_layernorms, find_layers)
from .layer_types import LAYER_TYPES, LayerType, layer_type_of, register_layer_type
from . import attention  # noqa: F401  (registers the attention kind, after the kinds of layer_types)

__all__ = ["LayerSpec", "LayerCapture", "NormSpec", "NormCapture", "CaptureControl", "find_layers",
           "find_batchnorms", "find_layernorms", "attach", "detach", "current_capture", "never_captured", "UNSEEN",
           "DENSE_CLASSES", "CONV_CLASSES", "LAYER_CLASSES", "LayerType", "LAYER_TYPES", "layer_type_of",
           "register_layer_type"]
