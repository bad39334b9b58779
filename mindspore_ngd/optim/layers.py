"""Which layers of a network the optimizer preconditions, and where their parameters sit."""
from mindspore import mint, nn

from ..capture import find_batchnorms, find_layernorms, find_layers
from ..capture.loss_scale import reference_batchnorm
from ..curvature.registry import block_type_of

__all__ = ["discover", "parameter_roles", "plain_layers", "scale_batchnorm", "NORM_CLASSES"]

_NORM_NAMES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LayerNorm", "LayerNormExt",
               "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")
# normalisation layers: their scale and shift get the plain update by design (K-FAC, THOR; SP-NGD
# preconditions BatchNorm unit-wise), so they are reported at INFO level, not warned about
NORM_CLASSES = tuple({getattr(module, name) for module in (nn, mint.nn) for name in _NORM_NAMES
                      if isinstance(getattr(module, name, None), type)})


def discover(network, skip_layers, unit_batchnorm, policy=None):
    """``(specs, cells, norm_specs, norm_cells, skipped)`` for ``network``.

    ``specs``/``cells``: the Dense/Conv2d/Embedding layers to precondition: every supported one except
    those named in ``skip_layers`` and those of a block type whose ``opt_in`` switch of ``policy`` is off
    (``precondition_embeddings`` for nn.Embedding); ``norm_*``: the BatchNorm, then the LayerNorm layers
    preconditioned unit-wise (only when ``unit_batchnorm``); ``skipped``: ``(name, reason)`` of the layers
    left to the plain update. Raises ValueError for a ``skip_layers`` name that is no such cell, or a
    network with nothing to precondition.
    """
    skip_layers = set(skip_layers)
    specs, cells, skipped = find_layers(network)
    unknown = skip_layers - {s.name for s in specs} - {n for n, _ in skipped}
    if unknown:
        raise ValueError(f"skip_layers names no Dense/Conv2d/Embedding cell of the network: {sorted(unknown)}")
    reasons = {}
    for s in specs:
        if s.name in skip_layers:
            reasons[s.name] = "skip_layers"
        else:
            switch = block_type_of(s).opt_in
            if switch is not None and not getattr(policy, switch, False):
                reasons[s.name] = f"{switch}=False"
    keep = [i for i, s in enumerate(specs) if s.name not in reasons]
    skipped += [(specs[i].name, reasons[specs[i].name]) for i in range(len(specs)) if i not in keep]
    specs, cells = [specs[i] for i in keep], [cells[i] for i in keep]
    norm_specs, norm_cells = [], []
    if unit_batchnorm:
        for find in (find_batchnorms, find_layernorms):
            found, found_cells, norm_skipped = find(network)
            norm_specs, norm_cells, skipped = norm_specs + found, norm_cells + found_cells, skipped + norm_skipped
    if not specs:
        raise ValueError("network has no nn.Dense or nn.Conv2d layer that can be preconditioned"
                         + (f" (skipped: {skipped})" if skipped else ""))
    return specs, cells, norm_specs, norm_cells, skipped


def scale_batchnorm(network, norm_cells, index):
    """``(spec, cell)`` of the BatchNorm layer that carries the loss-scale probe when no preconditioned
    layer has a bias (:func:`mindspore_ngd.capture.loss_scale.reference_batchnorm`: the fewest channels,
    among the supported BatchNorm layers not preconditioned unit-wise, ``norm_cells``, whose beta is an
    optimizer parameter, ``index``); ``(None, None)`` without one. The estimator uses it only when no
    layer has a bias."""
    specs, cells, _ = find_batchnorms(network)
    taken = {id(cell) for cell in norm_cells}
    free = [(spec, cell) for spec, cell in zip(specs, cells) if id(cell) not in taken]
    chosen = reference_batchnorm([spec for spec, _ in free], index)
    return (None, None) if chosen is None else free[chosen]


def parameter_roles(params, specs, norm_specs):
    """Per parameter, Python constants for the compiled step: ``(layer, is_bias, layer_has_bias, norm,
    which)``, with layer -1 for a parameter no Kronecker block owns and norm -1 for one no unit-wise
    BatchNorm block owns (``which``: 0 gamma, 1 beta); plus the name -> position index."""
    index = {p.name: i for i, p in enumerate(params)}
    roles = [[-1, False, False, -1, 0] for _ in params]
    for k, s in enumerate(specs):
        roles[index[s.weight_name]][:3] = [k, False, bool(s.has_bias)]
        if s.has_bias:
            roles[index[s.bias_name]][:3] = [k, True, True]
    for j, s in enumerate(norm_specs):
        roles[index[s.gamma_name]][3:] = [j, 0]
        roles[index[s.beta_name]][3:] = [j, 1]
    return tuple(tuple(role) for role in roles), index


def plain_layers(network, handled, skipped):
    """The cells that own trainable parameters the optimizer does not precondition, with a reason.

    Args:
        network: the network.
        handled: names of the parameters a Kronecker or unit-wise block preconditions.
        skipped: ``(name, reason)`` from :func:`discover`.

    Returns ``(unexpected, normalisation)``: ``unexpected`` is a list of ``(reason, cell name)`` for the
    warning (layers of an unsupported type, layers :func:`discover` skipped, parameters of custom cells
    or of the network itself); ``normalisation`` lists the normalisation cells whose scale and shift
    get the plain update by design. Only cells owning a trainable parameter that no block handles
    appear (a fully frozen layer has nothing to update).
    """
    reasons = dict(skipped)
    unexpected, normalisation = [], []
    for name, cell in network.cells_and_names():
        own = [p for p in cell.get_parameters(expand=False) if p.requires_grad and p.name not in handled]
        if not own:
            continue
        cls = type(cell).__name__
        if name in reasons or (not name and "<root>" in reasons):
            unexpected.append((reasons[name or "<root>"], name or "<root>"))
        elif isinstance(cell, NORM_CLASSES):
            normalisation.append(name)
        elif not name:
            unexpected.append(("parameters owned by the network itself",
                               ", ".join(p.name for p in own)))
        elif type(cell).__module__.startswith("mindspore."):
            unexpected.append(("layer type not preconditioned", f"{name} ({cls})"))
        else:
            unexpected.append(("custom cell with its own parameters", f"{name} ({cls})"))
    return unexpected, normalisation
