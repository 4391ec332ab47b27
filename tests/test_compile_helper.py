"""The compile helper (jitgrad.kernels.build.helper): a second process compiles a first call's kernels into the
disk cache. Each test runs in a fresh interpreter with an empty cache, so every kernel is really built."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

KERNEL = textwrap.dedent("""
    import numpy as np, json
    from numba import types
    from jitgrad.kernels.build import compiler, helper
    SOURCE = ("def serial_kernel(n0, a0, o0):\\n    for i in range(n0):\\n"
              "        o0[i] = a0[i] * 2.0 + {k}.0\\n    return 0\\n")
    SIGNATURE = (types.int64, types.float64[::1], types.float64[::1])

    def job(k):
        compiled = compiler.load(SOURCE.format(k=k), {"serial_kernel": {}})
        return compiled, helper.job_for(compiled, "serial_kernel", SIGNATURE)
    """)


def run_script(tmp_path, body: str, **env: str) -> dict:
    """Run KERNEL + body in a fresh interpreter with an empty kernel cache; its last stdout line as JSON."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_")}
    environ["JITGRAD_FIRST_CALL"] = "compiled"  # these tests study the compiled first call
    environ.update(JITGRAD_CACHE_DIR=str(tmp_path / "cache"), **env)
    out = subprocess.run([sys.executable, "-c", KERNEL + textwrap.dedent(body)], capture_output=True, text=True,
                         env=environ, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_kernel_the_helper_built_loads_from_disk(tmp_path) -> None:
    found = run_script(tmp_path, """
        h = helper.helper()
        compiled, j = job(1)
        h.offer([j])
        h.wait_idle()
        x = np.arange(5.0); out = np.empty(5)
        compiled.call("serial_kernel", [5, x, out])
        stats = compiler.stats()
        print(json.dumps({"pid": h.process.pid, "state": j.state, "out": out.tolist(), "builds": stats["builds"],
                          "disk_hits": stats["disk_hits"], "built": h.built, "again": helper.job_for(*job(1)[:1],
                          "serial_kernel", SIGNATURE) is None}))
        """)
    pid = found.pop("pid")
    assert found == {"state": "done", "out": [1.0, 3.0, 5.0, 7.0, 9.0], "builds": 0, "disk_hits": 1, "built": 1,
                     "again": True}
    assert helper_ends(pid), "the helper outlived the process that started it"


def helper_ends(pid: int, seconds: float = 30.0) -> bool:
    """Has process `pid` exited (gone, or a zombie nobody reaped yet) within `seconds`?"""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_kernel_not_yet_started_is_claimed_back(tmp_path) -> None:
    found = run_script(tmp_path, """
        h = helper.helper()
        (c1, j1), (c2, j2) = job(1), job(2)
        h.offer([j1, j2])  # j1 is sent at once; j2 waits its turn
        claimed = h.take(j2.key)
        x = np.arange(3.0); out = np.empty(3)
        c2.call("serial_kernel", [3, x, out])
        waited = h.take(j1.key)
        c1.call("serial_kernel", [3, x, out])
        stats = compiler.stats()
        print(json.dumps({"claimed": claimed, "j2": j2.state, "waited": waited, "j1": j1.state,
                          "builds": stats["builds"], "disk_hits": stats["disk_hits"]}))
        """)
    assert found == {"claimed": False, "j2": "claimed", "waited": True, "j1": "done", "builds": 1, "disk_hits": 1}


def test_a_dead_helper_leaves_the_compiles_here(tmp_path) -> None:
    found = run_script(tmp_path, """
        h = helper.helper()
        compiled, j = job(3)
        h.offer([j])
        import time
        while j.state == "queued":  # sent to the helper, which then dies mid-compile
            time.sleep(0.01)
        h.process.kill()
        taken = h.take(j.key)
        x = np.arange(3.0); out = np.empty(3)
        compiled.call("serial_kernel", [3, x, out])
        h.offer([job(4)[1]])
        print(json.dumps({"taken": taken, "state": j.state, "broken": h.broken, "out": out.tolist(),
                          "builds": compiler.stats()["builds"], "queued": len(h.queue)}))
        """)
    assert found == {"taken": False, "state": "failed", "broken": True, "out": [3.0, 5.0, 7.0], "builds": 1,
                     "queued": 0}


FIRST_CALL = """
    import jitgrad as jg
    from jitgrad.kernels.build import helper as kernel_helper
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((64, 32)), rng.standard_normal(32)
    x = rng.standard_normal((128, 64))

    def loss(w, b, x):
        h = np.tanh(x @ w + b)
        z = h - np.max(h, axis=1, keepdims=True)
        return np.sum(np.log(np.sum(np.exp(z), axis=1)) + np.mean(h * h, axis=1))

    f = jg.trace(loss)
    value, grads = f.value_and_grad(w, b, x.T.copy().T if {transposed} else x, argnums=(0, 1, 2))
    stats = compiler.stats()
    h = kernel_helper.helper()
    built = 0 if h is None else h.built
    print(json.dumps({{"value": float(value).hex(), "grads": [g.tobytes().hex()[:4000] for g in grads],
                      "builds": stats["builds"], "disk_hits": stats["disk_hits"], "built": built,
                      "sources": stats["sources"]}}))
    """


@pytest.mark.parametrize("transposed", [False, True])
def test_a_first_call_with_the_helper_gives_the_same_bits(tmp_path, transposed) -> None:
    """With the helper each kernel is built once (here or there) and loaded from disk when it was built there,
    for a Fortran-ordered input too (the guessed types take the call's inputs as they are). Results are
    bit-identical."""
    body = FIRST_CALL.format(transposed=transposed)
    alone = run_script(tmp_path / "alone", body, JITGRAD_COMPILE_HELPER="0")
    helped = run_script(tmp_path / "helped", body)
    assert helped["value"] == alone["value"] and helped["grads"] == alone["grads"]
    assert alone["builds"] >= 3 and alone["built"] == 0
    assert helped["builds"] + helped["built"] >= alone["builds"]
    assert helped["disk_hits"] <= helped["built"]
    # the call's own inputs are typed as they are (Fortran-ordered too): each kernel is built once, and both
    # processes compile (largest first, ahead of the steps)
    assert helped["builds"] + helped["built"] == alone["builds"]
    assert helped["builds"] >= 1 and helped["built"] >= 1




def test_background_compiles_wait_for_the_whole_first_call(tmp_path) -> None:
    """A first call holds the background compiles of parallel variants back until it returns, not only while
    numba compiles in it: also while a slow host step runs (or the call waits for a kernel the helper builds),
    where a parallel variant started would take a core and numba's compiler lock from the kernels still to
    compile. Here a sort of 16M values runs between two kernels, far longer than the scheduler's quiet time."""
    found = run_script(tmp_path, """
        import time
        import jitgrad as jg
        from numba.core import event

        starts = []

        class Starts(event.Listener):
            def on_start(self, ev):
                starts.append((ev.data["dispatcher"].py_func.__name__, time.perf_counter()))

            def on_end(self, ev):
                pass

        event.register("numba:compile", Starts())

        def f(x):
            y = np.exp(x) * 2.0
            return np.sum(np.sort(y) * x)

        x = np.random.default_rng(0).standard_normal(1 << 24)
        jg.trace(f)(x)
        returned = time.perf_counter()
        compiler.wait_for_background_compiles()
        parallel = [t for name, t in starts if name == "parallel_kernel"]
        print(json.dumps({"parallel": len(parallel), "before_return": sum(t < returned for t in parallel)}))
        """, JITGRAD_COMPILE_HELPER="0")
    assert found["parallel"] > 0
    assert found["before_return"] == 0
