"""Parameter groups as ``nn.Momentum`` takes them, checked against the network before anything is built.

``params`` is what ``nn.Optimizer`` calls ``parameters``: a list of Parameters, or a list of dicts with
the keys "params" (required), "lr", "weight_decay", "grad_centralization", and one optional dict
``{"order_params": [...]}``. The optimizer still takes the network itself (its layers capture the
curvature), so the groups must hold exactly the network's trainable parameters, each once.

How each key acts on a natural-gradient step (see :class:`mindspore_ngd.NGDOptimizer`):

* "lr": the group's learning rate, any form :func:`mindspore_ngd.schedule.check_learning_rate` takes.
  The preconditioned direction of a layer does not depend on it; the step of each parameter is its
  own lr times its part of the direction. KL clipping bounds ``sum_i lr_i^2 <P_i, g_i>`` over the
  preconditioned parameters ``i`` (each with its own lr), which is ``lr^2 sum <P, g>`` when all lrs are
  equal, so a group's learning rate enters the trust region it is clipped to.
* "weight_decay": a float >= 0 added to every parameter of the group after preconditioning and KL
  clipping, as the optimizer's ``weight_decay``; a group without the key uses the optimizer's
  ``weight_decay`` on the parameters its ``decay_filter`` accepts. Dynamic (Cell) weight decay is
  not supported.
* "grad_centralization": bool; the direction handed to the momentum update (after preconditioning,
  KL clipping and weight decay) has its mean over all axes but the first removed, for the group's
  parameters with 2+ dimensions whose second dimension is a multiple of 16 (``nn.Optimizer``'s rule).
  Centralizing after preconditioning keeps what gradient centralization is for (Yong et al., ECCV
  2020): the applied update has zero mean over each output unit's fan-in. Centralized before it,
  ``G^-1 (.) A^-1`` would mix the mean back in. With an identity preconditioner both orders are
  ``nn.Momentum``'s update (which applies it to the weight-decayed gradient).
* "order_params": the order of the optimizer's parameters (and of the gradients it receives).
"""
import logging
import numbers

from mindspore import nn, Parameter

from .. import _validate
from ..schedule import check_learning_rate

__all__ = ["GROUP_KEYS", "ParameterGroups", "parse_groups", "centralizes"]

logger = logging.getLogger("mindspore_ngd")

GROUP_KEYS = ("params", "lr", "weight_decay", "grad_centralization", "order_params")


def centralizes(param):
    """Whether gradient centralization applies to ``param`` (``nn.Optimizer``'s rule)."""
    return len(param.shape) >= 2 and param.shape[1] % 16 == 0


class ParameterGroups:
    """Parsed groups: ``parameters`` (for ``nn.Optimizer``: the same list or dicts, keys "params",
    "lr" and "order_params" only), and per network parameter name its ``weight_decay`` (None: the
    optimizer's, through ``decay_filter``) and ``centralize`` flag."""

    def __init__(self, parameters, weight_decay, centralize, grouped_lr):
        self.parameters = parameters
        self.weight_decay = weight_decay
        self.centralize = centralize
        self.grouped_lr = grouped_lr


def _param_list(where, value):
    if isinstance(value, Parameter) or not isinstance(value, (list, tuple)) and not hasattr(value, "__iter__"):
        raise TypeError(f"{where} must be a list of Parameters, got {type(value).__name__}")
    items = list(value)
    if not items:
        raise ValueError(f"{where} must not be empty")
    for k, item in enumerate(items):
        if not isinstance(item, Parameter):
            raise TypeError(f"{where}[{k}] must be a Parameter, got {type(item).__name__}")
    return items


def parse_groups(network, params):
    """Check ``params`` against ``network`` (TypeError/ValueError naming the group, the key and the
    allowed values) and return :class:`ParameterGroups`; ``params=None`` is every trainable
    parameter of the network, ungrouped."""
    trainable = list(network.trainable_params())
    if params is None:
        return ParameterGroups(trainable, {}, {}, False)
    if isinstance(params, (dict, Parameter)) or not isinstance(params, (list, tuple)):
        raise TypeError("params must be a list of Parameters or a list of group dicts (as nn.Momentum's "
                        f"'params'), got {type(params).__name__}")
    params = list(params)
    if not params:
        raise ValueError("params must not be empty (None: every trainable parameter of the network)")
    plain = all(isinstance(p, Parameter) for p in params)
    if plain:
        groups, order = [{"params": params}], None
    elif all(isinstance(p, dict) for p in params):
        groups, order = [], None
        for i, group in enumerate(params):
            unknown = sorted(set(group) - set(GROUP_KEYS))
            if unknown:
                raise ValueError(f"params[{i}] has unknown keys {unknown}; a group's keys are {list(GROUP_KEYS)}")
            if "order_params" in group:
                if len(group) > 1:
                    raise ValueError(f"params[{i}]: an 'order_params' dict must hold no other key, got {sorted(group)}")
                if order is not None:
                    raise ValueError(f"params[{i}]: only one 'order_params' dict is allowed")
                order = _param_list(f"params[{i}]['order_params']", group["order_params"])
                continue
            if "params" not in group:
                raise ValueError(f"params[{i}] has no 'params' key (the group's list of Parameters)")
            groups.append(dict(group, index=i))
        if not groups:
            raise ValueError("params holds only an 'order_params' dict: no group of parameters")
    else:
        raise TypeError("params must be all Parameters or all dicts (as nn.Optimizer's 'parameters'), "
                        f"got {sorted({type(p).__name__ for p in params})}")

    by_name = {p.name: p for p in trainable}
    seen, weight_decay, centralize, grouped_lr = {}, {}, {}, False
    lr_lengths = set()
    out = []
    for group in groups:
        i = group.get("index", 0)
        where = f"params[{i}]"
        members = _param_list(f"{where}['params']", group["params"])
        for p in members:
            if by_name.get(p.name) is not p:
                raise ValueError(f"{where}['params'] holds {p.name!r}, which is not a trainable parameter of the "
                                 "network (the groups must hold only the network's trainable parameters)")
            if p.name in seen:
                raise ValueError(f"{p.name!r} is in params[{seen[p.name]}] and {where}: each parameter "
                                 "belongs to one group")
            seen[p.name] = i
        entry = {"params": members}
        if "lr" in group:
            lr = check_learning_rate(f"{where}['lr']", group["lr"])
            if not isinstance(lr, (nn.Cell, float)) and getattr(lr, "ndim", 1) != 0:
                lr_lengths.add(len(lr) if not hasattr(lr, "shape") else int(lr.shape[0]))
            entry["lr"] = lr
            grouped_lr = True
        if "weight_decay" in group:
            value = group["weight_decay"]
            if isinstance(value, nn.Cell):
                raise TypeError(f"{where}['weight_decay']: dynamic (Cell) weight decay is not supported; give a "
                                "float >= 0")
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"{where}['weight_decay'] must be a float >= 0, got {type(value).__name__}")
            value = _validate.non_negative_float(f"{where}['weight_decay']", value)
            for p in members:
                weight_decay[p.name] = value
        if "grad_centralization" in group:
            flag = group["grad_centralization"]
            if not isinstance(flag, bool):
                raise TypeError(f"{where}['grad_centralization'] must be a bool, got {type(flag).__name__}")
            for p in members:
                centralize[p.name] = flag and centralizes(p)
            passed_over = [p.name for p in members if flag and len(p.shape) >= 2 and not centralizes(p)]
            if passed_over:
                logger.warning("%s['grad_centralization']: not applied to %s (second dimension not a multiple of "
                               "16, nn.Optimizer's rule)", where, passed_over)
        out.append(entry)
    missing = [p.name for p in trainable if p.name not in seen]
    if missing:
        raise ValueError(f"params leaves out trainable parameters of the network: {missing}. Every trainable "
                         "parameter must be in a group; freeze one with requires_grad=False instead")
    if len(lr_lengths) > 1:
        raise ValueError(f"per-step learning-rate lists in params must all have the same length, got lengths "
                         f"{sorted(lr_lengths)}")
    if plain:                                                   # a list of Parameters: one group, no keys
        return ParameterGroups(out[0]["params"], weight_decay, centralize, grouped_lr)
    if order is not None:
        names = [p.name for p in order]
        if sorted(names) != sorted(seen) or any(by_name.get(p.name) is not p for p in order):
            raise ValueError("params: 'order_params' must hold exactly the grouped parameters, each once")
        out.append({"order_params": order})
    return ParameterGroups(out, weight_decay, centralize, grouped_lr)
