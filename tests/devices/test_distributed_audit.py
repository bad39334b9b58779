"""The distributed graph under msrun: K-FAC's exchange built with HCCL's (Ascend) collective choice
on this CPU machine, audited like the single-device graphs.

What it proves: with ReduceScatter available (HCCL/NCCL), the compiled front-end graph holds a
ReduceScatter of the factors and an AllGather of the preconditioned gradients, and every operator
the optimizer adds, collectives included, is documented by MindSpore for Ascend and GPU, and (strict
audit, host_calls=False as "auto" picks on those devices) none runs on the host. What it
cannot prove: that the graph runs -- MCCL, the only backend here, has no ReduceScatter kernel, and
the CPU back-end's refusal is recorded in the result. ~50 s (msrun + two compilations per rank)."""
import pytest

from distributed import run_msrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_distributed_kfac_graph_with_hccl_collectives():
    run = run_msrun("tests/devices/workers/collective_graph_worker.py", ["--backend", "hccl", "--optimizer", "kfac"],
                    workers=2, timeout=400)
    for rank in (0, 1):
        result = run.results[rank]
        assert "factors ReduceScatter" in result["describe"] and "AllGather" in result["describe"]
        assert {"ReduceScatter", "AllGather"} <= set(result["added"])
        assert result["baseline_collectives"] == ["AllReduce"]       # the gradient mean of DATA_PARALLEL
        assert result["ok"] == {"Ascend": True, "GPU": True}, result["undocumented"]
        assert result["host_nodes"] == {"Ascend": [], "GPU": []}               # the strict audit: none
        assert result["baseline_error"] is None
