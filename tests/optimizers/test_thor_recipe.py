"""THOR with nn.thor's published hyper-parameters (the model zoo's Ascend ResNet-50 recipe: damping 0.03,
lr 0.058, loss scale 128, label smoothing 0.1, weight decay 5e-4 on every parameter) trains a small
conv+BatchNorm network on a learnable task at least as well as nn.Momentum at the same learning rate,
on the same data in the same order (3 short epochs, refresh every 4 steps as ``--set thor.frequency=4``):
its mean loss is at most nn.Momentum's in every epoch.

That is nn.thor's unclipped step (``kl_clip=None``). With the clip (THOR's default ``kl_clip`` 1e-3, and
the model zoo's THOR configs: ``kl_clip`` 0.001, ``adaptive_damping`` false, ``frequency`` 834), the
first epoch is not ahead: the clip scales the first steps down (issue 32; docs/performance.md, "THOR's
ImageNet recipes at small scale"). That case is an xfail (not strict: its first epoch is a near tie).
With the Monte-Carlo Fisher (``fisher="mc"``, trained through ``MCFisherTrainStep``) the same settings are
ahead in every epoch here; on ResNet-50 at batch 32 they are not (docs/performance.md).

The recipes' own regime is different: their learning rate is for the global batch of 8 devices x 32 = 256,
and at that batch, on real images (scikit-learn's digits), THOR with the zoo configs' settings (Ascend
and GPU values) is ahead of nn.Momentum in every epoch. The same holds for ResNet-50 on Fashion-MNIST
(docs/performance.md, "THOR's recipes at their global batch on real images").
"""
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.amp import FixedLossScaleManager
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset, digits_arrays
from benchmarks.models import ConvBNNet
from training import StepLosses, template_images

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

LR, DAMPING, SCALE, BATCH, STEPS_PER_EPOCH, EPOCHS = 0.05803, 0.03, 128.0, 32, 4, 3


def _epoch_losses(make_opt, data=None, batch=BATCH, step_of=None):
    """Mean training loss of each of the 3 epochs on ``data`` (x, y; default: the template images) in
    steps of ``batch``, label smoothing 0.1, loss scale 128, ``ConvBNNet`` with x's channels; the step is
    ``nn.TrainOneStepCell`` over ``make_opt(net)``, or ``step_of(net, loss)``."""
    x, y = template_images(BATCH * STEPS_PER_EPOCH) if data is None else data
    steps = len(x) // batch
    ms.set_seed(0)
    net = ConvBNNet(widths=(x.shape[1], 16, 32, 32))
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=0.1)
    if step_of is None:
        step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), make_opt(net), sens=SCALE)
    else:
        step = step_of(net, loss)
    step.set_train()
    losses = []
    for _ in range(EPOCHS):
        for i in range(steps):
            part = slice(i * batch, (i + 1) * batch)
            losses.append(float(step(Tensor(x[part]), Tensor(y[part])).asnumpy()))
    return np.array(losses).reshape(EPOCHS, steps).mean(axis=1)


def _momentum():
    return _epoch_losses(lambda net: nn.Momentum(net.trainable_params(), LR, 0.9, weight_decay=5e-4,
                                                 loss_scale=SCALE))


def test_thor_with_nn_thor_hyper_parameters_trains_at_least_as_well_as_momentum():
    """nn.thor's step itself (kl_clip=None): with THOR's default clip the first epoch is a near tie
    (measured 2.2709 against 2.2699, then 1.757 and 1.008 against 1.858 and 1.489)."""
    momentum = _momentum()
    thor = _epoch_losses(lambda net: ngd.THOR(net, LR, DAMPING, 0.9, 5e-4, SCALE, BATCH, frequency=4,
                                              kl_clip=None, verbose=False))
    assert np.isfinite(thor).all(), thor
    assert thor[-1] < thor[0], thor
    assert (thor <= momentum).all(), (thor, momentum)


def test_thor_with_the_zoo_configs_settings_and_the_monte_carlo_fisher_is_ahead_in_every_epoch():
    """The configs' settings with ``fisher="mc"`` (MCFisherTrainStep: its one refresh's G from labels sampled
    from the network). Measured (2026-12-02): 2.265, 1.694, 0.844 against nn.Momentum's 2.270, 1.858, 1.489
    (the empirical Fisher: 2.271, 1.749, 0.958). On ResNet-50 at this batch it does not close the gap
    (docs/performance.md, "The Monte-Carlo Fisher for THOR's slow start")."""
    momentum = _momentum()

    def monte_carlo_step(net, loss):
        opt = ngd.THOR(net, LR, DAMPING, 0.9, 5e-4, SCALE, BATCH, frequency=834, kl_clip=1e-3,
                       adaptive_damping=False, verbose=False, fisher="mc")
        return ngd.MCFisherTrainStep(net, loss, opt)

    thor = _epoch_losses(None, step_of=monte_carlo_step)
    assert np.isfinite(thor).all(), thor
    assert (thor <= momentum).all(), (thor, momentum)


@pytest.mark.slow      # two more training runs; it records a known gap, so it stays out of the default run
@pytest.mark.xfail(strict=False, reason="issue 32: with the zoo's kl_clip 0.001 the first epoch is not ahead of "
                                       "nn.Momentum (measured 2.271 against 2.270)")
def test_thor_with_the_zoo_configs_settings_is_ahead_in_every_epoch():
    momentum = _momentum()
    thor = _epoch_losses(lambda net: ngd.THOR(net, LR, DAMPING, 0.9, 5e-4, SCALE, BATCH, frequency=834,
                                              kl_clip=1e-3, adaptive_damping=False, verbose=False))
    assert np.isfinite(thor).all(), thor
    assert (thor <= momentum).all(), (thor, momentum)


# The published recipes (model zoo configs): the Ascend values and the GPU values, each with the zoo's
# settings (kl_clip 0.001, adaptive damping off, one refresh in 3 epochs at frequency 834)
RECIPES = {"ascend": (0.05803, 0.03), "gpu": (0.05672, 0.02345)}
GLOBAL_BATCH = 256          # 8 devices x 32, the batch the recipes' learning rate is for


def _digits():
    """scikit-learn's digits (1797 8x8 images, one channel), all of them, in the loader's fixed shuffled order."""
    x, y, _, _ = digits_arrays(test_fraction=0.0)
    return x, y


def _digits_epoch_losses(make_opt):
    """:func:`_epoch_losses` on the digits at the global batch: 3 epochs of 7 steps."""
    return _epoch_losses(make_opt, _digits(), GLOBAL_BATCH)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_zoo_recipes_at_their_global_batch_on_real_images_are_ahead_of_momentum(recipe):
    lr, damping = RECIPES[recipe]
    momentum = _digits_epoch_losses(lambda net: nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=5e-4,
                                                            loss_scale=SCALE))
    thor = _digits_epoch_losses(lambda net: ngd.THOR(net, lr, damping, 0.9, 5e-4, SCALE, GLOBAL_BATCH,
                                                     frequency=834, kl_clip=1e-3, adaptive_damping=False,
                                                     verbose=False))
    assert np.isfinite(thor).all(), thor
    # measured (2026-11-27, Ascend values): THOR 2.011, 1.008, 0.648 against nn.Momentum 2.082, 1.565, 1.111
    assert (thor <= momentum).all(), (thor, momentum)
    assert thor[-1] < 0.8 * momentum[-1], (thor, momentum)


def _models_repository_flow(thor, lr, damping):
    """The models repository's ``official/cv/ResNet/train.py`` with ``optimizer: Thor``: a Momentum
    ``Model`` with its ``FixedLossScaleManager(128)``, then (``thor=True``) ``thor(...)`` with nn.thor's
    arguments and ``ConvertModelUtils.convert_to_thor_model``. 3 epochs of the digits at batch 256."""
    x, y = _digits()
    ms.set_seed(0)
    net = ConvBNNet(widths=(1, 16, 32, 32))
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=0.1)
    scale = FixedLossScaleManager(SCALE, drop_overflow_update=False)
    momentum = nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=5e-4, loss_scale=SCALE)
    model = Model(net, loss_fn=loss, optimizer=momentum, loss_scale_manager=scale, metrics={"acc"})
    if thor:
        steps = EPOCHS * (len(x) // GLOBAL_BATCH)
        opt = ngd.thor(net, Tensor(np.full(steps, lr, np.float32)), Tensor(np.full(steps, damping, np.float32)),
                       0.9, 5e-4, SCALE, GLOBAL_BATCH, split_indices=[2], frequency=834, verbose=False)
        model = ngd.ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                              loss_scale_manager=scale, metrics={"acc"})
    record = StepLosses()
    model.train(EPOCHS, array_dataset(x, y, GLOBAL_BATCH, shuffle=False), callbacks=[record],
                dataset_sink_mode=False)
    return np.array(record.values).reshape(EPOCHS, -1).mean(axis=1)


def test_the_models_repository_thor_flow_at_the_global_batch_is_ahead_of_its_momentum_model():
    """nn.thor's own arguments and nothing else (so THOR's defaults: kl_clip 1e-3, adaptive damping), the
    Ascend recipe's learning rate and damping."""
    lr, damping = RECIPES["ascend"]
    momentum = _models_repository_flow(False, lr, damping)
    thor = _models_repository_flow(True, lr, damping)
    assert np.isfinite(thor).all() and len(thor) == EPOCHS, thor
    # measured (2026-11-27, THOR's defaults): 2.011, 1.008, 0.648 against the Momentum model's 2.082, 1.565, 1.111
    # (nn.thor's unclipped step: 1.566, 0.703, 0.625)
    assert (thor <= momentum).all(), (thor, momentum)
    assert thor[-1] < 0.8 * momentum[-1], (thor, momentum)
