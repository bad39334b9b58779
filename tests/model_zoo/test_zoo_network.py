"""model_zoo/resnet50/src/resnet.py: ResNet-50 v1.5 against its published parameter count and
strides, zero-initialised residual branches, and build_network's checks."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import zoo  # noqa: F401 - puts the model zoo's src/ on sys.path (and needs pyyaml)
from src.resnet import build_network, resnet50


def test_resnet50_has_the_published_parameter_count_and_v15_strides():
    net = resnet50(num_classes=1000)
    assert sum(p.size for p in net.trainable_params()) == 25_557_032
    first = net.layer2[0]               # the down-sampling bottleneck of stage 2
    assert first.conv1.stride == (1, 1) and first.conv1.kernel_size == (1, 1)
    assert first.conv2.stride == (2, 2) and first.conv2.kernel_size == (3, 3)   # v1.5: stride on the 3x3
    assert first.projection[0].stride == (2, 2)
    assert net.layer1[0].conv2.stride == (1, 1)


def test_zero_init_residual_zeroes_the_last_batchnorm_gamma_of_every_bottleneck():
    net = resnet50(num_classes=10, zero_init_residual=True)
    gammas = {p.name: p.asnumpy() for p in net.trainable_params() if p.name.endswith("bn3.gamma")}
    assert len(gammas) == 16 and all(not g.any() for g in gammas.values())
    assert resnet50(num_classes=10).layer1[0].bn3.gamma.asnumpy().all()


def test_resnet50_forward_shape_on_a_small_input():
    ms.set_seed(0)
    net = resnet50(num_classes=1000)
    net.set_train(False)
    out = net(Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)))
    assert out.shape == (2, 1000) and np.isfinite(out.asnumpy()).all()


def test_build_network_rejects_unknown_names_and_options():
    assert build_network("resnet_cifar", 10, {"blocks_per_stage": 1, "width": 4}) is not None
    with pytest.raises(ValueError, match="unknown net 'resnet18'"):
        build_network("resnet18", 10)
    with pytest.raises(ValueError, match="depth"):
        build_network("resnet50", 10, {"depth": 101})
