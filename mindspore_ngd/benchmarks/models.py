"""Small reference networks used by the demo, the benchmarks and the tests."""
from mindspore import nn

__all__ = ["DigitsCNN", "ResNetCifar", "resnet20"]


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


class _BasicBlock(nn.Cell):
    def __init__(self, in_ch, out_ch, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, pad_mode="pad", padding=1)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, pad_mode="pad", padding=1)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        self.has_shortcut = stride != 1 or in_ch != out_ch
        if self.has_shortcut:
            self.shortcut = nn.SequentialCell([nn.Conv2d(in_ch, out_ch, 1, stride=stride, pad_mode="valid"),
                                               nn.BatchNorm2d(out_ch)])

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.shortcut(x) if self.has_shortcut else x
        return self.relu(out + identity)


class ResNetCifar(nn.Cell):
    """CIFAR-style ResNet (He et al. 2016, sec. 4.2): 3 stages of n basic blocks, widths w, 2w, 4w."""

    def __init__(self, blocks_per_stage=3, width=16, num_classes=10, in_channels=3):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        layers, ch = [], width
        for stage, out_ch in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks_per_stage):
                stride = 2 if stage > 0 and b == 0 else 1
                layers.append(_BasicBlock(ch, out_ch, stride))
                ch = out_ch
        self.layers = nn.SequentialCell(layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(ch, num_classes)

    def construct(self, x):
        x = self.relu(self.bn(self.stem(x)))
        x = self.layers(x)
        return self.fc(self.flatten(self.pool(x)))


def resnet20(num_classes=10):
    return ResNetCifar(3, 16, num_classes)
