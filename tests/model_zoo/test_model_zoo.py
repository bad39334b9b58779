"""model_zoo/resnet50: network, schedules against the published formulas, config validation, data
pipelines, launch scripts, and end-to-end training / resume / evaluation on the cpu_smoke config."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import mindspore_ngd

# the model zoo reads YAML configs: pyyaml comes with the "model_zoo" and "test" extras of setup.py
pytest.importorskip("yaml", reason="model zoo tests need pyyaml (pip install -e '.[test]')")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = os.path.join(REPO, "model_zoo", "resnet50")
SCRIPTS = os.path.join(REPO, "scripts")
sys.path.insert(0, ZOO)

from src import config as zoo_config  # noqa: E402
from src import dataset as zoo_data  # noqa: E402
from src import optimizer as zoo_opt  # noqa: E402
from src import schedules  # noqa: E402
from src.resnet import build_network, resnet50  # noqa: E402

SCRIPT_NAMES = ("run_standalone_train.sh", "run_distribute_train.sh", "run_distribute_train_ascend.sh",
                "run_distribute_train_gpu.sh", "run_eval.sh")


# --------------------------------------------------------------------------- network
def test_resnet50_has_the_published_parameter_count_and_v15_strides():
    net = resnet50(num_classes=1000)
    assert sum(p.size for p in net.trainable_params()) == 25_557_032
    first = net.layer2[0]               # the down-sampling bottleneck of stage 2
    assert first.conv1.stride == (1, 1) and first.conv1.kernel_size == (1, 1)
    assert first.conv2.stride == (2, 2) and first.conv2.kernel_size == (3, 3)   # v1.5: stride on the 3x3
    assert first.projection[0].stride == (2, 2)
    assert net.layer1[0].conv2.stride == (1, 1)


def test_zero_init_residual_zeroes_the_last_batchnorm_gamma_of_every_bottleneck():
    net = resnet50(num_classes=10, zero_init_residual=True)
    gammas = {p.name: p.asnumpy() for p in net.trainable_params() if p.name.endswith("bn3.gamma")}
    assert len(gammas) == 16 and all(not g.any() for g in gammas.values())
    assert resnet50(num_classes=10).layer1[0].bn3.gamma.asnumpy().all()


def test_resnet50_forward_shape_on_a_small_input():
    ms.set_seed(0)
    net = resnet50(num_classes=1000)
    net.set_train(False)
    out = net(Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)))
    assert out.shape == (2, 1000) and np.isfinite(out.asnumpy()).all()


def test_build_network_rejects_unknown_names_and_options():
    assert build_network("resnet_cifar", 10, {"blocks_per_stage": 1, "width": 4}) is not None
    with pytest.raises(ValueError, match="unknown net 'resnet18'"):
        build_network("resnet18", 10)
    with pytest.raises(ValueError, match="depth"):
        build_network("resnet50", 10, {"depth": 101})


# --------------------------------------------------------------------------- schedules
SPE = 5004   # steps per ImageNet epoch at 8 x 32


def _steps_at(epochs):
    return [int(round(e * SPE)) - 1 for e in epochs]   # the step that finishes epoch e


def test_thor_lr_reproduces_the_model_zoo_formula_with_its_decay_epochs():
    # get_thor_lr(0, lr_init, lr_decay, lr_end_epoch, steps, decay_epochs=39) of the model zoo:
    # epoch = (i + 1) / steps; lr = lr_init (1 - epoch / lr_end_epoch) ** lr_decay, x0.5 from epoch 39, x0.5 from 40
    values = schedules.build_schedule("lr", "thor", {"lr_init": 0.05803, "lr_decay": 4.0839, "lr_end_epoch": 53,
                                                     "lr_halve_epoch": 39}, SPE, 45)
    for i in _steps_at([1, 10, 38.5, 39, 39.5, 40, 45]) + [0]:
        epoch = (i + 1) / SPE
        expected = 0.05803 * (1 - epoch / 53) ** 4.0839 * (0.5 if epoch >= 39 else 1) * (0.5 if epoch >= 40 else 1)
        assert values[i] == pytest.approx(expected, rel=1e-6), (i, epoch)
    assert values[0] == pytest.approx(0.0580291, rel=1e-5)
    assert values[_steps_at([39])[0]] / values[_steps_at([39])[0] - 1] == pytest.approx(0.5, rel=1e-3)
    # the package's thor_lr is the formula without the halving
    plain = schedules.build_schedule("lr", "thor", {"lr_init": 0.05803, "lr_decay": 4.0839, "lr_end_epoch": 53}, SPE, 45)
    np.testing.assert_array_equal(plain, mindspore_ngd.schedule.thor.thor_lr(0.05803, 4.0839, 53, SPE, 45))


def test_thor_damping_reproduces_the_model_zoo_formula():
    values = schedules.build_schedule("damping", "thor", {"damping_init": 0.03, "damping_decay": 0.50036}, SPE, 45)
    for i in _steps_at([1, 10, 20, 45]):
        epoch = (i + 1) / SPE
        assert values[i] == pytest.approx(0.03 * 0.50036 ** (epoch / 10), rel=1e-6)
    assert values[_steps_at([10])[0]] == pytest.approx(0.03 * 0.50036, rel=1e-6)


def test_linear_lr_reproduces_the_model_zoo_resnet_schedule():
    # model zoo lr_generator._generate_liner_lr(lr_init=0, lr_end=0, lr_max=0.8, warmup 2 epochs, 90 epochs)
    spe, epochs = 626, 90
    values = schedules.build_schedule("lr", "linear", {"lr_init": 0.0, "lr_max": 0.8, "lr_end": 0.0,
                                                       "warmup_epochs": 2}, spe, epochs)
    total, warmup = spe * epochs, 2 * spe
    for i in (0, 1, warmup - 1, warmup, total // 2, total - 1):
        expected = 0.8 * i / warmup if i < warmup else 0.8 - 0.8 * (i - warmup) / (total - warmup)
        assert values[i] == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_step_lr_reproduces_the_kaisa_recipe():
    # kfac-pytorch: warm-up 0.0125 -> 0.1 over 5 epochs, x0.1 at the start of epochs 25, 35, 40, 45, 50
    params = {"lr_init": 0.0125, "lr_max": 0.1, "warmup_epochs": 5, "lr_milestones": [25, 35, 40, 45, 50]}
    values = schedules.build_schedule("lr", "step", params, 10, 55)
    at = {epoch: values[epoch * 10] for epoch in (0, 5, 24, 25, 34, 35, 40, 45, 50, 54)}
    assert at[0] == pytest.approx(0.0125) and values[25] == pytest.approx(0.0125 + 0.0875 * 0.5)
    assert at[5] == at[24] == pytest.approx(0.1)
    assert at[25] == at[34] == pytest.approx(0.01)
    assert at[35] == pytest.approx(1e-3) and at[40] == pytest.approx(1e-4)
    assert at[45] == pytest.approx(1e-5) and at[50] == at[54] == pytest.approx(1e-6)


def test_polynomial_lr_reproduces_chainerkfac():
    # chainerkfac LrPolynomialDecay(ref_lr, epoch_start, epoch_end=max(epochs, polynomial_epoch), p), epoch = i / steps
    spe, epochs = 100, 46
    values = schedules.build_schedule("lr", "polynomial", {"lr_max": 0.03, "lr_decay_start_epoch": 1.5,
                                                           "lr_power": 3.5, "lr_end_epoch": 49.5}, spe, epochs)
    for epoch in (0, 1.49, 1.5, 10, 30, 45.99):
        i = int(round(epoch * spe))
        e = i / spe
        expected = 0.03 if e < 1.5 else 0.03 * (1 - (e - 1.5) / (49.5 - 1.5)) ** 3.5
        assert values[i] == pytest.approx(expected, rel=1e-6)


def test_cosine_and_constant_schedules():
    values = schedules.build_schedule("lr", "cosine", {"lr_max": 0.1, "lr_end": 0.001, "warmup_epochs": 1}, 10, 11)
    assert values[0] == 0.0 and values[10] == pytest.approx(0.1)
    assert values[60] == pytest.approx(0.001 + 0.099 * 0.5, rel=1e-5) 
    assert values[-1] == pytest.approx(0.001 + 0.099 * 0.5 * (1 + np.cos(np.pi * 99 / 100)), rel=1e-5)
    np.testing.assert_array_equal(schedules.build_schedule("damping", "constant", {"damping": 0.5}, 3, 2),
                                  np.full(6, 0.5, np.float32))
    step = schedules.build_schedule("damping", "step", {"damping": 0.1, "damping_milestones": [1]}, 2, 2)
    np.testing.assert_allclose(step, [0.1, 0.1, 0.05, 0.05])


@pytest.mark.parametrize("kind,name,params,match", [
    ("lr", "cosine", {"lr_max": 0.1, "lr_decay": 4}, r"\['lr_decay'\] are not keys of lr_schedule 'cosine'"),
    ("lr", "thor", {"lr_init": 0.1}, r"needs the keys \['lr_decay', 'lr_end_epoch'\]"),
    ("lr", "exp", {}, "unknown lr_schedule 'exp'"),
    ("lr", "constant", {"lr_init": "fast"}, "'lr_init' must be a finite number"),
    ("lr", "step", {"lr_max": 0.1, "lr_milestones": 30}, "must be a list of epochs"),
    ("lr", "thor", {"lr_init": 0.1, "lr_decay": 4, "lr_end_epoch": 2}, "lr_end_epoch must exceed total_epochs"),
])
def test_schedule_errors_name_the_key(kind, name, params, match):
    with pytest.raises(ValueError, match=match):
        schedules.build_schedule(kind, name, params, 10, 5)


# --------------------------------------------------------------------------- config validation
def _smoke(**changes):
    config = zoo_config.load_config("cpu_smoke")
    config.update(changes)
    return config


def _write_config(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_unknown_top_level_key_is_an_error_naming_it(tmp_path):
    path = _write_config(tmp_path, "net: resnet50\noptimizer: momentum\nmomentum: {lr_init: 0.1, momentum: 0.9}\n"
                                   "bacth_size: 32\n")
    with pytest.raises(zoo_config.ConfigError, match="unknown config key 'bacth_size'"):
        zoo_config.load_config(path)


def test_top_level_types_and_choices_are_checked(tmp_path):
    base = "optimizer: momentum\nmomentum: {lr_init: 0.1, momentum: 0.9}\n"
    with pytest.raises(zoo_config.ConfigError, match="'batch_size' must be of type int"):
        zoo_config.load_config(_write_config(tmp_path, base + "batch_size: 3.5\n"))
    with pytest.raises(zoo_config.ConfigError, match="'device_target' must be one of"):
        zoo_config.load_config(_write_config(tmp_path, base + "device_target: TPU\n"))
    with pytest.raises(zoo_config.ConfigError, match="has no 'kfac' section"):
        zoo_config.load_config(_write_config(tmp_path, base + "optimizer: kfac\n"))
    assert zoo_config.load_config(_write_config(tmp_path, base + "loss_scale: 128\n"))["loss_scale"] == 128.0


@pytest.mark.parametrize("section,key,value,match", [
    ("kfac", "dampng", 0.1, r"optimizer section 'kfac' \(mindspore_ngd.optim.kfac.KFAC\): unknown key 'dampng'"),
    ("thor", "factor_update_interval", 5, "unknown key 'factor_update_interval'"),   # a K-FAC argument
    ("kfac", "loss_scale", 8.0, "key 'loss_scale' is set by train.py"),
    ("kfac", "learning_rate", 0.1, "key 'learning_rate' is set by train.py"),
    ("momentum", "damping_schedule", "constant", "Momentum takes no damping"),
    ("momentum", "nesterov", True, "unknown key 'nesterov'"),                         # nn.Momentum's is use_nesterov
    ("kfac", "decay_filter", "biases", "decay_filter must be one of"),
])
def test_unknown_or_reserved_section_keys_are_errors_naming_them(section, key, value, match):
    config = _smoke(optimizer=section)
    config[section] = dict(config[section], **{key: value})
    with pytest.raises(zoo_config.ConfigError, match=match):
        zoo_opt.validate_sections(config)


def test_section_values_are_checked_by_the_constructor():
    config = _smoke(optimizer="kfac")
    config["kfac"] = dict(config["kfac"], damping_split="cube")
    zoo_opt.validate_sections(config)            # names are fine; the value is the constructor's to reject
    net = build_network(config["net"], config["num_classes"], config["net_options"])
    with pytest.raises(zoo_config.ConfigError, match="KFAC rejected its arguments: .*damping_split"):
        zoo_opt.build_optimizer(config, net, 4)


def test_momentum_signature_is_read_through_mindsporess_decorator():
    params = zoo_opt.constructor_parameters(ms.nn.Momentum)
    assert list(params)[:3] == ["params", "learning_rate", "momentum"] and "use_nesterov" in params


def test_factory_builds_each_available_optimizer_with_schedules_and_decay_groups():
    for section, cls in (("momentum", ms.nn.Momentum), ("kfac", mindspore_ngd.KFAC), ("thor", mindspore_ngd.THOR)):
        config = _smoke(optimizer=section)
        net = build_network(config["net"], config["num_classes"], config["net_options"])
        opt, lr, damping = zoo_opt.build_optimizer(config, net, 4, extra={"verbose": False})
        assert isinstance(opt, cls) and lr.shape == (8,)
        assert (damping is None) == (section == "momentum")
    # nn.Momentum gets two groups: weights decayed, BatchNorm/bias not ("matrices", like the model zoo)
    config = _smoke(optimizer="momentum")
    net = build_network(config["net"], config["num_classes"], config["net_options"])
    opt, _, _ = zoo_opt.build_optimizer(config, net, 4)
    decays = dict(zip((p.name for p in opt.parameters), opt.group_weight_decay))
    assert decays["fc.weight"] == decays["stem.weight"] == pytest.approx(5e-4)
    assert decays["fc.bias"] == decays["bn.gamma"] == decays["bn.beta"] == 0


def test_every_shipped_config_validates(monkeypatch):
    paths = sorted(glob.glob(os.path.join(ZOO, "configs", "*.yaml")))
    assert len(paths) >= 11
    for path in paths:
        config = zoo_config.load_config(path)
        zoo_opt.validate_sections(config)


def test_spngd_sections_validate_against_the_constructor():
    for name in ("resnet50_imagenet2012_spngd_bs4k", "resnet50_imagenet2012_spngd_bs32k", "resnet_cifar10_spngd"):
        zoo_opt.validate_sections(zoo_config.load_config(name))
    config = _smoke(optimizer="spngd")
    config["spngd"] = dict(config["spngd"], frequency=10)
    with pytest.raises(zoo_config.ConfigError, match="unknown key 'frequency'"):
        zoo_opt.validate_sections(config)


def test_missing_spngd_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(mindspore_ngd, "SPNGD", raising=False)
    with pytest.raises(zoo_opt.OptimizerUnavailable, match="this mindspore_ngd has no SPNGD"):
        zoo_opt.validate_sections(_smoke(optimizer="spngd"))
    assert zoo_opt.validate_sections(_smoke(optimizer="kfac")) == ["spngd"]   # unselected: skipped


def test_command_line_overrides():
    import argparse
    parser = zoo_config.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--config", "cpu_smoke", "--batch_size", "4", "--optimizer", "thor",
                              "--set", "thor.frequency=3", "--set", "net_options.width=4", "--data_path", "123"])
    config = zoo_config.config_from_args(args)
    assert config["batch_size"] == 4 and config["thor"]["frequency"] == 3 and config["net_options"]["width"] == 4
    assert config["data_path"] == "123"
    with pytest.raises(zoo_config.ConfigError, match="'nope' is not a section"):
        zoo_config.config_from_args(parser.parse_args(["--config", "cpu_smoke", "--set", "nope.x=1"]))
    with pytest.raises(zoo_config.ConfigError, match="neither a file nor one of"):
        zoo_config.load_config("no_such_config")


# --------------------------------------------------------------------------- data
def _data_config(**changes):
    return _smoke(num_parallel_workers=1, **changes)


def _batches(data):
    return list(data.create_tuple_iterator(output_numpy=True))


def test_missing_and_malformed_dataset_paths_are_clear_errors(tmp_path):
    with pytest.raises(zoo_data.DatasetError, match="does not exist"):
        zoo_data.create_dataset(_data_config(data_path=str(tmp_path / "nowhere")))
    with pytest.raises(zoo_data.DatasetError, match="no data path"):
        zoo_data.create_dataset(_data_config(data_path=""))
    (tmp_path / "empty").mkdir()
    with pytest.raises(zoo_data.DatasetError, match="no class sub-folders"):
        zoo_data.create_dataset(_data_config(dataset="imagenet2012", data_path=str(tmp_path / "empty")))
    with pytest.raises(zoo_data.DatasetError, match=r"lacks \['data_batch_1.bin'"):
        zoo_data.create_dataset(_data_config(dataset="cifar10", data_path=str(tmp_path / "empty")))
    bad = tmp_path / "badcifar"
    bad.mkdir()
    for name in zoo_data.CIFAR_TRAIN_FILES + zoo_data.CIFAR_TEST_FILES:
        (bad / name).write_bytes(b"\0" * 1000)
    with pytest.raises(zoo_data.DatasetError, match="has 1000 bytes, expected 10000 records of 3073 bytes"):
        zoo_data.create_dataset(_data_config(dataset="cifar10", data_path=str(bad)))


def test_imagenet_folder_pipeline(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("n01440764", "n01443537"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for k in range(2):
                Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(folder / f"{cls}_{k}.JPEG")
    config = _data_config(dataset="imagenet2012", data_path=str(tmp_path), image_size=32, batch_size=2,
                          eval_batch_size=3)
    train = _batches(zoo_data.create_dataset(config, training=True))
    assert len(train) == 2 and train[0][0].shape == (2, 3, 32, 32) and train[0][1].dtype == np.int32
    evaluation = _batches(zoo_data.create_dataset(config, training=False))
    assert [b[0].shape[0] for b in evaluation] == [3, 1]      # no dropped remainder at evaluation
    shard = zoo_data.create_dataset(config, training=True, rank=1, group_size=2)
    assert shard.get_dataset_size() == 1


def test_cifar10_binary_pipeline(tmp_path):
    # full-size files (Cifar10Dataset reads 10,000 records per file): zero images, labels 0..9
    records = np.zeros((zoo_data.CIFAR_FILE_RECORDS, zoo_data.CIFAR_RECORD), np.uint8)
    records[:, 0] = np.arange(zoo_data.CIFAR_FILE_RECORDS) % 10
    nested = tmp_path / "cifar-10-batches-bin"          # the archive's folder, found from its parent
    nested.mkdir()
    for name in zoo_data.CIFAR_TRAIN_FILES + zoo_data.CIFAR_TEST_FILES:
        (nested / name).write_bytes(records.tobytes())
    config = _data_config(dataset="cifar10", data_path=str(tmp_path), image_size=32, batch_size=8, eval_batch_size=4)
    train = zoo_data.create_dataset(config, training=True)
    assert train.get_dataset_size() == 50000 // 8
    images, labels = next(train.create_tuple_iterator(output_numpy=True))
    assert images.shape == (8, 3, 32, 32) and images.dtype == np.float32 and labels.dtype == np.int32
    evaluation = zoo_data.create_dataset(config, training=False)
    images, labels = next(evaluation.create_tuple_iterator(output_numpy=True))
    assert evaluation.get_dataset_size() == 10000 // 4 and images.shape == (4, 3, 32, 32)
    # no augmentation at evaluation: a zero image normalises to -mean/std in every pixel
    np.testing.assert_allclose(images[0, :, 5, 5], -np.array(zoo_data.CIFAR_MEAN) / np.array(zoo_data.CIFAR_STD),
                               rtol=1e-5)
    np.testing.assert_array_equal(labels, [0, 1, 2, 3])


def test_synthetic_data_is_deterministic_sharded_and_learnable():
    config = _data_config(data_path="synthetic")
    first = _batches(zoo_data.create_dataset(config))
    again = _batches(zoo_data.create_dataset(config))
    assert len(first) == config["synthetic_size"] // config["batch_size"]
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    shards = [_batches(zoo_data.create_dataset(config, rank=r, group_size=2)) for r in range(2)]
    assert [len(s) for s in shards] == [len(first)] * 2           # synthetic_size is per device
    assert not np.array_equal(shards[0][0][0], shards[1][0][0])
    train, evaluation = zoo_data.SyntheticImages(4, 8, 3, split=0), zoo_data.SyntheticImages(4, 8, 3, split=1)
    np.testing.assert_array_equal(train.templates, evaluation.templates)   # same classes, other noise
    assert not np.array_equal(train[0][0], evaluation[0][0])


# --------------------------------------------------------------------------- scripts
def _bash(script, *args, env=None, timeout=600, cwd=None):
    environment = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                          env=environment, timeout=timeout, cwd=cwd)


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
    result = _bash(script, *args)
    assert result.returncode == 2, result
    assert message in result.stderr and f"Usage: bash scripts/{script}" in result.stderr


def test_scripts_help_and_model_zoo_links():
    for name in SCRIPT_NAMES:
        result = _bash(name, "--help")
        assert result.returncode == 0 and result.stdout.startswith(f"Usage: bash scripts/{name}")
        link = os.path.join(ZOO, "scripts", name)
        assert os.path.realpath(link) == os.path.join(SCRIPTS, name)      # one implementation


def test_launch_commands_pass_extra_arguments_through(tmp_path):
    smoke = os.path.join(ZOO, "configs", "cpu_smoke.yaml")
    train = os.path.join(ZOO, "train.py")
    out = _bash("run_distribute_train.sh", "2", "cpu_smoke", "synthetic", "--optimizer", "thor", "--set", "a b=1",
                env={"DRY_RUN": "1", "MASTER_PORT": "8123", "LOG_DIR": "logs"}).stdout
    assert out.split() == ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_port=8123",
                           "--log_dir=logs", "--join=True", train, "--config", smoke, "--data_path", "synthetic",
                           "--optimizer", "thor", "--set", "a\\", "b=1"]
    out = _bash("run_distribute_train_gpu.sh", "4", "cpu_smoke", "synthetic", "--epoch_size", "1",
                env={"DRY_RUN": "1"}).stdout
    assert out.split()[:3] == ["mpirun", "-n", "4"] and out.split()[-4:] == ["--device_target", "GPU", "--epoch_size", "1"]
    table = tmp_path / "rank_table.json"
    table.write_text(json.dumps({"server_list": [{"device": [{"device_id": str(i), "rank_id": str(i)} for i in range(3)]}]}))
    lines = _bash("run_distribute_train_ascend.sh", str(table), "cpu_smoke", "synthetic", "--epoch_size", "1",
                  env={"DRY_RUN": "1", "DEVICE_START": "4"}).stdout.splitlines()
    assert len(lines) == 3 and lines[2].split()[:4] == ["env", "DEVICE_ID=6", "RANK_ID=2", "RANK_SIZE=3"]
    assert lines[0].split()[-4:] == ["--device_target", "Ascend", "--epoch_size", "1"]
    (tmp_path / "bad.json").write_text("[")
    assert "is not a JSON rank table" in _bash("run_distribute_train_ascend.sh", str(tmp_path / "bad.json"),
                                               "cpu_smoke", "synthetic").stderr


def test_train_py_reports_config_errors_without_a_traceback(tmp_path):
    result = _bash("run_standalone_train.sh", "cpu_smoke", "synthetic", "--set", "kfac.dampng=0.1",
                   "--output_dir", str(tmp_path))
    assert result.returncode == 2
    assert "train.py: error: optimizer section 'kfac'" in result.stderr and "unknown key 'dampng'" in result.stderr
    assert "Traceback" not in result.stderr
    result = _bash("run_standalone_train.sh", "cpu_smoke", "synthetic", "--batch_sise", "3")
    assert result.returncode == 2 and "unrecognized arguments: --batch_sise" in result.stderr


# --------------------------------------------------------------------------- end to end (cpu_smoke)
def _train(output_dir, optimizer, *extra):
    result = _bash("run_standalone_train.sh", "cpu_smoke", "synthetic", "--optimizer", optimizer,
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


@pytest.mark.parametrize("optimizer", ["momentum", "thor", "spngd"])
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
    result = _train(tmp_path, "kfac", "--resume", _checkpoint(output_dir, 1))
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


def test_eval_reads_the_checkpoint(kfac_run, tmp_path):
    output_dir, _ = kfac_run
    result_json = tmp_path / "result.json"
    result = _bash("run_eval.sh", "cpu_smoke", "synthetic", _checkpoint(output_dir, 2),
                   "--result_json", str(result_json))
    assert result.returncode == 0, result.stderr[-3000:]
    line = [line for line in result.stdout.splitlines() if line.startswith("result: ")][-1]
    metrics = json.loads(line[len("result: "):])
    assert metrics == json.loads(result_json.read_text())
    assert 0.0 <= metrics["top_1_accuracy"] <= metrics["top_5_accuracy"] <= 1.0
    deeper = _bash("run_eval.sh", "resnet_cifar10_kfac", "synthetic", _checkpoint(output_dir, 2))
    assert deeper.returncode == 2 and "lacks" in deeper.stderr and "same config" in deeper.stderr
    wider = _bash("run_eval.sh", "cpu_smoke", "synthetic", _checkpoint(output_dir, 2), "--set", "net_options.width=16")
    assert wider.returncode == 2 and "has parameters of other shapes" in wider.stderr


@pytest.mark.distributed
def test_distributed_script_trains_kfac_on_two_workers(tmp_path):
    """msrun with 2 CPU workers: both ranks train on their shard, K-FAC reduces the factors to their
    owners and gathers the preconditioned gradients, so every trainable weight (and momentum) is the
    same on both ranks; both write checkpoints and eval reads one. (BatchNorm moving statistics are
    per rank: each normalises its own shard.)"""
    result = _bash("run_distribute_train.sh", "2", "cpu_smoke", "synthetic", "--optimizer", "kfac", "--epoch_size", "1",
                   "--eval_interval", "0", "--output_dir", str(tmp_path / "out"), env={"LOG_DIR": str(tmp_path / "logs")})
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
    evaluated = _bash("run_eval.sh", "cpu_smoke", "synthetic", _checkpoint(tmp_path / "out", 1, rank=1))
    assert evaluated.returncode == 0 and "top_1_accuracy" in evaluated.stdout


@pytest.mark.slow
def test_resnet50_imagenet_config_trains_and_evaluates_on_synthetic_data(tmp_path):
    """The ImageNet Momentum config with ResNet-50 itself, shrunk to 32x32 synthetic images on CPU.

    (ResNet-50 with THOR also runs this way, but its first epoch takes ~3 minutes and ~12 GB here.)
    """
    shrink = ["--device_target", "CPU", "--amp_level", "O0", "--image_size", "32", "--batch_size", "2",
              "--eval_batch_size", "2", "--synthetic_size", "4", "--synthetic_eval_size", "4", "--epoch_size", "2",
              "--num_parallel_workers", "1"]
    result = _bash("run_standalone_train.sh", "resnet50_imagenet2012_momentum_8p", "synthetic", *shrink,
                   "--eval_interval", "1", "--eval_start_epoch", "1", "--save_checkpoint_epochs", "1",
                   "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _summary(tmp_path)
    assert summary["steps_per_epoch"] == 2 and [e["epoch"] for e in summary["eval"]] == [1, 2]
    assert "the config's hyper-parameters are for device_num=8 (global batch 16)" in result.stdout
    evaluated = _bash("run_eval.sh", "resnet50_imagenet2012_momentum_8p", "synthetic", _checkpoint(tmp_path, 2),
                      *shrink)
    assert evaluated.returncode == 0 and "top_5_accuracy" in evaluated.stdout, evaluated.stderr[-2000:]
