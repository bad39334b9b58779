"""The per-layer counts and flags stacked into one vector Parameter per family (issue 13), and the
conversion of checkpoints that hold them per layer. Host side only: nothing here compiles a graph."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor

import mindspore_ngd as ngd
from mindspore_ngd.curvature.counters import LayerCounters
from nets import BNNet


def _old(prefix, layers, norms, seed=0):
    """A checkpoint dict as mindspore_ngd 0.1 wrote it: one scalar Parameter per layer and family."""
    rng = np.random.default_rng(seed)
    out, expected = {}, {}
    families = [("A_updates", np.int32, layers), ("G_updates", np.int32, layers), ("has_inverse", np.bool_, layers),
                ("demoted", np.bool_, layers), ("F_updates", np.int32, norms)]
    for family, dtype, names in families:
        values = rng.integers(0, 7, len(names)).astype(dtype)
        expected[family] = values
        for name, value in zip(names, values):
            key = f"{prefix}.{name}.{family}"
            out[key] = Parameter(Tensor(np.array(value, dtype)), name=key)
    out[f"{prefix}.conv.A"] = Parameter(Tensor(np.eye(3, dtype=np.float32)), name=f"{prefix}.conv.A")
    return out, expected


def test_vectors_are_named_per_family_in_layer_order():
    counters = LayerCounters("kfac", ["conv", "fc"], ["bn"])
    names = sorted(p.name for p in counters.get_parameters())
    assert names == ["kfac.A_updates", "kfac.F_updates", "kfac.G_updates", "kfac.demoted", "kfac.has_inverse"]
    assert counters.a_updates.shape == (2,) and counters.f_updates.shape == (1,)
    assert counters.has_inverse.dtype == ms.bool_ and counters.a_updates.dtype == ms.int32
    assert LayerCounters("kfac", ["fc"]).f_updates is None            # no BatchNorm family without norms
    with pytest.raises(ValueError, match="at least one layer"):
        LayerCounters("kfac", [])


def test_upgrade_stacks_the_per_layer_scalars_of_an_old_checkpoint():
    layers, norms = ["conv", "fc", "head"], ["bn1", "bn2"]
    old, expected = _old("spngd", layers, norms)
    new = LayerCounters("spngd", layers, norms).upgrade(old)
    for family, values in expected.items():
        vector = new[f"spngd.{family}"]
        assert vector.name == f"spngd.{family}"
        np.testing.assert_array_equal(vector.asnumpy(), values)
        assert vector.asnumpy().dtype == values.dtype
        assert not [k for k in new if k.endswith(f".{family}") and k.count(".") > 1]   # per-layer keys gone
    assert "spngd.conv.A" in new                                       # everything else passes through
    assert len(old) == 4 * 3 + 2 + 1 and "spngd.conv.A_updates" in old   # the input is not modified


def test_upgrade_leaves_new_checkpoints_alone_and_keeps_families_the_old_one_lacks():
    counters = LayerCounters("kfac", ["conv", "fc"])
    old, _ = _old("kfac", ["conv", "fc"], [])
    del old["kfac.conv.demoted"], old["kfac.fc.demoted"]             # written before layers could be demoted
    new = counters.upgrade(old)
    assert "kfac.demoted" not in new and "kfac.A_updates" in new
    again = counters.upgrade(new)
    assert again.keys() == new.keys() and again is not new


def test_upgrade_refuses_a_checkpoint_of_other_layers():
    old, _ = _old("kfac", ["conv", "fc"], [])
    with pytest.raises(ValueError, match=r"'A_updates' entries for some layers but not for \['kfac.head.A_updates'\]"):
        LayerCounters("kfac", ["conv", "fc", "head"]).upgrade(old)


def test_optimizer_reports_its_counts_per_layer():
    opt = ngd.SPNGD(BNNet(), learning_rate=0.1, verbose=False)
    names = [s.name for s in opt.layer_specs]
    assert opt.factor_updates() == {name: (0, 0) for name in names}
    assert opt.demoted_layers() == []
    opt.counters.a_updates.set_data(Tensor(np.arange(1, len(names) + 1, dtype=np.int32)))
    opt.counters.demoted.set_data(Tensor(np.array([False] * (len(names) - 1) + [True])))
    assert [a for a, _ in opt.factor_updates().values()] == list(range(1, len(names) + 1))
    assert opt.demoted_layers() == [names[-1]]
    keys = {p.name for p in opt.get_parameters()}
    assert {"spngd.A_updates", "spngd.G_updates", "spngd.has_inverse", "spngd.demoted", "spngd.F_updates"} <= keys
    assert not [k for k in keys if k.endswith(("_updates", ".has_inverse", ".demoted")) and k.count(".") > 1]


def test_optimizer_upgrade_adds_the_capture_summary_and_the_kept_moments():
    """A 0.1 checkpoint lacks ``{prefix}.capturing`` (the OR of the capture flags) and
    ``{prefix}.damping.moments`` (the momentum buffers, concatenated in parameter order)."""
    opt = ngd.KFAC(BNNet(), learning_rate=0.1, verbose=False)
    rng = np.random.default_rng(1)
    old = {}
    for p in opt.get_parameters():
        if p.name in ("kfac.capturing", "kfac.damping.moments") or p.name.endswith(tuple(
                f"kfac.{family}" for family in ("A_updates", "G_updates", "has_inverse", "demoted"))):
            continue
        value = p.asnumpy()
        if value.dtype == np.bool_:
            value = np.zeros_like(value)
        elif ".moments." in p.name:
            value = rng.standard_normal(value.shape).astype(value.dtype)
        old[p.name] = Parameter(Tensor(value), name=p.name)
    for name in [s.name for s in opt.layer_specs]:
        for family, dtype in (("A_updates", np.int32), ("G_updates", np.int32), ("has_inverse", np.bool_)):
            old[f"kfac.{name}.{family}"] = Parameter(Tensor(np.array(1, dtype)), name=f"kfac.{name}.{family}")
    flag = opt.layer_specs[-1].name + ".capture_g"
    new = opt.upgrade_checkpoint(old)
    assert not bool(new["kfac.capturing"].asnumpy())                       # every flag off
    old[f"kfac.{flag}"] = Parameter(Tensor(np.array(True)), name=f"kfac.{flag}")
    new = opt.upgrade_checkpoint(old)
    assert bool(new["kfac.capturing"].asnumpy())                           # one flag on
    moments = np.concatenate([old[m.name].asnumpy().reshape(-1) for m in opt.moments])
    np.testing.assert_array_equal(new["kfac.damping.moments"].asnumpy(), moments)
    np.testing.assert_array_equal(new["kfac.A_updates"].asnumpy(), np.ones(len(opt.layer_specs), np.int32))
    assert "kfac.demoted" not in new                                       # not in that checkpoint: kept as is
    fixed = ngd.KFAC(BNNet(), learning_rate=0.1, adaptive_damping=False, verbose=False)
    assert "kfac.damping.moments" not in fixed.upgrade_checkpoint(old)     # no copy without adaptive damping
