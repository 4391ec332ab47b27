"""Shared test set-up: deterministic seeds, bounded hypothesis runs, passive OpenMP waiting."""
import os
import shutil
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Each test process (each pytest-xdist worker: pyproject's addopts run two) keeps its kernel disk cache in a
# temporary folder of its own, removed when the process's session ends: one worker's compiles never show
# up as the other's disk loads in the tests that count compiles and loads, and the suite leaves nothing in
# the user's ~/.cache/jitgrad. A JITGRAD_CACHE_DIR set by whoever runs the tests is kept as the parent.
_cache_parent = os.environ.get("JITGRAD_CACHE_DIR")
if _cache_parent:
    os.makedirs(_cache_parent, exist_ok=True)
TEST_CACHE_DIR = tempfile.mkdtemp(prefix=f"jitgrad-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-",
                                  dir=_cache_parent)
os.environ["JITGRAD_CACHE_DIR"] = TEST_CACHE_DIR
# Tests replace passes in memory (monkeypatch), which the disk cache of compiled programs cannot see (its key covers
# jitgrad's files): off in the test processes; the tests of that cache run child processes with it on.
os.environ.setdefault("JITGRAD_PROGRAM_CACHE", "0")
# The suite tests the compiled kernels from each program's first call on (and counts their compiles); the numpy
# first call, jitgrad's default, has tests of its own (tests/test_first_call.py) that set it.
os.environ.setdefault("JITGRAD_FIRST_CALL", "compiled")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("ci")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# tests/cuda runs in its own process under numba's CUDA simulator (tests/test_cuda_sim.py).
collect_ignore = ["cuda"]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's kernel cache folder (background compiles have finished or are abandoned)."""
    shutil.rmtree(TEST_CACHE_DIR, ignore_errors=True)
