"""model_zoo/resnet50 configuration: YAML validation with errors that name the key, optimizer sections
checked against the constructors, the optimizer factory, every shipped config, command-line overrides."""
import glob
import os

import pytest

import mindspore as ms

import mindspore_ngd
from zoo import ZOO, smoke_config  # first: puts the model zoo's src/ on sys.path
from src import config as zoo_config
from src import optimizer as zoo_opt
from src.resnet import build_network


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
    config = smoke_config(optimizer=section)
    config[section] = dict(config[section], **{key: value})
    with pytest.raises(zoo_config.ConfigError, match=match):
        zoo_opt.validate_sections(config)


def test_section_values_are_checked_by_the_constructor():
    config = smoke_config(optimizer="kfac")
    config["kfac"] = dict(config["kfac"], damping_split="cube")
    zoo_opt.validate_sections(config)            # names are fine; the value is the constructor's to reject
    net = build_network(config["net"], config["class_num"], config["net_options"])
    with pytest.raises(zoo_config.ConfigError, match="KFAC rejected its arguments: .*damping_split"):
        zoo_opt.build_optimizer(config, net, 4)


def test_momentum_signature_is_read_through_mindsporess_decorator():
    params = zoo_opt.constructor_parameters(ms.nn.Momentum)
    assert list(params)[:3] == ["params", "learning_rate", "momentum"] and "use_nesterov" in params


def test_factory_builds_each_available_optimizer_with_schedules_and_decay_groups():
    for section, cls in (("momentum", ms.nn.Momentum), ("kfac", mindspore_ngd.KFAC), ("thor", mindspore_ngd.THOR)):
        config = smoke_config(optimizer=section)
        net = build_network(config["net"], config["class_num"], config["net_options"])
        opt, lr, damping = zoo_opt.build_optimizer(config, net, 4, extra={"verbose": False})
        assert isinstance(opt, cls) and lr.shape == (8,)
        assert (damping is None) == (section == "momentum")
    # nn.Momentum gets two groups: weights decayed, BatchNorm/bias not ("matrices", like the model zoo)
    config = smoke_config(optimizer="momentum")
    net = build_network(config["net"], config["class_num"], config["net_options"])
    opt, _, _ = zoo_opt.build_optimizer(config, net, 4)
    decays = dict(zip((p.name for p in opt.parameters), opt.group_weight_decay))
    assert decays["fc.weight"] == decays["stem.weight"] == pytest.approx(5e-4)
    assert decays["fc.bias"] == decays["bn.gamma"] == decays["bn.beta"] == 0


def test_every_shipped_config_validates(monkeypatch):
    paths = sorted(glob.glob(os.path.join(ZOO, "configs", "*.yaml")))
    assert len(paths) >= 10
    for path in paths:
        config = zoo_config.load_config(path)
        zoo_opt.validate_sections(config)


def test_spngd_sections_validate_against_the_constructor():
    for name in ("resnet50_imagenet2012_spngd_bs4k", "resnet_cifar10_spngd"):
        zoo_opt.validate_sections(zoo_config.load_config(name))
    config = smoke_config(optimizer="spngd")
    config["spngd"] = dict(config["spngd"], frequency=10)
    with pytest.raises(zoo_config.ConfigError, match="unknown key 'frequency'"):
        zoo_opt.validate_sections(config)


def test_spngd_without_a_moving_average_on_fewer_devices_gets_a_note():
    """The SP-NGD recipe (factor_decay 0, 128 devices) on one device refreshes almost every statistic at
    every step (docs/performance.md); train.py says so and what to set. Other cases get no note."""
    config = zoo_config.load_config("resnet50_imagenet2012_spngd_bs4k")
    net = build_network("resnet_cifar", 10, {"blocks_per_stage": 1, "width": 8})
    opt, _, _ = zoo_opt.build_optimizer(config, net, 4, extra={"verbose": False})
    note = zoo_opt.statistics_note(opt, config, 1)
    assert "one step's 32 images, against the config's 4096" in note, note
    assert note.endswith("--set spngd.factor_decay=0.9 averages them over refreshes"), note
    assert zoo_opt.statistics_note(opt, config, 128) is None                  # the recipe's own devices
    config["spngd"] = dict(config["spngd"], factor_decay=0.9)
    averaged, _, _ = zoo_opt.build_optimizer(config, net, 4, extra={"verbose": False})
    assert zoo_opt.statistics_note(averaged, config, 1) is None
    kfac_config = smoke_config(optimizer="kfac", device_num=8)
    kfac, _, _ = zoo_opt.build_optimizer(kfac_config, net, 4, extra={"verbose": False})
    assert zoo_opt.statistics_note(kfac, kfac_config, 1) is None              # fixed intervals


def test_missing_spngd_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(mindspore_ngd, "SPNGD", raising=False)
    with pytest.raises(zoo_opt.OptimizerUnavailable, match="this mindspore_ngd has no SPNGD"):
        zoo_opt.validate_sections(smoke_config(optimizer="spngd"))
    assert zoo_opt.validate_sections(smoke_config(optimizer="kfac")) == ["spngd"]   # unselected: skipped


def test_command_line_overrides():
    import argparse
    parser = zoo_config.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--config_path", "cpu_smoke", "--batch_size", "4", "--optimizer", "thor",
                              "--set", "thor.frequency=3", "--set", "net_options.width=4", "--data_path", "123"])
    config = zoo_config.config_from_args(args)
    assert config["batch_size"] == 4 and config["thor"]["frequency"] == 3 and config["net_options"]["width"] == 4
    assert config["data_path"] == "123"
    with pytest.raises(zoo_config.ConfigError, match="'nope' is not a section"):
        zoo_config.config_from_args(parser.parse_args(["--config", "cpu_smoke", "--set", "nope.x=1"]))
    with pytest.raises(zoo_config.ConfigError, match="neither a file nor one of"):
        zoo_config.load_config("no_such_config")


def test_models_repository_names_and_the_former_ones(tmp_path):
    """class_num / eval_dataset_path / --config_path as in official/cv/ResNet; num_classes,
    eval_data_path and --config still read, in files and on the command line; both names at once with
    different values is an error."""
    import argparse
    parser = zoo_config.add_config_arguments(argparse.ArgumentParser())
    for argv in (["--config_path", "cpu_smoke", "--class_num", "7", "--eval_dataset_path", "val"],
                 ["--config", "cpu_smoke", "--num_classes", "7", "--eval_data_path", "val"]):
        config = zoo_config.config_from_args(parser.parse_args(argv))
        assert config["class_num"] == 7 and config["eval_dataset_path"] == "val"
        assert "num_classes" not in config and "eval_data_path" not in config
    old = tmp_path / "old.yaml"
    old.write_text(open(zoo_config.resolve_config_path("cpu_smoke"), encoding="utf-8").read()
                   .replace("class_num: 10", "num_classes: 12"))
    assert zoo_config.load_config(str(old))["class_num"] == 12
    both = tmp_path / "both.yaml"
    both.write_text(old.read_text() + "\nclass_num: 13\n")
    with pytest.raises(zoo_config.ConfigError, match="'num_classes' is the former name of 'class_num'"):
        zoo_config.load_config(str(both))


def test_dataset_sinking_defaults_to_on_except_on_cpu():
    assert zoo_config.load_config("cpu_smoke")["dataset_sink_mode"] is False
    assert zoo_config.load_config("cpu_smoke", {"device_target": "GPU"})["dataset_sink_mode"] is True
    assert zoo_config.load_config("cpu_smoke", {"device_target": "Ascend"})["dataset_sink_mode"] is True
    assert zoo_config.load_config("cpu_smoke", {"device_target": "GPU", "dataset_sink_mode": False})[
        "dataset_sink_mode"] is False
    assert zoo_config.load_config("cpu_smoke", {"dataset_sink_mode": True})["dataset_sink_mode"] is True


def test_eval_help_lists_only_evaluation_flags():
    import subprocess
    import sys
    text = subprocess.run([sys.executable, os.path.join(ZOO, "eval.py"), "--help"], capture_output=True,
                          text=True, check=True).stdout
    for flag in ("--config_path", "--data_path", "--eval_dataset_path", "--checkpoint_file_path", "--class_num",
                 "--eval_batch_size"):
        assert flag in text, flag
    for flag in ("--epoch_size", "--optimizer", "--batch_size ", "--lean_step", "--save_checkpoint_epochs",
                 "--resume_ckpt", "--run_eval", "--amp_level"):
        assert flag not in text, flag
