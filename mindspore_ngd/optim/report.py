"""What an optimizer can tell about itself, read on the Python side (``asnumpy``), never in a graph."""
import logging
import sys
import weakref

import numpy as np
from mindspore import nn
from mindspore.ops import constexpr

from .. import _log, _validate
from ..capture.layer_types import layer_type_of

__all__ = ["Inspection", "not_training_message", "report_invisible", "training_loss_message", "loss_refusal",
           "register_for_loss_check"]

logger = logging.getLogger("mindspore_ngd")


def _factor_floats(spec):
    """Floats of one layer's A and G (an Embedding's A is its diagonal)."""
    return int(np.prod(layer_type_of(spec).input_buffer_shape(spec.a_dim))) + spec.g_dim ** 2


class Inspection:
    """Inspection methods of :class:`mindspore_ngd.NGDOptimizer` (a mixin; reads its blocks and rule)."""

    @property
    def owned_layers(self):
        """Names of the preconditioned layers this rank owns (all of them on a single device)."""
        return tuple(b.spec.name for b in self.blocks if b.owned)

    def kronecker_factors(self):
        """``{layer_name: (A, G)}``: the current moving-average factors as NumPy arrays (distributed:
        of the layers this rank owns)."""
        return {b.spec.name: (b.a_factor.asnumpy().copy(), b.g_factor.asnumpy().copy())
                for b in self.blocks if b.owned}

    def parallel_state(self):
        """Distributed: ``{"world_size", "rank", "position", "owned_layers", "inversions": {layer: count}}``
        (inversions: how many times this rank computed each layer's inverses); None on one device."""
        if self.communicator is None:
            return None
        counts = self.exchange.inversions.asnumpy()
        return {"world_size": self.communicator.world_size, "rank": self.communicator.rank,
                "position": self.communicator.position, "owned_layers": list(self.owned_layers),
                "inversions": {s.name: int(counts[k]) for k, s in enumerate(self.layer_specs)}}

    def decayed_parameters(self):
        """Names of the parameters that receive weight decay."""
        return [p.name for p, flag in zip(self._parameters, self._decay) if flag]

    def state_counters(self):
        """Fault and refresh counters as Python ints, plus the refresh rule's own counters (SP-NGD:
        ``statistic_refreshes``; THOR: ``interval``, ``next_refresh``, ``layer_refreshes``)."""
        counters = {"step": int(self.global_step.asnumpy().reshape(-1)[0]),
                    "inverse_refreshes": int(self.inverse_refreshes.asnumpy()),
                    "factor_faults": int(self.factor_faults.asnumpy()),
                    "inverse_faults": int(self.inverse_faults.asnumpy()),
                    "skipped_steps": int(self.skipped_steps.asnumpy()),
                    "damping_boost": float(self.damping_boost.asnumpy())}
        counters.update(self.refresh_rule.counters())
        return counters

    def refresh_state(self):
        """``{statistic: (interval, next refresh step, refreshes so far)}`` as Python ints, for a rule
        with per-statistic intervals (SP-NGD's stale statistics); TypeError for other rules."""
        if not self.policy.refresh.per_statistic:
            raise TypeError(f"{type(self).__name__} has no per-statistic refresh intervals (its refresh rule is "
                            f"{type(self.policy.refresh).__name__}; SP-NGD's StaleIntervals has them)")
        return self.refresh_rule.refresh_state(self.statistic_names)

    def summary(self):
        """A printable table of the preconditioned layers and their factor sizes."""
        rows = [("layer", "kind", "weight", "bias", "A", "G")]
        for s in self.layer_specs:
            a_shape = layer_type_of(s).input_buffer_shape(s.a_dim)
            rows.append((s.name, s.kind, "x".join(map(str, s.weight_shape)), "yes" if s.has_bias else "no",
                         "x".join(map(str, a_shape)) + (" (diagonal)" if len(a_shape) == 1 else ""),
                         f"{s.g_dim}x{s.g_dim}"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        floats = sum(_factor_floats(s) for s in self.layer_specs)
        lines.append(f"{len(self.layer_specs)} preconditioned layers, {floats:,} floats per factor set "
                     f"({4 * floats / 2 ** 20:.1f} MiB; factors, inverses and batch buffers hold 3 sets)")
        for reason, cell in self.plain_layers:
            lines.append(f"not preconditioned: {cell} ({reason})")
        demoted = self.demoted_layers()
        if demoted:
            lines.append(f"demoted to the plain update (captured nothing): {', '.join(demoted)}")
        if self.communicator is not None:
            owned = sum(_factor_floats(b.spec) for b in self.blocks if b.owned)
            lines.append(f"distributed: rank {self.communicator.rank} of {self.communicator.world_size} owns "
                         f"{len(self.owned_layers)} layers [{', '.join(self.owned_layers)}], {owned:,} floats per "
                         "factor set (the others hold 1x1 placeholders; batch buffers stay whole)")
        return "\n".join(lines)

    def _log_layers(self, verbose):
        """At construction: one WARNING line naming every layer whose trainable parameters get the plain
        update although it is not a normalisation layer, grouped by reason (always emitted); with
        ``verbose`` (None: at INFO, shown when the application configured logging; True: always shown;
        False: never, see :mod:`mindspore_ngd._log`), one INFO line naming the preconditioned layers and the plain-update parameters
        (and, distributed, one naming the collectives)."""
        name = type(self).__name__
        if self.plain_layers:
            groups = {}
            for reason, cell in self.plain_layers:
                groups.setdefault(reason, []).append(cell)
            logger.warning("%s: the trainable parameters of %d layer(s) are not preconditioned and get the plain "
                           "momentum update -- %s", name, len(self.plain_layers),
                           "; ".join(f"{reason}: {', '.join(cells)}" for reason, cells in groups.items()))
        if verbose is False:
            return
        plain = [p.name for i, p in enumerate(self._parameters) if self._roles[i][0] < 0 and self._roles[i][3] < 0]
        norms = f"; unit-wise: {', '.join(s.name for s in self.norm_specs)}" if self.norm_specs else ""
        _log.info(verbose, "%s: preconditioning %d layers [%s]; plain momentum update for %d parameters [%s]%s",
                    name, len(self.layer_specs), ", ".join(s.name for s in self.layer_specs),
                    len(plain), ", ".join(plain), norms)
        if self.communicator is not None:
            _log.info(verbose, "%s: %s", name, self.communicator.describe())

    def demoted_layers(self):
        """Names of the preconditioned layers demoted to the plain update because a capture step found
        them invisible (their construct never ran, or their output never reached the loss)."""
        return [name for name, state in self.counters.per_layer().items() if state["demoted"]]

    def factor_updates(self):
        """``{layer_name: (A updates, G updates)}``: how many batches each layer's factors have taken, as
        Python ints (distributed: the same on every rank, also for layers the rank does not own)."""
        return {name: (state["A_updates"], state["G_updates"]) for name, state in self.counters.per_layer().items()}


def report_invisible(owner, names, strict, flags):
    """Host side of the step that demoted layers (called from the compiled step through MindSpore's
    JIT fallback): a WARNING naming them, or with ``strict`` a RuntimeError."""
    found = [name for name, flag in zip(names, np.asarray(flags).reshape(-1)) if flag]
    what = (f"{owner}: {len(found)} preconditioned layer(s) captured no statistics on their first capture "
            f"step: {', '.join(found)}. Their construct is never called (their owner reads their weight "
            "directly) or their output does not reach the loss, so their Kronecker factors "
            "would stay zero and their step be grad/damping")
    if strict:
        raise RuntimeError(f"{what}. strict=True: name them in skip_layers to give them the plain update, or "
                           "use strict=False to demote them automatically")
    logger.warning("%s; demoted to the plain momentum update (lr * grad, as the other un-preconditioned "
                   "parameters; strict=True raises instead)", what)


def training_loss_message(optimizer, checked):
    """The error for the loss of the training cell that runs ``optimizer``, or "".

    The optimizer never sees the loss, but the cell that runs it is on the Python call stack: in graph
    mode the cell being compiled (``Cell.__call__`` compiles its graph, and the optimizer's
    ``construct`` is read then), in PyNative the cell whose ``construct`` calls it. Every cell on the
    stack (a frame's ``self``) that holds ``optimizer`` in its tree -- ``nn.TrainOneStepCell``,
    ``TrainOneStepWithLossScaleCell``, the cell ``Model`` or ``amp.build_train_network`` builds, a
    subclass of one's own -- has each MindSpore loss cell (``nn.LossBase``) in that tree checked by
    :func:`mindspore_ngd._validate.mean_loss_message`. ``checked`` (a dict, id of a cell -> (the cell,
    its message)) keeps the verdicts, so a PyNative loop walks each cell's tree once. A functional loop
    (``ms.value_and_grad``) holds no cell: its loss cannot be checked."""
    frame = sys._getframe(1)
    while frame is not None:
        holder = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        # a weak proxy is skipped: one whose cell is gone raises ReferenceError on isinstance (and no
        # try statement here: MindSpore's parser rejects one when it reads this from the step's graph)
        is_cell = (not isinstance(holder, weakref.ProxyTypes) and isinstance(holder, nn.Cell)
                   and holder is not optimizer)
        if is_cell:
            verdict = checked.get(id(holder))
            if verdict is None or verdict[0] is not holder:       # (an id is reused once its cell is gone)
                verdict = checked[id(holder)] = (holder, _holder_loss_message(optimizer, holder))
            if verdict[1]:
                return verdict[1]
        frame = frame.f_back
    return ""


# the optimizers whose step checks its training cell's loss, by key (:func:`register_for_loss_check`)
_LOSS_CHECKED = weakref.WeakValueDictionary()


def register_for_loss_check(optimizer):
    """The key (an int, a compile-time constant of the step) under which :func:`loss_refusal` finds
    ``optimizer``."""
    key = id(optimizer)
    _LOSS_CHECKED[key] = optimizer
    object.__setattr__(optimizer, "_loss_verdicts", {})       # training_loss_message's ``checked``
    return key


@constexpr
def loss_refusal(key):
    """:func:`training_loss_message` of the optimizer registered under ``key``, computed on the host when
    the step is compiled (graph mode) or run (PyNative): a ``constexpr``, so MindSpore runs it in Python
    instead of parsing the stack walk into the step's graph."""
    optimizer = _LOSS_CHECKED.get(key)
    if optimizer is None:
        return ""
    return training_loss_message(optimizer, optimizer._loss_verdicts)


def _holder_loss_message(optimizer, holder):
    cells = [cell for _, cell in holder.cells_and_names()]
    if not any(cell is optimizer for cell in cells):
        return ""
    for cell in cells:
        if isinstance(cell, nn.LossBase):
            message = _validate.mean_loss_message(cell, f"{type(optimizer).__name__} in {type(holder).__name__}")
            if message:
                return message
    return ""


def not_training_message(owner, names, total):
    """The error of a step called while preconditioned layers are not in training mode (``nn.Cell``
    starts with ``training=False``; ``Model.train`` sets it, a hand-written loop must)."""
    if len(names) == total:
        which = f"the network is not in training mode (none of its {total} preconditioned layers is)"
    else:
        which = (f"{len(names)} of its {total} preconditioned layers are not in training mode: "
                 f"{', '.join(names)}")
    return (f"{owner}: {which}. The layers capture their curvature statistics only in training mode, so this "
            "step would fall back to plain momentum. Call net.set_train() before the training loop (Model.train "
            "does it for you; nn.Cell starts with training=False), and net.set_train(False) only for evaluation. "
            "To leave a layer in inference mode, name it in skip_layers so that it gets the plain update.")
