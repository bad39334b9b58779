"""distributed.py:run_msrun on 2 CPU workers: a worker that fails is reported with its error and the
job is stopped. The collectives_worker launch of test_mccl_collectives.py is its success case.

Each launch costs ~15 s (msrun start, import, init(), teardown).
"""
import pytest

from distributed import MsrunError, run_msrun

pytestmark = pytest.mark.distributed


def test_failure_is_reported_with_the_worker_error():
    with pytest.raises(MsrunError) as info:
        run_msrun("tests/distributed/workers/failing_worker.py", workers=2, timeout=120)
    text = str(info.value)
    assert "rank(s) [1] reported an error" in text
    assert "ValueError: rank 1 fails on purpose" in text
    assert "worker_1.log" in text
