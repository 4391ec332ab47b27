"""Shared test set-up: deterministic seeds, bounded hypothesis runs, passive OpenMP waiting."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
