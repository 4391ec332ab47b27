"""pytest-benchmark suite over the workloads of bench/workloads.py (not part of the test run).

    python -m pytest bench/test_bench.py --benchmark-only [-k "W1 and not compile"]

One test per (workload, size, mode, candidate), grouped by (workload, size, mode). Each first
checks the candidate against eager PyTorch, then times warm calls (the first, compiling call is
excluded). A candidate that cannot trace or compile a workload is skipped with the error.
bench/run.py is the runner that interleaves candidates and prints ratios; this suite is for
pytest-benchmark's own tooling (--benchmark-compare, --benchmark-json, histograms).
"""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "jitgrad_bench_workloads", os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.py"))
wl = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = wl
_spec.loader.exec_module(wl)

THREADS = 2
TOLERANCE = 1e-4
CASES = [(w, size, mode) for w in wl.WORKLOADS.values() for size in w.sizes for mode in w.modes]
CANDIDATE_NAMES = [c.name for c in wl.candidates()]


@pytest.fixture(scope="module")
def candidates() -> dict[str, wl.Candidate]:
    """One instance per candidate for the whole module, so traced/compiled functions are reused."""
    wl.configure_threads(THREADS)
    return {c.name: c for c in wl.candidates()}


@pytest.mark.parametrize("name", CANDIDATE_NAMES)
@pytest.mark.parametrize("case", CASES, ids=[f"{w.name}-{w.size_label(s)}-{m}" for w, s, m in CASES])
def test_workload(benchmark, candidates, case, name) -> None:
    workload, size, mode = case
    inputs = workload.make_inputs(size, np.random.default_rng(0))
    candidate = candidates[name]
    try:
        run = candidate.prepare(workload, mode, inputs)
        out = run()
    except Exception as exc:
        pytest.skip(f"{name} cannot run {workload.name}: {type(exc).__name__}: {exc}")
    eager = candidates["eager"]
    reference = eager.result(mode, eager.prepare(workload, mode, inputs)())
    error = wl.relative_error(candidate.result(mode, out), reference)
    assert error <= TOLERANCE, f"{name} differs from eager PyTorch by {error:.2e} (normwise relative)"
    benchmark.group = f"{workload.name} {workload.size_label(size)} {mode}"
    benchmark.extra_info["relative_error"] = error
    benchmark(run)


def _jax_peer():
    spec = importlib.util.spec_from_file_location(
        "jitgrad_bench_jax_peer", os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_peer.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_jax_peer_smoke() -> None:
    """bench/jax_peer.py at the models' tiny sizes: the JAX twins run, agree with jitgrad, and are timed; the
    cold child's measurement runs (in this process, caches as found), and so does the overhead part."""
    pytest.importorskip("jax")
    peer = _jax_peer()
    rows = peer.steady_rows(list(peer.model_text().MODELS), ["tiny"], 3)
    assert [r[0] for r in rows] == ["transformer", "lstm", "conv"]
    assert all(float(r[7]) <= peer.TOLERANCE and r[8] == "3" for r in rows)
    for library in ("jitgrad", "jax"):
        found = peer.child(library, "conv", "tiny")
        assert found["first_s"] > 0 and found["second_s"] > 0
    assert len(peer.overhead_rows(5)) == 5


def test_jax_peer_without_jax_says_so(monkeypatch, capsys) -> None:
    peer = _jax_peer()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
    assert peer.main(["--sizes", "tiny"]) == 0
    assert "JAX is not installed" in capsys.readouterr().out
