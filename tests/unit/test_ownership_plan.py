"""Ownership planner (parallel/plan.py; pure Python, no device): exact expected values, the LPT
bound, validation, printing. The buffer layouts it hands to the collectives are test_packing.py."""
import itertools
import os
import random
import subprocess
import sys
from fractions import Fraction

import pytest

from mindspore_ngd.parallel import plan as P
from mindspore_ngd.parallel.plan import lpt_assign, plan_ownership


def items_with_costs(costs):
    """Layers whose compute cost (a^3 + g^3 with g = 1) is ``c + 1``: same order as ``costs``."""
    return [(f"l{i}", c, 1) for i, c in enumerate(costs)]


# ----------------------------------------------------------------------------- LPT, by hand
@pytest.mark.parametrize("costs, bins, expected", [
    # 5->0 | 4->1 | 3->1 (4<5) | 3->0 (5<7) | 2->1 (7<8): loads (8, 9)
    ([5, 4, 3, 3, 2], 2, (0, 1, 1, 0, 1)),
    # all equal: ties go to the lower index item first, and to the lowest bin
    ([1, 1, 1, 1], 2, (0, 1, 0, 1)),
    # unsorted input with ties: order is l1(7), l3(7), l0(2), l2(2), l4(1)
    ([2, 7, 2, 7, 1], 3, (2, 0, 2, 1, 2)),
    # Graham's tight instance for 2 bins: LPT gives (7, 5), the optimum is (6, 6)
    ([3, 3, 2, 2, 2], 2, (0, 1, 0, 1, 0)),
    # fewer items than bins: bins 2 and 3 stay idle
    ([10, 1], 4, (0, 1)),
    # one bin takes everything
    ([3, 1, 2], 1, (0, 0, 0)),
    # zero costs are fine, they go after the others
    ([0, 5, 0], 2, (1, 0, 1)),
    ([], 3, ()),
])
def test_lpt_exact_assignments(costs, bins, expected):
    assert lpt_assign(costs, bins) == expected


def test_lpt_tight_instance_reaches_graham_bound():
    costs, s = [3, 3, 2, 2, 2], 2
    where = lpt_assign(costs, s)
    assert max_load(costs, where, s) == 7 and brute_force_opt(costs, s) == 6      # (3+3, 2+2+2)
    assert Fraction(7, 6) == Fraction(4, 3) - Fraction(1, 3 * s)                 # bound attained


def test_plan_exact_compute_assignment_and_structure():
    layers = [("conv1", 147, 64), ("conv2", 576, 64), ("conv3", 64, 256), ("fc", 2049, 1000)]
    plan = plan_ownership(layers, 2)
    assert plan.costs == (147 ** 3 + 64 ** 3, 576 ** 3 + 64 ** 3, 64 ** 3 + 256 ** 3, 2049 ** 3 + 1000 ** 3)
    # fc (9.6e9) -> 0 | conv2 -> 1 | conv3 -> 1 | conv1 -> 1
    assert plan.positions == (1, 1, 1, 0)
    assert dict(plan.owner_position) == {"conv1": 1, "conv2": 1, "conv3": 1, "fc": 0}
    assert plan.layers_of(0) == ("fc",)
    assert plan.layers_of(1) == ("conv1", "conv2", "conv3")
    assert plan.owners("fc") == (0,) and plan.owners("conv2") == (1,)
    assert plan.group_size == 2 and plan.grad_workers == 1 and plan.grad_worker_fraction == Fraction(1, 2)
    assert plan.groups == ((0, 1),) and plan.group_of(1) == (0, 1)
    assert plan.replica_groups == ((0,), (1,))
    assert plan.makespan == plan.costs[3] == plan.lower_bound
    with pytest.raises(KeyError, match="no layer named 'nope'"):
        plan.owners("nope")
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        plan.layers_of(2)


def test_plan_replicated_groups():
    # N = 4, f = 1/2: m = 2 owner groups {0,1} and {2,3}; every layer has 2 owners
    layers = [("a", 4, 4), ("b", 3, 3), ("c", 3, 3), ("d", 2, 2)]     # costs 128, 54, 54, 16
    plan = plan_ownership(layers, 4, 0.5)
    assert plan.group_size == 2 and plan.grad_workers == 2
    assert plan.positions == (0, 1, 1, 1)                             # loads (128, 124)
    assert plan.groups == ((0, 1), (2, 3))
    assert plan.replica_groups == ((0, 2), (1, 3))
    assert plan.owners("a") == (0, 2) and plan.owners("b") == (1, 3)
    assert plan.layers_of(0) == plan.layers_of(2) == ("a",)
    assert plan.layers_of(3) == ("b", "c", "d")
    assert plan.group_of(3) == (2, 3) and plan.replica_group_of(3) == (1, 3)
    assert plan.group_name((2, 3)) == "ngd_owner_2x2_1"
    assert plan.group_name((1, 3)) == "ngd_replica_2x2_1"
    with pytest.raises(ValueError, match="not an owner or replica group"):
        plan.group_name((0, 3))


def test_fraction_one_means_every_rank_owns_every_layer():
    layers = [("a", 4, 4), ("b", 3, 3), ("c", 2, 2)]
    plan = plan_ownership(layers, 4, 1)
    assert plan.group_size == 1 and plan.grad_workers == 4
    assert all(plan.layers_of(r) == ("a", "b", "c") for r in range(4))
    assert plan.owners("b") == (0, 1, 2, 3)
    assert plan.groups == ((0,), (1,), (2,), (3,))
    assert plan.replica_groups == ((0, 1, 2, 3),)
    assert plan.makespan == plan.total_cost == plan.lower_bound


def test_default_fraction_is_one_owner_per_layer():
    plan = plan_ownership([("a", 2, 2), ("b", 2, 2), ("c", 2, 2)], 3)
    assert plan.grad_worker_fraction == Fraction(1, 3)
    assert [plan.owners(n) for n in "abc"] == [(0,), (1,), (2,)]


def test_memory_balance_differs_from_compute():
    # a: 10^3+1 = 1001 (memory 101); b: 9^3+5^3 = 854 (memory 106); c: 2 (memory 2)
    layers = [("a", 10, 1), ("b", 9, 5), ("c", 1, 1)]
    compute = plan_ownership(layers, 2, balance="compute")
    memory = plan_ownership(layers, 2, balance="memory")
    assert compute.costs == (1001, 854, 2) and compute.positions == (0, 1, 1)
    assert memory.costs == (101, 106, 2) and memory.positions == (1, 0, 1)


def test_split_dim_compute_cost():
    # 300 split in blocks of 128 -> 3 blocks (last padded): 3 * 128^3; 100 < 128 stays whole
    plan = plan_ownership([("x", 300, 100)], 1, split_dim=128)
    assert plan.costs == (3 * 128 ** 3 + 100 ** 3,)
    assert P.factor_cost(300, "memory", split_dim=128) == 300 ** 2


# ----------------------------------------------------------------------------- LPT bound, random
def max_load(costs, where, bins):
    loads = [0] * bins
    for c, b in zip(costs, where):
        loads[b] += c
    return max(loads)


def brute_force_opt(costs, bins):
    """Optimal makespan by enumeration (item 0 fixed to bin 0 by symmetry)."""
    costs = list(costs)
    if not costs:
        return 0
    best = None
    for rest in itertools.product(range(bins), repeat=len(costs) - 1):
        value = max_load(costs, (0,) + rest, bins)
        best = value if best is None else min(best, value)
    return best


def test_lpt_within_graham_bound_of_brute_force_optimum():
    rng = random.Random(1234)
    attained = 0
    for trial in range(150):
        bins = rng.choice([2, 3, 4])
        n = rng.randint(1, 8 if bins < 4 else 7)
        costs = [rng.randint(1, 30) ** rng.choice([1, 3]) for _ in range(n)]
        plan = plan_ownership([(f"l{i}", 1, 1) for i in range(n)], bins)   # structure only
        where = lpt_assign(costs, bins)
        span = max_load(costs, where, bins)
        opt = brute_force_opt(costs, bins)
        # exact integer form of span <= (4/3 - 1/(3 bins)) * opt
        assert 3 * bins * span <= (4 * bins - 1) * opt, (costs, bins, where, span, opt)
        assert span >= opt
        attained += span == opt
        assert plan.group_size == bins
    assert attained > 100          # LPT is usually optimal on small instances


def test_makespan_at_least_lower_bound_and_loads_add_up():
    rng = random.Random(99)
    for trial in range(300):
        n = rng.randint(1, 60)
        world = rng.choice([1, 2, 3, 4, 6, 8, 16, 64, 256])
        m = rng.choice([k for k in range(1, world + 1) if world % k == 0])
        layers = [(f"l{i}", rng.randint(1, 600), rng.randint(1, 600)) for i in range(n)]
        plan = plan_ownership(layers, world, Fraction(m, world), balance=rng.choice(["compute", "memory"]))
        assert plan.makespan >= plan.lower_bound
        assert sum(plan.loads) == plan.total_cost
        assert plan.lower_bound >= max(plan.costs)
        # the greedy guarantee without knowing OPT: makespan <= total/s + largest
        assert plan.makespan <= plan.total_cost / plan.group_size + max(plan.costs)
        # every layer owned by exactly m ranks; every rank's layers are its position's
        counts = {name: 0 for name, _, _ in layers}
        for r in range(world):
            for name in plan.layers_of(r):
                counts[name] += 1
        assert set(counts.values()) == {m}


def test_plan_is_deterministic_across_calls_and_processes():
    layers = [(f"l{i}", (i * 37) % 300 + 1, (i * 53) % 200 + 1) for i in range(40)] + [("tie1", 5, 5), ("tie2", 5, 5)]
    here = plan_ownership(layers, 8)
    assert here == plan_ownership(list(layers), 8)
    code = ("from mindspore_ngd.parallel.plan import plan_ownership as p; "
            f"print(p({layers!r}, 8).positions)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip().splitlines()[-1] == str(here.positions)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("world, fraction", [
    (4, 0.75), (4, 3 / 4), (4, 0), (4, 1.5), (4, -0.25), (6, 4 / 6), (6, Fraction(5, 6)), (1, 0.5),
    (8, 0.3),
])
def test_grad_worker_fraction_rejected_with_allowed_values(world, fraction):
    with pytest.raises(ValueError, match="grad_worker_fraction must be k/world_size") as info:
        plan_ownership([("a", 2, 2)], world, fraction)
    assert f"world_size={world}" in str(info.value)


def test_grad_worker_fraction_message_lists_allowed_values():
    with pytest.raises(ValueError) as info:
        plan_ownership([("a", 2, 2)], 6, 4 / 6)
    assert "{1/6, 1/3, 1/2, 1}" in str(info.value)
    assert "got 0.666" in str(info.value)


@pytest.mark.parametrize("world, fraction, m", [
    (6, 1 / 6, 1), (6, 1 / 3, 2), (6, 2 / 6, 2), (6, 0.5, 3), (6, 1, 6), (6, 1.0, 6),
    (8, Fraction(1, 4), 2), (1, 1, 1), (1, None, 1), (1024, 1 / 1024, 1),
])
def test_grad_worker_fraction_accepted(world, fraction, m):
    plan = plan_ownership([("a", 2, 2)], world, fraction)
    assert plan.grad_workers == m and plan.group_size == world // m


def test_other_argument_errors():
    with pytest.raises(TypeError, match="grad_worker_fraction"):
        plan_ownership([("a", 2, 2)], 2, "half")
    with pytest.raises(ValueError, match="balance must be one of"):
        plan_ownership([("a", 2, 2)], 2, balance="time")
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        plan_ownership([("a", 2, 2)], 0)
    with pytest.raises(ValueError, match=r"unique, repeated: \['a'\]"):
        plan_ownership([("a", 2, 2), ("a", 3, 3)], 2)
    with pytest.raises(ValueError, match="a_dim of 'a'"):
        plan_ownership([("a", 0, 2)], 2)
    with pytest.raises(TypeError, match="work item"):
        plan_ownership([("a", 2)], 2)


def test_items_may_be_layer_spec_like_objects():
    class Spec:
        def __init__(self, name, a_dim, g_dim):
            self.name, self.a_dim, self.g_dim = name, a_dim, g_dim
    plan = plan_ownership([Spec("x", 3, 2), P.WorkItem("y", 4, 4)], 2)
    assert plan.layer_names == ("x", "y") and plan.positions == (1, 0)


# ----------------------------------------------------------------------------- printing
def test_str_prints_a_table():
    plan = plan_ownership([("conv", 4, 2), ("fc", 3, 3), ("tiny", 1, 1)], 4, 0.5)
    text = str(plan)
    lines = text.splitlines()
    assert lines[0] == ("OwnershipPlan: 3 layers, world_size 4, grad_worker_fraction 1/2 -> 2 owner group(s) "
                        "of 2 position(s), each layer held by 2 rank(s); balance=compute (cost a^3+g^3)")
    # conv 72 -> 0, fc 54 -> 1, tiny 2 -> 1; shares of 128
    assert lines[1].split() == ["pos", "ranks", "cost", "share", "layers"]
    assert lines[2].split() == ["0", "0,2", "72", "56.2%", "conv"]
    assert lines[3].split() == ["1", "1,3", "56", "43.8%", "fc,", "tiny"]
    assert lines[4] == "makespan 72, lower bound 72 (ratio 1.000; LPT guarantees <= 1.167 x optimal)"


def test_str_reports_idle_positions():
    text = str(plan_ownership([("a", 2, 2)], 3))
    assert "2 idle position(s)" in text
    assert text.splitlines()[3].split() == ["1", "1", "0", "0.0%", "-"]
