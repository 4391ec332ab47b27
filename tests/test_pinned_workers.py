"""numba's parallel workers each keep a CPU of their own (kernels/build/pinned_pool.py), in the process and in a
child it forks; the calling thread keeps every CPU; JITGRAD_PIN_WORKERS=0 pins nothing; results are unchanged.
Real subprocesses: the pool is started once per process."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
                                or not os.path.isdir("/proc/self/task"),
                                reason="needs Linux thread affinities and two CPUs")

CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np, numba
    import jitgrad as jg
    from jitgrad.kernels.build import compiler
    from jitgrad.kernels.cpu import variants

    def pinned_threads():
        found = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                cpus = os.sched_getaffinity(int(tid))
            except OSError:
                continue
            if len(cpus) == 1:
                found[int(tid)] = min(cpus)
        return found

    def run_parallel(f, x):
        for chooser in list(variants._choosers):  # every large kernel on its parallel variant, calls spread
            if not chooser.fixed:
                chooser.keep(chooser.options[0])
        return f(x)

    f = jg.trace(lambda x: np.sum(np.tanh(x + 0.5) * np.exp(-x * x)))
    x = np.linspace(-3.0, 3.0, 1_000_003)
    expected = np.sum(np.tanh(x + 0.5) * np.exp(-x * x))
    f(x)
    compiler.wait_for_background_compiles()  # the parallel variant
    report = {"workers": numba.config.NUMBA_NUM_THREADS, "cpus": sorted(os.sched_getaffinity(0))}
    report["value_error"] = abs(float(run_parallel(f, x)) - expected) / abs(expected)
    report["parent"] = pinned_threads()
    report["main_cpus"] = sorted(os.sched_getaffinity(0))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        child = {"value_error": abs(float(run_parallel(f, x)) - expected) / abs(expected),
                 "pinned": pinned_threads(), "main_cpus": sorted(os.sched_getaffinity(0))}
        os.write(write, json.dumps(child).encode())
        os._exit(0)
    os.close(write)
    report["child"] = json.loads(os.read(read, 1 << 16))
    os.waitpid(pid, 0)
    print(json.dumps(report))
""")


def _run(env_extra: dict[str, str], tmp_path) -> dict:
    import json
    env = dict(os.environ, JITGRAD_CACHE_DIR=str(tmp_path), **env_extra)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_worker_is_pinned_to_its_own_cpu_in_the_process_and_in_a_forked_child(tmp_path) -> None:
    report = _run({}, tmp_path)
    if report["workers"] > len(report["cpus"]):
        pytest.skip("more numba workers than CPUs: nothing is pinned")
    for where in (report["parent"], report["child"]["pinned"]):
        assert len(where) == report["workers"]  # every worker, and nothing else, on one CPU
        assert len(set(where.values())) == report["workers"]  # each on its own
        assert set(where.values()) <= set(report["cpus"])
    assert set(report["parent"]).isdisjoint(report["child"]["pinned"])  # the child's pool is its own
    assert report["main_cpus"] == report["child"]["main_cpus"] == report["cpus"]  # the caller keeps every CPU
    assert report["value_error"] < 1e-10 and report["child"]["value_error"] < 1e-10


def test_jitgrad_pin_workers_0_leaves_the_workers_where_linux_puts_them(tmp_path) -> None:
    report = _run({"JITGRAD_PIN_WORKERS": "0"}, tmp_path)
    assert report["parent"] == {} and report["child"]["pinned"] == {}
    assert report["value_error"] < 1e-10 and report["child"]["value_error"] < 1e-10
