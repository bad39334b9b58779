"""Training scenarios run both by the msrun workers (each rank on its slice of a fixed global batch)
and by the test process (one device on the whole batch), for the distributed equivalence tests.

``run_case(name, rank, world)`` builds the network with fixed weights, the optimizer of the case and
an ``nn.TrainOneStepCell`` (under ``DATA_PARALLEL`` it all-reduces the gradients), trains, and
returns the weights and the optimizer's counters.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, Tensor

import mindspore_ngd as ngd
from nets import set_weights

CE = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
GLOBAL_BATCH = 8
CLASSES = 3


class ThreeLayerNet(nn.Cell):
    """conv(2->3, bias) -> ReLU -> Dense(48->6) -> ReLU -> Dense(6->3): three preconditioned layers of
    different sizes (A: 19, 49, 7; G: 3, 6, 3), optionally a BatchNorm after the convolution."""

    def __init__(self, batchnorm=False):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(3) if batchnorm else nn.Identity()
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(48, 6)
        self.fc2 = nn.Dense(6, CLASSES)

    def construct(self, x):
        x = self.flatten(self.relu(self.bn(self.conv(x))))
        return self.fc2(self.relu(self.fc1(x)))


class TokenNet(nn.Cell):
    """nn.Embedding(12, 4) over 5 tokens -> Dense(20->6) -> ReLU -> Dense(6->3): an embedding block (A the
    (12,) diagonal of the token frequencies, G 4 x 4) and two Dense blocks (A: 21, 7; G: 6, 3)."""
    vocab, length = 12, 5

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, 4)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(4 * self.length, 6)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(6, CLASSES)

    def construct(self, ids):
        return self.fc2(self.relu(self.fc1(self.flatten(self.embed(ids)))))


def global_batches(steps, tokens=False):
    rng = np.random.default_rng(7)
    if tokens:      # tokens 0..8 only: three rows of the table are never looked up
        return [(rng.integers(0, 9, (GLOBAL_BATCH, TokenNet.length)).astype(np.int32),
                 rng.integers(0, CLASSES, GLOBAL_BATCH).astype(np.int32)) for _ in range(steps)]
    return [(rng.standard_normal((GLOBAL_BATCH, 2, 4, 4)).astype(np.float32),
             rng.integers(0, CLASSES, GLOBAL_BATCH).astype(np.int32)) for _ in range(steps)]


def _kfac(net, **kw):
    return ngd.KFAC(net, learning_rate=0.1, damping=1e-2, momentum=0.9, weight_decay=1e-3,
                    inverse_update_interval=2, verbose=False, **kw)


def _spngd(net, **kw):
    return ngd.SPNGD(net, learning_rate=0.1, damping=1e-2, weight_decay=1e-3, refresh_threshold=0.3,
                     max_interval=4, verbose=False, **kw)


def _thor(net, **kw):
    return ngd.THOR(net, 0.1, 1e-2, frequency=2, split_dim=16, verbose=False, **kw)


def _thor_trace(net, **kw):
    return ngd.THOR(net, 0.1, 1e-2, frequency=2, split_dim=None, trace_threshold=0.05, verbose=False, **kw)


# name: (optimizer builder, steps, network ("plain", "batchnorm": ThreeLayerNet; "tokens": TokenNet), extra
# optimizer arguments)
CASES = {
    "kfac": (_kfac, 4, "plain", {}),
    "kfac_half": (_kfac, 3, "plain", {"grad_worker_fraction": 0.5}),     # 4 ranks: owner groups of 2
    "kfac_f1": (_kfac, 3, "plain", {"grad_worker_fraction": 1}),
    "spngd": (_spngd, 8, "plain", {}),
    "spngd_bn": (_spngd, 4, "batchnorm", {}),
    "thor": (_thor, 5, "plain", {}),
    "thor_trace": (_thor_trace, 8, "plain", {}),
    # the embedding's diagonal A and (vocab, dim) step through the exchange
    "kfac_tokens": (_kfac, 4, "tokens", {}),
    "thor_tokens": (_thor_trace, 6, "tokens", {}),
}


def build(name, seed=0):
    make, steps, network, extra = CASES[name]
    ms.set_seed(seed)
    net = TokenNet() if network == "tokens" else ThreeLayerNet(network == "batchnorm")
    set_weights(net, np.random.default_rng(seed), scale=0.3)
    opt = make(net, **extra)
    return net, opt, steps


def run_case(name, rank=0, world=1):
    """Train case ``name`` on this rank's slice of every global batch; weights and counters."""
    net, opt, steps = build(name)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CE), opt)
    step.set_train()
    part = GLOBAL_BATCH // world
    for x, y in global_batches(steps, CASES[name][2] == "tokens"):
        step(Tensor(x[rank * part:(rank + 1) * part]), Tensor(y[rank * part:(rank + 1) * part]))
    out = {"weights": {p.name: p.asnumpy().copy() for p in net.trainable_params()},
           "counters": opt.state_counters(), "owned": list(opt.owned_layers),
           "factors": {k: [a.copy(), g.copy()] for k, (a, g) in opt.kronecker_factors().items()},
           "updates": [list(opt.factor_updates()[s.name]) for s in opt.layer_specs]}
    if opt.policy.refresh.per_statistic:
        out["refresh"] = {k: list(v) for k, v in opt.refresh_state().items()}
    if opt.parallel_plan is not None:
        out["parallel"] = opt.parallel_state()
        out["plan_positions"] = list(opt.parallel_plan.positions)
        out["plan_text"] = str(opt.parallel_plan)
        out["summary"] = opt.summary()
        out["factor_shapes"] = {s.name: [list(opt.blocks[k].a_factor.shape), list(opt.blocks[k].g_factor.shape),
                                         list(opt.blocks[k].a_inverse.shape), list(opt.blocks[k].g_inverse.shape)]
                                for k, s in enumerate(opt.layer_specs)}
    return out, net, opt
