"""The layer types Kronecker factors are captured for, in one registry keyed by kind.

Each kind of layer (``LayerSpec.kind``: ``"dense"``, ``"conv2d"``, ``"embedding"``, ``"attention"``) has one
:class:`LayerType` that owns everything that depends on the kind: the cell classes it matches, the checks that refuse a
cell of those classes, the kind's fields of a :class:`~mindspore_ngd.capture.LayerSpec` (``a_dim``,
``g_dim``, geometry), the capturing ``construct`` of each class, and the batch-statistic formulas of
:mod:`mindspore_ngd.curvature.factors` the capture uses (A, G, the trace of A, and whether the
outputs have positions, which also picks the trace of G and the output-gradient sum).
:func:`find_layers`, the capture cells, the loss-scale probe and the benchmarks' cost model ask
:func:`layer_type_of` instead of comparing kind strings; a new kind of layer is one more
:class:`LayerType`, registered with :func:`register_layer_type`, and the block type that keeps its
statistics, registered for the same kind in :mod:`mindspore_ngd.curvature.registry`. Dense, Conv2d and
Embedding are defined here; the attention kind, in its own module (:mod:`.attention`), shows the
pattern for a kind kept apart.

The formulas are plain functions with one signature per statistic (unused arguments ignored), so a
capture cell can hold them as attributes and call them in its compiled graph: ``geometry`` is
``(kernel_size, stride, dilation, pad_mode, padding)`` of the spec (see :func:`geometry_of`).
"""
import numpy as np

from mindspore import mint, nn

from ..curvature import factors

__all__ = ["LayerType", "DenseType", "Conv2dType", "EmbeddingType", "LAYER_TYPES", "register_layer_type",
           "layer_type_of", "layer_type_of_class", "geometry_of", "registered"]


def _pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value), int(value))


def geometry_of(spec):
    """``(kernel_size, stride, dilation, pad_mode, padding)`` of a LayerSpec, the argument the formulas
    of a :class:`LayerType` take (a tuple of constants in a compiled graph)."""
    return spec.kernel_size, spec.stride, spec.dilation, spec.pad_mode, spec.padding


class LayerType:
    """One kind of preconditioned layer (subclass it, then :func:`register_layer_type` an instance).

    Attributes:
        kind (str): the ``LayerSpec.kind`` of its layers.
        classes (tuple): the cell classes it matches (subclasses match too), in order.
        constructs (tuple): ``(class, mixin)`` pairs: the capturing ``construct`` of each class, a
            mixin placed before the class (the first pair whose class the cell's class subclasses).
        has_positions (bool): the output is NCHW with output positions (A sums over them, G averages,
            ``stat_stride`` subsamples them); False: every row of the output is an example. It is also
            the ``conv`` argument of :func:`~mindspore_ngd.curvature.factors.output_trace` and
            :func:`~mindspore_ngd.curvature.factors.output_sum`, which serve every kind.
        probe_rank (int): the loss-scale probe reads the biased layer of lowest rank first (then the
            fewest outputs); a convolution ranks after a Dense layer, as its bias is often followed
            by BatchNorm, which makes its gradient vanish up to rounding.
    """
    kind = None
    classes = ()
    constructs = ()
    has_positions = False
    probe_rank = 0
    # K-FAC-reduce's formulas (``sequence_approx="reduce"``), for a kind whose inputs may be sequences:
    # (input_factor, output_factor, input_trace, output_trace), or None when the kind has none
    reduce_formulas = None

    # the attribute holding the layer's weight Parameter
    weight_attr = "weight"

    def weight_of(self, cell):
        """The layer's weight Parameter."""
        return getattr(cell, self.weight_attr)

    def bias_of(self, cell):
        """The layer's bias Parameter, or None (nn.Dense/nn.Conv2d: ``has_bias``; nn.Linear/mint: bias None)."""
        if hasattr(cell, "has_bias") and not cell.has_bias:
            return None
        return getattr(cell, "bias", None)

    def geometry(self, spec):
        """The constant argument the formulas take (``geometry``): :func:`geometry_of` by default."""
        return geometry_of(spec)

    def input_buffer_shape(self, a_dim):
        """The shape of one batch A (and of the stored A): a square (a_dim, a_dim) matrix by default."""
        return (a_dim, a_dim)

    def base_class(self, cls):
        """The class of :attr:`classes` that ``cls`` subclasses, or None."""
        for base in self.classes:
            if issubclass(cls, base):
                return base
        return None

    def mixin(self, cls):
        """The capturing construct mixin of ``cls`` (one of :attr:`constructs`)."""
        for base, mixin in self.constructs:
            if issubclass(cls, base):
                return mixin
        raise TypeError(f"layer type {self.kind!r} has no capturing construct for {cls.__name__}")

    def network_reasons(self, network):
        """``{id(cell): reason}`` for the cells of ``network`` this kind cannot take because of where they
        sit in the network (none by default)."""
        return {}

    def unsupported_reason(self, cell, base):
        """Why a cell of class ``base`` (one of :attr:`classes`) cannot be captured, beyond the checks
        every kind shares (trainable weight and bias, no custom construct); None when it can."""
        return None

    def spec_fields(self, cell, weight_shape, has_bias):
        """The kind's fields of the cell's LayerSpec: ``a_dim``, ``g_dim`` and any geometry."""
        raise NotImplementedError

    def statistic_shape(self, shape):
        """The shape the formulas see for a layer input or output of ``shape``."""
        return tuple(shape)

    def positions_per_example(self, x_shape, y_shape, batch):
        """Output positions per example of one call with input ``x_shape`` and output ``y_shape``."""
        raise NotImplementedError

    # the batch statistics (graph-mode functions, see the module docstring)
    @staticmethod
    def input_factor(x, geometry, has_bias, fraction, position_stride):
        raise NotImplementedError

    @staticmethod
    def output_factor(dy, g_scale, fraction, position_stride):
        raise NotImplementedError

    @staticmethod
    def input_trace(x, geometry, has_bias):
        raise NotImplementedError

    @staticmethod
    def positions(x, geometry):
        """T, the output positions a captured A sums over (a Python int; 1 without :attr:`has_positions`,
        when the capture does not record it)."""
        return 1


# ------------------------------------------------------------------------- capturing constructs
class _CapturedAffine:
    """The capture around the affine kernel of nn.Dense and nn.Conv2d: A from the input, the kernel
    ``kernel(x, weight)``, the bias, and the G hook on the output (training mode only)."""

    def _ngd_affine(self, x, kernel):
        if self.training:
            x = self._ngd_capture.capture_input(x)
        x = kernel(x, self.weight)
        if self.has_bias:
            x = self.bias_add(x, self.bias)
        if self.training:
            x = self._ngd_capture.grad_hook(x)
        return x


class _CapturedDense(_CapturedAffine):
    """construct of a capturing nn.Dense (same computation as ``nn.Dense.construct``)."""

    def construct(self, x):
        x_shape = x.shape
        if len(x_shape) > 2 and self.training and self._ngd_capture.reduces:
            # K-FAC-reduce: the capture sees the input and the output gradient per example, (B, ..., n)
            x = self._ngd_capture.capture_input(x)
            y = self.matmul(x.reshape(-1, x_shape[-1]), self.weight)
            if self.has_bias:
                y = self.bias_add(y, self.bias)
            out_shape = x_shape[:-1] + (y.shape[-1],)
            y = self._ngd_capture.grad_hook(y.reshape(out_shape)).reshape(-1, y.shape[-1])
            if self.activation_flag:
                y = self.activation(y)
            return y.reshape(out_shape)
        if len(x_shape) != 2:
            x = x.reshape(-1, x_shape[-1])
        x = self._ngd_affine(x, self.matmul)
        if self.activation_flag:
            x = self.activation(x)
        if len(x_shape) != 2:
            x = x.reshape(x_shape[:-1] + (x.shape[-1],))
        return x


class _CapturedConv2d(_CapturedAffine):
    """construct of a capturing nn.Conv2d (same computation as ``nn.Conv2d.construct``)."""

    def construct(self, x):
        return self._ngd_affine(x, self.conv2d)


class _CapturedLinear:
    """construct of a capturing nn.Linear / mint.nn.Linear (``ops.Dense`` on the input as rows)."""

    def construct(self, x):
        if self.training and len(x.shape) > 2 and self._ngd_capture.reduces:
            # K-FAC-reduce: the capture sees the input and the output gradient per example, (B, ..., n)
            x_shape = x.shape
            x = self._ngd_capture.capture_input(x)
            out = self.dense(x.reshape(-1, x_shape[-1]), self.weight, self.bias)
            return self._ngd_capture.grad_hook(out.reshape(x_shape[:-1] + (out.shape[-1],)))
        if self.training:
            x_shape = x.shape
            rows = self._ngd_capture.capture_input(x.reshape(-1, x_shape[-1]))
            out = self._ngd_capture.grad_hook(self.dense(rows, self.weight, self.bias))
            return out.reshape(x_shape[:-1] + (out.shape[-1],))
        return self.dense(x, self.weight, self.bias)


class _CapturedMintConv2d:
    """construct of a capturing mint.nn.Conv2d with zero padding (the same kernel call; an unbatched
    (C, H, W) input is captured as a batch of one)."""

    def construct(self, x):
        if self.training:
            unbatched = len(x.shape) == 3
            if unbatched:
                x = x.expand_dims(0)
            x = self._ngd_capture.capture_input(x)
            output = self.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
            output = self._ngd_capture.grad_hook(output)
            if unbatched:
                output = output.squeeze(0)
            return output
        return self.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _CapturedEmbedding:
    """construct of a capturing nn.Embedding (same computation as ``nn.Embedding.construct``): the token
    ids as A's input, the G hook on the looked-up rows (training mode only)."""

    def construct(self, ids):
        out_shape = self.get_shp(ids) + (self.embedding_size,)
        flat_ids = self.reshape_flat(ids, self.shp_flat)
        if self.training:
            flat_ids = self._ngd_capture.capture_input(flat_ids)
        if self.use_one_hot:
            one_hot_ids = self.one_hot(flat_ids, self.vocab_size, self.on_value, self.off_value)
            rows = self.array_mul(one_hot_ids, self.embedding_table)
        else:
            rows = self.gather(self.embedding_table, flat_ids, 0)
        if self.training:
            rows = self._ngd_capture.grad_hook(rows)
        return self.reshape(rows, out_shape)


# ------------------------------------------------------------------------------------ the kinds
def _dense_reduce_input_factor(x, geometry, has_bias, fraction, position_stride):
    return factors.dense_reduce_input_factor(x, has_bias, fraction)


def _dense_reduce_output_factor(dy, g_scale, fraction, position_stride):
    return factors.dense_reduce_output_factor(dy, g_scale, fraction)


def _dense_reduce_input_trace(x, geometry, has_bias):
    return factors.dense_reduce_input_trace(x, has_bias)


class DenseType(LayerType):
    """``nn.Dense`` and ``nn.Linear`` (the same class as ``mint.nn.Linear``): inputs flattened to rows,
    every row an example (K-FAC-expand); with ``sequence_approx="reduce"`` an input of more than two
    dimensions counts each example once (:attr:`reduce_formulas`)."""
    kind = "dense"
    classes = (nn.Dense, nn.Linear)
    constructs = ((nn.Dense, _CapturedDense), (nn.Linear, _CapturedLinear))
    has_positions = False
    probe_rank = 0

    def spec_fields(self, cell, weight_shape, has_bias):
        return {"a_dim": weight_shape[1] + int(has_bias), "g_dim": weight_shape[0]}

    def statistic_shape(self, shape):
        return (int(np.prod(shape[:-1])), shape[-1])

    def positions_per_example(self, x_shape, y_shape, batch):
        return int(np.prod(x_shape[:-1])) // batch

    reduce_formulas = (_dense_reduce_input_factor, _dense_reduce_output_factor, _dense_reduce_input_trace,
                       factors.dense_reduce_output_trace)

    @staticmethod
    def input_factor(x, geometry, has_bias, fraction, position_stride):
        return factors.dense_input_factor(x, has_bias, fraction)

    @staticmethod
    def output_factor(dy, g_scale, fraction, position_stride):
        return factors.dense_output_factor(dy, g_scale, fraction)

    @staticmethod
    def input_trace(x, geometry, has_bias):
        return factors.dense_input_trace(x, has_bias)


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


class Conv2dType(LayerType):
    """``nn.Conv2d`` and ``mint.nn.Conv2d`` (NCHW, ``groups=1``, zero padding): KFC's im2col factors."""
    kind = "conv2d"
    classes = (nn.Conv2d, mint.nn.Conv2d)
    constructs = ((nn.Conv2d, _CapturedConv2d), (mint.nn.Conv2d, _CapturedMintConv2d))
    has_positions = True
    probe_rank = 1

    def unsupported_reason(self, cell, base):
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
        return None

    def spec_fields(self, cell, weight_shape, has_bias):
        pad_mode, padding = _conv_geometry(cell)
        return {"a_dim": int(np.prod(weight_shape[1:])) + int(has_bias), "g_dim": weight_shape[0],
                "kernel_size": _pair(cell.kernel_size), "stride": _pair(cell.stride)[-2:],
                "dilation": _pair(cell.dilation)[-2:], "pad_mode": pad_mode, "padding": padding}

    def positions_per_example(self, x_shape, y_shape, batch):
        return y_shape[2] * y_shape[3]

    @staticmethod
    def input_factor(x, geometry, has_bias, fraction, position_stride):
        kernel_size, stride, dilation, pad_mode, padding = geometry
        return factors.conv_input_factor(x, kernel_size, stride, dilation, pad_mode, padding, has_bias, fraction,
                                         position_stride)

    @staticmethod
    def output_factor(dy, g_scale, fraction, position_stride):
        return factors.conv_output_factor(dy, g_scale, fraction, position_stride)

    @staticmethod
    def input_trace(x, geometry, has_bias):
        kernel_size, stride, dilation, pad_mode, padding = geometry
        return factors.conv_input_trace(x, kernel_size, stride, dilation, pad_mode, padding, has_bias)

    @staticmethod
    def positions(x, geometry):
        kernel_size, stride, dilation, pad_mode, padding = geometry
        return factors.conv_positions(x, kernel_size, stride, dilation, pad_mode, padding)


class EmbeddingType(LayerType):
    """``nn.Embedding`` (weight ``embedding_table``, (vocab, dim)): a Dense layer whose input is the one-hot
    token, every token an example. Its A is then diagonal, the tokens' frequencies in the batch, and is
    kept as that vector (:class:`~mindspore_ngd.curvature.embedding.EmbeddingBlock`); G is a Dense
    layer's over the looked-up rows. ``a_dim`` is the vocabulary size, ``g_dim`` the embedding size."""
    kind = "embedding"
    classes = (nn.Embedding,)
    constructs = ((nn.Embedding, _CapturedEmbedding),)
    has_positions = False
    probe_rank = 2
    weight_attr = "embedding_table"

    def spec_fields(self, cell, weight_shape, has_bias):
        return {"a_dim": weight_shape[0], "g_dim": weight_shape[1]}

    def geometry(self, spec):
        return spec.a_dim                                   # the vocabulary size

    def input_buffer_shape(self, a_dim):
        return (a_dim,)

    def statistic_shape(self, shape):
        return (int(np.prod(shape[:-1])), shape[-1])

    def positions_per_example(self, x_shape, y_shape, batch):
        return int(np.prod(x_shape)) // batch

    @staticmethod
    def input_factor(x, geometry, has_bias, fraction, position_stride):
        return factors.embedding_input_factor(x, geometry, fraction)

    @staticmethod
    def output_factor(dy, g_scale, fraction, position_stride):
        return factors.dense_output_factor(dy, g_scale, fraction)

    @staticmethod
    def input_trace(x, geometry, has_bias):
        return factors.embedding_input_trace(x, geometry)


# ------------------------------------------------------------------------------------ the registry
LAYER_TYPES = {}
"""kind -> :class:`LayerType`, in registration order (the order :func:`find_layers` tries them)."""


def register_layer_type(layer_type):
    """Register a :class:`LayerType` instance under its ``kind``; returns it. A kind registered twice,
    or a class another kind already matches, is a ValueError naming it."""
    kind = layer_type.kind
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a layer type needs a non-empty kind string, got {kind!r}")
    if kind in LAYER_TYPES:
        raise ValueError(f"layer kind {kind!r} is already registered ({type(LAYER_TYPES[kind]).__name__})")
    for other in LAYER_TYPES.values():
        taken = [cls.__name__ for cls in layer_type.classes if cls in other.classes]
        if taken:
            raise ValueError(f"layer kind {kind!r}: {', '.join(taken)} already belongs to kind {other.kind!r}")
    LAYER_TYPES[kind] = layer_type
    return layer_type


def registered(table, spec, noun):
    """``table[kind]`` for the kind of ``spec`` (a spec with a ``kind``, or a kind string); a KeyError
    naming the kind, the ``noun`` of the entries and the registered kinds when there is none. The
    lookup of this registry and of :mod:`mindspore_ngd.curvature.registry`'s."""
    kind = spec if isinstance(spec, str) else spec.kind
    try:
        return table[kind]
    except KeyError:
        raise KeyError(f"no {noun} registered for kind {kind!r}; registered: {sorted(table)}") from None


def layer_type_of(spec):
    """The :class:`LayerType` of a LayerSpec (or of a kind string)."""
    return registered(LAYER_TYPES, spec, "layer type")


def layer_type_of_class(cls):
    """``(layer_type, base)``: the registered type matching cell class ``cls`` and the class of it that
    ``cls`` subclasses, or ``(None, None)``."""
    for layer_type in LAYER_TYPES.values():
        base = layer_type.base_class(cls)
        if base is not None:
            return layer_type, base
    return None, None


DENSE = register_layer_type(DenseType())
CONV2D = register_layer_type(Conv2dType())
EMBEDDING = register_layer_type(EmbeddingType())
