"""The compiled step's structure: what the per-step overhead of issue 13 was made of must not come back.

MindSpore 2.10 inserts a ``TensorMove`` (a copy, one kernel) for every read of a Parameter that one
graph reads more than once, and for reads passed into a run-time branch. The profile of a step that
refreshes nothing (``docs/performance.md``) found 267 of them per ResNet-20 step: the capture flags
(read by the network and by the optimizer), the momentum buffers (read twice by adaptive damping) and
the damping multipliers, the refresh rule's next refresh step. The optimizer now reads each of them
once per step; the compiled graph is read from MindSpore's saved IR
(:func:`mindspore_ngd.audit.compiled_primitives`)."""
import pytest
from mindspore import nn

import mindspore_ngd as ngd
from mindspore_ngd import audit
from nets import BNNet
from training import batch, train_step

OPTIMIZERS = {
    "kfac": lambda net: ngd.KFAC(net, 0.05, damping=1e-2, verbose=False),
    "kfac-fixed-damping": lambda net: ngd.KFAC(net, 0.05, damping=1e-2, adaptive_damping=False, kl_clip=None,
                                               verbose=False),
    "spngd": lambda net: ngd.SPNGD(net, 0.05, damping=1e-2, verbose=False),
    "thor": lambda net: ngd.THOR(net, 0.05, 1e-2, verbose=False),
}


def _sources(prims, op):
    """Where the compiled graph has operator ``op`` (MindSpore names some ``PrimFunc_<op>``)."""
    return prims.get(op, []) + prims.get(f"PrimFunc_{op}", [])


def _copies(net, opt, inputs, path):
    """The Parameters the compiled step copies (``TensorMove`` of their loads), by name."""
    prims = audit.compiled_primitives(train_step(net, opt), *inputs, keep=str(path))
    assert _sources(prims, "ApplyMomentum") and _sources(prims, "Assign")      # the IR was read
    return audit.ir_copies(str(path))


def _per_layer(copies, opt):
    """The copies of a layer's own state (``{prefix}.{layer}.*``: factors, inverses, capture flags)."""
    layers = {s.name for s in opt.layer_specs} | {s.name for s in opt.norm_specs}
    return [name for name in copies if len(name.split(".")) > 2 and name.split(".")[1] in layers]


def _dense_stack(layers):
    cells = []
    for _ in range(layers):
        cells += [nn.Dense(6, 6), nn.ReLU()]
    return nn.SequentialCell(cells + [nn.Dense(6, 3)])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "kfac-fixed-damping" else n
                                  for n in OPTIMIZERS])
def test_the_step_copies_no_layer_state_and_no_more_for_more_layers(name, tmp_path):
    """No factor, inverse or capture flag is copied, and the copies left (a few scalars and per-layer
    count vectors the fold and the refresh read across run-time branches: the capturing flag, the
    counts, the damping controller's scalars) are the same for 2 and for 5 layers: a per-step cost
    that does not grow with the network."""
    found = {}
    for layers in (2, 5):
        net = _dense_stack(layers)
        opt = OPTIMIZERS[name](net)
        copies = _copies(net, opt, batch(0, shape=(6,)), tmp_path / str(layers))
        assert not _per_layer(copies, opt), f"{name}, {layers} layers: {copies}"
        found[layers] = sorted(copies)
    assert found[2] == found[5]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_batchnorm_capture_flags_are_the_only_layer_state_copied(name, tmp_path):
    """With a BatchNorm layer: SP-NGD's unit-wise BatchNorm reads its capture flag in the forward probe
    and in the backward hook, two copies per BatchNorm layer; nothing else of a layer is copied."""
    net = BNNet()
    opt = OPTIMIZERS[name](net)
    copies = _per_layer(_copies(net, opt, batch(0), tmp_path), opt)
    assert sorted(copies) == sorted(f"{opt.policy.name}.{s.name}.capture_f" for s in opt.norm_specs for _ in range(2)), \
        f"{name}: {copies}"


def test_each_family_of_layer_counts_is_written_once():
    net = BNNet()
    opt = ngd.SPNGD(net, 0.05, damping=1e-2, verbose=False)
    prims = audit.compiled_primitives(train_step(net, opt), *batch(0))
    writes = [where for where in _sources(prims, "Assign") if where.split(":")[0].endswith("curvature/counters.py")]
    # A and G counts, demoted, has-inverse, BatchNorm counts: one write each, whatever the layer count
    assert len(writes) == 5, writes


_NO_OP_CALLS = """
import sys
sys.path.insert(0, {tests!r})
import mindspore as ms
import mindspore_ngd as ngd
from nets import BNNet
from training import batch, train_step
from mindspore import nn
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def no_bias():       # no layer with a bias: no loss-scale probe
    return nn.SequentialCell([nn.Flatten(), nn.Dense(50, 8, has_bias=False), nn.ReLU(),
                              nn.Dense(8, 3, has_bias=False)])


for build, make in ((BNNet, lambda net: ngd.THOR(net, 0.05, 1e-2, adaptive_damping=False, verbose=False)),
                    (BNNet, lambda net: ngd.KFAC(net, 0.05, damping=1e-2, verbose=False)),
                    (no_bias, lambda net: ngd.THOR(net, 0.05, 1e-2, adaptive_damping=False, verbose=False))):
    net = build()
    step = train_step(net, make(net))
    print(float(step(*batch(0)).asnumpy()))
"""


def test_the_step_has_no_call_that_mindspore_drops_as_a_lost_side_effect():
    """A call or value that comes to nothing in the compiled step (a method without an op when adaptive
    damping is off or no layer has a bias for the loss-scale probe, an unused None) made MindSpore warn
    "Some side effect nodes were eliminated by mistake" on every THOR run of the model zoo: a warning a
    user cannot tell from a lost write."""
    import os
    import subprocess
    import sys
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _NO_OP_CALLS.format(tests=tests)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.split()) == 3                     # every case compiled and stepped
    assert "eliminated by mistake" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
