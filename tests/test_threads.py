"""Many threads calling one traced function at once, the first call (tracing, compiling, writing
the disk cache) included, get correct results; each kernel compiles once."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.build import compiler

THREADS = 8


def row_score(a, b):
    return np.sum(np.sin(a) * np.cosh(b) - a * b, axis=1)


def row_score_loss(a, b):
    return np.sum(row_score(a, b) ** 2)


def _reference(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    rows = np.sum(np.sin(a64) * np.cosh(b64) - a64 * b64, axis=1)
    ga = 2 * rows[:, None] * (np.cos(a64) * np.cosh(b64) - b64)
    gb = 2 * rows[:, None] * (np.sin(a64) * np.sinh(b64) - a64)
    return rows, np.sum(rows ** 2), ga, gb


def test_many_threads_race_through_the_first_call(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))  # a cold disk cache: the threads race to fill it
    f = jg.trace(row_score)
    loss = jg.trace(row_score_loss)
    compiler.wait_for_background_compiles()  # earlier tests' background compiles count before, not here
    before = compiler.stats()
    barrier = threading.Barrier(THREADS)
    failures: list[str] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        shape = (600, 500) if k % 2 else (7, 5)  # parallel and serial kernel variants
        try:
            barrier.wait()
            for _ in range(3):
                a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
                rows, value, ga, gb = _reference(a, b)
                np.testing.assert_allclose(f(a, b), rows, rtol=2e-4, atol=1e-3)
                v, (da, db) = loss.value_and_grad(a, b, argnums=(0, 1))
                np.testing.assert_allclose(v, value, rtol=2e-4)
                np.testing.assert_allclose(da, ga, rtol=2e-3, atol=1e-2)
                np.testing.assert_allclose(db, gb, rtol=2e-3, atol=1e-2)
        except Exception as exc:  # collected: pytest sees only the main thread's exceptions
            failures.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n".join(failures)
    compiler.wait_for_background_compiles()  # quick kernels' full-level code and parallel variants, counted too
    after = compiler.stats()
    new_sources = after["sources"] - before["sources"]
    assert new_sources >= 2, "the kernels were already compiled: nothing raced"
    # every (kernel, variant) pair used was compiled or loaded exactly once, however many threads wanted it
    # (a kernel an earlier test loaded keeps its own disk cache, so a variant may come from disk)
    assert (after["builds"] - before["builds"]) + (after["disk_hits"] - before["disk_hits"]) \
        == after["numba_compiles"] - before["numba_compiles"]
    assert after["disk_writes"] - before["disk_writes"] == after["builds"] - before["builds"]
    assert f.cache_info()["misses"] == 2 and loss.cache_info()["misses"] == 2  # one plan per shape


WORKQUEUE_CHILD = r"""
import threading
import numba
import numpy as np
import pytest
import jitgrad as jg

from jitgrad.kernels.build import compiler

f = jg.trace(lambda a: np.tanh(a) * 2.0 + a)
f(np.ones(1 << 19, np.float32))
compiler.wait_for_background_compiles()  # the threads below then time (and run) the parallel variant
errors = []

def work(k):
    x = np.full(1 << 19, k / 10, np.float32)
    for _ in range(20):
        if not np.allclose(f(x), np.tanh(x) * 2.0 + x):
            errors.append(k)

threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(numba.threading_layer(), len(errors))
"""


def test_parallel_kernels_from_many_threads_under_the_workqueue_layer(tmp_path) -> None:
    """numba's workqueue layer aborts the process on concurrent parallel launches; jitgrad queues them."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", JITGRAD_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", WORKQUEUE_CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["workqueue", "0"]


FORK_CHILD = r"""
import multiprocessing as mp
import numpy as np
import pytest
import jitgrad as jg

def work(queue):
    # A kernel the parent never compiled: the child needs numba's compiler lock. Small inputs keep the
    # child serial (GNU OpenMP, numba's default layer, refuses parallel work in a forked child).
    g = jg.trace(lambda w, x: np.sum(np.exp(w * x) * np.sinh(x)))
    w, x = np.full(1000, 0.5, np.float32), np.full(1000, 0.25, np.float32)
    queue.put(float(g.value_and_grad(w, x)[0]))

if __name__ == "__main__":
    f = jg.trace(lambda w, x: np.sum(np.tanh(w * x) + x))
    f.value_and_grad(np.ones(300_000, np.float32), np.ones(300_000, np.float32))  # a compile starts behind
    context = mp.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=work, args=(queue,))
    child.start()
    print(queue.get(timeout=120))
    child.join(timeout=120)
"""


def test_fork_right_after_a_first_call_does_not_hang(tmp_path) -> None:
    """A fork waits for the background compile, so the child never inherits numba's lock held."""
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_CHILD)
    env = dict(os.environ, JITGRAD_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = np.exp(np.float64(0.125)) * np.sinh(np.float64(0.25)) * 1000
    assert abs(float(proc.stdout.strip().splitlines()[-1]) / expected - 1) < 1e-5


IDLE_CHILD = r"""
import sys, time
import torch  # first, as a script benchmarking against PyTorch imports it
import numpy as np
import pytest
import numba
import jitgrad as jg
from jitgrad.kernels.build import compiler

torch.manual_seed(0)
a = torch.randn(256, 256)
f = jg.trace(lambda w, x: np.sum(np.tanh(w * x) * 2.0 + np.exp(-x * x)))
w, x = np.full(1 << 20, 0.5, np.float32), np.linspace(-2, 2, 1 << 20, dtype=np.float32)
for _ in range(20):
    f.value_and_grad(w, x)
compiler.wait_for_background_compiles()
for _ in range(40):  # the parallel variant is timed and run, with torch's ops between calls
    f.value_and_grad(w, x)
    a @ a
time.sleep(0.05)  # torch's own OpenMP workers may spin briefly after its last op
cpu, wall = time.process_time(), time.perf_counter()
time.sleep(0.2)
print(numba.threading_layer(), (time.process_time() - cpu) / (time.perf_counter() - wall))
"""


def test_no_thread_spins_after_jitgrad_calls_with_torch_imported_first(tmp_path) -> None:
    """With torch's OpenMP runtime loaded first, jitgrad's parallel kernels run on numba's workqueue layer,
    whose idle workers sleep: over 200 ms after the calls the process uses under 10% of one core."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY")}
    env["JITGRAD_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", IDLE_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    layer, busy = proc.stdout.split()
    assert layer == "workqueue"
    assert float(busy) < 0.10


def test_a_threading_layer_the_user_chose_is_kept(tmp_path) -> None:
    child = ("import numba; numba.config.THREADING_LAYER = 'omp'; import numpy as np, jitgrad as jg; "
             "print(numba.config.THREADING_LAYER)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["omp"]


TORCH_SPIN_CHILD = r"""
import os, sys, time
import torch  # first: its GNU OpenMP runtime starts with the default (spinning) wait policy
import jitgrad
a = torch.randn(1500, 1500)
shares = []
for _ in range(10):
    a @ a  # a parallel region: torch's workers then wait for the next one
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(0.05)
    shares.append((time.process_time() - cpu) / (time.perf_counter() - wall))
import threading
print(sorted(shares)[5], sum(t.name == "jitgrad-openmp-idle" for t in threading.enumerate()))
"""


def torch_idle_share(extra_env: dict[str, str]) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "JITGRAD_OPENMP_SPIN")}
    proc = subprocess.run([sys.executable, "-c", TORCH_SPIN_CHILD], env={**env, **extra_env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    share, teams = proc.stdout.split()
    return float(share), int(teams)


def test_torch_imported_first_keeps_its_spin_by_default() -> None:
    """torch's OpenMP workers, started before jitgrad with the default policy, spin about 11 ms after each op (a
    fifth of the 50 ms after it): jitgrad leaves them so, as torch runs alone (its small ops are faster so)."""
    share, teams = torch_idle_share({})
    assert teams == 0
    assert share > 0.05  # (throttled: under 0.05, the next test)


def test_throttle_parks_an_idle_team_that_stops_torchs_spin() -> None:
    """JITGRAD_OPENMP_SPIN=throttle: one idle team in torch's runtime makes libgomp throttle its workers' spin."""
    share, teams = torch_idle_share({"JITGRAD_OPENMP_SPIN": "throttle"})
    assert teams == 1
    assert share < 0.05


@pytest.mark.parametrize("env", [{"JITGRAD_OPENMP_SPIN": "keep"}, {"OMP_WAIT_POLICY": "ACTIVE"},
                                 {"GOMP_SPINCOUNT": "300000"}])
def test_no_team_parked_unless_asked(env) -> None:
    assert torch_idle_share(env)[1] == 0
