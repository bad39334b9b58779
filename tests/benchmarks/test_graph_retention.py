"""The graph-retention benchmark compiles each chain in its own process and tables what it measured."""
import json

import pytest

from benchmarks import graph_retention


def test_each_chain_computes_its_value_and_is_tabled(tmp_path, capsys):
    rows = graph_retention.main(["--sizes", "2,6", "--ops", "add,logical_and", "--out", str(tmp_path)])
    results = dict(rows)
    # x + 1 applied n times to 1.0; the flag is True and (x > k) for k < n: False from k = 1 (x is 1.0)
    assert [r["value"] for r in results["add"]] == [3.0, 7.0]
    assert [r["flag"] for r in results["logical_and"]] == [False, False]
    assert all(isinstance(r["retained_mb"], float) for op in results.values() for r in op)
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| operator | retained after compiling 2 nodes (MB) | retained after compiling 6 nodes")
    assert [line.split(" | ")[0] for line in table[2:4]] == ["| add", "| logical_and"]
    with open(tmp_path / "graph_retention.json", encoding="utf-8") as handle:
        assert json.load(handle)["args"]["sizes"] == "2,6"


@pytest.mark.parametrize("argv, message", [(["--sizes", "20"], "two or more positive"),
                                           (["--sizes", "0,20"], "two or more positive"),
                                           (["--sizes", "a,20"], "two or more positive"),
                                           (["--ops", "conv"], "unknown")])
def test_bad_arguments_are_named(argv, message):
    with pytest.raises(SystemExit, match=message):
        graph_retention.main(argv)


def test_slope_is_none_for_a_failed_size():
    assert graph_retention.slope_kb({"size": 2, "error": "x"}, {"size": 6, "retained_mb": 1.0}) is None
    assert graph_retention.slope_kb({"size": 2, "retained_mb": 1.0}, {"size": 6, "retained_mb": 2.0}) == 256.0


def test_the_while_loop_computes_what_the_chain_computes():
    rows = dict(graph_retention.main(["--sizes", "2,6", "--ops", "add,logical_and", "--loop", "while"]))
    assert [r["value"] for r in rows["add"]] == [3.0, 7.0]
    assert [r["flag"] for r in rows["logical_and"]] == [False, False]
    assert {r["loop"] for op in rows.values() for r in op} == {"while"}
