"""The step profiler (benchmarks/profile_step.py): the timeline reader on a hand-made trace, the CLI's
checks, and one profiled run of a tiny network (slow)."""
import pytest

from benchmarks import profile_step


def _event(name, dur_us, ph="X"):
    return {"ph": ph, "name": name, "pid": 2, "tid": 0, "ts": "0", "dur": str(dur_us)}


def test_trace_summary_counts_kernels_per_step_by_region_and_type():
    events = [
        _event("Default/network-WithLossCell/_backbone-Net/fc-Dense/MatMul-op0", 300.0),
        _event("Default/network-WithLossCell/_backbone-Net/fc-Dense/MatMul-op0", 500.0),
        _event("Gradients/Default/network-WithLossCell/_backbone-Net/fc-Dense/Grad_MatMul/MatMul-op3", 1000.0),
        _event("Default/optimizer-KFAC/blocks-CellList/0-KroneckerBlock/Assign-op7", 20.0),
        _event("Default/optimizer-KFAC/Select-op2", 40.0),
        _event("Expand/_MatMulExt/MatMul-op9", 200.0),
        _event("Default/TensorMove-op4", 60.0),
        _event("Default/network-WithLossCell", 5000.0),                # a scope, not a kernel
        _event("Default/optimizer-KFAC/Assign-op1", 99.0, ph="B"),     # not a complete event
    ]
    summary = profile_step.summarize_trace(events, steps=2)
    assert summary["kernels"] == pytest.approx(3.5)
    assert summary["kernel_ms"] == pytest.approx((300 + 500 + 1000 + 20 + 40 + 200 + 60) / 1e3 / 2)
    regions = summary["regions"]
    assert regions["forward"] == pytest.approx({"kernels": 1.0, "ms": 0.4})
    assert regions["backward"] == pytest.approx({"kernels": 0.5, "ms": 0.5})
    assert regions["optimizer"] == pytest.approx({"kernels": 1.5, "ms": 0.13})
    assert regions["other"] == pytest.approx({"kernels": 0.5, "ms": 0.03})
    assert summary["ops"]["MatMul"] == pytest.approx({"kernels": 2.0, "ms": 1.0})
    assert set(summary["ops"]) == {"MatMul", "Assign", "Select", "TensorMove"}
    with pytest.raises(ValueError, match="steps"):
        profile_step.summarize_trace(events, steps=0)


@pytest.mark.parametrize("argv, words", [
    (["--models", "vgg"], ["--models", "'vgg'", "resnet20"]),
    (["--optimizers", "adam"], ["--optimizers", "'adam'", "kfac-P/P"]),
    (["--period", "1"], ["--period", ">= 2"]),
    (["--spngd-warmup", "-1"], ["--spngd-warmup", ">= 0"]),
    (["--models", "resnet20", "--data", "digits"], ["--data digits", "(1, 8, 8)", "resnet20"]),
])
def test_cli_rejects_bad_arguments_naming_them(argv, words, capsys):
    with pytest.raises(SystemExit):
        profile_step.parse_args(argv)
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.slow
def test_profiles_a_tiny_network_and_finds_the_optimizers_kernels(tmp_path):
    path = profile_step.main(["--models", "tiny-mlp", "--optimizers", "momentum,thor", "--period", "4",
                              "--out", str(tmp_path)])
    import json
    with open(path, encoding="utf-8") as handle:
        rows = json.load(handle)["rows"]
    momentum, thor = rows
    assert momentum["steps"] == thor["steps"] == 3
    # the same network: THOR adds kernels (state writes, selects, preconditioning), not layers
    assert thor["regions"]["optimizer"]["kernels"] > momentum["regions"]["optimizer"]["kernels"]
    assert momentum["regions"]["backward"]["kernels"] == thor["regions"]["backward"]["kernels"]
    assert thor["ops"]["Assign"]["kernels"] > 0 and "Assign" not in momentum["ops"]
    assert thor["step_ms"] > 0 and thor["kernel_ms"] > 0


def test_spngd_is_profiled_with_the_statistics_it_refreshed_in_the_window(tmp_path):
    row = profile_step.profile_one("tiny-mlp", "spngd", 3, spngd_warmup=2)
    assert row["steps"] == 2 and row["kernels"] > 0
    assert isinstance(row["statistic_refreshes"], int) and 0 <= row["statistic_refreshes"] <= 2 * 2
    table = profile_step.markdown([row])
    assert f"| tiny-mlp | spngd ({row['statistic_refreshes']} statistic refreshes) |" in table


@pytest.mark.slow
def test_the_lean_step_writes_no_factor_on_a_step_that_captures_nothing(tmp_path):
    plain = profile_step.profile_one("tiny-mlp", "thor", 4)
    lean = profile_step.profile_one("tiny-mlp", "thor+lean", 4)
    # the same steps (none captures), same network; the lean graph leaves out the write-backs of the
    # layer's two factors and of the fold's counters, and so runs fewer Assign kernels (measured: 20
    # against 24 per step) and fewer kernels in all
    assert plain["steps"] == lean["steps"] == 3
    assert lean["ops"]["Assign"]["kernels"] <= plain["ops"]["Assign"]["kernels"] - 2
    assert lean["kernels"] < plain["kernels"]
