"""Optimizer factory: a config section name -> constructor, with every key of the section validated.

Each optimizer section of a config (``momentum``, ``kfac``, ``thor``, ``spngd``) holds three kinds of
keys, and nothing else:

* constructor keyword arguments -- any parameter of the constructor's signature (read with
  :func:`inspect.signature`) except those ``train.py`` sets itself: the network / parameters,
  ``learning_rate``, ``damping`` (built from the schedules) and ``loss_scale`` (the top-level
  ``loss_scale``, so that the training cell and the optimizer agree);
* schedule keys -- ``lr_schedule`` and ``damping_schedule`` and the keys of the schedules they name
  (:mod:`src.schedules`); a damping schedule only for constructors that take ``damping``;
* ``decay_filter`` -- ``matrices`` (weights with 2+ dimensions: no biases, no BatchNorm gamma/beta)
  or ``all``. Passed as a callable to constructors that take ``decay_filter``; for a constructor that
  takes a parameter list (``nn.Momentum``), the parameters are split into a decayed and an undecayed
  group. Default: the constructor's own default (``matrices`` for ``nn.Momentum``).

An unknown key is an error that names the key, the section and what the section accepts.
"""
import importlib
import inspect

from .config import ConfigError

__all__ = ["OPTIMIZERS", "OptimizerUnavailable", "constructor", "constructor_parameters", "split_section",
           "validate_sections", "build_optimizer", "schedule_parameter_names", "statistics_note"]

# section name -> (module, class)
OPTIMIZERS = {
    "momentum": ("mindspore.nn", "Momentum"),
    "kfac": ("mindspore_ngd", "KFAC"),
    "thor": ("mindspore_ngd", "THOR"),
    "spngd": ("mindspore_ngd", "SPNGD"),
}

NETWORK_ARGS = ("network", "net")       # constructors that precondition layers take the network
PARAMS_ARGS = ("params",)               # first-order optimizers take the parameters
SET_BY_TRAIN = NETWORK_ARGS + PARAMS_ARGS + ("learning_rate", "damping", "loss_scale")


def _decay_matrices(param):
    return len(param.shape) > 1


def _decay_all(param):
    return True


DECAY_FILTERS = {"matrices": _decay_matrices, "all": _decay_all}


class OptimizerUnavailable(ImportError):
    """The config names an optimizer this installation does not have."""


def constructor(section):
    """The class for optimizer section ``section``."""
    if section not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer section {section!r}; known: {sorted(OPTIMIZERS)}")
    module_name, class_name = OPTIMIZERS[section]
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise OptimizerUnavailable(f"this {module_name} has no {class_name} (config section {section!r}); "
                                   f"install a version of {module_name} that provides {module_name}.{class_name}")
    return cls


def _unwrap(function):
    """Undo decorators that hide ``__init__``'s signature: follow ``__wrapped__``, else a closure cell
    holding a function named ``__init__`` (MindSpore's ``opt_init_args_register`` does not use
    functools.wraps)."""
    for _ in range(10):
        if hasattr(function, "__wrapped__"):
            function = function.__wrapped__
            continue
        inner = [c.cell_contents for c in (getattr(function, "__closure__", None) or ())
                 if inspect.isfunction(c.cell_contents) and c.cell_contents.__name__ == "__init__"
                 and c.cell_contents is not function]
        if not inner:
            break
        function = inner[0]
    return function


def constructor_parameters(cls):
    """Ordered ``{name: inspect.Parameter}`` of the constructor, without ``self`` and ``*args/**kwargs``."""
    signature = inspect.signature(_unwrap(cls.__init__))
    return {name: p for name, p in signature.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _schedule_tables():
    from .schedules import DAMPING_SCHEDULES, LR_SCHEDULES
    return LR_SCHEDULES, DAMPING_SCHEDULES


def split_section(section, values, cls):
    """Validate optimizer section ``section`` (a dict) against ``cls``.

    Returns ``dict(kwargs=..., lr=(name, params), damping=(name, params) or None, decay_filter=name or None,
    first_arg="network"|"params")``. Raises :class:`ConfigError` naming the first bad key.
    """
    lr_table, damping_table = _schedule_tables()
    accepted = constructor_parameters(cls)
    names = list(accepted)
    first = names[0] if names else None
    if first not in NETWORK_ARGS + PARAMS_ARGS:
        raise ValueError(f"{cls.__name__}'s first argument is {first!r}: the factory only knows optimizers "
                         f"built from a network {NETWORK_ARGS} or a parameter list {PARAMS_ARGS}")
    values = dict(values)
    where = f"optimizer section {section!r} ({cls.__module__}.{cls.__name__})"

    lr_name = values.pop("lr_schedule", "constant")
    if lr_name not in lr_table:
        raise ConfigError(f"{where}: unknown lr_schedule {lr_name!r}; choose one of {sorted(lr_table)}")
    takes_damping = "damping" in accepted
    damping_name = values.pop("damping_schedule", "constant" if takes_damping else None)
    if damping_name is not None and not takes_damping:
        raise ConfigError(f"{where}: key 'damping_schedule' given but {cls.__name__} takes no damping")
    if damping_name is not None and damping_name not in damping_table:
        raise ConfigError(f"{where}: unknown damping_schedule {damping_name!r}; choose one of {sorted(damping_table)}")
    lr_keys = lr_table[lr_name].keys
    damping_keys = damping_table[damping_name].keys if damping_name else ()

    decay_filter = values.pop("decay_filter", None)
    if decay_filter is not None and decay_filter not in DECAY_FILTERS:
        raise ConfigError(f"{where}: decay_filter must be one of {sorted(DECAY_FILTERS)}, got {decay_filter!r}")
    if decay_filter is not None and first in NETWORK_ARGS and "decay_filter" not in accepted:
        raise ConfigError(f"{where}: key 'decay_filter' given but {cls.__name__} takes no decay_filter")

    lr_params, damping_params, kwargs = {}, {}, {}
    constructor_keys = [n for n in names if n not in SET_BY_TRAIN and n != "decay_filter"]
    for key, value in values.items():
        if key in lr_keys:
            lr_params[key] = value
        elif key in damping_keys:
            damping_params[key] = value
        elif key in SET_BY_TRAIN and key in accepted:
            hint = {"loss_scale": "set the top-level loss_scale", "learning_rate": "use lr_schedule and its keys",
                    "damping": "use damping_schedule and its keys"}.get(key, "train.py passes it")
            raise ConfigError(f"{where}: key {key!r} is set by train.py ({hint})")
        elif key in constructor_keys:
            kwargs[key] = tuple(value) if isinstance(value, list) else value
        else:
            raise ConfigError(
                f"{where}: unknown key {key!r}. Accepted: constructor arguments {constructor_keys}, "
                f"lr_schedule {lr_name!r} keys {list(lr_keys)}"
                + (f", damping_schedule {damping_name!r} keys {list(damping_keys)}" if damping_name else "")
                + ", decay_filter, lr_schedule" + (", damping_schedule" if takes_damping else ""))
    return {"kwargs": kwargs, "lr": (lr_name, lr_params),
            "damping": (damping_name, damping_params) if damping_name else None,
            "decay_filter": decay_filter, "first_arg": "params" if first in PARAMS_ARGS else "network"}


def validate_sections(config):
    """Validate every optimizer section of ``config`` whose constructor exists, and the schedule keys.

    A section for an optimizer this installation lacks is skipped (its name is returned) unless it is
    the selected ``optimizer``, which raises :class:`OptimizerUnavailable`.
    """
    from .config import OPTIMIZER_SECTIONS
    from .schedules import build_schedule
    skipped = []
    for section in OPTIMIZER_SECTIONS:
        if section not in config:
            continue
        try:
            cls = constructor(section)
        except OptimizerUnavailable:
            if section == config["optimizer"]:
                raise
            skipped.append(section)
            continue
        parts = split_section(section, config[section], cls)
        # schedule values: build a one-epoch table to check types and ranges
        for kind in ("lr", "damping"):
            if parts[kind] is not None:
                name, params = parts[kind]
                try:
                    build_schedule(kind, name, params, 1, max(1, config["epoch_size"]))
                except ValueError as err:
                    raise ConfigError(f"optimizer section {section!r}: {err}") from None
    return skipped


def _param_groups(network, weight_decay, decay_filter):
    params = network.trainable_params()
    decayed = [p for p in params if decay_filter(p)]
    plain = [p for p in params if not decay_filter(p)]
    groups = []
    if decayed:
        groups.append({"params": decayed, "weight_decay": weight_decay})
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    groups.append({"order_params": params})
    return groups


def build_optimizer(config, network, steps_per_epoch, extra=None):
    """Build the optimizer of ``config["optimizer"]`` for ``network``.

    ``extra`` holds keyword arguments train.py adds when the constructor accepts them and the section
    does not set them (e.g. ``verbose`` on rank 0 only). Returns ``(optimizer, lr_table, damping_table)``.
    """
    from .schedules import build_schedule
    section = config["optimizer"]
    cls = constructor(section)
    parts = split_section(section, config[section], cls)
    epochs = config["epoch_size"]
    try:
        lr_values = build_schedule("lr", *parts["lr"], steps_per_epoch, epochs)
        damping_values = build_schedule("damping", *parts["damping"], steps_per_epoch, epochs) \
            if parts["damping"] is not None else None
    except ValueError as err:
        raise ConfigError(f"optimizer section {section!r}: {err}") from None
    kwargs = dict(parts["kwargs"])
    accepted = constructor_parameters(cls)
    for key, value in (extra or {}).items():
        if key in accepted and key not in kwargs:
            kwargs[key] = value
    if "loss_scale" in accepted:
        kwargs["loss_scale"] = float(config["loss_scale"])
    if damping_values is not None:
        kwargs["damping"] = damping_values
    if parts["first_arg"] == "params":
        decay = DECAY_FILTERS[parts["decay_filter"] or "matrices"]
        target = _param_groups(network, float(kwargs.get("weight_decay", 0.0)), decay)
    else:
        target = network
        if parts["decay_filter"] is not None:
            kwargs["decay_filter"] = DECAY_FILTERS[parts["decay_filter"]]
    try:
        optimizer = cls(target, learning_rate=lr_values, **kwargs)
    except (ValueError, TypeError) as err:   # the constructor's own argument checks
        raise ConfigError(f"optimizer section {section!r}: {cls.__name__} rejected its arguments: {err}") from None
    return optimizer, lr_values, damping_values


def schedule_parameter_names(optimizer):
    """Names of the optimizer Parameters that hold the learning-rate / damping tables.

    They are rebuilt from the config on ``--resume`` (a resumed run may train for a different number
    of epochs, which changes their length), so they are not loaded from the checkpoint.
    """
    from mindspore import Parameter, nn
    names = set()
    learning_rate = getattr(optimizer, "learning_rate", None)
    if isinstance(learning_rate, Parameter):
        names.add(learning_rate.name)
    elif isinstance(learning_rate, nn.Cell):
        names.update(p.name for p in learning_rate.get_parameters())
    damping = getattr(optimizer, "damping", None)
    if isinstance(damping, nn.Cell):
        names.update(p.name for p in damping.get_parameters())
    return names


def statistics_note(optimizer, config, group_size):
    """train.py's note when adaptive refresh intervals (SP-NGD's) meet statistics without a moving
    average (``factor_decay`` 0) on fewer devices than the config was published for; else None.

    Each statistic is then one step's global batch, fewer images than the recipe's. Measured on the SP-NGD
    recipe (chainerkfac's, 128 devices x 32 images) on one device on real images: 132-161 of its 161
    statistics changed by more than the rule's threshold and were refreshed at each of the first 10
    steps; with ``factor_decay`` 0.9 every interval doubled at each refresh (docs/performance.md)."""
    from mindspore_ngd.schedule.rules import StaleIntervals
    rule = getattr(getattr(optimizer, "policy", None), "refresh", None)
    if not isinstance(rule, StaleIntervals) or not rule.adaptive or optimizer.factor_decay > 0:
        return None
    if group_size >= config["device_num"]:
        return None
    batch = config["batch_size"]
    return (f"note: {type(optimizer).__name__} keeps no moving average of its statistics (factor_decay 0): each "
            f"comes from one step's {batch * group_size} images, against the config's {batch * config['device_num']}. "
            f"With one device's 32 images, ResNet-50's statistics changed by more than refresh_threshold "
            f"{rule.threshold:g} from step to step and almost every one was refreshed at every step "
            f"(model_zoo/resnet50/README.md); --set {config['optimizer']}.factor_decay=0.9 averages them over "
            f"refreshes")
