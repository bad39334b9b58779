"""First-order baselines whose training graph holds one run-time branch (``momentum-cf``, ``adam-cf``).

Why they exist (measured 2026-11-24, Intel Xeon, 2 vCPU, MindSpore 2.10 CPU, graph mode; docs/cpu_notes.md,
section 7, "A graph without a run-time branch runs at one of two speeds"): a training step whose graph has no run-time branch, such
as ``nn.Momentum``'s or ``nn.Adam``'s, runs at one of two speeds that alternate from one stretch of
steps to the next. The slow one is the speed of the same graph pinned to one core (``taskset -c 0``).
A graph with a run-time branch, such as every natural-gradient optimizer's, ran at the fast speed
throughout. Median step of the stock optimizer against the same optimizer with one never-taken branch:

* ``ConvBNNet`` at batch 32: 37.0 against 21.0 ms;
* the Fashion-MNIST MLP at batch 4096: 206.8 against 146.8 ms (Adam 203.7 against 146.5 ms);
* the digits CNN with BatchNorm at batch 64: 4.5 against 3.9 ms;
* ResNet-20 at batch 128: 496 against 495 ms (no difference).

A comparison with the stock optimizer therefore flatters the natural-gradient optimizers on small
networks. These variants give the first-order update its fast speed: the same arithmetic, plus one
branch on a flag that is never set, so the benchmarks can measure against the better of the two.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor

__all__ = ["MOMENTUM_KINDS", "with_runtime_branch", "BranchedMomentum", "BranchedAdam", "momentum_baseline"]

# the step-time benchmarks' Momentum baselines: stock, and with one never-taken run-time branch; their
# ratios divide by the faster median
MOMENTUM_KINDS = ("momentum", "momentum-cf")


def with_runtime_branch(optimizer_class):
    """A subclass of ``optimizer_class`` (an ``nn.Optimizer``) whose step ends with one run-time branch
    that is never taken: the update is the stock one, bit for bit."""

    class Branched(optimizer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.branch_flag = Parameter(Tensor(False), name="baseline.branch_flag", requires_grad=False)
            self.branch_count = Parameter(Tensor(np.zeros((), np.float32)), name="baseline.branch_count",
                                          requires_grad=False)

        def construct(self, gradients):
            success = super().construct(gradients)
            if self.branch_flag:                      # never set: only the graph's structure changes
                ops.assign_add(self.branch_count, ops.ones((), ms.float32))
            return success

    Branched.__name__ = Branched.__qualname__ = f"Branched{optimizer_class.__name__}"
    return Branched


BranchedMomentum = with_runtime_branch(nn.Momentum)
BranchedAdam = with_runtime_branch(nn.Adam)


def momentum_baseline(kind, params, learning_rate, momentum=0.9):
    """``nn.Momentum`` (``kind="momentum"``) or :data:`BranchedMomentum` (``"momentum-cf"``) over ``params``."""
    if kind not in MOMENTUM_KINDS:
        raise ValueError(f"kind must be one of {MOMENTUM_KINDS}, got {kind!r}")
    cls = nn.Momentum if kind == "momentum" else BranchedMomentum
    return cls(params, learning_rate=learning_rate, momentum=momentum)
