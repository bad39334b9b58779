"""The per-layer graph benchmark: nodes by source file and kept memory, slopes between two stack depths.

The end-to-end run compiles eight graphs in fresh processes (about 65 s): it is slow, run it with
``python -m pytest -m slow tests/benchmarks/test_graph_nodes.py``."""
import json

import pytest

from benchmarks import graph_nodes


@pytest.mark.slow
def test_one_more_layer_is_measured_by_source_file_and_the_lean_graph_is_smaller(tmp_path, capsys):
    summary = graph_nodes.main(["--layers", "1,2", "--optimizers", "momentum,kfac", "--lean", "--top", "3",
                                "--out", str(tmp_path)])
    rows = {(s["optimizer"], s["lean"]): s for s in summary}
    assert sorted(rows) == [("kfac", False), ("kfac", True), ("momentum", False)]
    assert not any(s["errors"] for s in summary)
    momentum, full, lean = rows["momentum", False], rows["kfac", False], rows["kfac", True]
    # the optimizer's step preconditions each layer: many more nodes per layer than Momentum's update,
    # and the lean graph leaves out the capture branches and the fold
    assert 0 < momentum["nodes_per_layer"] < lean["nodes_per_layer"] < full["nodes_per_layer"]
    # the attribution adds up; the inversion is compiled once per shape (``_graph.per_shape_subgraph`` on
    # CPU), so a layer of a shape already there adds none of its nodes, and the capture adds some
    assert sum(full["files_per_layer"].values()) == pytest.approx(full["nodes_per_layer"])
    assert "mindspore_ngd/curvature/inverse.py" not in full["files_per_layer"]
    assert full["files_per_layer"]["mindspore_ngd/capture/cells.py"] > 0
    assert all(isinstance(s["kept_mb_per_layer"], float) for s in summary)
    out = capsys.readouterr().out
    assert "| kfac (lean graph) |" in out and "Nodes per layer by source file, kfac:" in out
    with open(tmp_path / "graph_nodes.json", encoding="utf-8") as handle:
        saved = json.load(handle)
    assert saved["args"]["layers"] == [1, 2]
    assert {r["what"] for r in saved["runs"]} == {"memory", "nodes"}
    assert all(abs(r["loss"]) < 1e3 for r in saved["runs"] if r["what"] == "memory")


@pytest.mark.slow
def test_a_conv_batchnorm_pair_costs_sp_ngd_its_unit_wise_capture_on_top_of_k_fac():
    """``--model convbn``: one more Conv2d-BatchNorm pair. K-FAC leaves BatchNorm to the plain update;
    SP-NGD captures and folds it unit-wise, which adds nodes from the unit-wise group and the probe."""
    summary = graph_nodes.main(["--model", "convbn", "--width", "8", "--layers", "1,2", "--optimizers", "kfac,spngd",
                                "--top", "3"])
    rows = {s["optimizer"]: s for s in summary}
    assert not any(s["errors"] for s in summary)
    kfac, spngd = rows["kfac"], rows["spngd"]
    # measured 2026-11-29 (16 channels, 2 and 4 pairs): 179.5 against 295.5
    assert 0 < kfac["nodes_per_layer"] < spngd["nodes_per_layer"]
    assert "mindspore_ngd/curvature/unitwise.py" not in kfac["files_per_layer"]
    assert spngd["files_per_layer"]["mindspore_ngd/curvature/unitwise.py"] > 0


@pytest.mark.parametrize("argv, message", [(["--layers", "4"], "two or more different"),
                                           (["--layers", "4,4"], "two or more different"),
                                           (["--layers", "0,4"], "two or more different"),
                                           (["--layers", "a,b"], "two or more different"),
                                           (["--optimizers", "adam"], "unknown"),
                                           (["--width", "0"], "must be positive"),
                                           (["--model", "resnet50"], "invalid choice")])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        graph_nodes.main(argv)
    assert message in capsys.readouterr().err
