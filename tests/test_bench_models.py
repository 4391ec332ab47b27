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
    short, longer = models.rnn_pipeline([3, 6])  # both long enough that their input products batch alike
    assert short["T"] == 3 and longer["T"] == 6
    for key in ("traced_eqns", "joint_eqns", "optimized_eqns", "kernels", "host_steps"):
        assert 0 < short[key] < longer[key]
    assert short["total_s"] >= short["fusion_s"] >= 0


def test_step_memory_sees_an_allocation() -> None:
    megabytes = 16
    found = models.step_memory(lambda: np.ones(megabytes * 2 ** 20 // 8))
    assert found >= 0.9 * megabytes * 2 ** 20


def test_busy_neighbour_spins_and_is_killed_on_the_way_out() -> None:
    with pytest.raises(KeyboardInterrupt):
        with models.variants.busy_neighbour() as neighbour:
            assert neighbour.poll() is None
            raise KeyboardInterrupt
    assert neighbour.poll() is not None
    with models.variants.busy_neighbour(False) as nothing:
        assert nothing is None


@pytest.mark.slow
@pytest.mark.parametrize("order", models.variants.IMPORT_ORDERS)
def test_timing_child_imports_in_the_order_it_is_given(order, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))
    found = models.run_child("timing", ["--model", "lstm", "--sizes", "tiny", "--rounds", "3", "--no-compile"], 1,
                             {models.variants.IMPORT_ORDER_ENV: order})
    rows = [models.TimingRow.from_json(row) for row in found["rows"]]
    assert [r.mode for r in rows] == [order, f"{order}, busy"]
    assert all(r.rounds == 3 and len(r.cells["jitgrad"].samples) == 3 for r in rows)
    assert rows[0].cells["jitgrad"].error <= 1e-4


def test_the_runner_measures_torch_first_with_the_other_modes_by_default() -> None:
    args = models.runner.parse_args([])
    assert (args.import_order, args.busy, args.no_other_modes) == ("torch-first", False, False)
    assert models.runner.parse_args(["--import-order", "jitgrad-first"]).import_order == "jitgrad-first"


def test_the_runner_times_numpy_after_the_interleaved_candidates(monkeypatch) -> None:
    """numpy's threaded products leave OpenBLAS's threads spinning for ~0.1 s: the runner times numpy by hand in rounds
    of its own, after jitgrad and PyTorch's interleaved rounds (`run.TIMED_APART`)."""
    calls: list[str] = []

    class Recorded(wl.Candidate):
        def __init__(self, name: str) -> None:
            self.name = name

        def prepare(self, workload, mode, inputs):
            return lambda: calls.append(self.name)

        def result(self, mode, out):
            return None

    monkeypatch.setattr(models.runner, "check_against_eager", lambda *args: None)
    monkeypatch.setattr(models.runner, "settle_jitgrad", lambda runs: 0.0)  # no jitgrad here: nothing to wait for
    monkeypatch.setattr(models.runner, "per_call_estimate", lambda run: models.runner.SAMPLE_SECONDS)
    names = ["jitgrad", "eager", "numpy", "compile"]
    row = models.runner.measure_row(wl.WORKLOADS["W2"], 64, wl.VALUE_AND_GRAD, [Recorded(n) for n in names], 4)
    last_other = max(i for i, name in enumerate(calls) if name != "numpy")
    assert calls.count("numpy") == 6  # its first call, then its own rounds: one untimed call and four samples
    assert calls[last_other + 1:] == ["numpy"] * 5
    assert all(len(row.cells[n].samples) == 4 for n in names)


@pytest.mark.slow
def test_busy_steps_times_every_model_beside_a_spinning_core(tmp_path) -> None:
    """bench/busy_steps.py at the tiny sizes, as a user runs it: a row per model with its step count's median and
    p99, torch imported first (the neighbour's own test is above)."""
    import os
    import subprocess

    script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "busy_steps.py"
    env = {**os.environ, "JITGRAD_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script), "--steps", "5", "--sizes", "tiny"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "torch-first, beside one busy core, 5 steps per row"
    rows = [line.split(" | ") for line in lines if line.startswith(("| transformer", "| lstm", "| conv"))]
    assert [r[0].strip("| ") for r in rows] == ["transformer", "lstm", "conv"]
    assert all(0 < float(r[2]) <= float(r[3]) for r in rows)
    assert lines[-1].startswith("largest p99/median ")


@pytest.mark.slow
def test_beside_times_each_candidate_alone_and_beside_in_one_process(tmp_path) -> None:
    """bench/beside.py at the tiny size with the memory-sweeping neighbour (no torch.compile to build): a row per
    model with jitgrad's and the neighbour's medians alone and beside, and their ratio."""
    import os
    import re
    import subprocess

    script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "beside.py"
    env = {**os.environ, "JITGRAD_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script), "--size", "tiny", "--models", "conv,lstm", "--neighbour",
                          "memory", "--blocks", "2", "--rounds", "3"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("torch first, tiny models, neighbour memory, 2 pairs of blocks of 3 calls")
    assert [line.split()[0] for line in lines[1:]] == ["conv", "lstm"]
    cell = re.compile(r"(\w+) ([\d.]+) \(([\d.]+)\) -> ([\d.]+) \(([\d.]+)\) x([\d.]+)")
    for line in lines[1:]:
        cells = [cell.fullmatch(c.strip()) for c in line.split(None, 1)[1].split(" | ")]
        assert [c.group(1) for c in cells] == ["jitgrad", "memory"]
        for c in cells:
            alone, beside, ratio = float(c.group(2)), float(c.group(4)), float(c.group(6))
            assert 0 < alone <= float(c.group(3)) + 0.01 and 0 < beside <= float(c.group(5)) + 0.01
            assert ratio == pytest.approx(beside / alone, abs=0.01 + 0.03 * beside / alone)


@pytest.mark.slow
def test_blas_handoff_times_both_handovers_in_one_process(tmp_path) -> None:
    """bench/blas_handoff.py at the small size: the transformer block splits products (a row with jitgrad's
    medians with the Python handover and with the handoff, and their ratio), the small conv net splits none."""
    import os
    import re
    import subprocess

    script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "blas_handoff.py"
    env = {**os.environ, "JITGRAD_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script), "--size", "small", "--models", "transformer,conv", "--blocks",
                          "2", "--rounds", "3"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("torch first, small models, 2 blocks of 3 calls each way")
    assert lines[2] == "conv         splits no product at this size"
    c = re.fullmatch(r"transformer +jitgrad ([\d.]+) \(([\d.]+)\) -> ([\d.]+) \(([\d.]+)\) x([\d.]+)", lines[1])
    assert c, lines[1]
    python, handoff, ratio = float(c.group(1)), float(c.group(3)), float(c.group(5))
    assert 0 < python <= float(c.group(2)) + 0.01 and 0 < handoff <= float(c.group(4)) + 0.01
    assert ratio == pytest.approx(handoff / python, abs=0.01 + 0.03 * handoff / python)


def test_beside_refuses_an_unknown_model() -> None:
    import subprocess

    script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "beside.py"
    out = subprocess.run([sys.executable, str(script), "--models", "conv,resnet"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "unknown model(s) ['resnet']" in out.stderr
