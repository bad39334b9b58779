"""A hand-written ``nn.TrainOneStepWithLossScaleCell`` (MindSpore's, driven by a
``FixedLossScaleUpdateCell`` or a ``DynamicLossScaleUpdateCell``) trains with the same weights and
optimizer state as ``Model.train`` with the equivalent loss-scale manager on the same batches (issue 31).

``Model.train`` builds that same cell from the manager (``FixedLossScaleManager(drop_overflow_update=True)``
or ``DynamicLossScaleManager``), on an accelerator only: on CPU ``mindspore.train.amp`` refuses such a
manager, and the cell's overflow check (``NPUGetFloatStatusV2`` on Ascend, ``FloatStatus`` on GPU) has
no CPU kernel. So, for the test only, ``amp`` is told the device is not CPU, and both runs use the same
``IsFinite`` check, patched onto MindSpore's class: the cell ``Model.train`` builds and the hand-written
one are the same class with the same update cell.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops
from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager, Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset
from nets import BNNet
from training import CE, batch

STEPS = 4
SCALE = 2.0 ** 10
OPTIMIZERS = {
    "kfac": lambda net: ngd.KFAC(net, learning_rate=0.1, damping=1e-2, verbose=False),
    "thor": lambda net: ngd.THOR(net, learning_rate=0.1, damping=1e-2, frequency=2, verbose=False),
}
MANAGERS = {
    "fixed": (lambda: FixedLossScaleManager(SCALE, drop_overflow_update=True),
              lambda: nn.FixedLossScaleUpdateCell(SCALE)),
    "dynamic": (lambda: DynamicLossScaleManager(SCALE, scale_factor=2, scale_window=2),
                lambda: nn.DynamicLossScaleUpdateCell(loss_scale_value=SCALE, scale_factor=2, scale_window=2)),
}


def _finite_overflow_check(self, status, compute_output):
    flags = ()
    for grad in compute_output:
        flags += (ops.logical_not(ops.isfinite(grad).all()),)
    return ops.stack(flags).any()


class _AcceleratorContext:
    """``mindspore.context`` as ``mindspore.train.amp`` sees it: every query answered by MindSpore,
    except the device target, which is not ``"CPU"``."""

    def __getattr__(self, name):
        return getattr(ms.context, name)

    @staticmethod
    def get_context(key):
        return "GPU" if key == "device_target" else ms.context.get_context(key)


@pytest.fixture(autouse=True)
def cpu_loss_scale_cell(monkeypatch):
    from mindspore.train import amp
    monkeypatch.setattr(amp, "context", _AcceleratorContext())
    monkeypatch.setattr(nn.TrainOneStepWithLossScaleCell, "get_overflow_status", _finite_overflow_check)


def _fresh(kind):
    ms.set_seed(0)
    net = BNNet()
    return net, OPTIMIZERS[kind](net)


def _state(net, opt):
    state = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    state.update({p.name: p.asnumpy().copy() for p in opt.get_parameters()})
    return state


def _model_train(kind, manager):
    net, opt = _fresh(kind)
    batches = [batch(i) for i in range(STEPS)]
    x = np.concatenate([b[0].asnumpy() for b in batches])
    y = np.concatenate([b[1].asnumpy() for b in batches])
    model = Model(net, CE, opt, loss_scale_manager=MANAGERS[manager][0]())
    model.train(1, array_dataset(x, y, len(y) // STEPS, shuffle=False), dataset_sink_mode=False)
    assert type(model.train_network) is nn.TrainOneStepWithLossScaleCell    # pylint: disable=unidiomatic-typecheck
    return _state(net, opt), opt


def _custom_cell(kind, manager):
    net, opt = _fresh(kind)
    step = nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, CE), opt, MANAGERS[manager][1]())
    step.set_train()
    scales = []
    for i in range(STEPS):
        _, overflow, scale = step(*batch(i))
        assert not bool(overflow.asnumpy())
        scales.append(float(scale.asnumpy()))
    return _state(net, opt), opt, scales


_UNSCALED = {}


def _unscaled(kind):
    if kind not in _UNSCALED:
        _UNSCALED[kind] = _unscaled_run(kind)
    return _UNSCALED[kind]


def _unscaled_run(kind):
    net, opt = _fresh(kind)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    for i in range(STEPS):
        step(*batch(i))
    return _state(net, opt)


@pytest.mark.parametrize("manager", sorted(MANAGERS))
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_custom_loss_scale_cell_trains_as_model_train_with_the_manager(kind, manager):
    expected, ref_opt = _model_train(kind, manager)
    state, opt, scales = _custom_cell(kind, manager)
    if manager == "dynamic":
        assert scales == [SCALE, SCALE * 2, SCALE * 2, SCALE * 4]     # the scale moved during the run
    assert sorted(state) == sorted(expected)
    different = [name for name in expected if not np.array_equal(state[name], expected[name])]
    assert not different, f"not bit-identical to Model.train: {different}"
    assert opt.demoted_layers() == [] and ref_opt.demoted_layers() == []
    assert all(a > 0 and g > 0 for a, g in opt.factor_updates().values())
    # and the scale is taken out: the weights are those of an unscaled run, up to rounding
    start = {p.name: p.asnumpy().copy() for p in _fresh(kind)[0].trainable_params()}
    unscaled = _unscaled(kind)
    for name, value in start.items():
        update = max(float(np.abs(unscaled[name] - value).max()), 1e-12)
        np.testing.assert_allclose(state[name], unscaled[name], rtol=0, atol=1e-3 * update, err_msg=name)
