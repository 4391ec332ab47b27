"""Keeps the benchmark from rotting: every workload of bench/workloads.py, at a small size, gives
the same value and gradients with jitgrad and numpy-by-hand as with eager PyTorch.

torch.compile is left to the runner (its first compile alone takes 10+ s).
"""
from __future__ import annotations

import numpy as np
import pytest

from scripts import load_script

wl = load_script("bench/workloads.py", "jitgrad_bench_workloads")

SMALL = {"W1": 100, "I2": 100, "W2": 8, "W3": 16, "W4": 16}
CANDIDATES = {"jitgrad": wl.Jitgrad(), "numpy": wl.NumpyByHand()}
EAGER = wl.TorchEager()
CASES = [pytest.param(w, mode, name, id=f"{w.name}-{mode}-{name}")
         for w in wl.WORKLOADS.values() for mode in w.modes for name in CANDIDATES]


def test_every_workload_has_a_small_size() -> None:
    assert set(SMALL) == set(wl.WORKLOADS)


@pytest.mark.parametrize("workload, mode, name", CASES)
def test_candidate_matches_eager_torch(workload, mode, name) -> None:
    inputs = workload.make_inputs(SMALL[workload.name], np.random.default_rng(0))
    reference = EAGER.result(mode, EAGER.prepare(workload, mode, inputs)())
    candidate = CANDIDATES[name]
    result = candidate.result(mode, candidate.prepare(workload, mode, inputs)())
    assert result.value.shape == () and result.value.dtype == np.float32
    assert len(result.grads) == (len(workload.wrt) if mode == wl.VALUE_AND_GRAD else 0)
    for grad, i in zip(result.grads, workload.wrt):
        assert grad.shape == inputs[i].shape and grad.dtype == inputs[i].dtype
    assert wl.relative_error(result, reference) <= 1e-4


def test_relative_error_detects_a_wrong_gradient() -> None:
    inputs = wl.WORKLOADS["W1"].make_inputs(50, np.random.default_rng(1))
    value, grads = wl.w1_numpy_value_and_grad(*inputs)
    good = wl.Result(np.asarray(value), grads)
    bad = wl.Result(np.asarray(value), (grads[0], grads[1] * np.float32(1.001), grads[2]))
    assert wl.relative_error(good, good) == 0.0
    assert wl.relative_error(bad, good) > 1e-4
