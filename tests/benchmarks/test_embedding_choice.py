"""benchmarks.embedding_choice: a small transformer trained with and without a preconditioned embedding."""
import numpy as np
import pytest

from benchmarks import embedding_choice


@pytest.mark.slow
def test_a_run_reports_its_losses_and_the_embedding_is_what_changes():
    plain = embedding_choice.run("kfac", False, epochs=2)
    preconditioned = embedding_choice.run("kfac", True, epochs=2)
    for result in (plain, preconditioned):
        assert len(result["losses"]) == 16 and np.isfinite(result["losses"]).all() and result["stopped"] is None
        assert result["first"] == pytest.approx(np.mean(result["losses"][:8]))
    # the same data and initial weights: the first step's loss is the same, then the runs part
    assert plain["losses"][0] == preconditioned["losses"][0]
    assert plain["losses"][-1] != preconditioned["losses"][-1]


@pytest.mark.parametrize("argv, words", [
    (["--optimizers", "adam"], "--optimizers must name some of"),
    (["--epochs", "1"], "--epochs must be >= 2"),
    (["--seeds", "0"], "--seeds must be >= 1"),
])
def test_bad_arguments_are_named(argv, words, capsys):
    with pytest.raises(SystemExit):
        embedding_choice.main(argv)
    assert words in capsys.readouterr().err
