"""THOR with nn.thor's published hyper-parameters (the model zoo's Ascend ResNet-50 recipe: damping 0.03,
lr 0.058, loss scale 128, label smoothing 0.1, weight decay 5e-4 on every parameter) trains a small
conv+BatchNorm network on a learnable task at least as well as nn.Momentum at the same learning rate,
on the same data in the same order (3 short epochs, refresh every 4 steps as ``--set thor.frequency=4``):
its mean loss is at most nn.Momentum's in every epoch.

With the model zoo's THOR configs (``kl_clip`` 0.001, ``adaptive_damping`` false, ``frequency`` 834), the
first epoch is not ahead: the clip scales the first steps down (issue 32; docs/performance.md, "THOR's
ImageNet recipes at small scale"). That case is an xfail (not strict: its first epoch is a near tie).
"""
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from benchmarks.models import ConvBNNet

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

LR, DAMPING, SCALE, BATCH, STEPS_PER_EPOCH, EPOCHS = 0.05803, 0.03, 128.0, 32, 4, 3


def _data(size=BATCH * STEPS_PER_EPOCH, classes=10, hw=16, seed=0):
    """The model zoo's synthetic images (src/dataset.py): a fixed class template plus 0.5 noise."""
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((classes, 3, hw, hw)).astype(np.float32)
    y = (np.arange(size) % classes).astype(np.int32)
    x = templates[y] + 0.5 * rng.standard_normal((size, 3, hw, hw)).astype(np.float32)
    return x, y


def _epoch_losses(make_opt):
    ms.set_seed(0)
    net = ConvBNNet(widths=(3, 16, 32, 32))
    loss = nn.CrossEntropyLoss(reduction="mean", label_smoothing=0.1)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), make_opt(net), sens=SCALE)
    step.set_train()
    x, y = _data()
    losses = []
    for _ in range(EPOCHS):
        for i in range(STEPS_PER_EPOCH):
            part = slice(i * BATCH, (i + 1) * BATCH)
            losses.append(float(step(Tensor(x[part]), Tensor(y[part])).asnumpy()))
    return np.array(losses).reshape(EPOCHS, STEPS_PER_EPOCH).mean(axis=1)


def _momentum():
    return _epoch_losses(lambda net: nn.Momentum(net.trainable_params(), LR, 0.9, weight_decay=5e-4,
                                                 loss_scale=SCALE))


def test_thor_with_nn_thor_hyper_parameters_trains_at_least_as_well_as_momentum():
    momentum = _momentum()
    thor = _epoch_losses(lambda net: ngd.THOR(net, LR, DAMPING, 0.9, 5e-4, SCALE, BATCH, frequency=4,
                                              verbose=False))
    assert np.isfinite(thor).all(), thor
    assert thor[-1] < thor[0], thor
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
