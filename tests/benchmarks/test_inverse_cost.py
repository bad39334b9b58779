"""The inverse-cost benchmark runs end to end on a small size and records what it claims."""
import json

from benchmarks import inverse_cost


def test_inverse_cost_runs_and_saves_every_method(tmp_path):
    path = inverse_cost.main(["--sizes", "48", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    assert [r["method"] for r in result["rows"]] == list(inverse_cost.METHODS)
    for row in result["rows"]:
        assert row["size"] == 48 and row["seconds"] > 0 and row["ok"], row
        assert row["rel_frobenius_error"] < 1e-4, row
    newton = {r["method"]: r for r in result["rows"] if r["method"].startswith("newton")}
    assert newton["newton"]["steps_needed"] <= newton["newton"]["static_steps"]
    assert newton["newton (warm)"]["warm_residual"] < 1
    assert result["markdown"].count("| 48 |") == 1
