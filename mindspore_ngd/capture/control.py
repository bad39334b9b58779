"""The one owner of the capture flags.

Every statistic (A and G of each preconditioned layer, the unit-wise Fisher of each BatchNorm layer)
has a boolean flag Parameter that the network's capture reads in the forward and backward pass: the
statistic is computed only on steps whose flag is set. The flags live in the capture cells (the
network's graph reads them), but only :class:`CaptureControl` writes them: the optimizer's refresh
rule decides through :meth:`set_all` / :meth:`set_each` (and THOR's trace probes through
:meth:`set_probes`), and a training step that drives the capture itself (the Monte-Carlo Fisher
step) parks and restores them through :attr:`flags` after :meth:`claim`.

Statistic order, used by every vector over statistics: A of every layer, then G of every layer,
then F of every BatchNorm layer.

Whether a step captures anything is kept in one more flag, ``{prefix}.capturing``, written with the
others, so that the optimizer's fold branch reads one Parameter instead of all the flags: MindSpore
2.10 copies (``TensorMove``) every read of a Parameter that one graph reads more than once, and the
capture in the network already reads each flag (profile in ``docs/performance.md``).
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, ParameterTuple, Tensor

__all__ = ["CaptureControl"]


class CaptureControl(nn.Cell):
    """Writes the capture flags of one optimizer's statistics (see the module docstring).

    Args:
        layer_captures: the ``LayerCapture`` cells of the preconditioned layers, in layer order.
        norm_captures: the ``NormCapture`` cells of the unit-wise BatchNorm layers.
        scale_probe (LossScaleProbe): measures the loss scale of each step; None when no layer can
            (no bias) or the capture is driven by a Monte-Carlo step with its own scale.
        prefix (str): the optimizer's Parameter prefix (of ``{prefix}.capturing``).
    """

    def __init__(self, layer_captures, norm_captures, scale_probe=None, prefix="ngd"):
        super().__init__(auto_prefix=False)
        self.scale_probe = scale_probe
        self.prefix = prefix
        # every capture flag starts set (the first step captures everything)
        self.capturing = Parameter(Tensor(True), name=f"{prefix}.capturing", requires_grad=False)
        layer_captures, norm_captures = list(layer_captures), list(norm_captures)
        self.flags = ParameterTuple([c.capture_a for c in layer_captures] + [c.capture_g for c in layer_captures]
                                    + [c.capture_f for c in norm_captures])
        self.statistics = len(self.flags)
        self.layers = len(layer_captures)
        probes = [c for c in layer_captures if c.traces_enabled]
        self.has_probes = bool(probes)
        if self.has_probes:
            self.probes = ParameterTuple([c.trace_a for c in probes] + [c.trace_g for c in probes])
        self.driver = None

    def claim(self, driver):
        """Record (Python side, before compilation) that a training step drives the capture itself;
        ``driver`` names it in messages. A second, different driver is refused."""
        if self.driver is not None and self.driver != driver:
            raise RuntimeError(f"the capture is already driven by {self.driver}")
        self.driver = driver

    def any(self, token=None):
        """Whether any statistic is captured (the ``capturing`` flag, kept with the others); with
        ``token``, read after it (e.g. the flags the rule set for the next step)."""
        return self.capturing if token is None else ops.depend(self.capturing, token)

    def pending(self):
        """Host side: whether the next step captures any statistic or probes a trace (reads the flags
        the last step set, synchronising with the device)."""
        if bool(self.capturing.asnumpy()):
            return True
        return bool(self.has_probes and self.probing().asnumpy())

    def g_correction(self):
        """Factor that unscales a batch trace of G captured between folds (the last measured scale)."""
        if self.scale_probe is None:
            return 1.0
        return self.scale_probe.last_correction()

    def layer_flags(self, k):
        """(capture A?, capture G?) of layer ``k`` this step."""
        return self.flags[k], self.flags[self.layers + k]

    def norm_flag(self, j):
        """Capture the Fisher of BatchNorm layer ``j``? (this step)"""
        return self.flags[2 * self.layers + j]

    def norm_flags(self):
        """Every BatchNorm layer's flag, in order (a tuple)."""
        flags = ()
        for j in range(self.statistics - 2 * self.layers):
            flags += (self.norm_flag(j),)
        return flags

    def set_all(self, due):
        """Capture every statistic next step, or none (a bool scalar)."""
        for flag in self.flags:
            ops.assign(flag, due)
        ops.assign(self.capturing, due)

    def set_each(self, due):
        """Per-statistic flags for the next step: a bool vector or tuple in statistic order."""
        for i in range(self.statistics):
            ops.assign(self.flags[i], due[i])
        ops.assign(self.capturing, ops.any(ops.stack(due) if isinstance(due, tuple) else due))

    def upgrade(self, param_dict):
        """``param_dict`` with ``{prefix}.capturing`` added when a checkpoint written before it existed
        has the capture flags (it is their OR); otherwise ``param_dict`` itself."""
        name = f"{self.prefix}.capturing"
        keys = [flag.name for flag in self.flags]
        if name in param_dict or not all(key in param_dict for key in keys):
            return param_dict
        out = dict(param_dict)
        value = np.array(any(bool(out[key].asnumpy()) for key in keys))
        out[name] = Parameter(Tensor(value), name=name, requires_grad=False)
        return out

    def park(self, saved, token):
        """Monte-Carlo step: store the flags in the bool vector Parameter ``saved`` (after ``token``)
        and switch every capture off; returns the store, for ordering."""
        flags = ()
        for flag in self.flags:
            flags += (ops.depend(flag, token),)
        parked = ops.assign(saved, ops.stack(flags))
        for flag in self.flags:
            ops.assign(flag, ops.depend(ops.zeros((), ms.bool_), parked))
        return parked

    def restore(self, values):
        """Monte-Carlo step: set the flags back from the parked vector ``values``."""
        restored = ()
        for i in range(self.statistics):
            restored += (ops.assign(self.flags[i], values[i]),)
        return ops.stack(restored)

    def probing(self):
        """Whether this step probes the traces (THOR's trace rule; all probe flags are set together)."""
        return self.probes[0]

    def set_probes(self, due):
        """Probe the batch traces next step, or not (a bool scalar)."""
        for probe in self.probes:
            ops.assign(probe, due)
