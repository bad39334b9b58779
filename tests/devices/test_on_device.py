"""Checks for a real accelerator, marked ``device`` and excluded from the default run.

On a GPU or Ascend machine (docs/testing.md, "Device-specific tests")::

    NGD_TEST_DEVICE=GPU python -m pytest -m device tests/devices -v

* numerics: the device's inversion path against float64 NumPy inverses (1e-4 of the largest
  entry), and the weights after 3 K-FAC steps against the same inversion path run on CPU (1e-3 relative);
* the op audit compiled on the device itself (``python -m mindspore_ngd.audit --native``);
* 2 ranks under msrun (HCCL / NCCL): 3 distributed K-FAC steps of a network without BatchNorm
  equal to the one-process CPU run on the whole batch.

Without ``NGD_TEST_DEVICE`` every test skips, naming the variable. ``NGD_TEST_DEVICE=CPU`` runs the
same harness on CPU (a self-check of the scripts; it proves nothing about an accelerator)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from distributed import REPO_ROOT, run_msrun
from mindspore_ngd.curvature.inverse import DEVICE_INVERSE_METHODS

pytestmark = pytest.mark.device
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


@pytest.fixture(scope="module")
def device():
    name = os.environ.get("NGD_TEST_DEVICE")
    if not name:
        pytest.skip("no accelerator here: set NGD_TEST_DEVICE=Ascend or GPU on a machine with that device")
    if name not in ("Ascend", "GPU", "CPU"):
        pytest.fail(f"NGD_TEST_DEVICE must be Ascend, GPU or CPU, got {name!r}")
    return name


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests")]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _numerics(device, method, tmp_path_factory):
    out = tmp_path_factory.mktemp("numerics") / f"{device}.json"
    proc = subprocess.run([sys.executable, os.path.join(WORKERS, "device_numerics.py"), "--device", device,
                           "--method", method, "--out", str(out)], env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def on_device(device, tmp_path_factory):
    return _numerics(device, DEVICE_INVERSE_METHODS[device], tmp_path_factory)


@pytest.fixture(scope="module")
def on_cpu(device, tmp_path_factory):
    """The reference: the device's own inversion path, built and run on CPU."""
    return _numerics("CPU", DEVICE_INVERSE_METHODS[device], tmp_path_factory)


def test_inverses_match_float64(on_device):
    for case in on_device["inverses"]:
        m = np.asarray(case["matrix"], np.float64)
        ref = np.linalg.inv(m + case["damping"] * np.eye(case["n"]))
        err = np.abs(np.asarray(case["inverse"]) - ref).max() / np.abs(ref).max()
        assert case["ok"] and err < 1e-4, (case["n"], case["damping"], err)


def _close(weights, reference, rtol):
    for name, ref in reference.items():
        ref, got = np.asarray(ref), np.asarray(weights[name])
        assert np.all(np.isfinite(got)), name
        err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12)
        assert err < rtol, (name, err)


def test_three_kfac_steps_match_cpu(on_device, on_cpu):
    for net in ("audit_net", "plain_net"):
        _close(on_device["weights"][net], on_cpu["weights"][net], 1e-3)


def test_op_audit_compiled_on_the_device(device):
    if device == "CPU":
        pytest.skip("the audit of the CPU-built graphs runs in tests/devices/test_audit.py")
    proc = subprocess.run([sys.executable, "-m", "mindspore_ngd.audit", "--device", device, "--native"],
                          env=_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


@pytest.mark.distributed
def test_two_ranks_under_msrun(device, on_cpu):
    run = run_msrun(os.path.join(WORKERS, "device_train_worker.py"), workers=2, timeout=900,
                    env={"NGD_TEST_DEVICE": device})
    for rank in (0, 1):
        result = run.results[rank]
        assert result["device"] == device and result["world"] == 2
        _close(result["weights"], on_cpu["weights"]["plain_net"], 1e-3)
