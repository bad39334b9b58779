"""The THOR flow of MindSpore's models repository (``official/cv/ResNet/train.py``) with ``thor`` and
``ConvertModelUtils`` imported from mindspore_ngd: a Momentum ``Model`` built first, then the THOR
optimizer and ``convert_to_thor_model`` with a ``FixedLossScaleManager``. The converted model trains
with THOR (not the Momentum it was built with), and the refusals name what to pass instead. The
network is the small BNNet, not a ResNet-50."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.amp import FixedLossScaleManager
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset
from nets import BNNet
from training import CE, StepLosses, batch, template_images

STEPS = 4


def _dataset():
    x = np.concatenate([batch(i)[0].asnumpy() for i in range(STEPS)])
    y = np.concatenate([batch(i)[1].asnumpy() for i in range(STEPS)])
    return array_dataset(x, y, len(y) // STEPS, shuffle=False)


def _damping():
    return Tensor(np.full(STEPS, 1e-2, np.float32))      # upstream passes Tensor(get_thor_damping(...))


def _flow(amp_level):
    """train.py's THOR branch, in its order, with the repository's loss scale (128)."""
    ms.set_seed(0)
    net = BNNet()
    model = Model(net, CE, nn.Momentum(net.trainable_params(), 0.1, 0.9), metrics={"acc"})
    opt = ngd.thor(net, 0.1, _damping(), 0.9, 0.0, 128.0, 8, frequency=2, verbose=False)
    scale = FixedLossScaleManager(128.0, drop_overflow_update=False)
    model = ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=CE, optimizer=opt,
                                                          loss_scale_manager=scale, metrics={"acc"},
                                                          amp_level=amp_level, keep_batchnorm_fp32=False)
    model.train(1, _dataset(), dataset_sink_mode=False)
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}, opt


_PLAIN = []


def _plain_thor():
    """THOR in Model.train without loss scaling (computed once)."""
    if _PLAIN:
        return _PLAIN[0]
    ms.set_seed(0)
    net = BNNet()
    start = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    opt = ngd.THOR(net, 0.1, _damping(), 0.9, frequency=2, verbose=False)
    Model(net, CE, opt).train(1, _dataset(), dataset_sink_mode=False)
    _PLAIN.append(({p.name: p.asnumpy().copy() for p in net.trainable_params()}, start))
    return _PLAIN[0]


def test_the_converted_model_trains_thor_as_model_train_does():
    weights, opt = _flow("O0")
    expected, _ = _plain_thor()
    # the loss scale 128 is a power of two: scaling and unscaling are exact
    for name, value in expected.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)
    assert opt.state_counters()["step"] == STEPS
    assert opt.demoted_layers() == [] and all(a > 0 and g > 0 for a, g in opt.factor_updates().values())


@pytest.mark.parametrize("amp_level", ["O2", "O3"])
def test_the_converted_model_trains_thor_in_float16(amp_level):
    """O2 (with keep_batchnorm_fp32=False, as the models repository's train.py passes it) and O3 (the
    whole network in float16)."""
    weights, opt = _flow(amp_level)
    expected, start = _plain_thor()
    assert opt.state_counters()["step"] == STEPS and opt.state_counters()["skipped_steps"] == 0
    assert opt.demoted_layers() == [] and all(a > 0 and g > 0 for a, g in opt.factor_updates().values())
    # float16 arithmetic: the same training as float32 to a few per cent of the change of each tensor
    for name, value in expected.items():
        change = np.abs(value - start[name]).max()
        assert np.abs(weights[name] - value).max() < 0.1 * change, name


def test_convert_refuses_an_optimizer_it_would_silently_keep():
    net = BNNet()
    momentum = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, CE, momentum)
    with pytest.raises(TypeError, match=r"needs the natural-gradient optimizer.*mindspore_ngd\.thor.*got Momentum"):
        ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=CE, optimizer=momentum)
    opt = ngd.thor(net, 0.1, 1e-2, 0.9, verbose=False)
    with pytest.raises(TypeError, match="built on another network"):
        ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=BNNet(), loss_fn=CE, optimizer=opt)


@pytest.mark.parametrize("loss, reduction", [(nn.SoftmaxCrossEntropyWithLogits(sparse=True), "none"),
                                             (nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"), "sum")])
def test_convert_refuses_a_loss_that_is_not_a_mean(loss, reduction):
    net = BNNet()
    opt = ngd.thor(net, 0.1, 1e-2, 0.9, verbose=False)
    with pytest.raises(ValueError, match=rf"reduces with '{reduction}'.*reduction=\"mean\""):
        ngd.ConvertModelUtils().convert_to_thor_model(model=None, network=net, loss_fn=loss, optimizer=opt)


def test_the_monte_carlo_step_refuses_a_loss_that_is_not_a_mean():
    net = BNNet()
    opt = ngd.KFAC(net, 0.1, fisher="mc", verbose=False)
    with pytest.raises(ValueError, match=r"MCFisherTrainStep: the loss SoftmaxCrossEntropyWithLogits reduces with 'none'"):
        ngd.MCFisherTrainStep(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True), opt)


def test_the_converted_model_stops_a_finite_blow_up_with_a_reason():
    """The models repository's train.py passes its own callbacks; the converted Model adds the loss-side
    divergence stop to them. THOR at damping 1e-6 and lr 0.5 on a conv+BatchNorm net blows up and stays
    finite (test_divergence_monitor.py); the optimizer's own gradient rule is switched off here."""
    from benchmarks.models import ConvBNNet
    x, y = template_images()
    ms.set_seed(0)
    net = ConvBNNet(widths=(3, 16, 32, 32))
    loss = nn.CrossEntropyLoss(reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    opt = ngd.thor(net, 0.5, 1e-6, 0.9, 5e-4, 1.0, 32, frequency=4, verbose=False, divergence_growth=None,
                   kl_clip=None)      # nn.thor's unclipped step: the clip (the default) keeps this run stable
    model = ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt)
    theirs = ms.train.TimeMonitor()
    with pytest.raises(RuntimeError) as info:
        model.train(5, array_dataset(x, y, 32, shuffle=False), callbacks=[theirs], dataset_sink_mode=False)
    assert ngd.is_divergence(info.value) and "DivergenceMonitor" in str(info.value), str(info.value)
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    mine = ngd.DivergenceMonitor(patience=50)          # a monitor of the caller's own is kept, not doubled
    assert ngd.train.with_divergence_stops([theirs, mine], opt) == [theirs, mine]


def test_the_converted_model_adds_the_training_guard_without_host_calls():
    """On Ascend and GPU (host_calls=False) the step cannot raise; the converted Model's callbacks then
    include the TrainingGuard that raises the recorded stop."""
    net = BNNet()
    with_host = ngd.thor(net, 0.1, _damping(), 0.9, verbose=False)
    without = ngd.thor(net, 0.1, _damping(), 0.9, verbose=False, host_calls=False)
    kinds = lambda callbacks: sorted(type(c).__name__ for c in callbacks)
    assert kinds(ngd.train.with_divergence_stops(None, with_host)) == ["DivergenceMonitor"]
    assert kinds(ngd.train.with_divergence_stops(None, without)) == ["DivergenceMonitor", "TrainingGuard"]
    guard = ngd.TrainingGuard(without)
    assert ngd.train.with_divergence_stops([guard], without)[0] is guard
    assert len(ngd.train.with_divergence_stops([guard], without)) == 2


def _zoo_resnet50():
    """The model zoo's ResNet-50 as nn.thor's recipe builds it (zero-initialised residual gammas, no
    classifier bias), for 10 classes, from seed 0."""
    import importlib.util
    import os
    import sys
    module = sys.modules.get("zoo_resnet")
    if module is None:            # MindSpore's graph parser looks the network's module up by name
        path = os.path.join(os.path.dirname(__file__), "..", "..", "model_zoo", "resnet50", "src", "resnet.py")
        spec = importlib.util.spec_from_file_location("zoo_resnet", os.path.abspath(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules["zoo_resnet"] = module
        spec.loader.exec_module(module)
    ms.set_seed(0)
    return module.build_network("resnet50", 10, {"zero_init_residual": True, "classifier_bias": False})


RESNET_STEPS, RESNET_BATCH = 3, 8


def _resnet_flow(thor):
    """train.py's THOR branch (or, ``thor=False``, its Momentum model alone) on the zoo's ResNet-50 at
    32x32, batch 8, with the repository's THOR hyper-parameters, loss scale 128 and amp O2."""
    net = _zoo_resnet50()
    x, y = template_images(size=RESNET_STEPS * RESNET_BATCH, classes=10, hw=32)
    data = array_dataset(x, y, RESNET_BATCH, shuffle=False)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    scale = FixedLossScaleManager(128.0, drop_overflow_update=False)
    lr = Tensor(np.full(RESNET_STEPS, 0.05803, np.float32))
    if not thor:
        model = Model(net, loss, nn.Momentum(net.trainable_params(), lr, 0.9, 5e-4, 128.0), metrics={"acc"},
                      amp_level="O2", keep_batchnorm_fp32=False, loss_scale_manager=scale)
        opt = None
    else:
        model = Model(net, loss, nn.Momentum(net.trainable_params(), lr, 0.9, 5e-4, 128.0), metrics={"acc"})
        damping = Tensor(np.full(RESNET_STEPS, 0.03, np.float32))
        # nn.thor's positional order: net, lr, damping, momentum, weight_decay, loss_scale, batch_size
        opt = ngd.thor(net, lr, damping, 0.9, 5e-4, 128.0, RESNET_BATCH, split_indices=[26, 53], frequency=834,
                       verbose=False)
        model = ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                              loss_scale_manager=scale, metrics={"acc"},
                                                              amp_level="O2", keep_batchnorm_fp32=False)
    losses = StepLosses()
    model.train(1, data, callbacks=[losses], dataset_sink_mode=False)
    return {p.name: p.asnumpy().astype(np.float32).copy() for p in net.trainable_params()}, losses.values, opt


@pytest.mark.slow
def test_the_models_repository_thor_flow_trains_natural_gradient_on_the_zoo_resnet50():
    """The one-import change of train.py's THOR branch on the model zoo's own ResNet-50: every one of its
    54 Dense/Conv2d layers is preconditioned, captures its factors and is inverted (none demoted to the
    plain update), no step is skipped, the losses are finite, and the weights are not Momentum's."""
    weights, losses, opt = _resnet_flow(thor=True)
    counters = opt.state_counters()
    assert counters["step"] == RESNET_STEPS and counters["skipped_steps"] == 0, counters
    assert len(opt.layer_specs) == 54, [s.name for s in opt.layer_specs]
    assert opt.demoted_layers() == []
    updates = opt.factor_updates()
    assert len(updates) == 54 and all(a > 0 and g > 0 for a, g in updates.values()), updates
    assert counters["inverse_refreshes"] >= 1, counters
    assert len(losses) == RESNET_STEPS and np.all(np.isfinite(losses)), losses
    momentum, momentum_losses, _ = _resnet_flow(thor=False)
    assert np.all(np.isfinite(momentum_losses))
    # the same start, batches, loss scale and precision: the difference is the optimizer's
    fc = [name for name in weights if name.endswith("weight") and weights[name].ndim == 2]
    moved = {name: np.abs(weights[name] - momentum[name]).max() for name in weights}
    assert all(np.isfinite(w).all() for w in weights.values())
    assert sum(value > 1e-6 for value in moved.values()) > 0.9 * len(moved), moved
    assert fc and all(moved[name] > 1e-4 for name in fc), {name: moved[name] for name in fc}
