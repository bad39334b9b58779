"""The package is silent by default: constructing an optimizer prints nothing at INFO; WARNINGs still
reach stderr while the application configured no logging; the INFO layer report comes with
``verbose=True`` or when the application configured logging at INFO (issue 31)."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NET = """
import mindspore_ngd as ngd
from mindspore import nn

class Net(nn.Cell):
    def __init__(self, extra=False):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = nn.Dense(8, 3)
        if extra:
            self.conv1d = nn.Conv1d(4, 4, 3)  # not preconditioned: a WARNING line
    def construct(self, x):
        return self.fc2(self.fc1(x))
"""


def run(body):
    """Run ``NET + body`` in a fresh interpreter (no pytest logging handlers); return its stderr lines
    that come from mindspore_ngd."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), GLOG_v="3")
    out = subprocess.run([sys.executable, "-c", NET + textwrap.dedent(body)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stderr.splitlines() if "KFAC" in line or "SPNGD" in line or "THOR" in line
            or "mindspore_ngd" in line]


@pytest.mark.parametrize("ctor", ["ngd.KFAC(Net(), 0.1)", "ngd.SPNGD(Net(), 0.1)", "ngd.THOR(Net(), 0.1, 0.03)"])
def test_default_construction_prints_nothing(ctor):
    assert run(ctor) == []


def test_warning_still_reaches_stderr_without_logging_configured():
    lines = run("ngd.KFAC(Net(extra=True), 0.1)")
    assert len(lines) == 1 and lines[0].startswith("[mindspore_ngd] WARNING KFAC: the trainable parameters of 1 "
                                                    "layer(s) are not preconditioned"), lines


def test_verbose_true_prints_the_layer_report():
    lines = run("ngd.KFAC(Net(), 0.1, verbose=True)")
    assert lines == ["[mindspore_ngd] INFO KFAC: preconditioning 2 layers [fc1, fc2]; plain momentum update for "
                     "0 parameters []"], lines


def test_configured_logging_at_info_shows_the_report_once():
    lines = run("""
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        ngd.KFAC(Net(extra=True), 0.1)
        ngd.KFAC(Net(), 0.1, verbose=False)
    """)
    assert [line.split(" ")[:3] for line in lines] == [["mindspore_ngd", "WARNING", "KFAC:"],
                                                       ["mindspore_ngd", "INFO", "KFAC:"]], lines


def test_configured_logging_at_warning_hides_the_report_unless_verbose():
    lines = run("""
        import logging
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        ngd.KFAC(Net(), 0.1)
        ngd.SPNGD(Net(), 0.1, verbose=True)
    """)
    assert len(lines) == 1 and lines[0].startswith("[mindspore_ngd] INFO SPNGD: preconditioning 2 layers"), lines


def test_in_process_default_is_silent_at_info(capfd):
    import logging
    import mindspore_ngd as ngd
    from mindspore import nn
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []                        # an application that configured no logging
    try:
        ngd.KFAC(nn.SequentialCell([nn.Dense(4, 3)]), 0.1)
        logging.getLogger("mindspore_ngd").warning("still shown")
    finally:
        root.handlers = saved
    err = capfd.readouterr().err
    assert "INFO" not in err and "[mindspore_ngd] WARNING still shown" in err
