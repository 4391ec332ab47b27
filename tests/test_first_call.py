"""The numpy first call (kernels/cpu/first_call.py): a new executable's first call runs the graph on numpy while
its kernels compile (the default; the rest of the suite runs with JITGRAD_FIRST_CALL=compiled, tests/conftest.py);
the second waits for them and every later call runs them. Each test gets an empty
kernel cache of its own, so that the kernels are not on disk already; a warm first call (a new process on a filled
disk cache) runs on numpy too, while the kernels load, unless numpy's passes would take longer."""
import os
import subprocess
import sys

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.cpu import first_call
from jitgrad.kernels.build import compiler

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import models  # noqa: E402


@pytest.fixture
def numpy_first(monkeypatch, tmp_path):
    monkeypatch.setenv("JITGRAD_FIRST_CALL", "numpy")
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))
    compiler.wait_for_background_compiles()
    yield
    compiler.wait_for_background_compiles()


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def chain(w, x):
    return np.sum(np.tanh(w * x) * np.exp(-x * x) + np.sin(w) / (1.0 + x * x))


@pytest.mark.parametrize("dtype, bound", [(np.float32, 2e-6), (np.float64, 1e-14)])
def test_the_first_call_runs_on_numpy_and_agrees_with_the_compiled_calls(numpy_first, dtype, bound) -> None:
    rng = np.random.default_rng(0)
    w, x = (rng.standard_normal(5000).astype(dtype) for _ in range(2))
    f = jg.trace(chain)
    before = first_call.STATS["numpy_calls"]
    v0, g0 = f.value_and_grad(w, x, argnums=(0, 1))
    assert first_call.STATS["numpy_calls"] == before + 1
    assert v0.dtype == dtype and all(g.dtype == dtype for g in g0)
    v1, g1 = f.value_and_grad(w, x, argnums=(0, 1))
    v2, g2 = f.value_and_grad(w, x, argnums=(0, 1))
    assert first_call.STATS["numpy_calls"] == before + 1  # the second call on ran the kernels
    assert v1 == v2 and all(np.array_equal(a, b) for a, b in zip(g1, g2))
    assert relative(v0, v1) <= bound and max(relative(a, b) for a, b in zip(g0, g1)) <= 10 * bound


def test_the_second_call_gets_the_bits_of_a_compiled_first_call(numpy_first, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    w, x = (rng.standard_normal(3000).astype(np.float32) for _ in range(2))
    tiered = jg.trace(chain)
    tiered.value_and_grad(w, x, argnums=(0, 1))
    second = tiered.value_and_grad(w, x, argnums=(0, 1))
    monkeypatch.setenv("JITGRAD_FIRST_CALL", "compiled")
    compiled = jg.trace(lambda w, x: chain(w, x)).value_and_grad(w, x, argnums=(0, 1))
    assert second[0] == compiled[0] and all(np.array_equal(a, b) for a, b in zip(second[1], compiled[1]))


MODEL_CHILD = """
import sys
import numpy as np
import jitgrad as jg
from jitgrad.kernels.cpu import first_call
sys.path.insert(0, sys.argv[1])
import models

def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

model = models.MODELS[sys.argv[2]]
inputs = model.make_inputs(model.tiny, np.random.default_rng(0))
f = jg.trace(model.jitgrad_fn)
v0, g0 = f.value_and_grad(*inputs, argnums=model.wrt)
v1, g1 = f.value_and_grad(*inputs, argnums=model.wrt)
print(first_call.STATS["numpy_calls"], relative(v0, v1), max(relative(a, b) for a, b in zip(g0, g1)))
"""


@pytest.mark.parametrize("name", list(models.MODELS))
def test_bench_models_first_calls_agree_with_their_compiled_calls(tmp_path, name) -> None:
    """In a fresh process (kernels another test compiled in this one would make the first call compiled)."""
    env = dict(os.environ, JITGRAD_FIRST_CALL="numpy", JITGRAD_CACHE_DIR=str(tmp_path))
    bench = os.path.join(os.path.dirname(__file__), "..", "bench")
    proc = subprocess.run([sys.executable, "-c", MODEL_CHILD, bench, name], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    numpy_calls, value_error, grad_error = proc.stdout.split()
    assert int(numpy_calls) == 1 and float(value_error) <= 1e-5 and float(grad_error) <= 1e-4


def test_a_call_whose_kernels_are_on_disk_runs_compiled(numpy_first) -> None:
    w, x = np.linspace(-1, 1, 4000), np.linspace(0, 2, 4000)
    f = jg.trace(chain)
    f.value_and_grad(w, x)
    f.value_and_grad(w, x)  # compiled: the kernels are in this process and on disk now
    jg.clear_caches()
    before = first_call.STATS["numpy_calls"]
    jg.trace(chain).value_and_grad(w, x)
    assert first_call.STATS["numpy_calls"] == before


WARM_CHILD = r"""
import sys
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler
from jitgrad.kernels.cpu import first_call
first_call.LOAD_ELEMENTS = int(sys.argv[1])
w, x = np.linspace(-1, 1, 4000, dtype=np.float32), np.linspace(0, 2, 4000, dtype=np.float32)
f = jg.trace(lambda w, x: np.sum(np.tanh(w * x) * np.exp(-x * x) + np.sin(w) / (1.0 + x * x)))
v0, g0 = f.value_and_grad(w, x, argnums=(0, 1))
numpy_calls = first_call.STATS["numpy_calls"]
v1, g1 = f.value_and_grad(w, x, argnums=(0, 1))
compiler.wait_for_background_compiles()
error = max(abs(float(v0) - float(v1)) / abs(float(v1)), *(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                                                          for a, b in zip(g0, g1)))
print(numpy_calls, first_call.STATS["numpy_calls"], compiler.stats()["builds"], compiler.stats()["disk_hits"], error)
"""


def test_a_warm_first_call_runs_on_numpy_while_its_kernels_load(tmp_path) -> None:
    """A new process on a disk cache a first process filled: its first call runs numpy, its second loads the kernels
    (disk hits, nothing compiled); with more work than numpy does in the time of the loads, the first call loads."""
    env = dict(os.environ, JITGRAD_FIRST_CALL="numpy", JITGRAD_CACHE_DIR=str(tmp_path))

    def child(load_elements: int) -> list[float]:
        proc = subprocess.run([sys.executable, "-c", WARM_CHILD, str(load_elements)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [float(v) for v in proc.stdout.split()]

    numpy_first, numpy_calls, builds, _, error = child(first_call.LOAD_ELEMENTS)
    assert (numpy_first, numpy_calls) == (1, 1) and builds > 0 and error <= 1e-5  # cold: numpy, then compiled
    numpy_first, numpy_calls, builds, disk_hits, error = child(first_call.LOAD_ELEMENTS)
    assert (numpy_first, numpy_calls, builds) == (1, 1, 0) and disk_hits > 0 and error <= 1e-5
    numpy_first, numpy_calls, builds, disk_hits, _ = child(1)  # one element per kernel: loading is cheaper
    assert (numpy_first, numpy_calls, builds) == (0, 0, 0) and disk_hits > 0


def test_a_first_calls_guessed_array_types_are_numbas() -> None:
    """`first_call.numba_type` makes a plain array's type without `numba.typeof`: it must make the same types."""
    import numba
    base = np.zeros((4, 6), np.float32)
    readonly = np.ones(5)
    readonly.flags.writeable = False
    arrays = [base, base.T, base[:, ::2], base[::2], np.zeros(3, np.int64), np.zeros((), np.float64), readonly,
              np.zeros((2, 3, 4), np.bool_)[:, 1], np.asfortranarray(np.ones((3, 2), np.float64))]
    typed: dict = {}
    for a in arrays:
        assert first_call.numba_type(a, typed) == numba.typeof(a), a.flags


def test_compiled_mode_and_a_bad_mode(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JITGRAD_FIRST_CALL", "compiled")
    before = first_call.STATS["numpy_calls"]
    jg.trace(lambda x: np.sum(np.cosh(x) * 3.0)).value_and_grad(np.linspace(0, 1, 100))
    assert first_call.STATS["numpy_calls"] == before
    monkeypatch.setenv("JITGRAD_FIRST_CALL", "eager")
    with pytest.raises(ValueError, match="JITGRAD_FIRST_CALL='eager'"):
        first_call.mode()


FORK_CHILD = r"""
import os, numpy as np, jitgrad as jg
f = jg.trace(lambda w, x: np.sum(np.tanh(w * x) + np.exp(-x * x)))
w, x = np.linspace(-1, 1, 5000), np.linspace(0, 2, 5000)
v0, _ = f.value_and_grad(w, x)  # on numpy; the compiles are queued
pid = os.fork()
if pid == 0:  # the child's second call compiles what it needs itself
    v1, _ = f.value_and_grad(w, x)
    os._exit(0 if abs(v1 - v0) <= 1e-12 * abs(v0) else 3)
_, status = os.waitpid(pid, 0)
v1, _ = f.value_and_grad(w, x)
print(os.waitstatus_to_exitcode(status), abs(v1 - v0) <= 1e-12 * abs(v0))
"""


def test_a_child_forked_after_a_numpy_first_call_compiles_its_own(tmp_path) -> None:
    env = dict(os.environ, JITGRAD_FIRST_CALL="numpy", JITGRAD_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", FORK_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "True"]


def test_the_default_is_numpy_and_gradcheck_runs_the_kernels(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JITGRAD_FIRST_CALL")
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))
    assert first_call.mode() == "numpy"
    with first_call.compiled_only():
        assert first_call.mode() == "compiled"
    assert first_call.mode() == "numpy"
    f = jg.trace(lambda w, x: np.sum(np.sinh(w * x) * np.arctan(x)))
    before = f.cache_info()["numpy_calls"]
    w, x = np.linspace(-1, 1, 40), np.linspace(0.5, 2, 40)
    assert jg.gradcheck(f, (w, x))
    assert f.cache_info()["numpy_calls"] == before  # every call of the check ran the kernels
    g = jg.trace(lambda w, x: np.sum(np.cosh(w) * x * x))
    g.value_and_grad(w, x)
    assert g.cache_info()["numpy_calls"] == before + 1  # cache_info shows the tier a call used
    compiler.wait_for_background_compiles()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_each_function_on_the_numpy_first_call_is_within_its_bound_of_the_kernels(numpy_first, dtype) -> None:
    """docs/ops.md's ulp bounds hold between the two tiers: the first call (numpy's references) against the
    second (the kernels), over test_ulp_sweep's values. The outputs are in an order of this test's own, so that no
    other test in the process has compiled this kernel (a built kernel would run the first call compiled)."""
    import test_ulp_sweep as sweep
    x = sweep.sweep_values(dtype)
    ops = {**sweep.UNARY, **{name: f for name, (f, _) in sweep.WIDE.items()}}
    f = jg.trace(lambda a: {name: ops[name](a) for name in reversed(list(ops))})
    before = first_call.STATS["numpy_calls"]
    first = f(x)
    second = f(x)
    assert first_call.STATS["numpy_calls"] == before + 1
    found = []
    for name in ops:
        assert first[name].dtype == second[name].dtype  # float_power is float64 from float32, as numpy
        found += sweep.failures(name, dtype, (x,), first[name], second[name])
    assert not found, "\n".join(found)
