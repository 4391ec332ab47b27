"""Shared test set-up: deterministic seeds, bounded hypothesis runs, passive OpenMP waiting."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# pytest-xdist (pyproject's addopts run two workers): each worker keeps its own kernel disk cache, so one
# worker's compiles never show up as the other's disk loads in the tests that count compiles and loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _base = os.environ.get("JITGRAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "jitgrad")
    os.environ["JITGRAD_CACHE_DIR"] = os.path.join(_base, "xdist-" + os.environ["PYTEST_XDIST_WORKER"])

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
