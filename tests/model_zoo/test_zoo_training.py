"""End to end on the cpu_smoke config through the launch scripts: standalone training with every
optimizer, bit-identical resume, evaluation of a checkpoint, two msrun workers, and (slow) the
ResNet-50 ImageNet config on tiny synthetic images."""
import glob
import json
import os

import numpy as np
import pytest

import mindspore as ms

from zoo import run_script


def _train(output_dir, optimizer, *extra):
    result = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "--optimizer", optimizer,
                        "--output_dir", str(output_dir), *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _checkpoint(output_dir, epoch, rank=0):
    paths = glob.glob(os.path.join(str(output_dir), f"ckpt_{rank}", f"resnet-{epoch}_*.ckpt"))
    assert len(paths) == 1, os.listdir(os.path.join(str(output_dir), f"ckpt_{rank}"))
    return paths[0]


@pytest.fixture(scope="module")
def kfac_run(tmp_path_factory):
    """cpu_smoke with K-FAC for 2 epochs, a checkpoint after each."""
    output_dir = tmp_path_factory.mktemp("kfac_smoke")
    result = _train(output_dir, "kfac")
    return output_dir, result


def _summary(output_dir, rank=0):
    with open(os.path.join(str(output_dir), f"summary_rank{rank}.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _losses(stdout):
    return [float(line.rsplit(" ", 1)[1]) for line in stdout.splitlines() if ", loss is " in line]


def _check_trained(output_dir, stdout, optimizer):
    summary = _summary(output_dir)
    assert summary["optimizer"] == optimizer and summary["steps_per_epoch"] == 4
    assert [e["epoch"] for e in summary["eval"]] == [1, 2]
    assert summary["throughput"]["images_per_s"] > 0
    losses = _losses(stdout)
    assert len(losses) == 8 and all(np.isfinite(losses)) and np.mean(losses[-4:]) < np.mean(losses[:4])
    _checkpoint(output_dir, 1), _checkpoint(output_dir, 2)


def test_standalone_script_trains_kfac(kfac_run):
    output_dir, result = kfac_run
    _check_trained(output_dir, result.stdout, "kfac")


@pytest.mark.parametrize("optimizer", ["momentum", pytest.param("thor", marks=pytest.mark.slow),
                                       pytest.param("spngd", marks=pytest.mark.slow)])
def test_standalone_script_trains_each_optimizer(tmp_path, optimizer):
    result = _train(tmp_path, optimizer)
    _check_trained(tmp_path, result.stdout, optimizer)


def test_resume_continues_with_bit_identical_weights(kfac_run, tmp_path):
    """Resuming from the epoch-1 checkpoint gives exactly the continuous run's epoch-2 state.

    Bit-identical, not just close: the synthetic data come in the same order every epoch, every piece
    of state (weights, BatchNorm statistics, momenta, Kronecker factors and inverses, step counter,
    capture flags) is in the checkpoint and is loaded before the first compile, and the CPU kernels
    are deterministic for identical inputs. Only ``step_num`` (steps run by *this* process) differs.
    """
    output_dir, _ = kfac_run
    result = _train(tmp_path, "kfac", "--resume_ckpt", _checkpoint(output_dir, 1))
    assert "resumed from" in result.stdout and "epoch 1, step 4" in result.stdout
    assert len(_losses(result.stdout)) == 4                       # epoch 2 only
    continuous = ms.load_checkpoint(_checkpoint(output_dir, 2))
    resumed = ms.load_checkpoint(_checkpoint(tmp_path, 2))
    assert set(continuous) == set(resumed)
    compared = 0
    for name, value in continuous.items():
        if name == "step_num":
            continue
        np.testing.assert_array_equal(resumed[name].asnumpy(), value.asnumpy(), err_msg=name)
        compared += 1
    assert compared > 100 and any(name.startswith("kfac.") and name.endswith(".A_inv") for name in continuous)


def test_lean_step_trains_to_the_same_checkpoint(kfac_run, tmp_path):
    """``--lean_step true``: K-FAC's steps that capture nothing (every other one in cpu_smoke) run the
    lean graph of NGDTrainOneStepCell; the epoch-2 checkpoint is the plain run's, bit for bit."""
    output_dir, plain = kfac_run
    result = _train(tmp_path, "kfac", "--lean_step", "true")
    _check_trained(tmp_path, result.stdout, "kfac")
    assert _losses(result.stdout) == _losses(plain.stdout)
    expected = ms.load_checkpoint(_checkpoint(output_dir, 2))
    actual = ms.load_checkpoint(_checkpoint(tmp_path, 2))
    assert set(expected) == set(actual)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name].asnumpy(), value.asnumpy(), err_msg=name)
    refused = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "--optimizer", "momentum",
                         "--lean_step", "true", "--output_dir", str(tmp_path / "momentum"))
    assert refused.returncode != 0 and "lean_step: true needs a natural-gradient optimizer" in refused.stderr


def test_fisher_mc_trains_through_the_monte_carlo_step(tmp_path):
    """An optimizer section with ``fisher: mc`` trains through ``mindspore_ngd.MCFisherTrainStep`` (a plain
    ``Model`` would stop at its first step with the optimizer's RuntimeError), evaluates and checkpoints; a
    setting the step cannot honour is refused with the key to change, before anything compiles."""
    result = _train(tmp_path, "kfac", "--set", "kfac.fisher=mc")
    _check_trained(tmp_path, result.stdout, "kfac")
    refused = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "--optimizer", "kfac", "--set",
                         "kfac.fisher=mc", "--amp_level", "O2", "--output_dir", str(tmp_path / "o2"))
    assert refused.returncode != 0 and "fisher: mc trains in float32" in refused.stderr, refused.stderr[-2000:]
    assert "loss is" not in refused.stdout


def test_pre_trained_starts_from_the_network_weights(kfac_run, tmp_path):
    """--pre_trained (models repository): network weights from a checkpoint, a classifier of another
    class_num keeps its initial values, the optimizer and step counter start fresh; with --resume_ckpt
    it is refused."""
    output_dir, _ = kfac_run
    result = _train(tmp_path, "momentum", "--pre_trained", _checkpoint(output_dir, 2), "--class_num", "5",
                    "--epoch_size", "1", "--run_eval", "false")
    assert "network weights from" in result.stdout and "kept the initial values of ['fc.weight', 'fc.bias']" in result.stdout
    both = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", _checkpoint(output_dir, 1),
                      "--pre_trained", _checkpoint(output_dir, 2))
    assert both.returncode == 2 and "not both" in both.stderr


def test_eval_reads_the_checkpoint(kfac_run, tmp_path):
    output_dir, _ = kfac_run
    result_json = tmp_path / "result.json"
    result = run_script("run_eval.sh", "synthetic", _checkpoint(output_dir, 2), "cpu_smoke",
                        "--result_json", str(result_json))
    assert result.returncode == 0, result.stderr[-3000:]
    line = [line for line in result.stdout.splitlines() if line.startswith("result: ")][-1]
    metrics = json.loads(line[len("result: "):])
    assert metrics == json.loads(result_json.read_text())
    assert 0.0 <= metrics["top_1_accuracy"] <= metrics["top_5_accuracy"] <= 1.0
    deeper = run_script("run_eval.sh", "synthetic", _checkpoint(output_dir, 2), "resnet_cifar10_kfac")
    assert deeper.returncode == 2 and "lacks" in deeper.stderr and "same config" in deeper.stderr
    wider = run_script("run_eval.sh", "synthetic", _checkpoint(output_dir, 2), "cpu_smoke",
                       "--set", "net_options.width=16")
    assert wider.returncode == 2 and "has parameters of other shapes" in wider.stderr


# slow since issue 11/12 grew the default suite: tests/distributed covers 2-rank training
@pytest.mark.slow
@pytest.mark.distributed
def test_distributed_script_trains_kfac_on_two_workers(tmp_path):
    """msrun with 2 CPU workers: both ranks train on their shard, K-FAC reduces the factors to their
    owners and gathers the preconditioned gradients, so every trainable weight (and momentum) is the
    same on both ranks; both write checkpoints and eval reads one. (BatchNorm moving statistics are
    per rank: each normalises its own shard.)"""
    result = run_script("run_distribute_train_msrun.sh", "2", "synthetic", "cpu_smoke", "--optimizer", "kfac",
                        "--epoch_size", "1", "--eval_interval", "0", "--output_dir", str(tmp_path / "out"),
                        env={"LOG_DIR": str(tmp_path / "logs")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        summary = _summary(tmp_path / "out", rank)
        assert summary["group_size"] == 2 and summary["rank"] == rank and summary["steps_per_epoch"] == 4
        _checkpoint(tmp_path / "out", 1, rank)
    ranks = [ms.load_checkpoint(_checkpoint(tmp_path / "out", 1, rank)) for rank in (0, 1)]
    shared = [k for k in ranks[0] if k.endswith((".weight", ".bias", ".gamma", ".beta"))]
    assert len(shared) > 10
    for key in shared:
        np.testing.assert_array_equal(ranks[0][key].asnumpy(), ranks[1][key].asnumpy(), err_msg=key)
    evaluated = run_script("run_eval.sh", "synthetic", _checkpoint(tmp_path / "out", 1, rank=1), "cpu_smoke")
    assert evaluated.returncode == 0 and "top_1_accuracy" in evaluated.stdout


@pytest.mark.slow
def test_resnet50_imagenet_config_trains_and_evaluates_on_synthetic_data(tmp_path):
    """The ImageNet Momentum config with ResNet-50 itself, shrunk to 32x32 synthetic images on CPU.

    (ResNet-50 with THOR also runs this way, but its first epoch takes ~3 minutes and ~12 GB here.)
    """
    shrink = ["--device_target", "CPU", "--amp_level", "O0", "--image_size", "32", "--batch_size", "2",
              "--eval_batch_size", "2", "--synthetic_size", "4", "--synthetic_eval_size", "4", "--epoch_size", "2",
              "--num_parallel_workers", "1"]
    result = run_script("run_standalone_train.sh", "synthetic", "resnet50_imagenet2012_momentum_8p", *shrink,
                        "--run_eval", "True", "--eval_interval", "1", "--eval_start_epoch", "1", "--save_checkpoint_epochs", "1",
                        "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _summary(tmp_path)
    assert summary["steps_per_epoch"] == 2 and [e["epoch"] for e in summary["eval"]] == [1, 2]
    assert "the config's hyper-parameters are for device_num=8 (global batch 16)" in result.stdout
    evaluated = run_script("run_eval.sh", "synthetic", _checkpoint(tmp_path, 2), "resnet50_imagenet2012_momentum_8p",
                           *shrink)
    assert evaluated.returncode == 0 and "top_5_accuracy" in evaluated.stdout, evaluated.stderr[-2000:]
