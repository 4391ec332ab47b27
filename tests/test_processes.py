"""Traced functions across processes: a child forked after a large (parallel) call computes the same
numbers, a "fork" Pool finishes, and traced functions pickle for "spawn" pools and for cloudpickle
(by reference to the wrapped function). Each case runs in a fresh interpreter: forking pytest
itself, with its threads, is not what a user does."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, pickle, sys
import multiprocessing as mp
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler

X = np.random.default_rng(0).standard_normal(1 << 21)

@jg.trace
def loss(a):
    return np.sum(np.sin(a) * a)

def warm_up():
    for _ in range(3):
        loss.value_and_grad(X)
    compiler.wait_for_background_compiles()  # the parallel variant is ready and chosen by timing
    for _ in range(8):
        value, grad = loss.value_and_grad(X)
    return value, grad
"""


def run_script(body: str, tmp_path, timeout: float = 240) -> str:
    script = tmp_path / "main.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {**os.environ, "JITGRAD_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_forked_child_after_a_parallel_call_computes_the_same_numbers(tmp_path) -> None:
    out = run_script("""
        value, grad = warm_up()
        pid = os.fork()
        if pid == 0:
            v, g = loss.value_and_grad(X)
            os._exit(0 if v == value and np.array_equal(g, grad) else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """, tmp_path)
    assert "child 0" in out


@pytest.mark.slow
def test_fork_pool_finishes_after_a_parallel_call(tmp_path) -> None:
    out = run_script("""
        value, _ = warm_up()
        def work(k):
            return float(loss.value_and_grad(X)[0]) == float(value)
        with mp.get_context("fork").Pool(2) as pool:
            print("pool", pool.map_async(work, range(4)).get(180))
        """, tmp_path)
    assert "pool [True, True, True, True]" in out


def test_traced_functions_pickle_by_reference_for_spawn_pools(tmp_path) -> None:
    (tmp_path / "models.py").write_text(textwrap.dedent("""
        import numpy as np
        import jitgrad as jg

        @jg.trace
        def score(a):
            return np.sum(np.tanh(a) ** 2)
        """))
    out = run_script("""
        sys.path.insert(0, os.getcwd())
        import models
        data = pickle.dumps(models.score)
        assert b"score" in data and len(data) < 200  # a reference, not the function's code
        assert pickle.loads(data) is models.score
        a = np.linspace(-1, 1, 50)
        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(2) as pool:
                got = pool.map(models.score, [a, 2 * a])
            print("spawn", np.allclose(got, [np.sum(np.tanh(a) ** 2), np.sum(np.tanh(2 * a) ** 2)]))
        """, tmp_path)
    assert "spawn True" in out


def test_a_traced_lambda_travels_by_value_under_cloudpickle(tmp_path) -> None:
    cloudpickle = pytest.importorskip("cloudpickle")
    del cloudpickle
    out = run_script("""
        import cloudpickle, subprocess
        w = np.arange(4.0)
        f = jg.trace(lambda a: np.sum(a * w))
        payload = cloudpickle.dumps((f, loss))
        child = subprocess.run([sys.executable, "-c",
                                "import pickle, sys, numpy as np; f, g = pickle.loads(sys.stdin.buffer.read()); "
                                "print(float(f(np.ones(4))), type(g).__name__)"],
                               input=payload, capture_output=True)
        print(child.stdout.decode().strip(), child.stderr.decode()[-300:])
        """, tmp_path)
    assert "6.0 Traced" in out
