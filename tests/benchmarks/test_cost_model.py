"""The cost model's FLOP formulas against hand-computed values, and one tiny end-to-end run."""
import json
import math

import numpy as np
import pytest

from benchmarks import cost_model
from mindspore_ngd.capture import LayerSpec


def _dense(in_dim, out_dim, bias=True):
    return LayerSpec(name="fc", kind="dense", weight_name="fc.weight", bias_name="fc.bias" if bias else None,
                     weight_shape=(out_dim, in_dim), a_dim=in_dim + int(bias), g_dim=out_dim)


def _conv(c_in, c_out, k, stride, bias=False):
    return LayerSpec(name="conv", kind="conv2d", weight_name="conv.weight", bias_name="conv.bias" if bias else None,
                     weight_shape=(c_out, c_in, k, k), a_dim=c_in * k * k + int(bias), g_dim=c_out,
                     kernel_size=(k, k), stride=(stride, stride), pad_mode="same")


def test_dense_flops_by_hand():
    # Dense 784 -> 1000 with bias, batch 128: A is 785 x 785, G 1000 x 1000
    flops = cost_model.layer_flops(_dense(784, 1000), batch=128, positions=1)
    assert flops["forward"] == 2 * 128 * 1000 * 784 == 200_704_000
    assert flops["backward"] == 401_408_000
    assert flops["capture_a"] == 2 * 128 * 785 ** 2 == 157_753_600
    assert flops["capture_g"] == 256_000_000
    assert flops["inverse_a"] == 785 ** 3 and flops["inverse_g"] == 1000 ** 3
    assert flops["precondition"] == 2 * 1000 ** 2 * 785 + 2 * 1000 * 785 ** 2 == 2_802_450_000


def test_conv_flops_same_padding_stride_2_by_hand():
    # Conv2d 16 -> 32, 3x3, stride 2, pad 'same', no bias, on 32x32 inputs: 16x16 = 256 output positions
    assert cost_model.same_padding(32, 3, 2, 1) == (0, 1)
    flops = cost_model.layer_flops(_conv(16, 32, 3, 2), batch=8, positions=16 * 16)
    assert flops["forward"] == 2 * 8 * 256 * 32 * 144 == 18_874_368
    assert flops["backward"] == 37_748_736
    assert flops["capture_a"] == 2 * 8 * 256 * 144 ** 2 == 84_934_656
    assert flops["capture_g"] == 2 * 8 * 256 * 32 ** 2 == 4_194_304
    assert flops["precondition"] == 2 * 32 * 32 * 144 + 2 * 32 * 144 * 144 == 1_622_016


def test_thor_split_count_and_block_flops():
    assert cost_model.block_layout(577, 128) == (5, 128)        # 4 full blocks + one padded
    assert cost_model.block_layout(128, 128) == (1, 128)
    assert cost_model.block_layout(64, None) == (1, 64)
    assert cost_model.inverse_flops(577, 128) == 5 * 128 ** 3
    assert cost_model.inverse_flops(577) == 577 ** 3
    # G 64 (one block), A 577 (5 blocks of 128): 2 g^2 a + 2 g * 5 * 128^2
    assert cost_model.precondition_flops(64, 577, 128) == 2 * 64 ** 2 * 577 + 2 * 64 * 5 * 128 ** 2


def test_fixed_schedule_events():
    events = cost_model.fixed_events(cost_model.schedule_of("kfac", 4), 2, 8, first_step=4)
    assert [e[0][0] for e in events] == [True] * 8                # factors every step
    assert [e[2][1] for e in events] == [True, False, False, False] * 2
    events = cost_model.fixed_events(cost_model.schedule_of("thor", 4), 1, 4, first_step=4)
    assert [e[0][0] for e in events] == [True, False, False, False]


def test_main_end_to_end_on_a_tiny_net(tmp_path):
    path = cost_model.main(["--models", "tiny-mlp", "--optimizers", "momentum,kfac", "--rounds", "1",
                            "--period", "2", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    (row,) = result["rows"]
    assert row["optimizer"] == "kfac" and row["steps"] == 2 and row["refresh_steps"] == 1
    for key in ("amortised_ratio", "floor_amortised_ratio", "quiet_ratio", "floor_quiet_ratio", "flop_ratio"):
        assert math.isfinite(row[key]) and row[key] > 0, key
    assert row["floor_amortised_s"] >= row["momentum_median_s"]
    (layer,) = result["layers"]["tiny-mlp (batch 8)"]["kfac"]["layers"]
    assert layer["a_dim"] == 17 and layer["g_dim"] == 10 and layer["positions"] == 1
    assert layer["capture_rate_a"] == 1.0 and layer["inverse_rate"] == 0.5
    header = result["markdown"].split("\n")
    assert "| layer | kind | A | G | T | fwd+bwd | capture | inversion | precondition | extra / training |" in header
    assert any(line.startswith("| model (batch) | optimizer | fwd+bwd GFLOP") for line in header)
    assert "| tiny-mlp (8) | kfac |" in result["markdown"]


@pytest.mark.slow
def test_each_model_is_timed_at_each_batch_size(tmp_path):
    path = cost_model.main(["--models", "tiny-mlp", "--optimizers", "momentum,thor", "--batch", "4,32",
                            "--period", "2", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    assert [(r["batch"], r["optimizer"]) for r in result["rows"]] == [(4, "thor"), (32, "thor")]
    assert list(result["layers"]) == ["tiny-mlp (batch 4)", "tiny-mlp (batch 32)"]
    small, large = (result["layers"][key]["thor"]["layers"][0] for key in result["layers"])
    # the training arithmetic grows with the batch, the preconditioning does not
    assert large["train_gflop"] == pytest.approx(8 * small["train_gflop"])
    assert large["precondition_gflop"] == pytest.approx(small["precondition_gflop"])
    assert "| tiny-mlp (4) | thor |" in result["markdown"] and "| tiny-mlp (32) | thor |" in result["markdown"]


@pytest.mark.slow
def test_several_graphs_per_optimizer_pool_their_steps(tmp_path):
    path = cost_model.main(["--models", "tiny-mlp", "--optimizers", "momentum,kfac-P/P", "--rounds", "1",
                            "--period", "2", "--graphs", "2", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    (row,) = result["rows"]
    # each graph trains one period per round, and refreshes on the first step of it
    assert row["graphs"] == 2 and row["steps"] == 4 and row["refresh_steps"] == 2
    assert len(row["graph_medians_s"]) == 2 and len(row["momentum_graph_medians_s"]) == 2
    assert all(t > 0 for t in row["graph_medians_s"] + row["momentum_graph_medians_s"])
    assert "| model (batch) | optimizer | median step ms of each graph |" in result["markdown"].split("\n")
    assert "| tiny-mlp (8) | momentum | " in result["markdown"]


@pytest.mark.slow
def test_lean_kinds_train_with_the_lean_step_and_report_both_compiles(tmp_path):
    path = cost_model.main(["--models", "tiny-mlp", "--optimizers", "momentum,kfac-P/P,kfac-P/P+lean",
                            "--rounds", "1", "--period", "3", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    plain, lean = result["rows"]
    assert (plain["optimizer"], lean["optimizer"]) == ("kfac-P/P", "kfac-P/P+lean")
    assert plain["lean_compile_s"] is None and lean["lean_compile_s"] > 0
    # the same schedule: one refresh in the period, and the lean kind's FLOP model is the plain one's
    assert lean["refresh_steps"] == plain["refresh_steps"] == 1
    assert lean["flop_ratio"] == plain["flop_ratio"]
    assert "| tiny-mlp (8) | kfac-P/P+lean (compiles " in result["markdown"]
    cell, _ = cost_model.build_cell("tiny-mlp", "thor+lean", 3)
    assert type(cell).__name__ == "NGDTrainOneStepCell"


def test_digits_batches_are_one_epoch_of_the_training_split_in_a_fixed_order():
    from benchmarks.data import digits_arrays
    x_train, y_train = digits_arrays()[:2]
    batches = cost_model._batches("digits-bn", batch=64, data="digits")
    assert len(batches) == len(y_train) // 64
    inputs = np.concatenate([x.asnumpy() for x, _ in batches])
    labels = np.concatenate([y.asnumpy() for _, y in batches])
    assert inputs.shape == (64 * len(batches), 1, 8, 8) and labels.dtype == np.int32
    # distinct training examples, each with its own label, none repeated within the epoch
    order = np.random.default_rng(0).permutation(len(y_train))[:len(labels)]
    np.testing.assert_array_equal(inputs, x_train[order])
    np.testing.assert_array_equal(labels, y_train[order])
    again = cost_model._batches("digits-bn", batch=64, data="digits")
    np.testing.assert_array_equal(again[3][0].asnumpy(), batches[3][0].asnumpy())
    with pytest.raises(ValueError, match="1, 8, 8"):
        cost_model._batches("tiny-mlp", data="digits")
    with pytest.raises(ValueError, match="data must be one of"):
        cost_model._batches("digits-bn", data="imagenet")


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cost_model.main(["--models", "nosuchnet", "--out", str(tmp_path)])
    for bad in ("0", "8,x", ","):
        with pytest.raises(SystemExit):
            cost_model.main(["--models", "tiny-mlp", "--batch", bad, "--out", str(tmp_path)])
        assert "--batch must be positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost_model.main(["--compile", "--batch", "2,4", "--out", str(tmp_path)])
    assert "--batch must be one positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost_model.main(["--optimizers", "kfac", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        cost_model.main(["--models", "tiny-mlp", "--data", "digits", "--out", str(tmp_path)])
    assert "--data digits needs models with (1, 8, 8) inputs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost_model.main(["--models", "tiny-mlp", "--graphs", "0", "--out", str(tmp_path)])
    assert "--graphs must be a positive integer" in capsys.readouterr().err


def test_compile_phases_are_read_from_the_verbose_log_and_tabled():
    log = "\n".join([
        "[V1] PIPELINE(1,7f,python):2026 [mindspore/core/include/utils/profile.h:287] DisplayVlog] "
        "[MsProfile] [compile_action] type_inference costs 11455.4 msec.",
        "[V1] ... [MsProfile] [compile_irpass] opt_a costs 9939.37 msec.",           # a pass inside optimize
        "[V1] ... [MsProfile] [compile_action] optimize costs 13440 msec.",
        "[V1] ... [MsProfile] [compile_action] task_emit costs 2493.96 msec.",
        "unrelated line costs 5 msec."])
    phases = cost_model.parse_phases(log)
    assert phases == pytest.approx({"type_inference": 11.4554, "optimize": 13.44, "task_emit": 2.49396})
    rows = [{"config": "cpu_smoke", "optimizer": "kfac", "batch": 8, "parameters": 29, "first_call_s": 25.0,
             "first_step_s": 0.5, "median_step_s": 0.02, "compile_s": 24.5, "compile_ratio": 10.0, "phases": phases}]
    table = cost_model.compile_markdown(rows)
    assert "| kfac | 11.5 | 13.4 | 2.5 | 27.4 |" in table
    assert "| cpu_smoke | kfac | 8 | 29 | 25.0 | 0.5 | 20.0 | 24.5 | 10.00 |" in table


def test_the_ratios_divide_by_the_faster_of_the_two_momentum_graphs(tmp_path):
    path = cost_model.main(["--models", "tiny-mlp", "--optimizers", "momentum,momentum-cf,kfac-P/P", "--rounds", "1",
                            "--period", "2", "--repeats", "1", "--out", str(tmp_path)])
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    (row,) = result["rows"]                               # the baselines get no row of their own
    medians = row["baseline_medians_s"]
    assert set(medians) == {"momentum", "momentum-cf"} and all(t > 0 for t in medians.values())
    assert row["baseline"] == min(medians, key=medians.get)
    assert row["momentum_median_s"] == min(medians.values())
    assert row["amortised_ratio"] == pytest.approx(row["amortised_s"] / min(medians.values()))
    other = "momentum" if row["baseline"] == "momentum-cf" else "momentum-cf"
    assert f"({row['baseline']}; {other} " in result["markdown"]


def test_the_optimizers_must_start_with_a_baseline():
    with pytest.raises(SystemExit, match="must start with one of"):
        cost_model.main(["--models", "tiny-mlp", "--optimizers", "kfac,momentum", "--out", ""])


def test_the_capture_floor_trains_the_captured_network_with_momentum():
    """``momentum+capture`` compiles nn.Momentum over the zoo network with K-FAC's capture attached and
    every capture flag set (built here, not compiled)."""
    import sys
    from mindspore import nn
    from mindspore_ngd.capture import current_capture
    cost_model.compile_times((), config="cpu_smoke")          # puts the model zoo on the path
    import benchmark as zoo_benchmark
    cell = cost_model._zoo_cell(zoo_benchmark, "cpu_smoke", cost_model.CAPTURE_FLOOR, 8, 2)
    assert type(cell.optimizer) is nn.Momentum
    captures = [current_capture(c) for _, c in cell.network.cells_and_names() if current_capture(c) is not None]
    assert len(captures) == 10                                # cpu_smoke's convolutions and its Dense
    assert all(bool(c.capture_a.asnumpy()) and bool(c.capture_g.asnumpy()) for c in captures)
    assert {p.name for p in cell.optimizer.parameters} == {p.name for p in cell.network.trainable_params()}
    assert "model_zoo" in " ".join(sys.path)
    with pytest.raises(SystemExit, match="must be among"):
        cost_model.main(["--compile", "--optimizers", "momentum+lean", "--out", ""])
