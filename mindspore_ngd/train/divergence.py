"""A loss-side divergence stop: a run whose loss explodes while every value stays finite.

The optimizers' own stop (:mod:`mindspore_ngd.optim.divergence`) sees only gradients and damping. In a
network that ends in BatchNorm, global pooling and a softmax cross-entropy, a run can climb from the
chance loss to ten times it while the gradient stays bounded: the softmax gradient ``p - y`` has a
norm of at most sqrt(2) per example, and BatchNorm rescales what flows back. Measured on the model
zoo's THOR ResNet-50 recipe at 64x64 (docs/algorithms.md): the loss went 2.3 -> 189 -> 17-20 and
the run ended normally, without tripping the optimizer's gradient-norm or damping rule; only the
loss showed it. :class:`DivergenceMonitor` watches the loss that ``Model.train`` (or a hand-written loop)
already has.
"""
import math
from collections import deque

import numpy as np
from mindspore.train import Callback

from .. import _validate
from ..optim.divergence import ADVICE, DIVERGED
from ..optim.engine import NGDOptimizer
from .callbacks import TrainingGuard

__all__ = ["DivergenceMonitor", "with_divergence_stops", "step_loss", "FIRST_ORDER_ADVICE"]

# what the stop of a run with a first-order optimizer (nn.Momentum, nn.Adam, ...) tells the user to change:
# it has no damping and no clip
FIRST_ORDER_ADVICE = "Lower the learning rate, or lengthen its warm-up."


def step_loss(outputs):
    """The scalar loss of a step's outputs, as a float (None when there is none): a Tensor, a number,
    or the tuple of a loss-scale train cell (loss, overflow, scale), whose first item is the loss.
    What :class:`DivergenceMonitor` reads; the benchmarks record each step's loss with it too."""
    if isinstance(outputs, (tuple, list)):
        if not outputs:
            return None
        outputs = outputs[0]
    if outputs is None:
        return None
    value = outputs.asnumpy() if hasattr(outputs, "asnumpy") else np.asarray(outputs)
    value = np.asarray(value, dtype=np.float64)
    return float(value.mean()) if value.size else None


class DivergenceMonitor(Callback):
    """Stops training whose loss stays far above where it started, or is not finite.

    A step counts as exploded when its loss is above ``growth`` times the absolute value of the first
    finite loss the monitor saw, or is not finite. Two checks raise
    ``RuntimeError("<name> diverged at step N: ...")``, the same kind of error as the optimizers'
    own stop (:func:`mindspore_ngd.is_divergence` recognises it), naming the evidence and what to
    change:

    - **during the run**, ``patience`` exploded steps among the last ``2 * patience`` (so also
      ``patience`` in a row);
    - **at its end** (:meth:`finish`; ``Model.train`` calls it when training ends), when the run ends
      in a stretch of at most ``patience`` steps of which at least half exploded, and at least 5: a
      run does not end silently in the middle of a blow-up that the first check had no time to judge.

    Why a window and a default of 40 (measured 2026-11-29, docs/algorithms.md "The loss-side stop"):
    a healthy run can explode for a while and recover. K-FAC with factors every 10 steps and
    inverses every 100 on Fashion-MNIST 2c2d at batch 128 had an exploded loss on up to 29 of 40
    steps, eight of them infinite, after its first inverses, and then reached 90% test accuracy; a
    patience of 10 stopped two such runs of three. A run that stays blown up is still stopped, after 40
    exploded steps in a row at the latest. THOR at damping 1e-4 on the
    digits CNN explodes on 25-32 of its last 38 steps and ends below 0.9 test accuracy; within its 66
    steps the end check stops it. A non-finite loss counts because the gradients need not follow it:
    a softmax cross-entropy whose logits have blown up is ``inf`` while its gradient ``p - y`` stays
    bounded, so the optimizer keeps taking finite steps and its own stop (a run of non-finite
    gradients) never comes.

    In ``Model.train`` pass it with the other callbacks; in a hand-written loop call
    :meth:`observe` with each step's loss and :meth:`finish` after the last. The first loss is the
    reference, so start the monitor with the run (a resumed run takes its first step as the
    reference). A run trained in several ``Model.train`` calls with one monitor is checked at the end
    of each call.

    Args:
        growth (float): how many times the first loss a loss must exceed to count (> 1; default 1.5:
            a classifier that starts at the chance loss and stays at 1.5x it is not training).
        patience (int): exploded steps among the last ``2 * patience`` before the stop; the end
            check reads at most the last ``patience`` steps (>= 1; default 40).
        name (str): the name in the message, for example ``type(optimizer).__name__``.
        advice (Optional[str]): what the message tells the user to change. None (default): the
            natural-gradient optimizers' advice (raise the damping, clip the update or lower the
            learning rate); :func:`with_divergence_stops` gives a first-order optimizer
            ``FIRST_ORDER_ADVICE`` (lower the learning rate).

    Attributes:
        reference (float or None): the first finite loss.
        run (int): the current count of consecutive exploded steps.
        longest (int): the longest such count so far.
        recent (int): the exploded steps among the last ``2 * patience`` (since the reference).
        worst (float): the largest ratio of a finite loss to the reference so far.
    """

    def __init__(self, growth=1.5, patience=40, name="training", advice=None):
        super().__init__()
        self.growth = _validate.growth_factor("growth", growth, "how many times the first loss counts as exploded")
        self.patience = _validate.positive_int("patience", patience)
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if advice is not None and (not isinstance(advice, str) or not advice):
            raise TypeError(f"advice must be None or a non-empty str, got {advice!r}")
        self.name = name
        self.advice = ADVICE if advice is None else advice
        self.reference = None
        self.run = 0
        self.longest = 0
        self.worst = 0.0
        self.steps = 0
        self._last = None                                   # the last loss, for the message
        self._window = deque(maxlen=2 * self.patience)     # exploded or not, the last 2 * patience steps

    @property
    def recent(self):
        """The exploded steps among the last ``2 * patience`` (since the reference was taken)."""
        return sum(self._window)

    def observe(self, loss):
        """Account one step's loss (a Tensor, a number, or a loss-scale cell's output tuple); raise
        the divergence error when ``patience`` of the last ``2 * patience`` losses exceeded the
        threshold or were not finite."""
        self.steps += 1
        value = step_loss(loss)
        if value is None:
            return
        self._last = value
        finite = math.isfinite(value)
        if finite and self.reference is None:
            self.reference = value
            self.run = 0
            self._window.clear()
            return
        scale = 0.0 if self.reference is None else abs(self.reference)
        if finite and scale > 0:
            self.worst = max(self.worst, value / scale)
        exploded = not finite or (scale > 0 and value > self.growth * scale)
        self.run = self.run + 1 if exploded else 0
        self._window.append(exploded)
        self.longest = max(self.longest, self.run)
        if self.recent >= self.patience:
            if self.run >= self.patience:
                self._stop(f"for {self.run} consecutive steps", in_a_row=True)
            self._stop(f"on {self.recent} of the last {len(self._window)} steps")

    def finish(self):
        """The end-of-run check: raise the divergence error when the run ends in a stretch of at most
        ``patience`` steps (since the reference) of which at least half exploded, and at least 5
        (``patience`` if smaller). The longest such stretch is named."""
        tail = list(self._window)[-self.patience:]
        exploded, found = 0, None
        for length, bad in enumerate(reversed(tail), 1):
            exploded += bad
            if exploded >= max(length / 2, min(5, self.patience)):
                found = (exploded, length)
        if found:
            self._stop(f"on {found[0]} of its last {found[1]} steps, when the run ended")

    def _stop(self, how_often, in_a_row=False):
        """Raise the divergence error; ``how_often`` says on which steps the loss exploded."""
        value = self._last
        if self.reference is None:
            evidence = f"the loss was not finite {how_often} (now {value})"
        else:
            evidence = (f"the loss {'stayed' if in_a_row else 'was'} above {self.growth:g}x the first step's "
                        f"{self.reference:.4g} or {'was ' if in_a_row else ''}not finite {how_often} "
                        f"(now {value:.4g})")
        raise RuntimeError(f"{self.name} {DIVERGED} {self.steps}: {evidence}; DivergenceMonitor "
                           f"growth={self.growth:g}, patience={self.patience}. {self.advice}")

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        self.observe(params.net_outputs)

    def on_train_end(self, run_context):
        self.finish()


def with_divergence_stops(callbacks, optimizer):
    """``callbacks`` (None, one Callback or a list), as a new list, with the callbacks that stop a
    diverging run of ``optimizer`` appended unless they are there already: a :class:`DivergenceMonitor`
    named after the optimizer (with ``FIRST_ORDER_ADVICE`` when it is not a natural-gradient optimizer),
    and a :class:`mindspore_ngd.TrainingGuard` when the optimizer runs without host calls (Ascend, GPU:
    the step records a stop, the guard raises it on the host)."""
    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    callbacks = list(callbacks)
    if not any(isinstance(c, DivergenceMonitor) for c in callbacks):
        advice = None if isinstance(optimizer, NGDOptimizer) else FIRST_ORDER_ADVICE
        callbacks.append(DivergenceMonitor(name=type(optimizer).__name__, advice=advice))
    if not getattr(optimizer, "host_calls", True) and not any(isinstance(c, TrainingGuard) for c in callbacks):
        callbacks.append(TrainingGuard(optimizer))
    return callbacks
