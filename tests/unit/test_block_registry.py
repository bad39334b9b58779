"""The block registry (mindspore_ngd.curvature.registry): one BlockType per layer kind builds the
layer's curvature block, names its statistics and gives its FLOPs; the estimator builds every block
through it.

That the blocks built this way train exactly as before, and load the checkpoints written before, is
checked bit for bit by tests/golden/test_golden.py; the FLOP formulas against hand counts in
tests/benchmarks/test_cost_model.py.
"""
import pytest

import mindspore_ngd as ngd
from mindspore_ngd.capture.layer_types import LAYER_TYPES
from mindspore_ngd.curvature.kronecker import KroneckerBlock
from mindspore_ngd.curvature.registry import (BLOCK_TYPES, EMBEDDING, KRONECKER, UNIT_BATCHNORM, BlockType, KroneckerType,
                                              block_type_of, register_block_type)
from mindspore_ngd.curvature.embedding import EmbeddingBlock
from mindspore_ngd.curvature.unitwise import UnitBatchNormBlock
from nets import BNNet, DenseNet


def test_every_kind_has_its_block_type():
    assert BLOCK_TYPES == {"dense": KRONECKER, "conv2d": KRONECKER, "attention": KRONECKER, "embedding": EMBEDDING,
                           "batchnorm": UNIT_BATCHNORM, "layernorm": UNIT_BATCHNORM}
    assert EMBEDDING.block_class is EmbeddingBlock and EMBEDDING.statistics == ("A", "G")
    assert KRONECKER.block_class is KroneckerBlock and KRONECKER.statistics == ("A", "G")
    assert UNIT_BATCHNORM.block_class is UnitBatchNormBlock and UNIT_BATCHNORM.statistics == ("F",)
    # every kind the capture registry finds layers of has a block to keep its statistics
    assert set(LAYER_TYPES) <= set(BLOCK_TYPES)


def test_the_estimator_builds_each_layers_block_by_its_kind_with_the_names_it_always_had():
    opt = ngd.SPNGD(BNNet(), 0.1, verbose=False)
    curvature = opt.curvature
    assert [s.kind for s in opt.layer_specs] == ["conv2d", "dense"]
    assert [s.kind for s in opt.norm_specs] == ["batchnorm"]
    for spec, block in zip(opt.layer_specs, curvature.blocks):
        assert type(block) is block_type_of(spec).block_class is KroneckerBlock
        base = f"{opt.policy.name}.{spec.name}"
        assert [p.name for p in (block.a_factor, block.g_factor, block.a_inverse, block.g_inverse)] == \
            [f"{base}.A", f"{base}.G", f"{base}.A_inv", f"{base}.G_inv"]
    (spec,), (block,) = opt.norm_specs, list(curvature.norm_blocks)
    assert type(block) is UnitBatchNormBlock and block.fisher.name == f"{opt.policy.name}.{spec.name}.F"
    assert curvature.statistic_names == tuple(f"{s.name}.{suffix}" for suffix in ("A", "G") for s in opt.layer_specs) \
        + (f"{spec.name}.F",)


def test_a_kind_is_served_by_one_block_type_and_an_unknown_kind_is_named():
    before = dict(BLOCK_TYPES)
    with pytest.raises(ValueError, match="layer kind 'dense' already has block type 'kronecker'"):
        register_block_type(KroneckerType())

    class Partly(KroneckerType):
        kinds = ("conv3d", "conv2d")

    with pytest.raises(ValueError, match="layer kind 'conv2d' already has block type 'kronecker'"):
        register_block_type(Partly())           # nothing registered: not even conv3d

    class Nameless(BlockType):
        family = "nameless"

    with pytest.raises(ValueError, match="non-empty kind"):
        register_block_type(Nameless())
    assert BLOCK_TYPES == before
    with pytest.raises(KeyError, match="'scale'"):
        block_type_of("scale")
    with pytest.raises(NotImplementedError, match="'unitwise' has no FLOP model"):
        UNIT_BATCHNORM.flops(None, 1, 1)


def test_a_new_kind_is_one_registry_entry():
    class ScaleType(BlockType):
        family = "scale"
        kinds = ("scale",)

    entry = register_block_type(ScaleType())
    try:
        assert block_type_of("scale") is entry
    finally:
        del BLOCK_TYPES["scale"]
    assert "scale" not in BLOCK_TYPES


def test_each_family_runs_in_its_group_and_every_parameter_is_listed_once_under_its_old_name():
    """The estimator hands the Kronecker blocks to one group and the unit-wise blocks to another; the
    groups share the estimator's blocks, so no Parameter is listed twice (a checkpoint would hold it
    twice) and none is renamed."""
    from mindspore_ngd.curvature.kronecker_group import KroneckerGroup
    from mindspore_ngd.curvature.unitwise import UnitWiseGroup
    opt = ngd.SPNGD(BNNet(), 0.1, verbose=False)
    curvature = opt.curvature
    assert type(curvature.layer_group) is KroneckerGroup and type(curvature.norm_group) is UnitWiseGroup
    assert all(a is b for a, b in zip(curvature.layer_group.blocks, curvature.blocks))
    assert tuple(curvature.norm_group.blocks) == curvature.norm_blocks == tuple(opt.norm_blocks)
    params = list(opt.get_parameters())
    assert len({id(p) for p in params}) == len(params)
    names = [p.name for p in params]
    assert len(set(names)) == len(names)
    prefix = opt.policy.name
    block_names = {p.name for block in list(curvature.blocks) + list(curvature.norm_blocks)
                   for p in block.get_parameters()}
    assert {n for n in names if n.startswith(prefix + ".")} >= block_names
    assert all(n.startswith(prefix + ".") for n in block_names)
    # without unit-wise BatchNorm layers there is no unit-wise group
    plain = ngd.KFAC(DenseNet(), 0.1, verbose=False).curvature
    assert plain.norm_group is None and plain.norm_blocks == ()
