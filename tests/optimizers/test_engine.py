"""The engine, mostly through K-FAC: names, schedule, hyper-parameter forms, state, checkpoints, loss scale."""
import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model, FixedLossScaleManager

import mindspore_ngd as ngd
from nets import BNNet, DenseNet
from training import batch, train_step

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def test_parameter_names_and_network_checkpoint_are_unchanged(tmp_path):
    ms.set_seed(0)
    net = BNNet()
    plain = str(tmp_path / "plain.ckpt")
    ms.save_checkpoint(net, plain)
    names = [p.name for p in net.get_parameters()]
    ngd.KFAC(net, learning_rate=0.1, verbose=False)
    assert [p.name for p in net.get_parameters()] == names
    captured = str(tmp_path / "captured.ckpt")
    ms.save_checkpoint(net, captured)
    assert set(ms.load_checkpoint(plain)) == set(ms.load_checkpoint(captured))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_layer_selection_summary_and_log():
    net = BNNet()
    records = _Records()
    logger = logging.getLogger("mindspore_ngd")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)      # the application asks for INFO: the layer report is logged
    try:
        opt = ngd.KFAC(net, learning_rate=0.1)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    # the grouped convolution is warned about; BatchNorm, left to the plain update by design, is not
    assert records.messages == [
        "KFAC: the trainable parameters of 1 layer(s) are not preconditioned and get the plain momentum update -- "
        "group=2 convolution: gconv",
        "KFAC: preconditioning 2 layers [conv, fc]; plain momentum update for 3 parameters "
        "[bn.gamma, bn.beta, gconv.weight]"]
    assert [s.name for s in opt.layer_specs] == ["conv", "fc"]
    assert ("gconv", "group=2 convolution") in opt.skipped_layers
    text = opt.summary()
    assert "conv" in text and "19x19" in text and "not preconditioned: gconv (group=2 convolution)" in text
    # BatchNorm and the grouped convolution get the plain update; biases/BN are not weight-decayed
    opt = ngd.KFAC(net, learning_rate=0.1, weight_decay=1e-4, verbose=False)
    assert opt.decayed_parameters() == ["conv.weight", "gconv.weight", "fc.weight"]
    opt = ngd.KFAC(net, learning_rate=0.1, weight_decay=1e-4, decay_filter=lambda p: True, verbose=False)
    assert len(opt.decayed_parameters()) == len(net.trainable_params())


def test_refresh_schedule_and_no_capture_on_quiet_steps():
    ms.set_seed(0)
    net = BNNet()
    opt = ngd.KFAC(net, learning_rate=0.05, factor_update_interval=2, inverse_update_interval=3, verbose=False)
    step = train_step(net, opt)
    x0, y0 = batch(0)
    step(x0, y0)                                   # step 0: capture + inverse
    a_after_capture = opt.blocks[0].capture.a_batch.asnumpy().copy()
    x1, y1 = batch(1)
    step(x1, y1)                                   # step 1: no capture: buffers untouched
    np.testing.assert_array_equal(opt.blocks[0].capture.a_batch.asnumpy(), a_after_capture)
    for i in range(2, 7):
        step(*batch(i))
    counters = opt.state_counters()
    assert counters["step"] == 7
    assert counters["inverse_refreshes"] == 3                   # steps 0, 3, 6
    assert set(opt.factor_updates().values()) == {(4, 4)}              # steps 0, 2, 4, 6
    assert not bool(opt.blocks[0].capture.capture_a.asnumpy())        # step 7 does not capture


def test_learning_rate_and_damping_forms():
    net = DenseNet()
    lrs = [0.1, 0.05, 0.02]
    opt = ngd.KFAC(net, learning_rate=Tensor(np.array(lrs, np.float32)), damping=[0.1, 0.01], verbose=False)
    step = train_step(net, opt)
    x, y = Tensor(np.ones((4, 5), np.float32)), Tensor(np.array([0, 1, 2, 0], np.int32))
    for _ in range(3):
        step(x, y)
    for k, expected in enumerate([0.1, 0.01, 0.01, 0.01]):       # holds the last value
        assert float(opt.damping(Tensor([k], ms.int32)).asnumpy()) == pytest.approx(expected)
    schedule = nn.PolynomialDecayLR(0.1, 0.01, 10, power=2.0)
    opt = ngd.KFAC(DenseNet(), learning_rate=schedule, damping=schedule, verbose=False)
    assert float(opt.damping(Tensor([5], ms.int32)).asnumpy()) == pytest.approx(
        float(schedule(Tensor(5, ms.int32)).asnumpy()), rel=1e-6)


def test_moving_average_of_factors():
    ms.set_seed(0)
    net = DenseNet()
    decay = 0.8
    opt = ngd.KFAC(net, learning_rate=1e-3, factor_decay=decay, verbose=False)
    step = train_step(net, opt)
    expected = None
    for i in range(3):
        x, y = batch(i, shape=(5,))
        a_batch = ngd.kronecker_factors(net, CE, x, y)["fc1"][0]
        expected = a_batch if expected is None else decay * expected + (1 - decay) * a_batch
        step(x, y)
    np.testing.assert_allclose(opt.kronecker_factors()["fc1"][0], expected, rtol=1e-5, atol=1e-6)


def run(net, opt, batches):
    step = train_step(net, opt)
    for x, y in batches:
        step(x, y)
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def make(seed=0, kind="kfac"):
    ms.set_seed(seed)
    net = BNNet()
    if kind == "spngd":       # stale statistics and unit-wise BatchNorm state too
        return net, ngd.SPNGD(net, learning_rate=0.05, damping=1e-2, momentum=0.9, weight_decay=1e-3,
                              max_interval=4, verbose=False)
    opt = ngd.KFAC(net, learning_rate=0.05, damping=1e-2, momentum=0.9, weight_decay=1e-3,
                   inverse_update_interval=2, verbose=False)
    return net, opt


def _state(net, opt):
    """Every weight and every optimizer Parameter, plus the capture scratch buffers, as host copies."""
    state = {p.name: p.asnumpy().copy() for p in list(net.get_parameters()) + list(opt.get_parameters())}
    for block in list(opt.blocks) + list(opt.norm_blocks):
        for attr in ("a_batch", "g_batch", "f_batch"):
            buffer = getattr(block.capture, attr, None)
            if buffer is not None:
                state[buffer.name] = buffer.asnumpy().copy()
    return state


@pytest.mark.parametrize("kind, when", [("kfac", "before"), pytest.param("spngd", "before", marks=pytest.mark.slow),
                                        ("kfac", "after"),
                                        pytest.param("spngd", "after", marks=pytest.mark.slow)])
def test_checkpoint_round_trip_resumes_bit_identically(tmp_path, kind, when):
    """Resume from a checkpoint loaded into a fresh net/optimizer, either before its first step or
    after its training graph was compiled and run (on other data): the continuation, every optimizer
    state Parameter and the capture buffers equal the uninterrupted run's, bit for bit."""
    batches = [batch(i) for i in range(6)]
    net, opt = make(kind=kind)
    step = train_step(net, opt)
    for x, y in batches[:3]:
        step(x, y)
    net_ckpt, opt_ckpt = str(tmp_path / "net.ckpt"), str(tmp_path / "opt.ckpt")
    ms.save_checkpoint(net, net_ckpt)
    ms.save_checkpoint(opt, opt_ckpt)
    for x, y in batches[3:]:
        step(x, y)
    uninterrupted = _state(net, opt)

    net2, opt2 = make(seed=123, kind=kind)                       # different initial weights
    step2 = train_step(net2, opt2)
    if when == "after":                                          # compiled, run, state moved on
        for i in (10, 11):
            step2(*batch(i))
    ms.load_param_into_net(net2, ms.load_checkpoint(net_ckpt))
    not_loaded, _ = ms.load_param_into_net(opt2, ms.load_checkpoint(opt_ckpt))
    assert not_loaded == []
    assert opt2.state_counters()["step"] == 3
    for x, y in batches[3:]:
        step2(x, y)
    resumed = _state(net2, opt2)
    assert set(resumed) == set(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_capture_buffers_are_not_checkpointed():
    """The per-step batch buffers carry no state between steps; they stay out of the optimizer's
    Parameters (and so out of checkpoints and out of ``load_param_into_net``)."""
    _, opt = make(kind="spngd")
    names = {p.name for p in opt.get_parameters()}
    assert not [n for n in names if n.endswith(("a_batch", "g_batch", "f_batch"))]
    assert "spngd.conv.capture_a" in names and "spngd.bn.capture_f" in names
    assert opt.blocks[0].capture.a_batch.name == "spngd.conv.a_batch"


def test_state_parameter_names_are_deterministic():
    _, opt1 = make()
    _, opt2 = make()
    names1 = [p.name for p in opt1.get_parameters()]
    assert names1 == [p.name for p in opt2.get_parameters()]
    assert len(set(names1)) == len(names1)
    assert "kfac.conv.A" in names1 and "kfac.fc.G_inv" in names1 and "kfac.moments.fc.weight" in names1


def test_fixed_loss_scale_gives_the_same_update():
    x, y = batch(0, shape=(5,))
    results = []
    for scale in (1.0, 128.0):
        ms.set_seed(0)
        net = DenseNet()
        opt = ngd.KFAC(net, learning_rate=0.1, loss_scale=scale, inverse_update_interval=1, verbose=False)
        model = Model(net, CE, opt, loss_scale_manager=FixedLossScaleManager(scale, drop_overflow_update=False))
        from benchmarks.data import array_dataset
        model.train(1, array_dataset(x.asnumpy(), y.asnumpy(), 8, shuffle=False), dataset_sink_mode=False)
        results.append(({p.name: p.asnumpy() for p in net.trainable_params()}, opt.kronecker_factors()))
    for name in results[0][0]:
        np.testing.assert_allclose(results[1][0][name], results[0][0][name], rtol=1e-5, atol=1e-6)
    for layer in results[0][1]:
        np.testing.assert_allclose(results[1][1][layer][1], results[0][1][layer][1], rtol=1e-5, atol=1e-7)


def test_float16_network_keeps_float32_factors():
    ms.set_seed(0)
    net = DenseNet()
    net.to_float(ms.float16)
    opt = ngd.KFAC(net, learning_rate=0.05, verbose=False)
    step = train_step(net, opt, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    x, y = batch(0, shape=(5,))
    for _ in range(2):
        step(x, y)
    for a, g in opt.kronecker_factors().values():
        assert a.dtype == np.float32 and g.dtype == np.float32
        assert np.isfinite(a).all() and np.isfinite(g).all() and np.abs(g).max() > 0
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_first_layer_g_is_the_current_steps():
    # the first layer's G is written by the last hook of the backward pass; the fold must read it after
    # the gradients (before the fix it read the previous step's G from step 1 on)
    from nets import ConvNet
    ms.set_seed(0)
    net = ConvNet(2, 3, 3, 1, "same", 0, 1, True, 3 * 5 * 5)
    opt = ngd.KFAC(net, learning_rate=0.1, factor_decay=0.0, inverse_update_interval=2, verbose=False)
    step = train_step(net, opt)
    for i in range(4):
        x, y = batch(i, classes=4)
        expected = ngd.kronecker_factors(net, CE, x, y)
        step(x, y)
        for layer, (a, g) in opt.kronecker_factors().items():
            np.testing.assert_allclose(a, expected[layer][0], rtol=1e-5, atol=1e-7, err_msg=f"step {i} {layer}")
            np.testing.assert_allclose(g, expected[layer][1], rtol=1e-5, atol=1e-7, err_msg=f"step {i} {layer}")
