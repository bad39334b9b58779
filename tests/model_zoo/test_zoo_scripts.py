"""The launch scripts (scripts/*.sh, linked from model_zoo/resnet50/scripts/): usage and help, the
commands they build (dry run), and train.py's config errors without a traceback."""
import json
import os

import pytest

from zoo import SCRIPTS, SCRIPT_NAMES, ZOO, run_script


@pytest.mark.parametrize("script,args,message", [
    ("run_standalone_train.sh", [], "expected CONFIG and DATA_PATH"),
    ("run_standalone_train.sh", ["no_such_config", "synthetic"], "CONFIG 'no_such_config' is neither"),
    ("run_standalone_train.sh", ["cpu_smoke", "/no/such/data"], "DATA_PATH '/no/such/data' does not exist"),
    ("run_distribute_train.sh", ["cpu_smoke", "synthetic"], "expected DEVICE_NUM, CONFIG and DATA_PATH"),
    ("run_distribute_train.sh", ["two", "cpu_smoke", "synthetic"], "DEVICE_NUM must be a positive integer"),
    ("run_distribute_train_ascend.sh", ["/no/table.json", "cpu_smoke", "synthetic"], "is not a file"),
    ("run_distribute_train_gpu.sh", ["0", "cpu_smoke", "synthetic"], "DEVICE_NUM must be a positive integer"),
    ("run_eval.sh", ["cpu_smoke", "synthetic"], "expected CONFIG, DATA_PATH and CHECKPOINT"),
    ("run_eval.sh", ["cpu_smoke", "synthetic", "/no/such.ckpt"], "CHECKPOINT '/no/such.ckpt' is not a file"),
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


def test_launch_commands_pass_extra_arguments_through(tmp_path):
    smoke = os.path.join(ZOO, "configs", "cpu_smoke.yaml")
    train = os.path.join(ZOO, "train.py")
    out = run_script("run_distribute_train.sh", "2", "cpu_smoke", "synthetic", "--optimizer", "thor", "--set", "a b=1",
                     env={"DRY_RUN": "1", "MASTER_PORT": "8123", "LOG_DIR": "logs"}).stdout
    assert out.split() == ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_port=8123",
                           "--log_dir=logs", "--join=True", train, "--config", smoke, "--data_path", "synthetic",
                           "--optimizer", "thor", "--set", "a\\", "b=1"]
    out = run_script("run_distribute_train_gpu.sh", "4", "cpu_smoke", "synthetic", "--epoch_size", "1",
                     env={"DRY_RUN": "1"}).stdout
    assert out.split()[:3] == ["mpirun", "-n", "4"] and out.split()[-4:] == ["--device_target", "GPU", "--epoch_size", "1"]
    table = tmp_path / "rank_table.json"
    table.write_text(json.dumps({"server_list": [{"device": [{"device_id": str(i), "rank_id": str(i)} for i in range(3)]}]}))
    lines = run_script("run_distribute_train_ascend.sh", str(table), "cpu_smoke", "synthetic", "--epoch_size", "1",
                       env={"DRY_RUN": "1", "DEVICE_START": "4"}).stdout.splitlines()
    assert len(lines) == 3 and lines[2].split()[:4] == ["env", "DEVICE_ID=6", "RANK_ID=2", "RANK_SIZE=3"]
    assert lines[0].split()[-4:] == ["--device_target", "Ascend", "--epoch_size", "1"]
    (tmp_path / "bad.json").write_text("[")
    assert "is not a JSON rank table" in run_script("run_distribute_train_ascend.sh", str(tmp_path / "bad.json"),
                                                    "cpu_smoke", "synthetic").stderr


def test_train_py_reports_config_errors_without_a_traceback(tmp_path):
    result = run_script("run_standalone_train.sh", "cpu_smoke", "synthetic", "--set", "kfac.dampng=0.1",
                        "--output_dir", str(tmp_path))
    assert result.returncode == 2
    assert "train.py: error: optimizer section 'kfac'" in result.stderr and "unknown key 'dampng'" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_script("run_standalone_train.sh", "cpu_smoke", "synthetic", "--batch_sise", "3")
    assert result.returncode == 2 and "unrecognized arguments: --batch_sise" in result.stderr
