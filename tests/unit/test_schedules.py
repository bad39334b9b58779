"""Per-step hyper-parameter schedules of mindspore_ngd.schedule against their formulas: THOR's
learning rate and damping as MindSpore's model zoo defines them (tables and graph cells), and
SP-NGD's polynomial learning rate with the momentum rescaled to it.

The repository's model zoo builds its schedules on these; its own tests are tests/model_zoo/."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import mindspore_ngd as ngd
from mindspore_ngd.schedule import polynomial_lr, rescaled_momentum
from mindspore_ngd.schedule.thor import ThorDamping, ThorLR, thor_damping, thor_lr
from nets import DenseNet
from training import batch, train_step


def test_model_zoo_schedules():
    lr = thor_lr(0.05803, 4.0839, 53, steps_per_epoch=10, total_epochs=45)
    for epoch in (1, 10, 30, 45):
        step = epoch * 10 - 1                                  # the last step of that epoch
        assert lr[step] == pytest.approx(0.05803 * (1 - epoch / 53) ** 4.0839, rel=1e-6)
    damping = thor_damping(0.03, 0.50036, steps_per_epoch=10, total_epochs=45)
    for epoch in (1, 10, 45):
        assert damping[epoch * 10 - 1] == pytest.approx(0.03 * 0.50036 ** (epoch / 10), rel=1e-6)
    lr_cell, damping_cell = ThorLR(0.05803, 4.0839, 53, 10), ThorDamping(0.03, 0.50036, 10)
    for step in (0, 99, 449):
        assert float(lr_cell(Tensor(step, ms.int32)).asnumpy()) == pytest.approx(lr[step], rel=1e-5)
        assert float(damping_cell(Tensor(step, ms.int32)).asnumpy()) == pytest.approx(damping[step], rel=1e-5)
    with pytest.raises(ValueError, match="lr_end_epoch must exceed total_epochs"):
        thor_lr(0.05, 4.0, 40, 10, 45)


def test_polynomial_lr_and_rescaled_momentum():
    lrs = polynomial_lr(0.1, total_steps=10, power=2.0, warmup_steps=2, end_lr=0.0)
    np.testing.assert_allclose(lrs[:4], [0.05, 0.1, 0.1, 0.1 * (1 - 1 / 8) ** 2], rtol=1e-6)
    np.testing.assert_allclose(lrs[-1], 0.1 * (1 / 8) ** 2, rtol=1e-6)
    assert len(lrs) == 10 and np.all(lrs > 0)
    momenta = rescaled_momentum(0.9, lrs)
    np.testing.assert_allclose(momenta, 0.9 * lrs / lrs.max(), rtol=1e-6)
    net = DenseNet()
    opt = ngd.SPNGD(net, learning_rate=lrs, momentum=momenta, verbose=False)
    step = train_step(net, opt)
    for i in range(3):
        step(*batch(i, shape=(5,)))
    with pytest.raises(ValueError, match="momentum"):
        ngd.SPNGD(DenseNet(), 0.1, momentum=[0.9, 1.5], verbose=False)
