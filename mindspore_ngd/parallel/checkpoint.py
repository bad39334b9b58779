"""Resuming distributed optimizer state: each rank's checkpoint holds the factors and inverses of the
layers that rank owned, so it fits only a run with the same world size and the same ownership.

The optimizer records its layout in state Parameters (``{prefix}.parallel.world_size``,
``.grad_workers``, ``.position``, ``.owner_positions``); :func:`check_checkpoint` compares them with
the current run before ``load_param_into_net``. No MindSpore import: values are read with
``asnumpy()``.
"""
import numpy as np

__all__ = ["checkpoint_layout", "optimizer_layout", "check_checkpoint"]

_FIELDS = ("world_size", "grad_workers", "position", "owner_positions")


def _value(item):
    value = item.asnumpy() if hasattr(item, "asnumpy") else np.asarray(item)
    value = np.asarray(value).reshape(-1)
    return tuple(int(v) for v in value)


def optimizer_layout(optimizer):
    """``{"world_size", "grad_workers", "position", "owner_positions"}`` of a natural-gradient
    optimizer (world size 1 and position 0 on a single device)."""
    plan = optimizer.parallel_plan
    if plan is None:
        return {"world_size": 1, "grad_workers": 1, "position": 0,
                "owner_positions": (0,) * len(optimizer.layer_specs)}
    return {"world_size": plan.world_size, "grad_workers": plan.grad_workers,
            "position": optimizer.communicator.position, "owner_positions": tuple(plan.positions)}


def checkpoint_layout(param_dict, prefix):
    """The layout recorded in a checkpoint's parameter dict for optimizer prefix ``prefix``
    ("kfac", "spngd", "thor"); None when the dict holds no state of that optimizer (weights only);
    world size 1 when it was written by a single process."""
    keys = {field: f"{prefix}.parallel.{field}" for field in _FIELDS}
    if not any(key in param_dict for key in keys.values()):
        if not any(name.startswith(prefix + ".") for name in param_dict):
            return None
        owners = sorted({name[len(prefix) + 1:-len(".A_inv")] for name in param_dict
                         if name.startswith(prefix + ".") and name.endswith(".A_inv")})
        return {"world_size": 1, "grad_workers": 1, "position": 0, "owner_positions": (0,) * len(owners)}
    missing = [key for key in keys.values() if key not in param_dict]
    if missing:
        raise ValueError(f"checkpoint has an incomplete parallel record: missing {missing}")
    layout = {field: _value(param_dict[key]) for field, key in keys.items()}
    for field in ("world_size", "grad_workers", "position"):
        layout[field] = layout[field][0]
    return layout


def _describe(layout, names):
    if layout["world_size"] == 1:
        return "1 process"
    owners = {}
    for name, position in zip(names, layout["owner_positions"]):
        owners.setdefault(position, []).append(name)
    table = "; ".join(f"position {p}: {', '.join(owners[p])}" for p in sorted(owners))
    return (f"{layout['world_size']} ranks ({layout['grad_workers']} owner(s) per layer; ownership {table}; "
            f"this file: position {layout['position']})")


def check_checkpoint(optimizer, param_dict):
    """Raise ValueError when ``param_dict`` (from ``ms.load_checkpoint``) holds optimizer state written
    under another world size or layer ownership than ``optimizer``'s, or by a rank at another owner
    position; pass silently when it matches or holds no state of this optimizer (weights only).

    Call it before ``ms.load_param_into_net(optimizer, param_dict)``. The fix for a mismatch: resume
    with the same world size (and ``grad_worker_fraction``, ``balance``), each rank loading the file
    its own rank wrote, or drop the optimizer state and keep the weights (load the checkpoint into
    the network only; the factors are rebuilt within a few steps).
    """
    prefix = optimizer.policy.name
    saved = checkpoint_layout(param_dict, prefix)
    if saved is None:
        return
    current = optimizer_layout(optimizer)
    names = [s.name for s in optimizer.layer_specs]
    advice = ("resume with the same world size, grad_worker_fraction and balance (each rank loading the file "
              "its own rank wrote), or drop the optimizer state and keep the weights "
              "(ms.load_param_into_net(network, param_dict) only)")
    if len(saved["owner_positions"]) != len(names):
        raise ValueError(f"checkpoint holds {prefix} state of {len(saved['owner_positions'])} preconditioned "
                         f"layers, this optimizer has {len(names)}: {advice}")
    if (saved["world_size"], saved["grad_workers"], saved["owner_positions"]) != \
            (current["world_size"], current["grad_workers"], current["owner_positions"]):
        raise ValueError(f"checkpoint was written by {_describe(saved, names)}; this run has "
                         f"{_describe(current, names)}: {advice}")
    if saved["position"] != current["position"]:
        raise ValueError(f"checkpoint holds the state of owner position {saved['position']}, this rank is at "
                         f"position {current['position']}: each rank must load the checkpoint its own rank "
                         f"(or a rank at the same position) wrote")
