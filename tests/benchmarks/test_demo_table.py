"""The README's results table is the demo's own output (benchmarks/demo.py markdown_table)."""
from benchmarks.demo import markdown_table


def _rows(accuracies, losses=None):
    losses = losses or [1.0] * len(accuracies)
    return [{"epoch": i + 1, "test_acc": a, "train_loss": l, "seconds": 1.5 * (i + 1)}
            for i, (a, l) in enumerate(zip(accuracies, losses))]


def test_markdown_table_reports_the_epoch_each_optimizer_reaches_momentums_best():
    table = markdown_table({"momentum": _rows([0.5, 0.9, 0.8], [2.0, 1.0, 0.5]),
                            "kfac": _rows([0.95, 0.97, 0.96]),
                            "thor": _rows([0.4, 0.6, 0.7])})
    lines = table.splitlines()
    assert lines[0].startswith("| optimizer |") and "first epoch at 0.9000" in lines[0]
    assert lines[2] == "| `nn.Momentum` | 0.5000 | 0.9000 | 2 | 3.0 |"
    assert lines[3] == "| `ngd.KFAC` | 1.0000 | 0.9700 | 1 | 1.5 |"
    assert lines[4] == "| `ngd.THOR` | 1.0000 | 0.7000 | not reached | - |"
