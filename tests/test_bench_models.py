"""Keeps the model benchmark (bench/models.py) from rotting: each model, at a tiny size, gives the
same loss and gradients with jitgrad as with eager PyTorch, and the structural and memory probes the
benchmark reports still run. No timing is asserted.

torch.compile is left to the runner (its first compile alone takes 10+ s).
"""
from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
models = importlib.import_module("models")
wl = models.wl

EAGER = wl.TorchEager()
JITGRAD = wl.Jitgrad()


@pytest.mark.parametrize("model", list(models.MODELS.values()), ids=list(models.MODELS))
def test_jitgrad_matches_eager_torch(model) -> None:
    inputs = model.make_inputs(model.tiny, np.random.default_rng(0))
    reference = EAGER.result(wl.VALUE_AND_GRAD, EAGER.prepare(model, wl.VALUE_AND_GRAD, inputs)())
    result = JITGRAD.result(wl.VALUE_AND_GRAD, JITGRAD.prepare(model, wl.VALUE_AND_GRAD, inputs)())
    assert result.value.shape == () and result.value.dtype == np.float32
    assert len(result.grads) == len(model.wrt)
    for grad, i in zip(result.grads, model.wrt):
        assert grad.shape == inputs[i].shape and grad.dtype == np.float32
    assert wl.relative_error(result, reference) <= 1e-4


def test_every_model_has_small_and_medium_sizes() -> None:
    for model in models.MODELS.values():
        assert [s.name for s in model.sizes] == ["small", "medium"]
        assert all(s.dims == model.size(s.name).dims for s in model.sizes)


def test_pipeline_stages_count_what_the_rnn_builds() -> None:
    short, longer = models.rnn_pipeline([2, 4])
    assert short["T"] == 2 and longer["T"] == 4
    for key in ("traced_eqns", "joint_eqns", "optimized_eqns", "kernels", "host_steps"):
        assert 0 < short[key] < longer[key]
    assert short["total_s"] >= short["fusion_s"] >= 0


def test_step_memory_sees_an_allocation() -> None:
    megabytes = 16
    found = models.step_memory(lambda: np.ones(megabytes * 2 ** 20 // 8))
    assert found >= 0.9 * megabytes * 2 ** 20
