"""Callbacks that report what a natural-gradient optimizer did during training, and stop it with a reason."""

from mindspore.train import Callback

from .. import _log

__all__ = ["RefreshMonitor", "TrainingGuard"]



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


class TrainingGuard(Callback):
    """Stops ``Model.train`` with the optimizer's reason when its step recorded a stop.

    An optimizer built with ``host_calls=False`` (the default on Ascend and GPU, whose graphs run
    whole on the device) cannot raise from its step: at a divergence it records the stop, prints it
    with ``ops.Print`` and freezes the weights. This callback calls ``optimizer.check_status()`` at the
    end of every ``interval``-th step (with ``dataset_sink_mode=True``: every sink cycle) and at the
    end of every epoch; that raises the same ``RuntimeError`` the step raises with host calls
    (:func:`mindspore_ngd.is_divergence` recognises it), which ends ``Model.train``. It also logs the
    WARNINGs of the steps skipped and the layers demoted since the previous check. With host calls
    (CPU's default) the step raises by itself and the callback finds nothing to report.

    Args:
        optimizer: an optimizer of this package (:class:`mindspore_ngd.NGDOptimizer`).
        interval (int): check every this many step ends (>= 1; each check reads a few scalars from
            the device). Default 1.

    Attributes:
        error: the ``RuntimeError`` that stopped training, or None.

    Examples:
        >>> model.train(epochs, dataset, callbacks=[mindspore_ngd.TrainingGuard(opt)], dataset_sink_mode=True)
    """

    def __init__(self, optimizer, interval=1):
        super().__init__()
        if not callable(getattr(optimizer, "check_status", None)):
            raise TypeError(f"TrainingGuard needs an optimizer of mindspore_ngd (with check_status), "
                            f"got {type(optimizer).__name__}")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an int >= 1, got {interval!r}")
        self.optimizer = optimizer
        self.interval = interval
        self.error = None
        self._ends = 0

    def _check(self, run_context):
        try:
            self.optimizer.check_status()
        except RuntimeError as error:
            self.error = error
            run_context.request_stop()
            raise

    def on_train_step_end(self, run_context):
        self._ends += 1
        if self._ends % self.interval == 0:
            self._check(run_context)

    def on_train_epoch_end(self, run_context):
        self._check(run_context)
