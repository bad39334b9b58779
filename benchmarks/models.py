"""Small reference networks used by the demo, the benchmarks and the tests.

The CIFAR-style ResNet belongs to the model zoo (``model_zoo/resnet50/src/resnet.py``) and is
imported from there, so that the benchmarks and the model zoo train the same network.
"""
import numpy as np

from mindspore import nn, Tensor

from model_zoo.resnet50.src.resnet import ResNetCifar

__all__ = ["DigitsCNN", "ConvBNNet", "MLP", "CNN1D", "DeepAutoencoder", "ConvPool2Dense2", "fmnist_mlp",
           "fmnist_2c2d", "ResNetCifar", "resnet20", "ByteTransformerLM", "TokenCrossEntropy"]


class DigitsCNN(nn.Cell):
    """conv3x3(1->16)-ReLU-conv3x3(16->32)-ReLU-maxpool2-Dense(512->64)-ReLU-Dense(64->10), 8x8 input.

    ``batchnorm=True`` puts a BatchNorm2d after each convolution (whose bias is then dropped)."""

    def __init__(self, num_classes=10, batchnorm=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, pad_mode="same", has_bias=not batchnorm)
        self.conv2 = nn.Conv2d(16, 32, 3, pad_mode="same", has_bias=not batchnorm)
        self.bn1 = nn.BatchNorm2d(16) if batchnorm else nn.Identity()
        self.bn2 = nn.BatchNorm2d(32) if batchnorm else nn.Identity()
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(32 * 4 * 4, 64)
        self.fc2 = nn.Dense(64, num_classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        x = self.relu(self.fc1(self.flatten(x)))
        return self.fc2(x)


class ConvBNNet(nn.Cell):
    """Three conv3x3-BatchNorm-ReLU blocks 3->32->64->64 (the last two with stride 2), global average
    pooling and Dense(64->10), for 32x32x3 inputs: a small conv+BatchNorm network (cost-model target,
    batch 32). Spatial sizes 32 -> 32 -> 16 -> 8; the convolutions have no bias (BatchNorm follows)."""

    def __init__(self, num_classes=10, widths=(3, 32, 64, 64), strides=(1, 2, 2)):
        super().__init__()
        layers = []
        for c_in, c_out, stride in zip(widths[:-1], widths[1:], strides):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, pad_mode="same", has_bias=False),
                       nn.BatchNorm2d(c_out), nn.ReLU()]
        self.features = nn.SequentialCell(layers)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(widths[-1], num_classes)

    def construct(self, x):
        x = self.features(x)
        return self.fc(self.flatten(x.mean(axis=(2, 3), keep_dims=True)))


class MLP(nn.Cell):
    """Fully connected ReLU network, e.g. ``MLP((40, 100, 100, 10))`` (MNIST-1D's MLP baseline).

    ``flatten=True`` flattens each input example first (images straight in, e.g. NCHW)."""

    def __init__(self, widths=(40, 100, 100, 10), flatten=False):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(a, b) for a, b in zip(widths[:-1], widths[1:])])
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten() if flatten else nn.Identity()

    def construct(self, x):
        x = self.flatten(x)
        for layer in self.layers[:-1]:
            x = self.relu(layer(x))
        return self.layers[-1](x)


class CNN1D(nn.Cell):
    """1-D CNN for length-40 signals (MNIST-1D): three stride-2 convolutions of 25 channels, then Dense.

    The convolutions are ``nn.Conv2d`` with (1, k) kernels on (N, 1, 1, L) inputs, the layout the
    natural-gradient optimizers precondition; lengths 40 -> 20 -> 10 -> 5.
    """

    def __init__(self, length=40, channels=25, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, (1, 5), stride=(1, 2), pad_mode="same", has_bias=True)
        self.conv2 = nn.Conv2d(channels, channels, (1, 3), stride=(1, 2), pad_mode="same", has_bias=True)
        self.conv3 = nn.Conv2d(channels, channels, (1, 3), stride=(1, 2), pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(channels * (-(-length // 8)), num_classes)

    def construct(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.fc(self.flatten(x))


class DeepAutoencoder(nn.Cell):
    """Deep autoencoder in the style of Hinton & Salakhutdinov (2006) / Martens & Grosse (2015).

    Hidden layers with ``activation`` ("sigmoid" as the classic, "tanh" or "relu"), a linear code
    layer (the last of ``widths``) and output logits (train with binary cross-entropy on inputs in
    [0, 1]). Default 64-128-64-32-8-32-64-128-64 for 8x8 digits.
    """

    def __init__(self, widths=(64, 128, 64, 32, 8), activation="sigmoid"):
        super().__init__()
        sizes = list(widths) + list(widths[-2::-1])
        self.layers = nn.CellList([nn.Dense(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        self.code_index = len(widths) - 2      # the layer producing the code stays linear
        self.sigmoid = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "relu": nn.ReLU}[activation]()

    def construct(self, x):
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i != self.code_index and i != last:
                x = self.sigmoid(x)
        return x


class ConvPool2Dense2(nn.Cell):
    """Two (5x5 'same' convolution, ReLU, 2x2 max-pool of stride 2) stages, then two dense layers.

    With the defaults this is DeepOBS's ``fmnist_2c2d`` / ``mnist_2c2d`` network (Schneider, Balles &
    Hennig, "DeepOBS: A Deep Learning Optimizer Benchmark Suite", ICLR 2019): 32 and 64 channels,
    a 1024-unit ReLU layer and ``num_classes`` logits, for 28x28 single-channel images
    (28 -> 14 -> 7). Weights use MindSpore's default initialisers, not DeepOBS's.
    """

    def __init__(self, in_channels=1, size=28, channels=(32, 64), hidden=1024, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels[0], 5, pad_mode="same", has_bias=True)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        side = size // 4
        self.fc1 = nn.Dense(channels[1] * side * side, hidden)
        self.fc2 = nn.Dense(hidden, num_classes)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(self.flatten(x)))
        return self.fc2(x)


def fmnist_mlp(num_classes=10):
    """DeepOBS's ``fmnist_mlp`` network (Schneider et al. 2019): flattened 28x28 input, ReLU MLP
    784-1000-500-100-``num_classes``. Takes (N, 1, 28, 28) images."""
    return MLP((28 * 28, 1000, 500, 100, num_classes), flatten=True)


def fmnist_2c2d(num_classes=10):
    """DeepOBS's ``fmnist_2c2d`` network (Schneider et al. 2019), see :class:`ConvPool2Dense2`."""
    return ConvPool2Dense2(num_classes=num_classes)


def resnet20(num_classes=10):
    """ResNet-20 for 32x32x3 images: three basic blocks per stage, widths 16, 32, 64."""
    return ResNetCifar(3, 16, num_classes)


class ByteTransformerLM(nn.Cell):
    """A small causal byte-level transformer language model of MindSpore's stock layers.

    Token and position ``nn.Embedding`` (summed), a post-LayerNorm ``nn.TransformerEncoder`` of
    ``layers`` ``nn.TransformerEncoderLayer`` (ReLU feed-forward, no dropout) with a causal mask and a
    final ``nn.LayerNorm``, and an ``nn.Dense`` read-out to the ``vocab`` logits at every position.
    Input: int32 (batch, length) tokens; output: (batch, length, vocab) logits of each next token.
    """

    def __init__(self, vocab=256, length=64, dim=64, heads=4, layers=2, feedforward=256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.position_ids = Tensor(np.arange(length, dtype=np.int32)[None])
        layer = nn.TransformerEncoderLayer(dim, heads, feedforward, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm((dim,)))
        self.head = nn.Dense(dim, vocab)
        # a position attends to itself and the positions before it (a large negative, not -inf: a
        # softmax over an all -inf row is NaN)
        self.causal_mask = Tensor(np.triu(np.full((length, length), -1e9, np.float32), 1))

    def construct(self, x):
        h = self.tokens(x) + self.positions(self.position_ids)
        return self.head(self.encoder(h, self.causal_mask))


class TokenCrossEntropy(nn.Cell):
    """Softmax cross-entropy averaged over every position of every sequence: logits (batch, length,
    vocab), int32 targets (batch, length)."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, labels):
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
