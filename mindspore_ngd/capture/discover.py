"""Which layers of a network can capture Kronecker factors, and their geometry.

:func:`find_layers` returns a :class:`LayerSpec` for each supported ``nn.Dense``, ``nn.Linear``,
(zero-padded, ``groups=1``) ``nn.Conv2d`` / ``mint.nn.Conv2d``, ``nn.Embedding`` and
``nn.MultiheadAttention`` (its packed input projection) cell, and the reason for each such cell it cannot take; :func:`find_batchnorms` and :func:`find_layernorms` do the same for the BatchNorm and
LayerNorm layers SP-NGD preconditions unit-wise. What depends on the kind of layer (the classes, their
checks, ``a_dim`` / ``g_dim`` and geometry) is in the registry of :mod:`mindspore_ngd.capture.layer_types`.
The capture itself is in :mod:`mindspore_ngd.capture.cells`.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

from mindspore import nn

from .layer_types import CONV2D, DENSE, LAYER_TYPES, layer_type_of, layer_type_of_class

__all__ = ["LayerSpec", "NormSpec", "find_layers", "find_batchnorms", "find_layernorms", "DENSE_CLASSES",
           "CONV_CLASSES", "LAYER_CLASSES"]

# the attribute of a captured cell that holds its capture (set by mindspore_ngd.capture.cells.attach)
_ATTR = "_ngd_capture"

# the layer classes of the built-in kinds (layer_types.LAYER_TYPES, which find_layers consults, may
# hold more); mint.nn.Linear is nn.Linear
DENSE_CLASSES = DENSE.classes
CONV_CLASSES = CONV2D.classes
LAYER_CLASSES = DENSE_CLASSES + CONV_CLASSES


@dataclass(frozen=True)
class LayerSpec:
    """What the engine needs to know about one preconditioned layer."""
    name: str                       # the cell's name in the network, e.g. "conv1" or "layer1.0.fc"
    kind: str                       # "dense", "conv2d" or "embedding": a key of layer_types.LAYER_TYPES
                                    # (and of mindspore_ngd.curvature.registry.BLOCK_TYPES)
    weight_name: str                # the weight Parameter's name (unchanged by capture)
    bias_name: Optional[str]        # the bias Parameter's name, None without bias
    weight_shape: Tuple[int, ...]
    a_dim: int                      # in (* kh * kw) (+1 with bias); an Embedding's vocabulary size
    g_dim: int                      # out; an Embedding's embedding size
    kernel_size: Tuple[int, int] = (1, 1)
    stride: Tuple[int, int] = (1, 1)
    dilation: Tuple[int, int] = (1, 1)
    pad_mode: str = "valid"
    padding: Tuple[int, int, int, int] = (0, 0, 0, 0)
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def has_bias(self):
        return self.bias_name is not None

    @property
    def a_diagonal(self):
        """Whether the layer's A is kept as its diagonal (an Embedding's: a (a_dim,) vector)."""
        return len(layer_type_of(self).input_buffer_shape(self.a_dim)) == 1


def _base_class(cell):
    """``(layer_type, base)``: the registered layer type of ``cell`` and its supported class (the
    original class of a captured cell), or ``(None, None)``."""
    return layer_type_of_class(getattr(type(cell), "_ngd_original_class", type(cell)))


def _unsupported_reason(cell, layer_type, base):
    weight = layer_type.weight_of(cell)
    if weight is None:                  # e.g. an attention with separate q/k/v weights
        return layer_type.unsupported_reason(cell, base) or "no weight"
    if not weight.requires_grad:
        return "weight is not trainable"
    if type(cell).construct is not base.construct and not hasattr(cell, _ATTR):
        return "custom construct"
    reason = layer_type.unsupported_reason(cell, base)
    if reason is not None:
        return reason
    bias = layer_type.bias_of(cell)
    if bias is not None and not bias.requires_grad:
        return "bias is not trainable"
    return None


# a layer whose weight its owner reads directly, never calling the layer: the capture would see
# nothing. The stock nn.MultiheadAttention passes out_proj.weight and .bias to its functional forward;
# a captured one (attention.AttentionType) calls out_proj as a layer instead.
READ_DIRECTLY = "read directly by nn.MultiheadAttention, which never calls it"


def _network_reasons(network):
    """``{id(cell): reason}`` of the cells that cannot be captured where they sit in ``network``: each
    registered kind's :meth:`~mindspore_ngd.capture.layer_types.LayerType.network_reasons`."""
    reasons = {}
    for layer_type in LAYER_TYPES.values():
        reasons.update(layer_type.network_reasons(network))
    return reasons


def _read_directly(network, placed):
    """ids of the cells whose owner reads their weight without calling them (:data:`READ_DIRECTLY`): the
    ``out_proj`` of every nn.MultiheadAttention that is not captured itself (``placed``: the network's
    :func:`_network_reasons`)."""
    out = set()
    for _, cell in network.cells_and_names():
        if isinstance(cell, nn.MultiheadAttention) and isinstance(getattr(cell, "out_proj", None), nn.Cell):
            layer_type, base = _base_class(cell)
            if layer_type is None or id(cell) in placed or _unsupported_reason(cell, layer_type, base) is not None:
                out.add(id(cell.out_proj))
    return out


def find_layers(network):
    """Return ``(specs, cells, skipped)`` for the Dense/Linear/Conv2d/Embedding cells of ``network`` (the
    cells of every registered :class:`~mindspore_ngd.capture.layer_types.LayerType`).

    ``skipped`` lists ``(name, reason)`` for such cells that cannot be preconditioned; their
    parameters get the plain (momentum) update. Among them is ``out_proj`` of every
    ``nn.MultiheadAttention`` that cannot be captured, whose weight the stock attention reads without
    calling the layer.
    """
    specs, cells, skipped = [], [], []
    placed = _network_reasons(network)
    read_directly = _read_directly(network, placed)
    for name, cell in network.cells_and_names():
        layer_type, base = _base_class(cell)
        if layer_type is None:
            continue
        if not name:
            skipped.append(("<root>", "the network itself is a single layer; wrap it in a Cell"))
            continue
        reason = READ_DIRECTLY if id(cell) in read_directly else placed.get(id(cell)) or \
            _unsupported_reason(cell, layer_type, base)
        if reason is not None:
            skipped.append((name, reason))
            continue
        bias = layer_type.bias_of(cell)
        bias_name = None if bias is None else bias.name
        has_bias = bias is not None
        weight = layer_type.weight_of(cell)
        w = tuple(weight.shape)
        spec = LayerSpec(name=name, kind=layer_type.kind, weight_name=weight.name, bias_name=bias_name,
                         weight_shape=w, **layer_type.spec_fields(cell, w, has_bias))
        specs.append(spec)
        cells.append(cell)
    return specs, cells, skipped


@dataclass(frozen=True)
class NormSpec:
    """A normalisation layer preconditioned unit-wise (one 2x2 Fisher per channel): a BatchNorm layer
    (``kind="batchnorm"``, channels on axis 1) or a LayerNorm layer (``kind="layernorm"``, one unit per
    feature of the last axis)."""
    name: str
    gamma_name: str
    beta_name: str
    channels: int
    eps: float
    kind: str = "batchnorm"         # a key of mindspore_ngd.curvature.registry.BLOCK_TYPES


def _norm_unsupported_reason(cell):
    if type(cell).construct not in (nn.BatchNorm1d.construct, nn.BatchNorm2d.construct) \
            and not hasattr(cell, _ATTR):
        return "custom construct"
    if not (cell.gamma.requires_grad and cell.beta.requires_grad):
        return "gamma/beta not trainable (affine=False?)"
    if cell.use_batch_statistics is not None:
        return f"use_batch_statistics={cell.use_batch_statistics}"
    if getattr(cell, "format", "NCHW") != "NCHW":
        return f"data_format={cell.format}"
    return None


def _layernorm_unsupported_reason(cell):
    if type(cell).construct is not nn.LayerNorm.construct and not hasattr(cell, _ATTR):
        return "custom construct"
    if not (cell.gamma.requires_grad and cell.beta.requires_grad):
        return "gamma/beta not trainable"
    if len(cell.normalized_shape) != 1 or cell.begin_norm_axis != -1 or cell.begin_params_axis != -1:
        return (f"normalises more than the last axis (normalized_shape={tuple(cell.normalized_shape)}, "
                f"begin_norm_axis={cell.begin_norm_axis}, begin_params_axis={cell.begin_params_axis})")
    return None


def _find_norms(network, classes, unsupported_reason, eps_attr, kind):
    """``(specs, cells, skipped)`` for the cells of ``network`` of ``classes``: a :class:`NormSpec` of
    ``kind`` for each one ``unsupported_reason`` accepts (its epsilon in the attribute ``eps_attr``),
    ``(name, reason)`` for the others."""
    specs, cells, skipped = [], [], []
    for name, cell in network.cells_and_names():
        if not isinstance(cell, classes) or not name:
            continue
        reason = unsupported_reason(cell)
        if reason is not None:
            skipped.append((name, reason))
            continue
        specs.append(NormSpec(name=name, gamma_name=cell.gamma.name, beta_name=cell.beta.name,
                              channels=int(cell.gamma.shape[0]), eps=float(getattr(cell, eps_attr)), kind=kind))
        cells.append(cell)
    return specs, cells, skipped


def find_layernorms(network):
    """``(specs, cells, skipped)`` for the ``nn.LayerNorm`` cells of ``network`` that normalise the last
    axis with a scale and shift per feature (the transformer's LayerNorm; ``normalized_shape`` of one
    axis, ``begin_norm_axis = begin_params_axis = -1``)."""
    return _find_norms(network, nn.LayerNorm, _layernorm_unsupported_reason, "epsilon", "layernorm")


def find_batchnorms(network):
    """``(specs, cells, skipped)`` for the ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` cells of ``network``."""
    return _find_norms(network, (nn.BatchNorm1d, nn.BatchNorm2d), _norm_unsupported_reason, "eps",
                       "batchnorm")
