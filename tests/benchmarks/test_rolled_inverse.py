"""The rolled-inverse benchmark: both forms invert every factor, each in its own process."""
import json

import numpy as np
import pytest

from benchmarks import rolled_inverse


def test_both_forms_invert_every_factor_to_float32_accuracy(tmp_path, capsys):
    results = rolled_inverse.main(["--counts", "3", "--dim", "8", "--out", str(tmp_path)])
    assert [(r["form"], r["count"]) for r in results] == [("unrolled", 3), ("rolled", 3)]
    for r in results:
        assert "error" not in r, r
        assert r["relative_error"] < 1e-5, r
        assert np.isfinite([r["compile_s"], r["kept_mb"], r["call_ms"]]).all()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| form | factors | compile (s)")
    assert [line.split(" | ")[0] for line in lines[2:4]] == ["| unrolled", "| rolled"]
    with open(tmp_path / "rolled_inverse.json", encoding="utf-8") as handle:
        assert json.load(handle)["args"]["dim"] == 8


def test_the_factors_are_positive_definite():
    stack = rolled_inverse.factors(2, 5)
    assert stack.shape == (2, 5, 5) and stack.dtype == np.float32
    assert np.linalg.eigvalsh(stack.astype(np.float64)).min() > 0


@pytest.mark.parametrize("argv, message", [(["--counts", "0"], "positive factor counts"),
                                           (["--counts", "a"], "positive factor counts"),
                                           (["--dim", "1"], "at least 2"),
                                           (["--forms", "looped"], "unknown")])
def test_bad_arguments_are_named(argv, message):
    with pytest.raises(SystemExit, match=message):
        rolled_inverse.main(argv)
