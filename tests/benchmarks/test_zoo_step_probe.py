"""benchmarks.zoo_step_probe on the model zoo's cpu_smoke config: one row per step of train.py, with the
loss, the update, the step's time and the optimizer's counters after that step; and train.py's own
per-epoch refresh ratio of SP-NGD."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("yaml", reason="model zoo tests need pyyaml (pip install -e '.[test]')")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_probe_records_each_steps_time_and_spngd_refresh_counts(tmp_path):
    out = tmp_path / "probe.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.zoo_step_probe", str(out), "--", "--config_path", "cpu_smoke",
         "--optimizer", "spngd", "--data_path", "synthetic", "--device_target", "CPU", "--epoch_size", "1",
         "--eval_interval", "0", "--save_checkpoint_epochs", "0", "--output_dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [row["step"] for row in rows] == [0, 1, 2, 3]          # cpu_smoke: 4 steps per epoch
    assert all(np.isfinite(row["loss"]) and row["seconds"] > 0 and row["update_norm"] > 0 for row in rows)
    counters = [row["counters"] for row in rows]
    assert [c["step"] for c in counters] == [1, 2, 3, 4]            # read after each step
    refreshes = [c["statistic_refreshes"] for c in counters]
    # SP-NGD's adaptive intervals start at one step: step 0 refreshes every statistic, and the count
    # never falls
    assert refreshes[0] > 0 and all(b >= a for a, b in zip(refreshes, refreshes[1:])), refreshes
    assert counters[0]["inverse_refreshes"] == 1 and counters[0]["skipped_steps"] == 0
    # train.py's own record of SP-NGD's refreshes: the epoch's share of statistics refreshed per step
    summary = json.loads((tmp_path / "run" / "summary_rank0.json").read_text())
    statistics = refreshes[0]                                        # step 0 refreshes every statistic
    expected = {"epoch": 1, "steps": 4, "ratio": pytest.approx(refreshes[-1] / (4 * statistics))}
    assert summary["refresh_ratio"] == [expected], summary
    assert "refresh ratio" in result.stderr
