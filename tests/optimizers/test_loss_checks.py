"""A loss that is not the batch mean is refused on the first step, before any weight moves, with an
error that names ``reduction="mean"``: ``reduction="none"`` (whose per-example vector reaches the
training cell's ``sens`` and is back-propagated as a sum) and ``reduction="sum"`` make the curvature
statistics ``B**2`` too large, and on main they trained without a word. Checked in the cell that runs
the optimizer -- the one ``Model.train`` builds, a hand-built ``nn.TrainOneStepCell`` (graph mode and
PyNative), and a custom training cell that passes a per-example ``sens`` vector itself.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset
from nets import BNNet
from training import batch

REFUSED = r"KFAC in {cell}: the loss SoftmaxCrossEntropyWithLogits reduces with '{reduction}'.*reduction=\"mean\""


class _PerExampleSensStep(nn.Cell):
    """A hand-written training cell over a per-example loss that passes its own ``sens`` vector
    (ones, one per example): the gradient of the sum of the losses."""

    def __init__(self, network, optimizer):
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad(self.network, self.weights)(x, y, ops.ones_like(loss))
        self.optimizer(grads)
        return loss.mean()


def _fresh():
    ms.set_seed(0)
    net = BNNet()
    return net, ngd.KFAC(net, learning_rate=0.1, damping=1e-2, verbose=False)


def _run(form, net, opt, loss):
    x, y = batch(0)
    if form == "model":
        Model(net, loss, opt).train(1, array_dataset(x.asnumpy(), y.asnumpy(), 8, shuffle=False),
                                    dataset_sink_mode=False)
        return
    cell = (nn.TrainOneStepCell if form != "sens" else _PerExampleSensStep)(nn.WithLossCell(net, loss), opt)
    cell.set_train()
    cell(x, y)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("form, cell", [("model", "TrainOneStepCell"), ("cell", "TrainOneStepCell"),
                                        ("pynative", "TrainOneStepCell"), ("sens", "_PerExampleSensStep")])
def test_a_loss_that_is_not_the_batch_mean_is_refused_before_any_update(form, cell, reduction, request):
    if form == "pynative":
        request.getfixturevalue("pynative")
    net, opt = _fresh()
    start = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction=reduction)
    with pytest.raises(ValueError, match=REFUSED.format(cell=cell, reduction=reduction)) as info:
        _run(form, net, opt, loss)
    if reduction == "none":
        assert "sens" in str(info.value) and "defaults to 'none'" in str(info.value)
    for p in net.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), start[p.name], err_msg=p.name)
    assert opt.state_counters()["step"] == 0


def test_the_mean_loss_trains_in_the_same_cells():
    """The check passes the mean (and a cell whose loss is not a MindSpore loss cell is not judged)."""
    net, opt = _fresh()
    _run("cell", net, opt, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    assert opt.state_counters()["step"] == 1 and opt.demoted_layers() == []
