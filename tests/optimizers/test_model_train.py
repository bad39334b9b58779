"""K-FAC in stock mindspore.train.Model on real data (scikit-learn's digits)."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn
from mindspore.train import Model

import mindspore_ngd as ngd
from benchmarks.data import array_dataset, digits_arrays
from benchmarks.models import DigitsCNN
from benchmarks.demo import train_digits


# slow since issue 11/12 grew the default suite: a timing, which benchmarks measure
@pytest.mark.slow
def test_kfac_trains_faster_than_momentum_per_epoch():
    # same network, initial weights, data order and learning rate; 2 epochs of 22 steps
    momentum = train_digits("momentum", epochs=2, lr=0.05, verbose=False)
    kfac = train_digits("kfac", epochs=2, lr=0.05, verbose=False)
    assert kfac[-1]["train_loss"] < 0.5 * momentum[-1]["train_loss"], (kfac, momentum)
    assert kfac[-1]["test_acc"] > momentum[-1]["test_acc"]


@pytest.mark.parametrize("optimizer, network", [("kfac", "cnn"), pytest.param("spngd", "cnn-bn", marks=pytest.mark.slow)])
def test_sink_mode_gives_the_same_training_as_step_mode(optimizer, network):
    plain = train_digits(optimizer, epochs=1, verbose=False, sink=False, network=network)
    sunk = train_digits(optimizer, epochs=1, verbose=False, sink=True, network=network)
    assert sunk[0]["train_loss"] == plain[0]["train_loss"]


def _model_train_and_eval():
    x_train, y_train, x_test, y_test = digits_arrays()
    ms.set_seed(0)
    net = DigitsCNN()
    opt = ngd.KFAC(net, learning_rate=0.05, damping=1e-2, momentum=0.9, weight_decay=5e-4, verbose=False)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, metrics={"acc"})
    model.train(1, array_dataset(x_train[:640], y_train[:640], 64), dataset_sink_mode=False)
    result = model.eval(array_dataset(x_test, y_test, 64, shuffle=False, drop_remainder=False),
                        dataset_sink_mode=False)
    model.train(1, array_dataset(x_train[:640], y_train[:640], 64), dataset_sink_mode=False)   # train again
    return result, opt


def test_model_train_then_eval_in_graph_mode():
    result, opt = _model_train_and_eval()
    assert result["acc"] > 0.6
    assert opt.state_counters()["step"] == 20


# slow since issue 11/12 grew the default suite: the graph-mode twin stays in the default run
@pytest.mark.slow
def test_model_train_then_eval_in_pynative_mode(pynative):
    result, opt = _model_train_and_eval()
    assert result["acc"] > 0.6
    assert opt.state_counters()["step"] == 20
    assert all(np.isfinite(p.asnumpy()).all() for p in opt.parameters)
