"""Parameter groups as nn.Momentum takes them (issue 12): per-group learning rate, weight decay and
gradient centralization on the preconditioned step, checked against the NumPy reference; the
groups' validation; Model.train and checkpoints with groups."""
import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, Tensor
from mindspore.train import Model

import mindspore_ngd as ngd
from nets import BNNet, DenseNet, set_weights
from reference import numpy_kfac as ref

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
TOL = 1e-5


def _f64(param):
    return param.asnumpy().astype(np.float64)


def _reference_parts(net, x, y):
    """Per layer (A, G, [dW | db]) of DenseNet by hand-derived backprop."""
    w1, w2 = _f64(net.fc1.weight), _f64(net.fc2.weight)
    h = x @ w1.T + _f64(net.fc1.bias)
    z = np.maximum(h, 0)
    _, dlogits = ref.softmax_ce(z @ w2.T + _f64(net.fc2.bias), y)
    dh = (dlogits @ w2) * (h > 0)
    out = {}
    for name, inp, dy in (("fc1", x, dh), ("fc2", z, dlogits)):
        big_a, big_g = ref.dense_factors(inp, dy, True)
        out[name] = (big_a, big_g, np.concatenate([dy.T @ inp, dy.sum(0)[:, None]], axis=1))
    return out


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_two_groups_one_step_matches_the_numpy_reference():
    """Weights in one group (lr 0.3, weight decay 1e-2, gradient centralization), biases in the other
    (lr 0.05, the optimizer's weight decay, which the default filter keeps off biases); KL clipping
    active, computed with each parameter's own lr."""
    rng = np.random.default_rng(4)
    net = DenseNet(din=16)
    set_weights(net, rng)
    x = rng.standard_normal((8, 16))
    y = rng.integers(0, 3, 8).astype(np.int32)
    before = {p.name: _f64(p) for p in net.trainable_params()}
    parts = _reference_parts(net, x, y)
    lr = {"fc1.weight": 0.3, "fc2.weight": 0.3, "fc1.bias": 0.05, "fc2.bias": 0.05}
    decay = {"fc1.weight": 1e-2, "fc2.weight": 1e-2, "fc1.bias": 0.0, "fc2.bias": 0.0}
    damping, kl_clip = 0.05, 1e-4

    weights, biases = [net.fc1.weight, net.fc2.weight], [net.fc1.bias, net.fc2.bias]
    records = _Records()
    logging.getLogger("mindspore_ngd").addHandler(records)
    try:
        opt = ngd.KFAC(net, learning_rate=0.7, damping=damping, momentum=0.0, weight_decay=1e-3,
                       factor_decay=0.0, kl_clip=kl_clip, inverse_update_interval=1, verbose=False,
                       params=[{"params": weights, "lr": 0.3, "weight_decay": 1e-2, "grad_centralization": True},
                               {"params": biases, "lr": 0.05},
                               {"order_params": net.trainable_params()}])
    finally:
        logging.getLogger("mindspore_ngd").removeHandler(records)
    # fc2.weight is (3, 4): nn.Optimizer's rule (second dimension a multiple of 16) leaves it out
    assert records.messages == ["params[0]['grad_centralization']: not applied to ['fc2.weight'] (second "
                                "dimension not a multiple of 16, nn.Optimizer's rule)"]
    assert opt.decayed_parameters() == ["fc1.weight", "fc2.weight"]
    assert [p.name for p in opt.parameters] == [p.name for p in net.trainable_params()]
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    step(Tensor(x.astype(np.float32)), Tensor(y))

    # reference: P per layer, then nu from sum_i lr_i^2 <P_i, g_i>, decay, centralization, lr_i
    directions, vg = {}, 0.0
    for name, (big_a, big_g, grad) in parts.items():
        p = ref.preconditioned(big_a, big_g, grad, damping, "pi", jitter=1e-6)
        for key, p_part, g_part in ((f"{name}.weight", p[:, :-1], grad[:, :-1]),
                                    (f"{name}.bias", p[:, -1], grad[:, -1])):
            directions[key] = p_part
            vg += lr[key] ** 2 * float((p_part * g_part).sum())
    nu = min(1.0, np.sqrt(kl_clip / vg))
    assert nu < 0.5                                               # the clip is active
    for name, value in before.items():
        direction = nu * directions[name] + decay[name] * value
        if name == "fc1.weight":                                  # (4, 16): centralized
            direction = direction - direction.mean(axis=1, keepdims=True)
        expected = value - lr[name] * direction
        got = _f64(dict((p.name, p) for p in net.trainable_params())[name])
        # relative to the size of the update, plus the float32 rounding of the stored weight itself
        bound = TOL * np.abs(expected - value).max() + 2.0 ** -23 * np.abs(value).max()
        assert np.abs(got - expected).max() < bound, (name, np.abs(got - expected).max(), bound)
    # the centralized weight's update has zero mean over each unit's fan-in
    change = _f64(net.fc1.weight) - before["fc1.weight"]
    assert np.abs(change.mean(axis=1)).max() < 1e-6 * np.abs(change).max()


def _bad(net):
    w, b = net.fc1.weight, net.fc1.bias
    rest = [net.fc2.weight, net.fc2.bias]
    other = DenseNet().fc1.weight
    return [
        ({"params": [w, b, *rest], "momentum": 0.9}, ValueError,
         r"params\[0\] has unknown keys \['momentum'\]; a group's keys are \['params', 'lr', 'weight_decay'"),
        ([{"params": [w, b]}, {"params": [b, *rest]}], ValueError,
         r"'fc1.bias' is in params\[0\] and params\[1\]: each parameter belongs to one group"),
        ([{"params": [w, b, *rest, other]}], ValueError, r"which is not a trainable parameter of the network"),
        ([{"params": [w, b]}], ValueError,
         r"params leaves out trainable parameters of the network: \['fc2.weight', 'fc2.bias'\]"),
        ([{"params": [w, b], "lr": -0.1}, {"params": rest}], ValueError,
         r"params\[0\]\['lr'\] must be a finite number >= 0, got -0.1"),
        ([{"params": [w, b], "lr": [0.1, 0.2]}, {"params": rest, "lr": [0.1]}], ValueError,
         r"per-step learning-rate lists in params must all have the same length"),
        ([{"params": [w, b], "weight_decay": -1.0}, {"params": rest}], ValueError,
         r"params\[0\]\['weight_decay'\] must be a finite number >= 0"),
        ([{"params": [w, b], "weight_decay": nn.WarmUpLR(0.1, 2)}, {"params": rest}], TypeError,
         r"dynamic \(Cell\) weight decay is not supported"),
        ([{"params": [w, b], "grad_centralization": 1}, {"params": rest}], TypeError,
         r"params\[0\]\['grad_centralization'\] must be a bool"),
        ([{"params": [w, b, *rest]}, {"order_params": [w, b]}], ValueError,
         r"'order_params' must hold exactly the grouped parameters"),
        ([{"lr": 0.1}], ValueError, r"params\[0\] has no 'params' key"),
        ([w, {"params": [b]}], TypeError, r"params must be all Parameters or all dicts"),
        ({"params": [w]}, TypeError, r"params must be a list of Parameters or a list of group dicts"),
    ]


@pytest.mark.parametrize("case", range(13))
def test_bad_groups_raise_before_compilation(case):
    net = DenseNet()
    params, error, match = _bad(net)[case]
    if isinstance(params, dict) and "momentum" in params:
        params = [params]
    with pytest.raises(error, match=match):
        ngd.KFAC(net, learning_rate=0.1, verbose=False, params=params)


def test_groups_of_equal_lr_clip_like_the_ungrouped_optimizer_with_unit_wise_batchnorm():
    """SP-NGD's KL clip with parameter groups sums each layer's and each BatchNorm gamma/beta's term
    with its own lr; with the same lr in every group it must give the ungrouped optimizer's update."""
    from training import batch, train_step

    def weights(grouped):
        ms.set_seed(0)
        net = BNNet()
        params = net.trainable_params()
        if grouped:
            norm = [p for p in params if p.name.startswith("bn.")]
            params = [{"params": [p for p in params if not p.name.startswith("bn.")], "lr": 0.05},
                      {"params": norm, "lr": 0.05}]
        opt = ngd.SPNGD(net, 0.05, damping=1e-2, kl_clip=1e-4, verbose=False, params=params)
        assert opt.is_group_lr == grouped and len(opt.norm_specs) == 1
        step = train_step(net, opt)
        for i in range(4):
            step(*batch(i))
        return {p.name: p.asnumpy().copy() for p in net.trainable_params()}

    plain, grouped = weights(False), weights(True)
    for name, value in plain.items():
        np.testing.assert_allclose(grouped[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_plain_parameter_list_is_the_ungrouped_optimizer():
    net = DenseNet()
    opt = ngd.SPNGD(net, learning_rate=0.1, weight_decay=1e-3, verbose=False, params=net.trainable_params())
    assert not opt.is_group and [p.name for p in opt.parameters] == [p.name for p in net.trainable_params()]
    assert opt.decayed_parameters() == ["fc1.weight", "fc2.weight"]


def test_groups_train_in_model_train_and_checkpoint(tmp_path):
    """Model.train with two groups (a warm-up lr list on one, a float on the other); the optimizer
    checkpoint holds each group's lr and loads into an optimizer built with the same groups."""
    from benchmarks.data import array_dataset

    def build():
        ms.set_seed(0)
        net = DenseNet()
        groups = [{"params": [net.fc1.weight, net.fc2.weight], "lr": nn.warmup_lr(0.1, 6, 3, 1),
                   "weight_decay": 1e-3},
                  {"params": [net.fc1.bias, net.fc2.bias], "lr": 0.01}]
        return net, ngd.THOR(net, 0.05, 1e-2, frequency=2, verbose=False, params=groups)

    net, opt = build()
    assert opt.is_group_lr and opt.dynamic_lr
    rng = np.random.default_rng(0)
    data = array_dataset(rng.standard_normal((24, 5)).astype(np.float32),
                         rng.integers(0, 3, 24).astype(np.int32), 8, shuffle=False)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    Model(net, CE, opt).train(2, data, dataset_sink_mode=False)
    assert opt.state_counters()["step"] == 6 and opt.state_counters()["skipped_steps"] == 0
    for p in net.trainable_params():
        assert np.all(np.isfinite(p.asnumpy())) and not np.array_equal(p.asnumpy(), before[p.name]), p.name
    path = str(tmp_path / "opt.ckpt")
    ms.save_checkpoint(opt, path)
    saved = ms.load_checkpoint(path)
    assert "learning_rate_group_0" in saved and "learning_rate_group_1" in saved
    _, fresh = build()
    not_loaded, _ = ms.load_param_into_net(fresh, saved)
    assert not_loaded == []
    assert fresh.state_counters()["step"] == 6
