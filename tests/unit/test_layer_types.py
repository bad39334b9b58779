"""The layer-type registry (mindspore_ngd.capture.layer_types): one LayerType per LayerSpec.kind owns
the cell classes of that kind, its LayerSpec fields, its capturing construct and its batch-statistic
formulas; find_layers, the capture cells, the loss-scale probe and the cost model ask it.

That the capturing cells compute the same factors as before is checked bit for bit by
tests/golden/test_golden.py; the factors against NumPy in tests/numerics/.
"""
import numpy as np
import pytest

from mindspore import Parameter, Tensor, mint, nn

import mindspore_ngd as ngd
from mindspore_ngd.capture import CONV_CLASSES, DENSE_CLASSES, LAYER_CLASSES, LayerCapture, LayerSpec, find_layers
from mindspore_ngd.capture import attach, detach
from mindspore_ngd.capture.layer_types import (LAYER_TYPES, Conv2dType, DenseType, LayerType, layer_type_of,
                                               layer_type_of_class, register_layer_type)
from mindspore_ngd.capture.loss_scale import reference_layer


class Net(nn.Cell):
    """One cell of each built-in class, plus layers no registered type matches (never run)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.mconv = mint.nn.Conv2d(8, 4, (3, 1), stride=1, padding=(1, 0), dilation=2, bias=False)
        self.conv1d = nn.Conv1d(4, 4, 3)                 # no registered type: not picked up
        self.fc = nn.Dense(16, 10)
        self.head = nn.Linear(10, 5, bias=False)


def test_the_built_in_kinds_are_registered_with_their_classes():
    assert list(LAYER_TYPES) == ["dense", "conv2d", "embedding", "attention"]
    assert LAYER_TYPES["embedding"].classes == (nn.Embedding,)
    assert LAYER_TYPES["attention"].classes == (ngd.SelfAttention, nn.MultiheadAttention)
    assert isinstance(LAYER_TYPES["dense"], DenseType) and isinstance(LAYER_TYPES["conv2d"], Conv2dType)
    assert LAYER_TYPES["dense"].classes == DENSE_CLASSES == (nn.Dense, nn.Linear)
    assert LAYER_TYPES["conv2d"].classes == CONV_CLASSES == (nn.Conv2d, mint.nn.Conv2d)
    assert LAYER_CLASSES == DENSE_CLASSES + CONV_CLASSES


@pytest.mark.parametrize("kind", ["dense", "conv2d"])
def test_every_registered_type_matches_its_own_classes(kind):
    layer_type = LAYER_TYPES[kind]
    assert layer_type_of(kind) is layer_type
    for cls in layer_type.classes:
        assert layer_type_of_class(cls) == (layer_type, cls)
        subclass = type(f"My{cls.__name__}", (cls,), {})
        assert layer_type_of_class(subclass) == (layer_type, cls)
        # the capturing construct of that class is one of the type's own mixins
        assert layer_type.mixin(subclass) in dict(layer_type.constructs).values()
        assert layer_type.mixin(cls) is dict(layer_type.constructs)[cls]


def test_find_layers_builds_the_same_specs_as_before():
    net = Net()
    specs, cells, skipped = find_layers(net)
    expected = [
        LayerSpec(name="conv", kind="conv2d", weight_name="conv.weight", bias_name="conv.bias",
                  weight_shape=(8, 3, 3, 3), a_dim=3 * 3 * 3 + 1, g_dim=8, kernel_size=(3, 3), stride=(2, 2),
                  dilation=(1, 1), pad_mode="pad", padding=(1, 1, 1, 1)),
        LayerSpec(name="mconv", kind="conv2d", weight_name="mconv.weight", bias_name=None,
                  weight_shape=(4, 8, 3, 1), a_dim=8 * 3 * 1, g_dim=4, kernel_size=(3, 1), stride=(1, 1),
                  dilation=(2, 2), pad_mode="pad", padding=(1, 1, 0, 0)),
        LayerSpec(name="fc", kind="dense", weight_name="fc.weight", bias_name="fc.bias", weight_shape=(10, 16),
                  a_dim=17, g_dim=10),
        LayerSpec(name="head", kind="dense", weight_name="head.weight", bias_name=None, weight_shape=(5, 10),
                  a_dim=10, g_dim=5),
    ]
    assert specs == expected
    assert cells == [net.conv, net.mconv, net.fc, net.head]
    assert skipped == []                                 # the Conv1d is neither taken nor skipped
    assert "conv1d" not in [s.name for s in specs]


def test_the_capture_uses_the_formulas_of_the_layers_type():
    specs, _, _ = find_layers(Net())
    conv, mconv, fc, head = (LayerCapture(spec, "t", stat_stride=2) for spec in specs)
    assert conv._input_factor is Conv2dType.input_factor and conv._output_factor is Conv2dType.output_factor
    assert fc._input_factor is DenseType.input_factor and fc._input_trace is DenseType.input_trace
    assert conv.has_positions and not fc.has_positions
    assert (conv.stat_stride, fc.stat_stride) == (2, 1)  # Dense layers have no positions to subsample
    assert conv.geometry == ((3, 3), (2, 2), (1, 1), "pad", (1, 1, 1, 1))
    assert mconv.geometry == ((3, 1), (1, 1), (2, 2), "pad", (1, 1, 0, 0))
    # the loss-scale probe prefers a biased Dense layer over a biased convolution
    assert specs[reference_layer(specs)].name == "fc"
    assert specs[reference_layer([specs[0]])].name == "conv"
    assert reference_layer([specs[1], specs[3]]) is None


def test_attach_gives_each_class_its_types_construct():
    net = Net()
    specs, cells, _ = find_layers(net)
    attach(cells, [LayerCapture(spec, "t") for spec in specs])
    try:
        for spec, cell in zip(specs, cells):
            layer_type = layer_type_of(spec)
            original = type(cell)._ngd_original_class
            assert type(cell).__mro__[1] is layer_type.mixin(original)
        assert find_layers(net)[0] == specs            # a captured cell is found as its original class
    finally:
        detach(cells)


def test_the_cost_models_shapes_come_from_the_type():
    dense, conv = LAYER_TYPES["dense"], LAYER_TYPES["conv2d"]
    assert dense.statistic_shape((4, 7, 16)) == (28, 16)
    assert conv.statistic_shape((4, 3, 8, 8)) == (4, 3, 8, 8)
    assert dense.positions_per_example((4, 7, 16), (4, 7, 10), 4) == 7
    assert conv.positions_per_example((4, 3, 8, 8), (4, 8, 4, 5), 4) == 20


class Scale(nn.Cell):
    """A layer no built-in type knows: ``y = x * weight`` per feature."""

    def __init__(self, features):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones((features, 1), np.float32)), name="weight")

    def construct(self, x):
        return x * self.weight.reshape(-1)


class ScaleType(LayerType):
    kind = "scale"
    classes = (Scale,)

    def spec_fields(self, cell, weight_shape, has_bias):
        return {"a_dim": 1, "g_dim": weight_shape[0]}


class WithScale(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 3)
        self.scale = Scale(3)


def test_an_unregistered_layer_class_is_not_picked_up_until_its_type_is_registered():
    net = WithScale()
    assert [s.name for s in find_layers(net)[0]] == ["fc"]
    assert layer_type_of_class(Scale) == (None, None)
    with pytest.raises(KeyError, match="'scale'"):
        layer_type_of("scale")
    register_layer_type(ScaleType())
    try:
        specs, cells, skipped = find_layers(net)
        assert [(s.name, s.kind, s.a_dim, s.g_dim) for s in specs] == [("fc", "dense", 5, 3), ("scale", "scale", 1, 3)]
        assert cells[1] is net.scale and skipped == []
        assert isinstance(layer_type_of(specs[1]), ScaleType)
    finally:
        del LAYER_TYPES["scale"]
    assert [s.name for s in find_layers(net)[0]] == ["fc"]


def test_registering_a_kind_twice_is_an_error_naming_the_kind():
    before = dict(LAYER_TYPES)
    with pytest.raises(ValueError, match="layer kind 'dense' is already registered"):
        register_layer_type(DenseType())

    class OtherConv(Conv2dType):
        kind = "conv2d-other"

    with pytest.raises(ValueError, match="'conv2d-other'.*Conv2d.*already belongs to kind 'conv2d'"):
        register_layer_type(OtherConv())

    class Nameless(LayerType):
        classes = (Scale,)

    with pytest.raises(ValueError, match="non-empty kind"):
        register_layer_type(Nameless())
    assert LAYER_TYPES == before
