"""The names of the step state's positions (mindspore_ngd/curvature/state.py) agree with the tuples
the engine builds: each builder puts every field at its named position, and the optimizer's stored
state holds the Parameters the names say. Host side only: nothing here compiles a graph."""
import pytest

import mindspore_ngd as ngd
from mindspore_ngd.curvature.counters import LayerCounters
from mindspore_ngd.curvature.state import (FactorState, FoldOutcome, InverseState, LayerCounts, factor_state,
                                           fold_outcome, inverse_state)
from nets import BNNet


def _positions(names):
    """The class's field constants as {NAME: position}."""
    return {key: value for key, value in vars(names).items() if key.isupper()}


@pytest.mark.parametrize("names", [FactorState, LayerCounts, InverseState, FoldOutcome])
def test_positions_are_distinct_and_contiguous(names):
    assert sorted(_positions(names).values()) == list(range(len(_positions(names))))


def test_builders_put_each_field_at_its_name():
    fields = ["layers", "counts", "faults", "fishers", "norm_counts"]
    short, full = factor_state(*fields[:3]), factor_state(*fields)
    assert len(short) == 3 and len(full) == 5
    for position, value in zip([FactorState.LAYERS, FactorState.COUNTS, FactorState.FAULTS,
                                FactorState.NORM_FISHERS, FactorState.NORM_COUNTS], fields):
        assert full[position] == value
        assert position >= len(short) or short[position] == value

    local, distributed = inverse_state("layers", "has", "faults"), inverse_state("layers", "has", "faults", "n")
    assert len(local) == 3 and distributed[InverseState.INVERSIONS] == "n"
    for state in (local, distributed):
        assert (state[InverseState.LAYERS], state[InverseState.HAS_INVERSE], state[InverseState.FAULTS]) == \
            ("layers", "has", "faults")

    plain, tracked = fold_outcome("ta", "tg", "ra", "rg"), fold_outcome("ta", "tg", "ra", "rg", ("ca", "cg"))
    assert len(plain) == 4 and len(tracked) == 6
    assert (tracked[FoldOutcome.CHANGE_A], tracked[FoldOutcome.CHANGE_G]) == ("ca", "cg")
    for outcome in (plain, tracked):
        assert [outcome[FoldOutcome.TOOK_A], outcome[FoldOutcome.TOOK_G], outcome[FoldOutcome.REJECTED_A],
                outcome[FoldOutcome.REJECTED_G]] == ["ta", "tg", "ra", "rg"]


def test_stored_state_holds_the_parameters_its_names_say():
    counters = LayerCounters("kfac", ["conv", "fc"])
    counts = counters.factor_counts()
    assert counts[LayerCounts.A_UPDATES] is counters.a_updates
    assert counts[LayerCounts.G_UPDATES] is counters.g_updates
    assert counts[LayerCounts.DEMOTED] is counters.demoted

    opt = ngd.SPNGD(BNNet(), learning_rate=0.1, verbose=False)      # with unit-wise BatchNorm blocks
    assert opt.num_norms > 0
    factors = opt.curvature.stored_factors()
    assert factors[FactorState.COUNTS][LayerCounts.DEMOTED] is opt.counters.demoted
    assert factors[FactorState.FAULTS] is opt.factor_faults
    assert factors[FactorState.LAYERS][0][0] is opt.blocks[0].a_factor
    assert factors[FactorState.NORM_FISHERS][0] is opt.norm_blocks[0].fisher
    assert factors[FactorState.NORM_COUNTS] is opt.counters.f_updates
    inverses = opt.curvature.stored_inverses()
    assert len(inverses) == 3                                         # single device: no inversion counts
    assert inverses[InverseState.HAS_INVERSE] is opt.counters.has_inverse
    assert inverses[InverseState.FAULTS] is opt.inverse_faults
    assert inverses[InverseState.LAYERS][0][1] is opt.blocks[0].g_inverse
