"""The Newton precision benchmark runs end to end on a small case and never reports a wrong acceptance.

Slow (about 45 s; the Newton paths' numerics are in tests/numerics/test_newton_precision.py, in the
default suite): ``python -m pytest -m slow tests/benchmarks/test_newton_precision_benchmark.py``."""
import json

import pytest

from benchmarks import newton_precision


@pytest.mark.slow
def test_newton_precision_runs_and_saves_every_variant(tmp_path):
    path = newton_precision.main(["--cases", "64,32x2", "--shifts", "1e-2", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    rows = result["rows"]
    assert len(rows) == 2 * len(newton_precision.VARIANTS) * len(newton_precision.PRECISIONS)
    assert not any(r["wrong"] for r in rows)
    for r in rows:
        if r["variant"] != "newton12":
            assert r["accepted"] and r["error"] < 1e-4, r
    assert result["markdown"].count("| 32x2 | 1e-02 |") == 1
