"""The compile-pattern benchmark runs every pattern in its own process and records what it claims."""
import json

import pytest

from benchmarks import compile_patterns


def test_every_pattern_compiles_the_same_pass_and_is_tabled(tmp_path):
    path = compile_patterns.main(["--sizes", "3", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    assert [r["pattern"] for r in result["rows"]] == list(compile_patterns.PATTERNS)
    assert all(r["size"] == 3 and r["seconds"] > 0 for r in result["rows"])
    table = result["markdown"].splitlines()
    assert table[0] == "| pass written as | 3 tensors, s |"
    assert [line.split(" | ")[0] for line in table[2:]] == [f"| {p}" for p in compile_patterns.PATTERNS]


def test_sizes_must_be_positive():
    with pytest.raises(SystemExit, match="--sizes must be positive"):
        compile_patterns.main(["--sizes", "0"])
