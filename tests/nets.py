"""Small networks with known weights, shared by the tests."""
import numpy as np

from mindspore import nn, Tensor

from reference import numpy_kfac as ref


def set_weights(cell, rng, scale=0.5):
    for p in cell.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32)))


class SeedNet(nn.Cell):
    """The seed article's 3-4-2 fully connected network without biases."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(3, 4, has_bias=False)
        self.act = nn.Tanh()
        self.fc2 = nn.Dense(4, 2, has_bias=False)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class DenseNet(nn.Cell):
    def __init__(self, din=5, hidden=4, dout=3, bias=True):
        super().__init__()
        self.fc1 = nn.Dense(din, hidden, has_bias=bias)
        self.act = nn.ReLU()   # exact in float32 (MindSpore's tanh is only accurate to ~1e-5)
        self.fc2 = nn.Dense(hidden, dout, has_bias=True)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Cell):
    """conv -> ReLU -> flatten -> Dense, for one convolution geometry."""

    def __init__(self, cin, cout, kernel, stride, pad_mode, padding, dilation, bias, flat_dim, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, pad_mode=pad_mode, padding=padding,
                              dilation=dilation, has_bias=bias)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(flat_dim, classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


class BNNet(nn.Cell):
    """conv (bias) -> BN -> grouped conv -> ReLU -> flatten -> Dense: every kind of parameter."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.gconv = nn.Conv2d(4, 4, 3, pad_mode="same", group=2)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 5 * 5, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.gconv(self.bn(self.conv(x))))))


# convolution geometries checked against the NumPy reference (explicit patches), padding included
CONV_CASES = [
    # kernel, stride, pad_mode, padding, dilation, bias
    ((3, 3), (1, 1), "same", 0, (1, 1), True),
    ((3, 3), (2, 2), "same", 0, (1, 1), False),
    ((3, 3), (1, 1), "valid", 0, (1, 1), True),
    ((3, 3), (2, 2), "pad", (1, 0, 2, 1), (1, 1), True),
    ((3, 2), (1, 2), "pad", 1, (2, 1), False),
    ((2, 2), (2, 1), "same", 0, (1, 2), True),
]


def make_dense_net(seed, bias, batch):
    """A DenseNet with random weights, a batch of ``batch`` 5-vectors and labels in [0, 3)."""
    rng = np.random.default_rng(seed)
    net = DenseNet(bias=bias)
    set_weights(net, rng)
    x = rng.standard_normal((batch, 5)).astype(np.float32)
    y = rng.integers(0, 3, batch).astype(np.int32)
    return net, x, y


def make_conv_net(case, rng, cin=2, cout=3, hw=7):
    """A ConvNet for one of CONV_CASES with random weights, a batch of 4 inputs and labels, and the
    geometry in the reference's terms: ``(kernel, stride, pad_mode, (top, bottom, left, right), dilation)``."""
    kernel, stride, pad_mode, padding, dilation, bias = case
    x_shape = (4, cin, hw, hw)
    _, (oh, ow) = ref.conv_geometry(x_shape, kernel, stride, dilation, pad_mode,
                                    padding if isinstance(padding, tuple) else (padding,) * 4)
    net = ConvNet(cin, cout, kernel, stride, pad_mode, padding, dilation, bias, cout * oh * ow)
    set_weights(net, rng)
    x = rng.standard_normal(x_shape).astype(np.float32)
    y = rng.integers(0, 4, x_shape[0]).astype(np.int32)
    pads = padding if isinstance(padding, tuple) else (padding,) * 4
    return net, x, y, (kernel, stride, pad_mode, pads, dilation)


def conv_net_reference(net, x, y, geometry):
    """Float64 forward and backward of a :class:`ConvNet` in NumPy: ``(patches (B, T, D), conv output
    (B, out, Ho, Wo), gradient of the mean loss w.r.t. that output)``."""
    def w(param):
        return param.asnumpy().astype(np.float64)
    kernel, stride, pad_mode, padding, dilation = geometry
    patches, (oh, ow) = ref.im2col(x.astype(np.float64), kernel, stride, dilation, pad_mode, padding)
    wc = w(net.conv.weight)
    cout = wc.shape[0]
    conv = patches @ wc.reshape(cout, -1).T
    if net.conv.has_bias:
        conv = conv + w(net.conv.bias)
    conv = conv.transpose(0, 2, 1).reshape(x.shape[0], cout, oh, ow)
    logits = np.maximum(conv, 0).reshape(x.shape[0], -1) @ w(net.fc.weight).T + w(net.fc.bias)
    _, dlogits = ref.softmax_ce(logits, y)
    return patches, conv, (dlogits @ w(net.fc.weight)).reshape(conv.shape) * (conv > 0)
