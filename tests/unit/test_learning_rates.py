"""Learning rates follow ``nn.Momentum``'s rules (issue 12): every form ``nn.Optimizer`` accepts,
values >= 0, so MindSpore's warm-up schedules (which start at 0) and the model zoo's tables with
``lr_init: 0`` work; a step at learning rate 0 leaves the weights exactly as they were."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.schedule import check_learning_rate, rescaled_momentum
from nets import DenseNet
from training import batch, train_step


def _zoo_linear():
    """The model zoo's ``lr_schedule: linear`` table with its default ``lr_init: 0`` (starts at 0)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "model_zoo", "resnet50", "src", "schedules.py")
    spec = importlib.util.spec_from_file_location("zoo_schedules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_schedule("lr", "linear", {"lr_max": 0.1, "warmup_epochs": 1}, 4, 3)


def _forms():
    return {
        "zero float": 0.0,
        "int": 1,
        "scalar Tensor": Tensor(0.05, ms.float32),
        "nn.warmup_lr": nn.warmup_lr(0.1, 6, 2, 3),
        "nn.cosine_decay_lr": nn.cosine_decay_lr(0.0, 0.1, 6, 2, 3),
        "tuple": (0.0, 0.1),
        "generator": (0.01 * i for i in range(4)),
        "ndarray": np.linspace(0.0, 0.1, 5, dtype=np.float32),
        "1-D Tensor": Tensor(np.array([0.0, 0.1], np.float32)),
        "nn.WarmUpLR": nn.WarmUpLR(0.1, 4),
        "model zoo linear, lr_init 0": _zoo_linear(),
    }


@pytest.mark.parametrize("name", list(_forms()))
def test_every_form_nn_momentum_accepts_is_accepted(name):
    value = _forms()[name]
    checked = check_learning_rate("learning_rate", value)
    reference = nn.Momentum(DenseNet().trainable_params(), learning_rate=checked, momentum=0.9)
    net = DenseNet()
    for cls, args in ((ngd.KFAC, {}), (ngd.SPNGD, {}), (ngd.THOR, {"damping": 1e-3})):
        opt = cls(net, learning_rate=check_learning_rate("learning_rate", _forms()[name]), verbose=False, **args)
        assert opt.dynamic_lr == reference.dynamic_lr


def test_zoo_linear_table_starts_at_zero():
    table = _zoo_linear()
    assert table[0] == 0.0 and np.all(table[1:] > 0)


def test_rescaled_momentum_accepts_a_warm_up_from_zero():
    momenta = rescaled_momentum(0.9, nn.warmup_lr(0.1, 6, 2, 3))
    np.testing.assert_allclose(momenta, 0.9 * np.array([0, 0, 1, 1, 2, 2]) / 2, rtol=1e-6)
    with pytest.raises(ValueError, match="not all 0"):
        rescaled_momentum(0.9, [0.0, 0.0])


@pytest.mark.parametrize("schedule", ["list", pytest.param("cell", marks=pytest.mark.slow)])
def test_a_step_at_learning_rate_zero_changes_no_weight(schedule):
    """Warm-up from 0 with KL clipping on (its bound divides by lr^2 v'g, guarded against 0): the
    first step leaves every weight bit-identical and every state finite, and the second step
    (lr > 0) trains. As with nn.Momentum the moments still accumulate the (preconditioned)
    gradient at lr 0."""
    ms.set_seed(0)
    net = DenseNet()
    lr = [0.0, 0.1] if schedule == "list" else nn.WarmUpLR(0.1, 1)     # WarmUpLR: 0 at step 0, 0.1 after
    opt = ngd.KFAC(net, learning_rate=lr, kl_clip=1e-3, inverse_update_interval=1, verbose=False)
    step = train_step(net, opt)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    step(*batch(0, shape=(5,)))
    for p in net.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)
    for p in opt.get_parameters():
        assert np.all(np.isfinite(p.asnumpy())), p.name
    assert np.abs(opt.moments[0].asnumpy()).max() > 0
    assert opt.state_counters()["skipped_steps"] == 0
    step(*batch(1, shape=(5,)))
    moved = [p.name for p in net.trainable_params() if not np.array_equal(p.asnumpy(), before[p.name])]
    assert len(moved) == len(before)
    assert all(np.all(np.isfinite(p.asnumpy())) for p in net.trainable_params())
