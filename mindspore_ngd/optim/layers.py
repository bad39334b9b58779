"""Which layers of a network the optimizer preconditions, and where their parameters sit."""
from ..capture import find_batchnorms, find_layers

__all__ = ["discover", "parameter_roles"]


def discover(network, skip_layers, unit_batchnorm):
    """``(specs, cells, norm_specs, norm_cells, skipped)`` for ``network``.

    ``specs``/``cells``: the Dense/Conv2d layers to precondition (all supported ones except those named
    in ``skip_layers``); ``norm_*``: the BatchNorm layers preconditioned unit-wise (only when
    ``unit_batchnorm``); ``skipped``: ``(name, reason)`` of the layers left to the plain update.
    Raises ValueError for a ``skip_layers`` name that is no Dense/Conv2d cell, or a network with
    nothing to precondition.
    """
    skip_layers = set(skip_layers)
    specs, cells, skipped = find_layers(network)
    unknown = skip_layers - {s.name for s in specs} - {n for n, _ in skipped}
    if unknown:
        raise ValueError(f"skip_layers names no Dense/Conv2d cell of the network: {sorted(unknown)}")
    keep = [i for i, s in enumerate(specs) if s.name not in skip_layers]
    skipped += [(specs[i].name, "skip_layers") for i in range(len(specs)) if i not in keep]
    specs, cells = [specs[i] for i in keep], [cells[i] for i in keep]
    norm_specs, norm_cells = [], []
    if unit_batchnorm:
        norm_specs, norm_cells, norm_skipped = find_batchnorms(network)
        skipped += norm_skipped
    if not specs:
        raise ValueError("network has no nn.Dense or nn.Conv2d layer that can be preconditioned"
                         + (f" (skipped: {skipped})" if skipped else ""))
    return specs, cells, norm_specs, norm_cells, skipped


def parameter_roles(params, specs, norm_specs):
    """Per parameter (Python constants unrolled in the graph): ``(layer, is_bias)`` with layer -1
    for a parameter no Kronecker block owns, and ``(norm, 0 gamma / 1 beta)`` with norm -1 for one no
    unit-wise BatchNorm block owns; plus the name -> position index."""
    index = {p.name: i for i, p in enumerate(params)}
    roles = [(-1, False)] * len(params)
    for k, s in enumerate(specs):
        roles[index[s.weight_name]] = (k, False)
        if s.has_bias:
            roles[index[s.bias_name]] = (k, True)
    norm_roles = [(-1, 0)] * len(params)
    for j, s in enumerate(norm_specs):
        norm_roles[index[s.gamma_name]] = (j, 0)
        norm_roles[index[s.beta_name]] = (j, 1)
    return tuple(roles), tuple(norm_roles), index
