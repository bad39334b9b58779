"""ResNet-50 v1.5 (He et al. 2016; v1.5: the stride of a down-sampling bottleneck sits on its 3x3
convolution, not on the first 1x1) and the CIFAR-style ResNet used for quick runs.

The model zoo owns both networks; the repository's benchmarks (``benchmarks/models.py``) import
:class:`ResNetCifar` from here rather than keeping a copy.
"""
import math

from mindspore import nn
from mindspore.common import initializer as init

__all__ = ["Bottleneck", "ResNet", "resnet50", "ResNetCifar", "build_network", "NETWORKS"]

EXPANSION = 4
RESNET50_BLOCKS = (3, 4, 6, 3)
STAGE_WIDTHS = (64, 128, 256, 512)


def _conv(in_ch, out_ch, kernel, stride=1):
    """Bias-free convolution, He-normal (fan_out) initialised as in torchvision's ResNet."""
    return nn.Conv2d(in_ch, out_ch, kernel, stride=stride, pad_mode="pad", padding=kernel // 2,
                     has_bias=False, weight_init=init.HeNormal(mode="fan_out", nonlinearity="relu"))


def _bn(channels, zero_gamma=False):
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.9, gamma_init="zeros" if zero_gamma else "ones")


class Bottleneck(nn.Cell):
    """1x1 (reduce) -> 3x3 (stride here: v1.5) -> 1x1 (expand x4), each followed by BatchNorm;
    a 1x1 strided projection shortcut when the shape changes."""

    def __init__(self, in_ch, width, stride=1, zero_init_residual=False):
        super().__init__()
        out_ch = width * EXPANSION
        self.conv1 = _conv(in_ch, width, 1)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, width, 3, stride)
        self.bn2 = _bn(width)
        self.conv3 = _conv(width, out_ch, 1)
        self.bn3 = _bn(out_ch, zero_gamma=zero_init_residual)
        self.relu = nn.ReLU()
        self.has_projection = stride != 1 or in_ch != out_ch
        if self.has_projection:
            self.projection = nn.SequentialCell([_conv(in_ch, out_ch, 1, stride), _bn(out_ch)])

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.projection(x) if self.has_projection else x
        return self.relu(out + identity)


class ResNet(nn.Cell):
    """ImageNet-style bottleneck ResNet: 7x7/2 stem, 3x3/2 max-pool, four stages, global average
    pool, fully connected classifier.

    Args:
        blocks (tuple[int]): bottlenecks per stage, (3, 4, 6, 3) for ResNet-50.
        num_classes (int): classifier outputs.
        zero_init_residual (bool): initialise the last BatchNorm gamma of every bottleneck to zero,
            so that each residual branch starts as the identity (Goyal et al. 2017).
        classifier_bias (bool): give the classifier a bias. MindSpore's THOR ResNet-50
            (``model_zoo/official/cv/resnet_thor/src/resnet_thor.py``: ``_fc`` without bias, ``_bn_last``
            with gamma 0) has none, and starts every bottleneck's last BatchNorm at zero; nn.thor's
            published ResNet-50 hyper-parameters were tuned on that network.
    """

    def __init__(self, blocks=RESNET50_BLOCKS, num_classes=1000, zero_init_residual=False, classifier_bias=True):
        super().__init__()
        self.conv1 = _conv(3, 64, 7, stride=2)
        self.bn1 = _bn(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        stages, in_ch = [], 64
        for index, (count, width) in enumerate(zip(blocks, STAGE_WIDTHS)):
            cells = []
            for b in range(count):
                stride = 2 if index > 0 and b == 0 else 1
                cells.append(Bottleneck(in_ch, width, stride, zero_init_residual))
                in_ch = width * EXPANSION
            stages.append(nn.SequentialCell(cells))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        bound = 1.0 / math.sqrt(in_ch)
        self.fc = nn.Dense(in_ch, num_classes, weight_init=init.Uniform(bound), bias_init=init.Uniform(bound),
                           has_bias=bool(classifier_bias))

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flatten(self.pool(x)))


def resnet50(num_classes=1000, zero_init_residual=False, classifier_bias=True):
    """ResNet-50 v1.5: 25,557,032 trainable parameters for 1000 classes (1,000 fewer without the
    classifier's bias)."""
    return ResNet(RESNET50_BLOCKS, num_classes, zero_init_residual, classifier_bias)


class _BasicBlock(nn.Cell):
    """3x3 -> BatchNorm -> ReLU -> 3x3 -> BatchNorm, plus the input (a strided 1x1 projection when
    the shape changes), then ReLU."""

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


def _resnet_cifar(num_classes, blocks_per_stage=3, width=16):
    return ResNetCifar(blocks_per_stage=blocks_per_stage, width=width, num_classes=num_classes)


# network name -> (constructor, options it accepts besides num_classes)
NETWORKS = {
    "resnet50": (resnet50, ("zero_init_residual", "classifier_bias")),
    "resnet_cifar": (_resnet_cifar, ("blocks_per_stage", "width")),
}


def build_network(name, num_classes, options=None):
    """Build a network of :data:`NETWORKS` by name with the options of its config entry."""
    if name not in NETWORKS:
        raise ValueError(f"unknown net {name!r}; choose one of {sorted(NETWORKS)}")
    ctor, accepted = NETWORKS[name]
    options = dict(options or {})
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"net_options {unknown} are not options of net {name!r} (accepted: {list(accepted)})")
    return ctor(num_classes=num_classes, **options)
