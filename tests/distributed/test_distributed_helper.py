"""distributed.py:run_msrun on 2 CPU workers, and the MCCL collectives the engine may use.

Each launch costs ~15 s (msrun start, import, init(), teardown).
"""
import numpy as np
import pytest

from distributed import MsrunError, run_msrun

pytestmark = pytest.mark.distributed


def test_collectives_on_cpu():
    run = run_msrun("tests/distributed/workers/collectives_worker.py", workers=2, timeout=240)
    assert sorted(run.results) == [0, 1]
    base = np.arange(4, dtype=np.float32)
    for rank, res in run.results.items():
        assert res["rank"] == rank and res["size"] == 2
        assert res["device_target"] == "CPU"
        assert res["parallel_mode"] == "stand_alone"          # init() alone does not set a parallel mode
        np.testing.assert_array_equal(res["allreduce"], 2 * base + 10)
        np.testing.assert_array_equal(res["allgather"], np.concatenate([base, base + 10]))   # axis 0, rank order
        np.testing.assert_array_equal(res["subgroup_allreduce"], 2 * base + 10)
        # MindSpore 2.10 CPU: AllGather/Broadcast only on the world group; no ReduceScatter kernel
        assert res["subgroup_allgather_error"].startswith(
            "AllGather only support mccl_world_group on CPU, but got pair")
        assert "Unsupported op [ReduceScatter] on CPU" in res["reducescatter_error"]
        assert res["allreduce_max_error"].startswith("AllReduce only support reduce sum on CPU, but got max")


def test_failure_is_reported_with_the_worker_error():
    with pytest.raises(MsrunError) as info:
        run_msrun("tests/distributed/workers/failing_worker.py", workers=2, timeout=120)
    text = str(info.value)
    assert "rank(s) [1] reported an error" in text
    assert "ValueError: rank 1 fails on purpose" in text
    assert "worker_1.log" in text
