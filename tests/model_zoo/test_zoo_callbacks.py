"""The model zoo's callbacks on MindSpore's own: ThroughputMonitor is a TimeMonitor whose training
epoch leaves out the evaluation Model.fit runs inside it; EvalRecorder keeps Model.fit's metrics."""
from types import SimpleNamespace

from mindspore.train import TimeMonitor

import zoo  # noqa: F401  (puts the model zoo's src/ on sys.path)
from src import callbacks


class _Context:
    def __init__(self, **params):
        self.params = SimpleNamespace(get=lambda key, default=None: getattr(self.params, key, default), **params)

    def original_args(self):
        return self.params


def test_throughput_epoch_leaves_out_the_evaluation_inside_it(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(callbacks.time, "time", lambda: now[0])   # the time module TimeMonitor reads too
    lines = []
    monitor = callbacks.ThroughputMonitor(batch_size=8, printer=lines.append)
    assert isinstance(monitor, TimeMonitor)
    train = _Context(cur_epoch_num=1, batch_num=4, dataset_sink_mode=False, mode="train")
    evaluation = _Context(cur_epoch_num=1, batch_num=2, dataset_sink_mode=False, mode="eval")
    for at, hook, context in ((100.0, monitor.on_train_epoch_begin, train),      # the epoch starts
                              (101.0, monitor.on_eval_epoch_begin, evaluation),  # Model.fit evaluates
                              (105.0, monitor.on_eval_epoch_end, evaluation),    # 4 s of evaluation
                              (106.0, monitor.on_train_epoch_end, train)):       # 6 s in all, 2 s training
        now[0] = at
        hook(context)
    assert [round(e["seconds"], 6) for e in monitor.epochs] == [2.0]
    assert monitor.epochs[0]["images_per_s"] == 4 * 8 / 2.0
    assert lines == ["throughput epoch 1: 16.0 images/s per device (4 steps of 8 in 2.00 s)"]


def test_eval_recorder_keeps_the_metrics_of_each_evaluation():
    recorder = callbacks.EvalRecorder()
    recorder.on_eval_end(_Context(cur_epoch_num=3, metrics={"top_1_accuracy": 0.5}))
    assert recorder.history == [{"epoch": 3, "top_1_accuracy": 0.5}]
