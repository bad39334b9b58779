"""The launch scripts (scripts/*.sh, linked from model_zoo/resnet50/scripts/): usage and help, the
commands they build (dry run) with the argument order of MindSpore's models repository
(official/cv/ResNet), and train.py's config errors without a traceback."""
import json
import os

import pytest

from zoo import SCRIPTS, SCRIPT_NAMES, ZOO, run_script


@pytest.mark.parametrize("script,args,message", [
    ("run_standalone_train.sh", [], "expected DATASET_PATH and CONFIG_PATH"),
    ("run_standalone_train.sh", ["synthetic", "no_such_config"], "CONFIG 'no_such_config' is neither"),
    ("run_standalone_train.sh", ["/no/such/data", "cpu_smoke"], "DATA_PATH '/no/such/data' does not exist"),
    ("run_standalone_train.sh", ["synthetic", "cpu_smoke", "/no/such.ckpt"], "RESUME_CKPT '/no/such.ckpt' is not a file"),
    ("run_standalone_train.sh", ["synthetic", "cpu_smoke", "True"], "must be followed by EVAL_DATASET_PATH"),
    ("run_distribute_train.sh", ["synthetic", "cpu_smoke"], "expected RANK_TABLE_FILE, DATASET_PATH and CONFIG_PATH"),
    ("run_distribute_train.sh", ["/no/table.json", "synthetic", "cpu_smoke"], "is not a file"),
    ("run_distribute_train_msrun.sh", ["synthetic", "cpu_smoke"], "expected DEVICE_NUM, DATASET_PATH and CONFIG_PATH"),
    ("run_distribute_train_msrun.sh", ["two", "synthetic", "cpu_smoke"], "DEVICE_NUM must be a positive integer"),
    ("run_distribute_train_gpu.sh", ["synthetic"], "expected DATASET_PATH and CONFIG_PATH"),
    ("run_eval.sh", ["synthetic", "/no/such.ckpt"], "expected DATASET_PATH, CHECKPOINT_PATH and CONFIG_PATH"),
    ("run_eval.sh", ["synthetic", "/no/such.ckpt", "cpu_smoke"], "CHECKPOINT_PATH '/no/such.ckpt' is not a file"),
])
def test_scripts_print_usage_on_bad_arguments(script, args, message):
    result = run_script(script, *args)
    assert result.returncode == 2, result
    assert message in result.stderr and f"Usage: bash scripts/{script}" in result.stderr


def test_scripts_help_and_model_zoo_links():
    for name in SCRIPT_NAMES:
        result = run_script(name, "--help")
        assert result.returncode == 0 and result.stdout.startswith(f"Usage: bash scripts/{name}")
        link = os.path.join(ZOO, "scripts", name)
        assert os.path.realpath(link) == os.path.join(SCRIPTS, name)      # one implementation


def test_launch_commands_take_the_models_repository_argument_order(tmp_path):
    """DATASET_PATH before CONFIG_PATH everywhere, then RESUME_CKPT or RUN_EVAL EVAL_DATASET_PATH, then
    train.py options passed through; train.py gets the models repository's flag names."""
    smoke = os.path.join(ZOO, "configs", "cpu_smoke.yaml")
    train = os.path.join(ZOO, "train.py")
    ckpt = tmp_path / "resnet-1_4.ckpt"
    ckpt.write_bytes(b"")
    out = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", str(ckpt), "--epoch_size", "3",
                     env={"DRY_RUN": "1", "PYTHON": "python"}).stdout
    assert out.split() == ["python", train, "--data_path", "synthetic", "--config_path", smoke,
                           "--resume_ckpt", str(ckpt), "--epoch_size", "3"]
    out = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "True", "synthetic",
                     env={"DRY_RUN": "1", "PYTHON": "python"}).stdout
    assert out.split()[-4:] == ["--run_eval", "True", "--eval_dataset_path", "synthetic"]
    out = run_script("run_distribute_train_msrun.sh", "2", "synthetic", "cpu_smoke", "--optimizer", "thor",
                     "--set", "a b=1", env={"DRY_RUN": "1", "MASTER_PORT": "8123", "LOG_DIR": "logs"}).stdout
    assert out.split() == ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_port=8123",
                           "--log_dir=logs", "--join=True", train, "--data_path", "synthetic", "--config_path", smoke,
                           "--optimizer", "thor", "--set", "a\\", "b=1"]
    out = run_script("run_distribute_train_gpu.sh", "synthetic", "cpu_smoke", "--epoch_size", "1",
                     env={"DRY_RUN": "1", "RANK_SIZE": "4"}).stdout
    assert out.split()[:3] == ["mpirun", "-n", "4"] and out.split()[-4:] == ["--device_target", "GPU", "--epoch_size", "1"]
    assert run_script("run_distribute_train_gpu.sh", "synthetic", "cpu_smoke",
                      env={"DRY_RUN": "1"}).stdout.split()[:3] == ["mpirun", "-n", "8"]   # the repository's 8 GPUs
    table = tmp_path / "rank_table.json"
    table.write_text(json.dumps({"server_list": [{"device": [{"device_id": str(i), "rank_id": str(i)} for i in range(3)]}]}))
    lines = run_script("run_distribute_train.sh", str(table), "synthetic", "cpu_smoke", str(ckpt), "--epoch_size", "1",
                       env={"DRY_RUN": "1", "DEVICE_START": "4"}).stdout.splitlines()
    assert len(lines) == 3 and lines[2].split()[:4] == ["env", "DEVICE_ID=6", "RANK_ID=2", "RANK_SIZE=3"]
    assert lines[0].split()[-8:] == ["--config_path", smoke, "--resume_ckpt", str(ckpt),
                                     "--device_target", "Ascend", "--epoch_size", "1"]
    (tmp_path / "bad.json").write_text("[")
    assert "is not a JSON rank table" in run_script("run_distribute_train.sh", str(tmp_path / "bad.json"),
                                                    "synthetic", "cpu_smoke").stderr
    out = run_script("run_eval.sh", "synthetic", str(ckpt), "cpu_smoke", env={"DRY_RUN": "1", "PYTHON": "python"}).stdout
    assert out.split() == ["python", os.path.join(ZOO, "eval.py"), "--data_path", "synthetic",
                           "--checkpoint_file_path", str(ckpt), "--config_path", smoke]


def test_train_py_reports_config_errors_without_a_traceback(tmp_path):
    result = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "--set", "kfac.dampng=0.1",
                        "--output_dir", str(tmp_path))
    assert result.returncode == 2
    assert "train.py: error: optimizer section 'kfac'" in result.stderr and "unknown key 'dampng'" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_script("run_standalone_train.sh", "synthetic", "cpu_smoke", "--batch_sise", "3")
    assert result.returncode == 2 and "unrecognized arguments: --batch_sise" in result.stderr
