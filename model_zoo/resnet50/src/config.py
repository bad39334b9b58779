"""YAML configuration: defaults, loading, command-line overrides and validation of the top level.

A config file is a flat mapping of the keys in :data:`DEFAULTS` plus one section per optimizer
(``momentum``, ``kfac``, ``thor``, ``spngd``: the names of :data:`OPTIMIZER_SECTIONS`). ``optimizer``
names the section used. Sections are validated against the optimizer's constructor by
:mod:`src.optimizer` (which needs MindSpore); this module deliberately imports no MindSpore, so that
``train.py`` can read the device from the config and set ``ONEDNN_MAX_CPU_ISA`` before MindSpore loads.

Command line: ``--config_path`` names the file (as in MindSpore's models repository,
``official/cv/ResNet``); every top-level key is an option (``--batch_size 16``), and ``--set KEY=VALUE``
(repeatable) sets any key, including section keys (``--set kfac.damping=0.01``). Values are parsed
as YAML scalars (``1e-3``, ``true``, ``[30, 60]``).

Why a config module of our own: MindSpore itself ships no configuration loader, and the models
repository's ``model_utils/config.py`` is copied into each model rather than installed as a package.
This module follows its conventions (a flat YAML file, ``--config_path``, every key a flag) and adds
what the optimizers need: one section per optimizer, checked against the constructor's signature.

Key names follow the models repository where it has the same setting (``class_num``,
``eval_dataset_path``, ``run_eval``); the names this zoo used before are accepted as aliases
(:data:`ALIASES`), in files and on the command line.
"""
import copy
import os

try:
    import yaml
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("the model zoo reads YAML configs: pip install pyyaml "
                      "(or pip install 'mindspore_ngd[model_zoo]')") from err

__all__ = ["DEFAULTS", "ALIASES", "EVAL_KEYS", "OPTIMIZER_SECTIONS", "ConfigError", "CONFIG_DIR", "resolve_config_path",
           "load_config", "add_config_arguments", "config_from_args"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

# optimizer section names; the factory in src/optimizer.py maps each to a constructor
OPTIMIZER_SECTIONS = ("momentum", "kfac", "thor", "spngd")

DEFAULTS = {
    # network and data
    "net": "resnet50",                 # resnet50 | resnet_cifar
    "net_options": {},                 # resnet50: zero_init_residual, classifier_bias; resnet_cifar: blocks_per_stage, width
    "dataset": "imagenet2012",         # imagenet2012 | cifar10 (a data path "synthetic" replaces either)
    "data_path": "",                   # training data; "synthetic" for generated data
    "eval_dataset_path": "",           # evaluation data; default: derived from data_path (see README)
    "class_num": 1000,
    "image_size": 224,
    "batch_size": 32,                  # per device
    "eval_batch_size": 32,
    "synthetic_size": 256,             # images per epoch (per device) of the synthetic data set
    "synthetic_eval_size": 64,
    "num_parallel_workers": 4,
    # training
    "epoch_size": 90,
    "device_num": 1,                   # devices the hyper-parameters were published for (global batch)
    "optimizer": "momentum",
    "loss_scale": 1.0,                 # fixed loss scale (FixedLossScaleManager, no overflow dropping)
    "label_smooth_factor": 0.0,
    "dataset_sink_mode": None,         # None: sink except on CPU, as the models repository does
    "lean_step": False,                # natural-gradient optimizers: train with NGDTrainOneStepCell
    "seed": 1,
    # checkpoints, evaluation, logging
    "output_dir": "./outputs",
    "save_checkpoint_epochs": 1,       # 0 disables checkpoints
    "keep_checkpoint_max": 10,
    "run_eval": False,                 # evaluate during training (every eval_interval epochs)
    "eval_interval": 1,                # with run_eval: evaluate every N epochs; 0 disables
    "eval_start_epoch": 1,
    "log_interval": 1,                 # LossMonitor: print every N steps
    # device
    "device_target": "CPU",            # CPU | GPU | Ascend
    "mode": "graph",                   # graph | pynative
    "amp_level": "O0",                 # mixed precision of mindspore.train.Model: O0 (float32) | O1 | O2 | O3
}

# former key -> key: a config file or command line may use either name (not both)
ALIASES = {"num_classes": "class_num", "eval_data_path": "eval_dataset_path"}

# the keys eval.py reads (its --help lists only these)
EVAL_KEYS = ("net", "dataset", "data_path", "eval_dataset_path", "class_num", "image_size", "eval_batch_size",
             "synthetic_eval_size", "num_parallel_workers", "label_smooth_factor", "seed", "device_target", "mode")

NETWORK_NAMES = ("resnet50", "resnet_cifar")
DATASETS = ("imagenet2012", "cifar10")
DEVICES = ("CPU", "GPU", "Ascend")


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


def resolve_config_path(config):
    """A path to a YAML file, or the name of a file in ``configs/`` (with or without ``.yaml``)."""
    if os.path.isfile(config):
        return os.path.abspath(config)
    name = config if config.endswith((".yaml", ".yml")) else config + ".yaml"
    candidate = os.path.join(CONFIG_DIR, name)
    if os.path.isfile(candidate):
        return candidate
    available = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
    raise ConfigError(f"config {config!r} is neither a file nor one of {available}")


def _read_yaml(path):
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys to values, got {type(data).__name__}")
    return data


def _check_type(key, value, default):
    if default is None:              # dataset_sink_mode: true, false, or null for the device's default
        ok = value is None or isinstance(value, bool)
    elif isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:  # pragma: no cover - DEFAULTS only holds the types above
        ok = True
    if not ok:
        raise ConfigError(f"config key {key!r} must be of type {type(default).__name__}, got {value!r}")
    return float(value) if isinstance(default, float) else value


def validate_top_level(config):
    """Check every top-level key: known, of the default's type, allowed value. Returns ``config``."""
    for key, value in config.items():
        if key in OPTIMIZER_SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"optimizer section {key!r} must be a mapping, got {value!r}")
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"unknown config key {key!r}; known keys: {sorted(DEFAULTS)} and optimizer "
                              f"sections {list(OPTIMIZER_SECTIONS)}")
        config[key] = _check_type(key, value, DEFAULTS[key])
    choices = {"net": NETWORK_NAMES, "dataset": DATASETS, "device_target": DEVICES,
               "optimizer": OPTIMIZER_SECTIONS, "mode": ("graph", "pynative"),
               "amp_level": ("O0", "O1", "O2", "O3")}
    for key, allowed in choices.items():
        if config[key] not in allowed:
            raise ConfigError(f"config key {key!r} must be one of {list(allowed)}, got {config[key]!r}")
    if config["optimizer"] not in config:
        raise ConfigError(f"optimizer is {config['optimizer']!r} but the config has no {config['optimizer']!r} "
                          "section with its hyper-parameters")
    for key in ("class_num", "image_size", "batch_size", "eval_batch_size", "synthetic_size",
                "synthetic_eval_size", "num_parallel_workers", "epoch_size", "device_num", "log_interval",
                "eval_start_epoch"):
        if config[key] < 1:
            raise ConfigError(f"config key {key!r} must be >= 1, got {config[key]}")
    for key in ("save_checkpoint_epochs", "eval_interval"):
        if config[key] < 0:
            raise ConfigError(f"config key {key!r} must be >= 0, got {config[key]}")
    if config["keep_checkpoint_max"] < 1:
        raise ConfigError(f"config key 'keep_checkpoint_max' must be >= 1, got {config['keep_checkpoint_max']}")
    if config["loss_scale"] <= 0:
        raise ConfigError(f"config key 'loss_scale' must be > 0, got {config['loss_scale']}")
    if not 0.0 <= config["label_smooth_factor"] < 1.0:
        raise ConfigError(f"config key 'label_smooth_factor' must be in [0, 1), got {config['label_smooth_factor']}")
    if config["dataset_sink_mode"] is None:
        # the models repository sinks the data set on Ascend and GPU, not on CPU
        config["dataset_sink_mode"] = config["device_target"] != "CPU"
    return config


def _rename_aliases(mapping, origin):
    """Rename former key names in ``mapping`` (in place) to the current ones; both at once is an error."""
    for old, new in ALIASES.items():
        if old in mapping:
            if new in mapping and mapping[new] != mapping[old]:
                raise ConfigError(f"{origin}: {old!r} is the former name of {new!r}; give one of them")
            mapping[new] = mapping.pop(old)
    return mapping


def _set_dotted(config, dotted, value):
    section, _, key = dotted.partition(".")
    if not key:
        config[ALIASES.get(section, section)] = value
        return
    if section not in OPTIMIZER_SECTIONS and section != "net_options":
        raise ConfigError(f"--set {dotted}: {section!r} is not a section (sections: "
                          f"{list(OPTIMIZER_SECTIONS) + ['net_options']})")
    config.setdefault(section, {})
    if not isinstance(config[section], dict):
        raise ConfigError(f"--set {dotted}: {section!r} is not a mapping in this config")
    config[section][key] = value


def load_config(path, overrides=None, sets=()):
    """Defaults <- YAML file <- ``overrides`` (top-level dict) <- ``sets`` ("key=value" strings).

    Returns the validated top-level config (optimizer sections are validated by src.optimizer).
    """
    path = resolve_config_path(path)
    config = copy.deepcopy(DEFAULTS)
    config.update(_rename_aliases(_read_yaml(path), path))
    for key, value in _rename_aliases(dict(overrides or {}), "command line").items():
        config[key] = value
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        _set_dotted(config, key.strip(), yaml.safe_load(text))
    validate_top_level(config)
    config["config_path"] = path
    return config


def add_config_arguments(parser, keys=None):
    """``--config_path`` plus one option per top-level key (parsed as YAML) and ``--set``.

    ``keys``: the keys to offer as options (default: all); eval.py offers only those it reads.
    """
    parser.add_argument("--config_path", "--config", dest="config_path", required=True,
                        help="YAML file, or the name of a file in model_zoo/resnet50/configs (e.g. cpu_smoke); "
                             "--config is a deprecated alias")
    group = parser.add_argument_group("config overrides (top-level keys of the YAML file)")
    former = {new: old for old, new in ALIASES.items()}
    for key, default in DEFAULTS.items():
        if key in ("net_options",) or (keys is not None and key not in keys):
            continue
        names = [f"--{key}"] + ([f"--{former[key]}"] if key in former else [])
        note = f" (--{former[key]} is a deprecated alias)" if key in former else ""
        metavar = "BOOL" if default is None else type(default).__name__.upper()
        shown = "true except on CPU" if key == "dataset_sink_mode" else repr(default)
        group.add_argument(*names, dest=f"override_{key}", type=yaml.safe_load, default=None,
                           metavar=metavar, help=f"default {shown}{note}")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="set any key, also in a section: --set kfac.damping=0.01 (repeatable)")
    return parser


def config_from_args(args):
    """The config selected and overridden by the options of :func:`add_config_arguments`."""
    overrides = {key[len("override_"):]: value for key, value in vars(args).items()
                 if key.startswith("override_") and value is not None}
    # --data_path 123 would parse as an int: paths stay strings
    for key in ("data_path", "eval_dataset_path", "output_dir"):
        if key in overrides:
            overrides[key] = str(overrides[key])
    return load_config(args.config_path, overrides, args.set)

