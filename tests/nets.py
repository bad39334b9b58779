"""Small networks with known weights, shared by the tests."""
import numpy as np

from mindspore import nn, Tensor


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
