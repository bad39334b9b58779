"""Training callbacks built on MindSpore's own: a throughput record on top of ``TimeMonitor``, and a
recorder of the metrics ``Model.fit`` computes when it evaluates.

Evaluation itself is ``Model.fit(valid_dataset=..., valid_frequency=...)`` (see train.py); these
callbacks only keep what it and ``TimeMonitor`` already measure, for the JSON summary train.py writes.
"""
import json
import os
import time

from mindspore.train import Callback, TimeMonitor

__all__ = ["EvalRecorder", "ThroughputMonitor"]


class EvalRecorder(Callback):
    """Keep the metrics of every evaluation ``Model.fit`` runs (``history``: one dict per evaluation,
    with its epoch), for the run's summary; ``Model.fit`` prints them itself."""

    def __init__(self):
        super().__init__()
        self.history = []

    def on_eval_end(self, run_context):
        params = run_context.original_args()
        result = {key: float(value) for key, value in params.metrics.items()}
        self.history.append({"epoch": params.cur_epoch_num, **result})


class ThroughputMonitor(TimeMonitor):
    """``TimeMonitor`` (it prints the epoch and per-step times) that also records images/s per epoch and
    writes a JSON summary at the end of training.

    One timer serves both: the epoch's seconds are ``TimeMonitor``'s own ``epoch_time`` mark. ``Model.fit``
    evaluates inside the training epoch, before the epoch's end callbacks, and ``TimeMonitor`` times
    that evaluation with the same mark; the mark is moved on by the evaluation's duration afterwards,
    so the training epoch's time (printed and recorded) leaves the evaluation out. The first
    epoch of a run includes graph compilation, so the summary's ``images_per_s`` averages the later
    epochs (all epochs if there is only one). ``images_per_s`` is per device; the global rate is
    ``images_per_s * group_size``.
    """

    def __init__(self, batch_size, group_size=1, path=None, printer=print):
        super().__init__()
        self.batch_size, self.group_size, self.path, self.printer = batch_size, group_size, path, printer
        self.epochs = []
        self._train_mark = None

    def on_eval_epoch_begin(self, run_context):
        self._train_mark = self.epoch_time
        super().on_eval_epoch_begin(run_context)

    def on_eval_epoch_end(self, run_context):
        evaluation = time.time() - self.epoch_time
        super().on_eval_epoch_end(run_context)
        if self._train_mark is not None:
            self.epoch_time = self._train_mark + evaluation
            self._train_mark = None

    def on_train_epoch_end(self, run_context):
        seconds = time.time() - self.epoch_time
        super().on_train_epoch_end(run_context)
        params = run_context.original_args()
        steps = params.batch_num
        record = {"epoch": params.cur_epoch_num, "seconds": seconds, "steps": steps,
                  "images_per_s": steps * self.batch_size / seconds}
        self.epochs.append(record)
        self.printer(f"throughput epoch {record['epoch']}: {record['images_per_s']:.1f} images/s per device "
                     f"({steps} steps of {self.batch_size} in {seconds:.2f} s)")

    def summary(self):
        later = self.epochs[1:] or self.epochs
        images = sum(r["steps"] * self.batch_size for r in later)
        seconds = sum(r["seconds"] for r in later)
        rate = images / seconds if seconds else float("nan")
        return {"batch_size": self.batch_size, "group_size": self.group_size, "epochs": self.epochs,
                "images_per_s": rate, "global_images_per_s": rate * self.group_size,
                "first_epoch_seconds": self.epochs[0]["seconds"] if self.epochs else None}

    def on_train_end(self, run_context):
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "w", encoding="utf-8") as handle:
                json.dump(self.summary(), handle, indent=2)
