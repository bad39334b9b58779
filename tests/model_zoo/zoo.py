"""Shared by the model-zoo tests: repository paths, the model zoo's ``src`` package on sys.path (as
train.py sees it), the cpu_smoke config, and the launch scripts run the way a user runs them.

Importing this module skips the importing test module when pyyaml is missing: the model zoo reads
YAML configs (pyyaml comes with the "model_zoo" and "test" extras of setup.py).
"""
import os
import subprocess
import sys

import pytest

pytest.importorskip("yaml", reason="model zoo tests need pyyaml (pip install -e '.[test]')")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = os.path.join(REPO, "model_zoo", "resnet50")
SCRIPTS = os.path.join(REPO, "scripts")
SCRIPT_NAMES = ("run_standalone_train.sh", "run_distribute_train.sh", "run_distribute_train_msrun.sh",
                "run_distribute_train_gpu.sh", "run_eval.sh")
if ZOO not in sys.path:
    sys.path.insert(0, ZOO)

from src import config as zoo_config  # noqa: E402


def smoke_config(**changes):
    """The cpu_smoke config with ``changes`` applied (a fresh dict each call)."""
    config = zoo_config.load_config("cpu_smoke")
    config.update(changes)
    return config


def run_script(script, *args, env=None, timeout=600, cwd=None):
    """``bash scripts/<script> args...`` with ``env`` added to this environment; the completed process,
    stdout and stderr captured as text."""
    environment = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                          env=environment, timeout=timeout, cwd=cwd)
