"""Distributed K-FAC / SP-NGD / THOR on 2 CPU ranks (msrun, MCCL) against one process on the whole batch.

One msrun launch (tests/distributed/workers/ngd_worker.py) runs every case of dist_cases.py: each rank
trains on its half of fixed global batches with ``nn.TrainOneStepCell`` under ``DATA_PARALLEL``; the
single-process references run here. Tolerance on the weights: rtol 1e-5 and atol 1e-5 times the
tensor's largest magnitude. The factors are averaged with the sums in another order (two half-batch
means added instead of one full-batch matmul), which moves them by ~1e-7 relative (float32); the
damped inverses (condition numbers up to ~1/damping) and the steps amplify that: measured at most
1.5e-6 of the tensor's scale (THOR without KL clipping, 8 steps), ~1e-7 for K-FAC and SP-NGD.
Elementwise rtol alone would fail on near-zero entries. Across the ranks the weights must be
bit-identical.
"""
import numpy as np
import pytest

from distributed import run_msrun
import dist_cases

pytestmark = pytest.mark.distributed

EXACT = ["kfac", "kfac_f1", "spngd", "thor", "thor_trace", "kfac_tokens", "thor_tokens"]
CASES = EXACT + ["spngd_bn"]


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt")
    run = run_msrun("tests/distributed/workers/ngd_worker.py", CASES + ["--checkpoint", str(directory)], workers=2,
                    timeout=420)
    assert sorted(run.results) == [0, 1]
    return run.results


@pytest.fixture(scope="module")
def references():
    return {name: dist_cases.run_case(name)[0] for name in EXACT}


def _close(value, reference, what):
    np.testing.assert_allclose(value, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max(), err_msg=what)


def _weights(result):
    return {name: np.asarray(value, np.float32) for name, value in result["weights"].items()}


@pytest.mark.parametrize("name", EXACT)
def test_two_ranks_equal_one_process_on_the_whole_batch(launch, references, name):
    ref = references[name]
    ranks = [launch[r]["cases"][name] for r in (0, 1)]
    for result in ranks:
        assert result["counters"] == ref["counters"], name
        assert result["updates"] == ref["updates"], name          # same statistics taken at the same steps
        if "refresh" in ref:                                        # SP-NGD: same adaptive intervals
            assert result["refresh"] == ref["refresh"]
        for key, value in _weights(result).items():
            _close(value, ref["weights"][key], f"{name} {key}")
        for layer, (a, g) in result["factors"].items():             # the owned factors are the global ones
            _close(np.asarray(a), ref["factors"][layer][0], f"{name} {layer}.A")
            _close(np.asarray(g), ref["factors"][layer][1], f"{name} {layer}.G")
    first, second = (_weights(r) for r in ranks)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=f"{name} {key}: ranks differ")


@pytest.mark.parametrize("name", ["kfac_tokens", "thor_tokens"])
def test_an_embedding_is_preconditioned_by_its_owner_with_a_diagonal_a(launch, references, name):
    # the equality above is not vacuous: the embedding is one of the blocks, its owner keeps A as the
    # (vocab,) diagonal, the other rank its placeholders, and the table rows of tokens never seen stay put
    shapes = [launch[r]["cases"][name]["factor_shapes"]["embed"] for r in (0, 1)]
    vocab, dim = dist_cases.TokenNet.vocab, 4
    assert sorted(shapes) == sorted([[[vocab], [dim, dim], [vocab], [dim, dim]], [[1], [1, 1], [1], [1, 1]]])
    owner = [r for r in (0, 1) if shapes[r][0] == [vocab]][0]
    a, _ = launch[owner]["cases"][name]["factors"]["embed"]
    np.testing.assert_allclose(np.asarray(a), references[name]["factors"]["embed"][0], rtol=1e-5, atol=1e-7)
    assert (np.asarray(a)[9:] == 0).all() and (np.asarray(a)[:9] > 0).all()
    table = _weights(launch[0]["cases"][name])["embed.embedding_table"]
    start = {n: v for n, v in dist_cases.build(name)[0].parameters_and_names()}["embed.embedding_table"].asnumpy()
    moved = np.abs(table - start).max(axis=1)
    assert (moved[:9] > 0).all()
    if name == "thor_tokens":       # no weight decay: a row whose token never occurred has no step at all
        assert (moved[9:] == 0).all()


def test_stale_and_trace_rules_actually_skipped_statistics(launch, references):
    # the equivalence above covers non-trivial decisions: some statistics were not refreshed every step
    spngd = launch[0]["cases"]["spngd"]
    assert min(count for _, _, count in spngd["refresh"].values()) < 8
    thor = launch[0]["cases"]["thor_trace"]
    assert min(min(u) for u in thor["updates"]) < max(max(u) for u in thor["updates"])


def test_batchnorm_network_keeps_the_ranks_identical(launch):
    # BatchNorm batch statistics are per rank, so there is no single-process equivalent; the weights
    # (and the unit-wise Fishers' effect on them) must still agree bit for bit
    first, second = (_weights(launch[r]["cases"]["spngd_bn"]) for r in (0, 1))
    assert "bn.gamma" in first
    for key in first:
        assert np.isfinite(first[key]).all()
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    assert launch[0]["cases"]["spngd_bn"]["refresh"] == launch[1]["cases"]["spngd_bn"]["refresh"]


def test_each_rank_inverts_only_the_layers_it_owns(launch):
    results = [launch[r]["cases"]["kfac"] for r in (0, 1)]
    positions = results[0]["plan_positions"]
    assert positions == results[1]["plan_positions"] == [1, 0, 1]   # LPT on a^3 + g^3: fc1 alone, conv + fc2
    layers = ["conv", "fc1", "fc2"]
    refreshes = results[0]["counters"]["inverse_refreshes"]
    assert refreshes == 2
    for rank, result in enumerate(results):
        owned = [layer for layer, p in zip(layers, positions) if p == rank]
        assert result["owned"] == owned == result["parallel"]["owned_layers"]
        assert result["parallel"]["inversions"] == {layer: refreshes if layer in owned else 0 for layer in layers}
        assert sorted(result["factors"]) == owned
        for layer, shapes in result["factor_shapes"].items():
            if layer in owned:
                assert all(shape != [1, 1] for shape in shapes), layer
            else:                                   # placeholders: no factor or inverse memory
                assert shapes == [[1, 1]] * 4, layer
        assert "world_size 2, grad_worker_fraction 1/2" in result["plan_text"]
        assert f"distributed: rank {rank} of 2 owns {len(owned)} layers [{', '.join(owned)}]" in result["summary"]
    # grad_worker_fraction 1: every rank owns and inverts every layer
    for rank in (0, 1):
        full = launch[rank]["cases"]["kfac_f1"]
        assert full["owned"] == layers
        assert full["parallel"]["inversions"] == {layer: 2 for layer in layers}


def test_checkpoint_per_rank_round_trip_and_world_size_check(launch):
    for rank in (0, 1):
        ckpt = launch[rank]["cases"]["kfac"]["checkpoint"]
        assert ckpt["keys"] == ["kfac.parallel.grad_workers", "kfac.parallel.inversions",
                                "kfac.parallel.owner_positions", "kfac.parallel.position",
                                "kfac.parallel.world_size"]
        assert ckpt["not_loaded"] == [] and ckpt["state_equal"]
        assert ckpt["world_size_mismatch"].startswith("checkpoint was written by 4 ranks")
        assert "this run has 2 ranks" in ckpt["world_size_mismatch"]


@pytest.mark.slow
def test_four_ranks_owner_groups_and_an_idle_rank():
    """4 ranks (~75 s): grad_worker_fraction 1/2 (owner groups {0,1}, {2,3}; the gather is an AllReduce
    over the owner group on CPU) and 1/4 with 3 layers (rank 3 owns nothing but takes part in every
    collective)."""
    names = ["kfac", "kfac_half", "thor_trace"]
    results = run_msrun("tests/distributed/workers/ngd_worker.py", names, workers=4, timeout=600).results
    for name in names:
        ref = dist_cases.run_case(name)[0]
        weights = [_weights(results[r]["cases"][name]) for r in range(4)]
        for key, value in weights[0].items():
            _close(value, ref["weights"][key], f"{name} {key}")
            for other in weights[1:]:
                np.testing.assert_array_equal(other[key], value, err_msg=f"{name} {key}: ranks differ")
        assert results[0]["cases"][name]["updates"] == ref["updates"]
    owned = [results[r]["cases"]["kfac"]["owned"] for r in range(4)]
    assert owned == [["fc1"], ["conv"], ["fc2"], []]
    assert results[3]["cases"]["kfac"]["parallel"]["inversions"] == {"conv": 0, "fc1": 0, "fc2": 0}
    half = [results[r]["cases"]["kfac_half"]["owned"] for r in range(4)]
    assert half == [["fc1"], ["conv", "fc2"], ["fc1"], ["conv", "fc2"]]
