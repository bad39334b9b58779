"""A training step with a second, lean graph for the steps that capture nothing.

Every step of a natural-gradient optimizer runs the capture's run-time branches in the network (one
per statistic: A in the forward pass, G in the backward pass) and the optimizer's fold branch, even
when no flag is set, and MindSpore 2.10 charges a branch whether or not it is taken. Branches cannot
be removed from one graph, so :class:`NGDTrainOneStepCell` compiles two: the full step (as
``nn.TrainOneStepCell``) and a lean one without the capture branches, the fold and the factor
write-backs, and picks one from Python before each step, from the capture flags the previous step
set. On every step on which the full graph would have captured nothing the two compute the same
values, so training is unchanged (tested bit for bit, on one process and on two msrun ranks); the
refresh of the inverses, the guard and the update are in both. Measured in ``docs/performance.md``
(a lean graph for the steps that capture nothing): ResNet-20 at batch 128, K-FAC every 20 steps,
15-28 ms less per step in three runs (1.01-1.04x Momentum's step instead of 1.05-1.09x), at the
price of a second compilation (13-15 s after 40-45 s).
"""
from mindspore import nn

from ..optim.engine import NGDOptimizer

__all__ = ["NGDTrainOneStepCell"]


class NGDTrainOneStepCell(nn.Cell):
    """``nn.TrainOneStepCell`` for the natural-gradient optimizers, with a lean graph for the steps
    that capture no statistic, for ``Model(NGDTrainOneStepCell(...))``.

    Before each step it reads the optimizer's capture flags (a host read of two scalars): a step that
    captures or probes anything runs the full graph, the others run the lean graph. With K-FAC's
    ``factor_update_interval=P`` or THOR's ``frequency=P`` that is ``P - 1`` steps in ``P``; with SP-NGD
    the steps on which no statistic is due; K-FAC with factors on every step never uses it.

    The lean graph is compiled on the first step that uses it: a second compilation, paid once (a
    third to a half of the first, measured on ResNet-20 and three small networks). Use it when the run is long enough for
    the per-step saving to repay that (``docs/performance.md`` has both numbers). Where MindSpore
    compiles the training loop into one graph (a sunk loop on a device that runs it, or this cell
    called inside another graph), ``construct`` runs the full step on every step: always correct,
    never lean. On CPU, MindSpore 2.10 calls the cell once per step even with
    ``dataset_sink_mode=True`` (measured), so the lean graph runs there too.

    Args:
        network (nn.Cell): the network with its loss (e.g. ``nn.WithLossCell``), as for
            ``nn.TrainOneStepCell``.
        optimizer (NGDOptimizer): K-FAC, SP-NGD or THOR built on the same network (not ``fisher="mc"``).
        sens (float or None): as ``nn.TrainOneStepCell`` (the loss scale of the backward pass; None: 1).

    Inputs: as ``network``. Outputs: the loss. ``full_steps`` and ``lean_steps`` count the steps each
    graph ran.
    """

    def __init__(self, network, optimizer, sens=None):
        super().__init__(auto_prefix=False)
        if not isinstance(optimizer, NGDOptimizer):
            raise TypeError(f"optimizer must be a mindspore_ngd optimizer (KFAC, SPNGD, THOR), "
                            f"got {type(optimizer).__name__}")
        if optimizer.policy.fisher == "mc":       # the only optimizers whose capture another step drives
            raise ValueError(f"{type(optimizer).__name__} cannot run a lean step: fisher='mc' trains with "
                             "MCFisherTrainStep, which drives the capture itself")
        # one backward pass per optimizer call by construction (this cell runs both): no gradient
        # accumulation to refuse, and the pass counter would not be shared by the two graphs
        optimizer._stop_counting_passes()
        self.full = nn.TrainOneStepCell(network, optimizer, sens)
        self.lean = nn.TrainOneStepCell(network, optimizer, sens)
        self.network = network                # as nn.TrainOneStepCell's attributes
        self.optimizer = optimizer
        self.full_steps = 0
        self.lean_steps = 0

    def __call__(self, *inputs):
        if self.optimizer.capture_control.pending():
            self.full_steps += 1
            return self.full(*inputs)
        self.lean_steps += 1
        # the switch holds while the lean graph is compiled (its first call, or a recompilation for
        # new input shapes) and never while the full one is
        self.optimizer._set_lean(True)
        try:
            return self.lean(*inputs)
        finally:
            self.optimizer._set_lean(False)

    def compile(self, *inputs, **kwargs):
        """Compile the full graph for ``inputs``: the graph a step that captures runs (``Cell.compile`` of
        this cell would compile ``construct``, which a call from Python never runs). Runs no step."""
        self.full.compile(*inputs, **kwargs)

    def compile_lean(self, *inputs, **kwargs):
        """Compile the lean graph for ``inputs`` now, as :meth:`compile` does the full one, instead of on
        the first step that captures nothing: to pay both compilations before training, or to time them
        apart. Runs no step and changes no weight or state."""
        self.optimizer._set_lean(True)
        try:
            self.lean.compile(*inputs, **kwargs)
        finally:
            self.optimizer._set_lean(False)

    def construct(self, *inputs):
        # reached only inside another graph or a sunk loop: the full step is correct on every step
        return self.full(*inputs)
