"""Which layers of a network can capture Kronecker factors, and their geometry.

:func:`find_layers` returns a :class:`LayerSpec` for each supported ``nn.Dense``, ``nn.Linear`` and
(zero-padded, ``groups=1``) ``nn.Conv2d`` / ``mint.nn.Conv2d`` cell, and the reason for each such cell
it cannot take; :func:`find_batchnorms` does the same for the BatchNorm layers SP-NGD preconditions
unit-wise. The capture itself is in :mod:`mindspore_ngd.capture.cells`.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

from mindspore import mint, nn

__all__ = ["LayerSpec", "NormSpec", "find_layers", "find_batchnorms", "DENSE_CLASSES", "CONV_CLASSES",
           "LAYER_CLASSES"]

# the attribute of a captured cell that holds its capture (set by mindspore_ngd.capture.cells.attach)
_ATTR = "_ngd_capture"

# the layer classes find_layers takes, with the kind of factors they get; mint.nn.Linear is nn.Linear
DENSE_CLASSES = (nn.Dense, nn.Linear)
CONV_CLASSES = (nn.Conv2d, mint.nn.Conv2d)
LAYER_CLASSES = DENSE_CLASSES + CONV_CLASSES


@dataclass(frozen=True)
class LayerSpec:
    """What the engine needs to know about one preconditioned layer."""
    name: str                       # the cell's name in the network, e.g. "conv1" or "layer1.0.fc"
    kind: str                       # "dense" or "conv2d"
    weight_name: str                # the weight Parameter's name (unchanged by capture)
    bias_name: Optional[str]        # the bias Parameter's name, None without bias
    weight_shape: Tuple[int, ...]
    a_dim: int                      # in (* kh * kw) (+1 with bias)
    g_dim: int                      # out
    kernel_size: Tuple[int, int] = (1, 1)
    stride: Tuple[int, int] = (1, 1)
    dilation: Tuple[int, int] = (1, 1)
    pad_mode: str = "valid"
    padding: Tuple[int, int, int, int] = (0, 0, 0, 0)
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def has_bias(self):
        return self.bias_name is not None


def _pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value), int(value))


def _base_class(cell):
    """The supported layer class ``cell`` is an instance of (the original one for a captured cell)."""
    cls = getattr(type(cell), "_ngd_original_class", type(cell))
    for base in LAYER_CLASSES:
        if issubclass(cls, base):
            return base
    return None


def _conv_geometry(cell):
    """``(pad_mode, (top, bottom, left, right))`` of an nn.Conv2d or a mint.nn.Conv2d."""
    pad = cell.padding
    if isinstance(cell, nn.Conv2d):
        if isinstance(pad, int):
            return cell.pad_mode, (pad, pad, pad, pad)
        pad = tuple(pad)
        return cell.pad_mode, (pad if len(pad) == 4 else (pad[0], pad[0], pad[1], pad[1]))
    # mint.nn.Conv2d: "same" / "valid", or (height, width) zero padding on both sides
    if isinstance(pad, str):
        return pad, (0, 0, 0, 0)
    pad_h, pad_w = _pair(pad)
    return "pad", (pad_h, pad_h, pad_w, pad_w)


def _unsupported_reason(cell):
    base = _base_class(cell)
    if not cell.weight.requires_grad:
        return "weight is not trainable"
    if type(cell).construct is not base.construct and not hasattr(cell, _ATTR):
        return "custom construct"
    if base is nn.Conv2d:
        if cell.group != 1:
            return f"group={cell.group} convolution"
        if getattr(cell, "data_format", "NCHW") != "NCHW":
            return f"data_format={cell.data_format}"
    elif base is mint.nn.Conv2d:
        if cell.groups != 1:
            return f"groups={cell.groups} convolution"
        if cell.padding_mode != "zeros":
            return f"padding_mode={cell.padding_mode!r} (only zero padding is captured)"
    if _bias(cell) is not None and not cell.bias.requires_grad:
        return "bias is not trainable"
    return None


def _bias(cell):
    """The layer's bias Parameter, or None (nn.Dense/nn.Conv2d: has_bias; nn.Linear/mint: bias None)."""
    if hasattr(cell, "has_bias") and not cell.has_bias:
        return None
    return getattr(cell, "bias", None)


def find_layers(network):
    """Return ``(specs, cells, skipped)`` for the Dense/Linear/Conv2d cells of ``network``.

    ``skipped`` lists ``(name, reason)`` for such cells that cannot be preconditioned; their
    parameters get the plain (momentum) update.
    """
    specs, cells, skipped = [], [], []
    for name, cell in network.cells_and_names():
        if _base_class(cell) is None:
            continue
        if not name:
            skipped.append(("<root>", "the network itself is a single layer; wrap it in a Cell"))
            continue
        reason = _unsupported_reason(cell)
        if reason is not None:
            skipped.append((name, reason))
            continue
        bias = _bias(cell)
        bias_name = None if bias is None else bias.name
        has_bias = bias is not None
        w = tuple(cell.weight.shape)
        if isinstance(cell, DENSE_CLASSES):
            spec = LayerSpec(name=name, kind="dense", weight_name=cell.weight.name, bias_name=bias_name,
                             weight_shape=w, a_dim=w[1] + int(has_bias), g_dim=w[0])
        else:
            pad_mode, padding = _conv_geometry(cell)
            spec = LayerSpec(name=name, kind="conv2d", weight_name=cell.weight.name, bias_name=bias_name,
                             weight_shape=w, a_dim=int(np.prod(w[1:])) + int(has_bias),
                             g_dim=w[0], kernel_size=_pair(cell.kernel_size),
                             stride=_pair(cell.stride)[-2:], dilation=_pair(cell.dilation)[-2:],
                             pad_mode=pad_mode, padding=padding)
        specs.append(spec)
        cells.append(cell)
    return specs, cells, skipped


@dataclass(frozen=True)
class NormSpec:
    """A BatchNorm layer preconditioned unit-wise (one 2x2 Fisher per channel)."""
    name: str
    gamma_name: str
    beta_name: str
    channels: int
    eps: float


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


def find_batchnorms(network):
    """``(specs, cells, skipped)`` for the ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` cells of ``network``."""
    specs, cells, skipped = [], [], []
    for name, cell in network.cells_and_names():
        if not isinstance(cell, (nn.BatchNorm1d, nn.BatchNorm2d)) or not name:
            continue
        reason = _norm_unsupported_reason(cell)
        if reason is not None:
            skipped.append((name, reason))
            continue
        specs.append(NormSpec(name=name, gamma_name=cell.gamma.name, beta_name=cell.beta.name,
                              channels=int(cell.gamma.shape[0]), eps=float(cell.eps)))
        cells.append(cell)
    return specs, cells, skipped
