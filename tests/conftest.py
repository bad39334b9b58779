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
import ctypes
import ctypes.util
import gc
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


def _release_memory():
    """Free what the finished test file compiled: its cells (often in reference cycles, so the graphs they
    own stay alive until the collector runs), MindSpore's cached runtime memory, and glibc's free heap
    pages (so msrun's child processes, launched later, find the memory)."""
    gc.collect()
    ms.ms_memory_recycle()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # a worker runs whole test files (--dist loadfile) and keeps what each compiled: without this, the
    # default run's two workers grew to 12 GB each and thrashed a 24 GB machine
    yield
    if nextitem is None or nextitem.module is not item.module:
        _release_memory()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests, excluded by default (run with -m slow)")
    config.addinivalue_line("markers", "distributed: tests that launch msrun")
    config.addinivalue_line("markers", "device: checks for a real GPU/Ascend (NGD_TEST_DEVICE), excluded by default "
                                       "(run with -m device)")
