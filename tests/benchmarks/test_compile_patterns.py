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


@pytest.mark.slow
def test_both_forms_of_every_idiom_compile_to_the_same_values(tmp_path):
    path = compile_patterns.main(["--family", "idioms", "--sizes", "3", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    rows = {r["pattern"]: r for r in result["rows"]}
    assert list(rows) == list(compile_patterns.FAMILIES["idioms"])
    assert all(r["size"] == 3 and r["seconds"] > 0 for r in rows.values())
    for indexed, primitive in compile_patterns.IDIOMS:
        assert rows[primitive]["checksum"] == pytest.approx(rows[indexed]["checksum"], rel=1e-6, abs=1e-6)
    # the checksums are not trivially equal: the idioms take different parts of the same matrices
    assert len({round(rows[p]["checksum"], 4) for p, _ in compile_patterns.IDIOMS}) > 1
    assert result["markdown"].splitlines()[0] == "| idiom written as | 3 call sites, s |"


def test_a_child_names_a_pattern_of_its_family():
    with pytest.raises(SystemExit, match="--child must be one of"):
        compile_patterns.main(["--family", "idioms", "--child", "HyperMap", "--sizes", "3"])
