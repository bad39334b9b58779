"""What train.py and eval.py share: argument parsing, device setup, checkpoint loading, error exits.

:func:`parse` reads the config *before* MindSpore is imported, so that on CPU it can set
``ONEDNN_MAX_CPU_ISA=AVX2`` (MindSpore 2.10's oneDNN otherwise runs non-1x1 convolutions with a
reference kernel, 13-40x slower on AVX-512 CPUs; the variable is read when MindSpore loads).
"""
import argparse
import os
import re
import sys

from .config import ConfigError, add_config_arguments, config_from_args

__all__ = ["UsageError", "parse", "setup_context", "allow_deep_graphs", "load_checkpoint", "load_pretrained",
           "checkpoint_epoch", "main_guard"]


class UsageError(ValueError):
    """A problem with the arguments that is reported without a traceback."""


def parse(description, add_arguments=None, argv=None, config_keys=None):
    """Parse the command line into ``(args, config)``; set the CPU ISA variable when the device is CPU.

    ``config_keys``: the config keys offered as options (default: all).
    """
    parser = argparse.ArgumentParser(description=description)
    add_config_arguments(parser, config_keys)
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as err:
        parser.error(str(err))
    if config["device_target"] == "CPU":
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    return args, config


RECURSION_LIMIT = 10000


def allow_deep_graphs():
    """Raise MindSpore's limit of nested calls in a compiled graph to :data:`RECURSION_LIMIT`.

    ResNet-50's training graph nests deeper than MindSpore 2.10's default of 1000: its compile stops
    with "Exceed function call depth limit 1000", even with ``nn.Momentum``."""
    import mindspore as ms
    ms.set_recursion_limit(RECURSION_LIMIT)


def setup_context(config):
    import mindspore as ms
    ms.set_seed(config["seed"])
    ms.set_device(config["device_target"])
    ms.set_context(mode=ms.GRAPH_MODE if config["mode"] == "graph" else ms.PYNATIVE_MODE)
    allow_deep_graphs()


def checkpoint_epoch(path, params):
    """The epoch a checkpoint was written after: its ``epoch_num`` entry, else its file name."""
    if "epoch_num" in params:
        return int(params["epoch_num"].asnumpy())
    match = re.search(r"-(\d+)_\d+\.ckpt$", os.path.basename(path))
    if match:
        return int(match.group(1))
    raise UsageError(f"cannot tell which epoch checkpoint {path!r} was written after: it has no epoch_num "
                     "entry and its name is not PREFIX-EPOCH_STEP.ckpt")


def load_checkpoint(path, cells, skip=()):
    """Load checkpoint ``path`` into every cell of ``cells``; every Parameter of the cells must be in it.

    ``skip`` names Parameters not to load (they keep their freshly built values). Returns the
    checkpoint's parameter dict.
    """
    import mindspore as ms
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint {path!r} does not exist")
    params = ms.load_checkpoint(path)
    loadable = {k: v for k, v in params.items() if k not in set(skip) and k not in ("epoch_num", "step_num")}
    missing, mismatched = [], []
    for cell in cells:
        wanted = {p.name: p for p in cell.get_parameters() if p.name not in set(skip)}
        missing += sorted(set(wanted) - set(loadable))
        mismatched += [f"{name} {tuple(loadable[name].shape)} vs {tuple(p.shape)}" for name, p in wanted.items()
                       if name in loadable and tuple(loadable[name].shape) != tuple(p.shape)]
    if missing or mismatched:
        problem = (f"lacks {len(missing)} parameters of this network/optimizer, e.g. {missing[:5]}" if missing
                   else f"has parameters of other shapes (checkpoint vs network), e.g. {mismatched[:3]}")
        raise UsageError(f"checkpoint {path!r} {problem}: was it written with the same config (net, optimizer)?")
    for cell in cells:
        names = {p.name for p in cell.get_parameters()}
        ms.load_param_into_net(cell, {k: v for k, v in loadable.items() if k in names})
    return params


def load_pretrained(path, network):
    """Load the network weights of checkpoint ``path`` into ``network`` (``--pre_trained``).

    Parameters the checkpoint lacks, or holds in another shape (a classifier for another
    ``class_num``), keep their initial values; their names are returned. Optimizer state in the
    checkpoint is ignored.
    """
    import mindspore as ms
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint {path!r} does not exist")
    params = ms.load_checkpoint(path)
    loadable, kept = {}, []
    for param in network.get_parameters():
        value = params.get(param.name)
        if value is None or tuple(value.shape) != tuple(param.shape):
            kept.append(param.name)
        else:
            loadable[param.name] = value
    if not loadable:
        raise UsageError(f"checkpoint {path!r} holds none of this network's parameters: was it written for "
                         "the same net?")
    ms.load_param_into_net(network, loadable)
    return kept


def main_guard(function, program):
    """Run ``function()``; report configuration, data and usage errors as one line and exit 2, and the
    divergence stop of an optimizer or of DivergenceMonitor as one line and exit 1."""
    from .dataset import DatasetError
    from .optimizer import OptimizerUnavailable
    try:
        return function()
    except (ConfigError, DatasetError, OptimizerUnavailable, UsageError) as err:
        print(f"{program}: error: {err}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as err:
        from mindspore_ngd import is_divergence
        if not is_divergence(err):
            raise
        print(f"{program}: stopped: {err}", file=sys.stderr)      # training diverged: the reason, no traceback
        sys.exit(1)
