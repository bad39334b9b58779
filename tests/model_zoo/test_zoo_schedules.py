"""model_zoo/resnet50/src/schedules.py: every lr / damping schedule of the configs against the
formula of the recipe it reproduces (MindSpore model zoo THOR and ResNet, KAISA, chainerkfac), and
errors that name the key."""
import numpy as np
import pytest

import mindspore_ngd
import zoo  # noqa: F401 - puts the model zoo's src/ on sys.path (and needs pyyaml)
from src import schedules


SPE = 5004   # steps per ImageNet epoch at 8 x 32


def _steps_at(epochs):
    return [int(round(e * SPE)) - 1 for e in epochs]   # the step that finishes epoch e


def test_thor_lr_reproduces_the_model_zoo_formula_with_its_decay_epochs():
    # get_thor_lr(0, lr_init, lr_decay, lr_end_epoch, steps, decay_epochs=39) of the model zoo:
    # epoch = (i + 1) / steps; lr = lr_init (1 - epoch / lr_end_epoch) ** lr_decay, x0.5 from epoch 39, x0.5 from 40
    values = schedules.build_schedule("lr", "thor", {"lr_init": 0.05803, "lr_decay": 4.0839, "lr_end_epoch": 53,
                                                     "lr_halve_epoch": 39}, SPE, 45)
    for i in _steps_at([1, 10, 38.5, 39, 39.5, 40, 45]) + [0]:
        epoch = (i + 1) / SPE
        expected = 0.05803 * (1 - epoch / 53) ** 4.0839 * (0.5 if epoch >= 39 else 1) * (0.5 if epoch >= 40 else 1)
        assert values[i] == pytest.approx(expected, rel=1e-6), (i, epoch)
    assert values[0] == pytest.approx(0.0580291, rel=1e-5)
    assert values[_steps_at([39])[0]] / values[_steps_at([39])[0] - 1] == pytest.approx(0.5, rel=1e-3)
    # the package's thor_lr is the formula without the halving
    plain = schedules.build_schedule("lr", "thor", {"lr_init": 0.05803, "lr_decay": 4.0839, "lr_end_epoch": 53}, SPE, 45)
    np.testing.assert_array_equal(plain, mindspore_ngd.schedule.thor.thor_lr(0.05803, 4.0839, 53, SPE, 45))


def test_thor_damping_reproduces_the_model_zoo_formula():
    values = schedules.build_schedule("damping", "thor", {"damping_init": 0.03, "damping_decay": 0.50036}, SPE, 45)
    for i in _steps_at([1, 10, 20, 45]):
        epoch = (i + 1) / SPE
        assert values[i] == pytest.approx(0.03 * 0.50036 ** (epoch / 10), rel=1e-6)
    assert values[_steps_at([10])[0]] == pytest.approx(0.03 * 0.50036, rel=1e-6)


def test_linear_lr_reproduces_the_model_zoo_resnet_schedule():
    # model zoo lr_generator._generate_liner_lr(lr_init=0, lr_end=0, lr_max=0.8, warmup 2 epochs, 90 epochs)
    spe, epochs = 626, 90
    values = schedules.build_schedule("lr", "linear", {"lr_init": 0.0, "lr_max": 0.8, "lr_end": 0.0,
                                                       "warmup_epochs": 2}, spe, epochs)
    total, warmup = spe * epochs, 2 * spe
    for i in (0, 1, warmup - 1, warmup, total // 2, total - 1):
        expected = 0.8 * i / warmup if i < warmup else 0.8 - 0.8 * (i - warmup) / (total - warmup)
        assert values[i] == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_step_lr_reproduces_the_kaisa_recipe():
    # kfac-pytorch: warm-up 0.0125 -> 0.1 over 5 epochs, x0.1 at the start of epochs 25, 35, 40, 45, 50
    params = {"lr_init": 0.0125, "lr_max": 0.1, "warmup_epochs": 5, "lr_milestones": [25, 35, 40, 45, 50]}
    values = schedules.build_schedule("lr", "step", params, 10, 55)
    at = {epoch: values[epoch * 10] for epoch in (0, 5, 24, 25, 34, 35, 40, 45, 50, 54)}
    assert at[0] == pytest.approx(0.0125) and values[25] == pytest.approx(0.0125 + 0.0875 * 0.5)
    assert at[5] == at[24] == pytest.approx(0.1)
    assert at[25] == at[34] == pytest.approx(0.01)
    assert at[35] == pytest.approx(1e-3) and at[40] == pytest.approx(1e-4)
    assert at[45] == pytest.approx(1e-5) and at[50] == at[54] == pytest.approx(1e-6)


def test_polynomial_lr_reproduces_chainerkfac():
    # chainerkfac LrPolynomialDecay(ref_lr, epoch_start, epoch_end=max(epochs, polynomial_epoch), p), epoch = i / steps
    spe, epochs = 100, 46
    values = schedules.build_schedule("lr", "polynomial", {"lr_max": 0.03, "lr_decay_start_epoch": 1.5,
                                                           "lr_power": 3.5, "lr_end_epoch": 49.5}, spe, epochs)
    for epoch in (0, 1.49, 1.5, 10, 30, 45.99):
        i = int(round(epoch * spe))
        e = i / spe
        expected = 0.03 if e < 1.5 else 0.03 * (1 - (e - 1.5) / (49.5 - 1.5)) ** 3.5
        assert values[i] == pytest.approx(expected, rel=1e-6)


def test_cosine_and_constant_schedules():
    values = schedules.build_schedule("lr", "cosine", {"lr_max": 0.1, "lr_end": 0.001, "warmup_epochs": 1}, 10, 11)
    assert values[0] == 0.0 and values[10] == pytest.approx(0.1)
    assert values[60] == pytest.approx(0.001 + 0.099 * 0.5, rel=1e-5) 
    assert values[-1] == pytest.approx(0.001 + 0.099 * 0.5 * (1 + np.cos(np.pi * 99 / 100)), rel=1e-5)
    np.testing.assert_array_equal(schedules.build_schedule("damping", "constant", {"damping": 0.5}, 3, 2),
                                  np.full(6, 0.5, np.float32))
    step = schedules.build_schedule("damping", "step", {"damping": 0.1, "damping_milestones": [1]}, 2, 2)
    np.testing.assert_allclose(step, [0.1, 0.1, 0.05, 0.05])


@pytest.mark.parametrize("kind,name,params,match", [
    ("lr", "cosine", {"lr_max": 0.1, "lr_decay": 4}, r"\['lr_decay'\] are not keys of lr_schedule 'cosine'"),
    ("lr", "thor", {"lr_init": 0.1}, r"needs the keys \['lr_decay', 'lr_end_epoch'\]"),
    ("lr", "exp", {}, "unknown lr_schedule 'exp'"),
    ("lr", "constant", {"lr_init": "fast"}, "'lr_init' must be a finite number"),
    ("lr", "step", {"lr_max": 0.1, "lr_milestones": 30}, "must be a list of epochs"),
    ("lr", "thor", {"lr_init": 0.1, "lr_decay": 4, "lr_end_epoch": 2}, "lr_end_epoch must exceed total_epochs"),
])
def test_schedule_errors_name_the_key(kind, name, params, match):
    with pytest.raises(ValueError, match=match):
        schedules.build_schedule(kind, name, params, 10, 5)
