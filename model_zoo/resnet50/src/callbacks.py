"""Training callbacks: evaluation every N epochs and a throughput record."""
import json
import os
import time

from mindspore.train import Callback

__all__ = ["EvalCallback", "ThroughputMonitor"]


class EvalCallback(Callback):
    """Run ``model.eval`` on ``dataset`` after epochs ``start, start + interval, ...`` and print top-1/top-5."""

    def __init__(self, model, dataset, interval, start_epoch=1, printer=print):
        super().__init__()
        self.model, self.dataset = model, dataset
        self.interval, self.start_epoch = interval, start_epoch
        self.printer = printer
        self.history = []

    def on_train_epoch_end(self, run_context):
        epoch = run_context.original_args().cur_epoch_num
        if epoch < self.start_epoch or (epoch - self.start_epoch) % self.interval:
            return
        start = time.perf_counter()
        result = self.model.eval(self.dataset, dataset_sink_mode=False)
        result = {k: float(v) for k, v in result.items()}
        self.history.append({"epoch": epoch, **result})
        self.printer(f"eval epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.items()))
                     + f" ({time.perf_counter() - start:.1f} s)")


class ThroughputMonitor(Callback):
    """Wall time and images/s of every epoch; a JSON summary at the end of training.

    The first epoch of a run includes graph compilation, so the summary's ``images_per_s`` averages
    the later epochs (all epochs if there is only one). ``images_per_s`` is per device; the global
    rate is ``images_per_s * group_size``.
    """

    def __init__(self, batch_size, group_size=1, path=None, printer=print):
        super().__init__()
        self.batch_size, self.group_size, self.path, self.printer = batch_size, group_size, path, printer
        self.epochs = []
        self._start = self._first_step = None

    def on_train_epoch_begin(self, run_context):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, run_context):
        params = run_context.original_args()
        seconds = time.perf_counter() - self._start
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
