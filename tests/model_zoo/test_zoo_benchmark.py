"""model_zoo/resnet50/benchmark.py: the kinds of steps it tells apart, the recipe schedules it
amortises over, and a run of two optimizers side by side (issue 36's ResNet-50 cost)."""
import os

import pytest

from zoo import ZOO

import benchmark as zoo_benchmark
from mindspore_ngd.schedule.rules import FixedInterval, GrowingInterval, StaleIntervals


def test_schedule_shares_follow_each_fixed_rule_and_leave_data_driven_ones_out():
    kfac = zoo_benchmark.schedule_shares(FixedInterval(factor_interval=10, inverse_interval=100))
    assert kfac == pytest.approx({"plain": 0.90, "capture": 0.09, "refresh": 0.01})
    thor = zoo_benchmark.schedule_shares(GrowingInterval(frequency=834))
    assert thor == pytest.approx({"plain": 833 / 834, "capture": 0.0, "refresh": 1 / 834})
    every = zoo_benchmark.schedule_shares(FixedInterval(factor_interval=1, inverse_interval=20), horizon=40)
    assert every == pytest.approx({"plain": 0.0, "capture": 0.95, "refresh": 0.05})
    assert zoo_benchmark.schedule_shares(StaleIntervals()) is None
    assert zoo_benchmark.schedule_shares(GrowingInterval(frequency=10, trace_threshold=0.1)) is None


def test_amortised_weights_each_kind_and_needs_every_kind_the_schedule_runs():
    shares = {"plain": 0.9, "capture": 0.09, "refresh": 0.01}
    medians = {"plain": 1.0, "capture": 3.0, "refresh": 51.0}
    assert zoo_benchmark.amortised(medians, shares) == pytest.approx(0.9 + 0.27 + 0.51)
    assert zoo_benchmark.amortised(dict(medians, capture=None), shares) is None
    assert zoo_benchmark.amortised(dict(medians, capture=None), {"plain": 0.5, "capture": 0.0, "refresh": 0.5}) \
        == pytest.approx(26.0)
    assert zoo_benchmark.amortised(medians, None) is None


def test_step_kind_reads_the_refresh_counter_and_the_capture_flag():
    assert zoo_benchmark.step_kind(None, None) == "plain"                 # a first-order optimizer
    assert zoo_benchmark.step_kind((True, 3), (False, 4)) == "refresh"
    assert zoo_benchmark.step_kind((True, 3), (False, 3)) == "capture"
    assert zoo_benchmark.step_kind((False, 3), (True, 3)) == "plain"


@pytest.mark.slow
def test_two_optimizers_side_by_side_with_their_own_configs(tmp_path, capsys):
    """Momentum from cpu_smoke and K-FAC from a copy of it whose inverses come every 4 steps (factors
    every 2): steps 0..4 are refresh, plain, capture, plain, refresh, as K-FAC's own counters say."""
    with open(os.path.join(ZOO, "configs", "cpu_smoke.yaml"), encoding="utf-8") as handle:
        text = handle.read()
    assert "  inverse_update_interval: 2\n" in text
    path = tmp_path / "kfac_every4.yaml"
    path.write_text(text.replace("  inverse_update_interval: 2\n", "  inverse_update_interval: 4\n"))
    out = tmp_path / "result.json"
    results = zoo_benchmark.main(["--optimizers", "momentum,kfac", "--config_path", f"cpu_smoke,{path}",
                                  "--rounds", "1", "--steps", "5", "--out", str(out)])
    assert results["momentum"]["kinds"] == ["plain"] * 5
    kfac = results["kfac"]
    assert kfac["kinds"] == ["refresh", "plain", "capture", "plain", "refresh"]
    assert kfac["shares"] == pytest.approx({"plain": 0.5, "capture": 0.25, "refresh": 0.25})
    medians = kfac["medians"]
    assert medians["refresh"] == pytest.approx((kfac["steps"][0] + kfac["steps"][4]) / 2)
    assert medians["capture"] == kfac["steps"][2]
    assert kfac["amortised_s"] == pytest.approx(0.5 * medians["plain"] + 0.25 * (medians["capture"] + medians["refresh"]))
    assert kfac["compile_s"] > 0 and kfac["first_step_s"] == kfac["steps"][0]
    table = capsys.readouterr().out
    assert "| kfac_every4.yaml | kfac |" in table and "[2]" in table and out.exists()
    with pytest.raises(SystemExit):
        zoo_benchmark.main(["--optimizers", "momentum,kfac,thor", "--config_path", "cpu_smoke,cpu_smoke"])


@pytest.mark.slow
def test_the_lean_step_is_timed_with_both_compilations(tmp_path, capsys):
    """--lean_step: K-FAC trains with NGDTrainOneStepCell (train.py's lean_step: true); its lean graph is
    compiled before the first step and counted in the compile time, and the steps are told apart as
    without it."""
    with open(os.path.join(ZOO, "configs", "cpu_smoke.yaml"), encoding="utf-8") as handle:
        text = handle.read()
    path = tmp_path / "kfac_every4.yaml"
    path.write_text(text.replace("  inverse_update_interval: 2\n", "  inverse_update_interval: 4\n"))
    results = zoo_benchmark.main(["--optimizers", "momentum,kfac", "--config_path", f"cpu_smoke,{path}",
                                  "--rounds", "1", "--steps", "5", "--lean_step"])
    kfac, momentum = results["kfac"], results["momentum"]
    assert kfac["kinds"] == ["refresh", "plain", "capture", "plain", "refresh"]
    assert 0 < kfac["lean_compile_s"] < kfac["compile_s"]
    assert momentum["lean_compile_s"] is None                      # nn.Momentum keeps nn.TrainOneStepCell
    assert "includes the lean graph's (NGDTrainOneStepCell): kfac" in capsys.readouterr().out
