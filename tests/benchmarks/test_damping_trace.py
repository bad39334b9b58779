"""benchmarks.damping_trace: a run step by step with the divergence stop disabled."""
import io

import numpy as np
import pytest

from benchmarks import damping_trace
from benchmarks.tasks import TASKS

DIGITS = TASKS["digits-cnn"]


@pytest.mark.skipif(not DIGITS.available(), reason="needs scikit-learn")
def test_trace_reports_every_step_of_a_run_that_the_stop_cannot_end():
    stream = io.StringIO()
    rows, accuracy = damping_trace.trace(DIGITS, "kfac", 0.1, 1e-2, steps=4, stream=stream)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert np.isfinite([row["loss"] for row in rows]).all()
    assert all(row["boost"] >= 1.0 and row["exploding"] == 0 for row in rows)
    assert np.isnan(rows[0]["rho"]) and np.isfinite(rows[-1]["rho"])      # no step in the ratio yet at step 0
    assert len(stream.getvalue().splitlines()) == 4 and "multiplier" in stream.getvalue()
    assert 0.0 <= accuracy <= 1.0


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--optimizer", "adam"], "invalid choice"),
])
def test_bad_arguments_are_named(argv, words, capsys):
    base = {"--task": "digits-cnn", "--optimizer": "kfac", "--lr": "0.1", "--damping": "1e-2"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    with pytest.raises(SystemExit):
        damping_trace.main([item for pair in base.items() for item in pair])
    assert words in capsys.readouterr().err


def test_an_optimizer_without_adaptive_damping_is_refused():
    with pytest.raises(ValueError, match="'kfac-fixed' has no adaptive damping"):
        damping_trace.trace(DIGITS, "kfac-fixed", 0.1, 1e-2, steps=1)
