"""model_zoo/resnet50/src/resnet.py: ResNet-50 v1.5 against its published parameter count and
strides, zero-initialised residual branches, and build_network's checks."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

from zoo import smoke_config  # puts the model zoo's src/ on sys.path (and needs pyyaml)
from src import runtime
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


@pytest.mark.parametrize("config", ["resnet50_imagenet2012_thor_8p", "resnet50_imagenet2012_thor_gpu_8p"])
def test_thor_recipes_build_the_network_nn_thor_was_tuned_on(config):
    """nn.thor's published ResNet-50 values were tuned on the models repository's resnet_thor.py: the
    last BatchNorm of every bottleneck starts at gamma 0 and the classifier has no bias."""
    from src.config import load_config
    settings = load_config(config)
    net = build_network(settings["net"], 10, settings["net_options"])
    names = [p.name for p in net.trainable_params()]
    assert not any(n.startswith("fc.") and n.endswith("bias") for n in names)
    assert sum(p.size for p in net.trainable_params()) == sum(p.size for p in resnet50(10).trainable_params()) - 10
    gammas = [p.asnumpy() for p in net.trainable_params() if p.name.endswith("bn3.gamma")]
    assert len(gammas) == 16 and not any(g.any() for g in gammas)


def test_resnet50_forward_shape_on_a_small_input():
    ms.set_seed(0)
    net = resnet50(num_classes=1000)
    net.set_train(False)
    out = net(Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)))
    assert out.shape == (2, 1000) and np.isfinite(out.asnumpy()).all()


def test_resnet50_training_step_compiles_in_the_zoo_context():
    """MindSpore 2.10 stops compiling ResNet-50's training graph at its default limit of 1000 nested
    calls ("Exceed function call depth limit 1000", measured with nn.Momentum); train.py and eval.py
    set the context through runtime.setup_context, which raises the limit."""
    runtime.setup_context(smoke_config(net="resnet50"))
    net = resnet50(num_classes=10)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()),
                               nn.Momentum(net.trainable_params(), 0.01, 0.9))
    step.set_train()
    images = Tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    loss = step(images, Tensor(np.array([1, 2], np.int32))).asnumpy()
    assert np.isfinite(loss) and loss > 0


def test_build_network_rejects_unknown_names_and_options():
    assert build_network("resnet_cifar", 10, {"blocks_per_stage": 1, "width": 4}) is not None
    with pytest.raises(ValueError, match="unknown net 'resnet18'"):
        build_network("resnet18", 10)
    with pytest.raises(ValueError, match="depth"):
        build_network("resnet50", 10, {"depth": 101})
