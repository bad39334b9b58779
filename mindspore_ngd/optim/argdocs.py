"""Argument documentation shared by the optimizers' docstrings, written once.

A line ``@name@`` (indented as an ``Args:`` entry) in the docstring of a class decorated with
:func:`shared_arguments` is replaced by the entry for ``name`` below; ``@all@`` by every entry, in
order."""

__all__ = ["ARGUMENTS", "shared_arguments"]

# each entry without the indentation of its marker line (which shared_arguments prepends to every
# line); continuation lines are indented 4 spaces more
ARGUMENTS = {
    "distributed": (
        'distributed: "auto" (default), True or False; see :class:`mindspore_ngd.NGDOptimizer` and\n'
        '    docs/distributed.md.'
    ),
    "grad_worker_fraction": (
        'grad_worker_fraction: fraction of the ranks that own each layer (``k/N``); None is ``1/N``.'
    ),
    "balance": (
        'balance (str): "compute" (default) or "memory": what the layer ownership balances.'
    ),
    "adaptive_damping": (
        'adaptive_damping (bool): adapt the damping during training (it starts at ``damping``, never\n'
        '    goes below it, rises when steps overshoot; see docs/algorithms.md). Default True.'
    ),
    "divergence_patience": (
        'divergence_patience (int): stop with ``RuntimeError("... diverged at step ...")`` after this\n'
        '    many consecutive non-finite steps, or this many consecutive finite steps that explode (>= 1).\n'
        '    Default 10.'
    ),
    "divergence_growth": (
        'divergence_growth (float): a finite step explodes when its gradient norm exceeds this many times\n'
        "    the first finite step's (> 1), or when adaptive damping's multiplier sits at its maximum while\n"
        '    the steps still overshoot; None keeps only the second test. Default 1e3 (docs/algorithms.md).'
    ),
    "host_calls": (
        'host_calls: whether the compiled step may call back into Python: "auto" (default) -- True\n'
        "    when the context's ``device_target`` is CPU at construction, False on Ascend and GPU (whose\n"
        '    graphs run whole on the device, e.g. GE sink mode). True: the step raises the divergence stop\n'
        '    and logs skipped steps and demoted layers itself. False: no host call in the graph; the step\n'
        '    records a stop in the ``{prefix}.status`` Parameter, prints its reports with ``ops.Print`` and\n'
        '    freezes the weights from the stop on; ``opt.check_status()`` or the\n'
        '    :class:`mindspore_ngd.TrainingGuard` callback raises the same error on the host\n'
        '    (docs/limitations.md, "Devices without host calls").'
    ),
    "params": (
        "params (list): parameter groups as ``nn.Momentum``'s ``params``: a list of the network's\n"
        '    Parameters, or of dicts with "params" and optionally "lr", "weight_decay" and\n'
        '    "grad_centralization", plus an optional ``{"order_params": [...]}``. The groups must hold\n'
        "    exactly the network's trainable parameters. A group's lr scales its parameters' part of\n"
        "    the preconditioned step (KL clipping uses each parameter's own lr); its weight decay is\n"
        '    added after preconditioning; gradient centralization acts on the final direction. See\n'
        '    :mod:`mindspore_ngd.optim.groups`. None (default): every trainable parameter, one group.'
    ),
    "strict": (
        'strict (bool): raise a RuntimeError when a preconditioned layer captures nothing on its first\n'
        '    capture step (its construct is never called: its owner reads its weight directly); False\n'
        '    (default) demotes it to the plain update with a WARNING.'
    ),
    "stat_fraction": (
        'stat_fraction (float): in (0, 1]; compute the batch A and G from the first\n'
        '    ``max(1, ceil(stat_fraction * B))`` examples of each batch (a random subset when the data\n'
        '    is shuffled), rescaled to estimate the full-batch factors. Default 1 (whole batch).'
    ),
    "stat_stride": (
        "stat_stride (int): >= 1; Conv2d A and G from every ``stat_stride``-th output position in each\n"
        "    spatial direction only (A rescaled by ``T / T'``). Dense layers, and SP-NGD's unit-wise\n"
        "    BatchNorm Fisher, use every position. Default 1. See :class:`mindspore_ngd.Policy` and\n"
        "    docs/algorithms.md."
    ),
    "sequence_approx": (
        'sequence_approx (str): "expand" (default) or "reduce": the factors of a Dense layer (or of an\n'
        '    nn.MultiheadAttention\'s packed input projection) whose input has more than two dimensions,\n'
        '    (B, R, ..., features). "expand" counts each of the B R rows as an\n'
        '    example (right for a loss averaged over positions, as a language model\'s); "reduce" counts each\n'
        '    example once, its rows averaged (A) and summed (G) (Eschenhagen et al. 2023), and captures\n'
        '    its Gram matrices over B rows instead of B R. See :class:`mindspore_ngd.Policy`.'
    ),
    "precondition_embeddings": (
        "precondition_embeddings (bool): precondition ``nn.Embedding`` layers, with a diagonal A (the\n"
        "    tokens' frequencies in the batch), on one device; False gives them the plain update, named in\n"
        "    the WARNING line. Default True. See :class:`mindspore_ngd.Policy` and docs/algorithms.md."
    ),
}


def shared_arguments(cls):
    """Class decorator: fill the ``@name@`` lines of ``cls.__doc__`` from :data:`ARGUMENTS`."""
    lines = []
    for line in cls.__doc__.split("\n"):
        name = line.strip()
        if name.startswith("@") and name.endswith("@") and len(name) > 2:
            indent = line[:len(line) - len(line.lstrip())]
            names = list(ARGUMENTS) if name == "@all@" else [name[1:-1]]
            lines += [indent + part for key in names for part in ARGUMENTS[key].split("\n")]
        else:
            lines.append(line)
    cls.__doc__ = "\n".join(lines)
    return cls


# Why an argument that KFAC, SPNGD and THOR all take has a different default in one of them.
# scripts/gen_api_docs.py renders these, with the defaults read from the signatures, as the table
# "Defaults that differ" of docs/api.md, and refuses to run when an argument whose defaults differ
# has no reason here (or a reason is kept for one whose defaults no longer differ).
DEFAULT_DIFFERENCES = {
    "damping": (
        "THOR keeps `mindspore.nn.thor`'s positional order `(net, learning_rate, damping, momentum, ...)`, "
        "in which damping is required; KFAC and SPNGD follow `nn.Momentum`'s order, with every "
        "natural-gradient argument keyword-only, so damping needs a default there."
    ),
    "damping_split": (
        "THOR reproduces `nn.thor`'s damping, `A + sqrt(damping T) I` and `G + sqrt(damping / T) I` with "
        "T a Conv2d's output positions (\"positions\"); K-FAC and SP-NGD split it between A and G by "
        "Martens and Grosse's pi rule (\"pi\")."
    ),
    "decay_filter": (
        "THOR decays every parameter, as `nn.thor` does by default; KFAC and SPNGD (None: "
        "`default_decay_filter`) decay only parameters with two or more dimensions, as is usual for "
        "`nn.Momentum` training, leaving biases and BatchNorm gamma/beta undecayed."
    ),
    "factor_decay": (
        "K-FAC keeps a moving average of A and G captured every step (0.95, as Martens and Grosse); "
        "SP-NGD refreshes a statistic only when it changed, and with small per-device batches a lower "
        "0.9 let the refresh ratio fall to 0.02-0.05 at the same accuracy (with 0 it stayed at 0.84, "
        "measured on digits); THOR, as `nn.thor`, uses each refresh's own batch (0)."
    ),
    "split_dim": (
        "THOR inverts factors above 128 as 128-blocks, as `nn.thor` does (Ascend's cube size); KFAC and "
        "SPNGD invert whole factors (None), the exact Kronecker-factored inverse. On Ascend, pass 128 for "
        "lightly damped factors larger than 2048 (docs/algorithms.md, Newton-Schulz in device precision)."
    ),
}
