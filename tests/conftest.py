"""Test configuration: CPU, graph mode, and oneDNN's AVX2 convolution path (see README).

Where the tests are:

- unit/        one piece at a time, in seconds: ownership planner, buffer packing, BlockLayout,
               argument validation, schedules, layer discovery and capture attachment
- numerics/    Kronecker factors, inverses and block inverses against NumPy float64 references,
               the exact one-example Fisher
- optimizers/  per-optimizer behaviour: the shared contract, faults, SP-NGD, THOR, the Monte-Carlo
               Fisher, Model.train
- distributed/ msrun tests with their helper (distributed.py), cases (dist_cases.py) and worker
               scripts (workers/); the distributed engine's one-process pieces
- model_zoo/, benchmarks/  the repository's model zoo and benchmark harness

Shared by all: nets.py (networks), training.py (short training runs), reference/ (NumPy oracles).
"""
import os
import sys

# must be set before MindSpore loads oneDNN: 3x3 convolutions are 13-40x faster on AVX-512 CPUs
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
TESTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS)
# shared helpers import by bare name: nets.py, training.py, reference/ (tests/) and the msrun helper
# distributed.py with dist_cases.py (tests/distributed/; the msrun workers get the same paths)
sys.path[:0] = [os.path.join(TESTS, "distributed"), TESTS]
# the benchmarks package and the model zoo are not installed: import them from the checkout (appended,
# so that an installed mindspore_ngd is still the one under test when pytest runs outside the root)
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

import mindspore as ms  # noqa: E402
import pytest  # noqa: E402

ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests, excluded by default (run with -m slow)")
    config.addinivalue_line("markers", "distributed: tests that launch msrun")
    config.addinivalue_line("markers", "device: checks for a real GPU/Ascend (NGD_TEST_DEVICE), excluded by default "
                                       "(run with -m device)")
