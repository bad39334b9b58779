"""The MCCL (CPU) collectives the distributed engine relies on, and the ones it must avoid (MindSpore
2.10: AllGather only on the world group, no ReduceScatter, AllReduce only with sum), on 2 msrun
workers (workers/collectives_worker.py). One launch, ~15 s.
"""
import numpy as np
import pytest

from distributed import run_msrun

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
