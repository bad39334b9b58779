"""Callbacks that report what a natural-gradient optimizer did during training."""

from mindspore.train import Callback

from .. import _log

__all__ = ["RefreshMonitor"]



class RefreshMonitor(Callback):
    """Logs, per epoch, the fraction of statistics an SP-NGD optimizer recomputed per step.

    ``ratio = (refreshes during the epoch) / (steps in the epoch * number of statistics)``; 1 means
    every statistic every step (K-FAC with interval 1). The per-epoch values are kept in
    :attr:`history` as ``(epoch, steps, ratio)``.

    Args:
        optimizer: an optimizer whose refresh rule has per-statistic intervals (:class:`mindspore_ngd.SPNGD`,
            or any :class:`mindspore_ngd.NGDOptimizer` with a ``StaleIntervals`` rule).
        verbose (bool or None): one line per epoch on the "mindspore_ngd" logger. None (default): at
            INFO, shown only when the application configured logging at INFO; True: always shown;
            False: never.
    """

    def __init__(self, optimizer, verbose=None):
        super().__init__()
        rule = getattr(getattr(optimizer, "policy", None), "refresh", None)
        if not getattr(rule, "per_statistic", False):
            raise TypeError(f"RefreshMonitor needs an optimizer with per-statistic refresh intervals (SPNGD), "
                            f"got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.verbose = verbose
        self.history = []
        self._start = None

    def _totals(self):
        counters = self.optimizer.state_counters()
        return counters["step"], counters["statistic_refreshes"]

    def on_train_epoch_begin(self, run_context):
        self._start = self._totals()

    def on_train_epoch_end(self, run_context):
        step, refreshes = self._totals()
        steps = step - self._start[0]
        count = len(self.optimizer.statistic_names)
        ratio = (refreshes - self._start[1]) / float(max(steps, 1) * count)
        epoch = run_context.original_args().cur_epoch_num
        self.history.append((epoch, steps, ratio))
        _log.info(self.verbose, "epoch %d: %d steps, refresh ratio %.3f (%d statistics)", epoch, steps, ratio, count)
