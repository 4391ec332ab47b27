"""A KeyboardInterrupt in a cold first call leaves nothing half-done: the next call gives the right result,
no lock or compile bookkeeping stays held, the compile helper is the only child and ends with the process,
and the disk cache holds only whole entries. Each case runs in a fresh interpreter with an empty cache and
interrupts its first call at one point: while tracing, while fusing, as a compile in this process ends,
while it waits for the compile helper, during a background promotion, and by a real signal (SIGALRM raising
KeyboardInterrupt) inside a compile."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jitgrad import cache

SCRIPT = textwrap.dedent("""
    import _thread, gc, json, os, signal, sys, threading, time
    import numpy as np
    import jitgrad as jg
    from numba.core import event
    from jitgrad.passes import recipes
    from jitgrad.kernels.build import background, collector, compiler, numba_passes, helper, quick_codegen
    POINT = sys.argv[1]
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even where the parent left SIGINT ignored (a child
    # inherits that, and `_thread.interrupt_main` then does nothing)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    armed, compiling = [True], [False]

    def interrupt_once():
        if armed[0]:
            armed[0] = False
            _thread.interrupt_main()

    @jg.trace
    def f(W, x, b):
        h = np.tanh(x @ W + b)
        if POINT == "trace":
            interrupt_once()
            time.sleep(0.5)
        return np.sum(np.exp(h @ W.T) * 0.5) + np.sum(np.sqrt(np.abs(h) + 1.0))

    def reference(W, x, b):
        h = np.tanh(x @ W + b)
        e = np.exp(h @ W.T) * 0.5
        dh = (e @ W + 0.5 * np.sign(h) / np.sqrt(np.abs(h) + 1.0)) * (1 - h * h)
        return e.sum() + np.sqrt(np.abs(h) + 1.0).sum(), (x.T @ dh + e.T @ h, None, dh.sum(0))

    class OnCompile(event.Listener):
        def on_start(self, e):
            worker = threading.current_thread() is background.scheduler.worker
            compiling[0] = True
            if POINT == "promotion" and worker:
                interrupt_once()
            elif POINT == "signal" and armed[0]:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0.05)
        def on_end(self, e):
            pass

    event.register("numba:compile", OnCompile())
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    if POINT == "fusion":
        schedule = recipes.schedule
        recipes.schedule = lambda graph: (interrupt_once(), schedule(graph), time.sleep(0.5))[1]
    if POINT == "compile":  # as a compile ends, in the garbage collection after it
        resume = collector.pause.exit
        collector.pause.exit = lambda: (compiling[0] and interrupt_once(), resume())[1]
    if POINT == "helper":
        take = helper.CompileHelper.take
        helper.CompileHelper.take = lambda self, key: (interrupt_once(), take(self, key))[1]

    rng = np.random.default_rng(0)
    W, x, b = rng.standard_normal((8, 8)) * 0.3, rng.standard_normal((16, 8)), rng.standard_normal(8)
    interrupted = False
    try:
        for _ in range(200):  # promotion: call again until the background compile is interrupted
            f.value_and_grad(W, x, b)
            if POINT != "promotion":
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        interrupted = True
    start = time.perf_counter()
    value, grads = f.value_and_grad(W, x, b, argnums=(0, 1, 2))
    second = time.perf_counter() - start
    ref_value, ref_grads = reference(W, x, b)
    right = bool(np.allclose(value, ref_value) and all(np.allclose(g, r) for g, r in zip(grads, ref_grads)
                                                       if r is not None))
    compiler.wait_for_background_compiles()

    @jg.trace
    def other(y):
        return np.sum(np.cos(y) * 3.0)

    found = []
    thread = threading.Thread(target=lambda: found.append(float(other(np.arange(5.0)))), daemon=True)
    thread.start()
    thread.join(120)
    compile_helper = helper.helper()
    process = compile_helper.process if compile_helper is not None else None
    children = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/stat")
                and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
    if compile_helper is not None:
        compile_helper.close()
    helper_ended = process is None or process.wait(60) is not None
    print(json.dumps(dict(
        interrupted=interrupted, right=right, second=second,
        other=bool(found) and bool(np.isclose(found[0], np.sum(np.cos(np.arange(5.0)) * 3))),
        children=len(children), helper_ended=helper_ended, gc=gc.isenabled(), pause=collector.pause._depth,
        foreground=background.scheduler._foreground + len(background.scheduler._holders),
        depths=[numba_passes.depth(), quick_codegen.depth()])))
    """)

CHECK = textwrap.dedent("""
    import json, numpy as np, jitgrad as jg
    from jitgrad.kernels.build import compiler
    @jg.trace
    def f(W, x, b):
        h = np.tanh(x @ W + b)
        return np.sum(np.exp(h @ W.T) * 0.5) + np.sum(np.sqrt(np.abs(h) + 1.0))
    rng = np.random.default_rng(0)
    W, x, b = rng.standard_normal((8, 8)) * 0.3, rng.standard_normal((16, 8)), rng.standard_normal(8)
    print(json.dumps(dict(value=float(f.value_and_grad(W, x, b)[0]), rejected=compiler.stats()["disk_rejected"])))
    """)


def _run(code: str, cache_dir: str, *args: str) -> dict:
    """Run `code` in a fresh interpreter on the kernel cache `cache_dir`; its last stdout line as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_")}
    env["JITGRAD_FIRST_CALL"] = "compiled"  # the compiled first call is under test
    env.update(JITGRAD_CACHE_DIR=cache_dir, JITGRAD_PROGRESS="0")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _whole_entries(cache_dir: str) -> list[str]:
    """Problems of the files under `cache_dir`: temporary files left, machine code whose checksum fails."""
    problems = []
    for folder, _, files in os.walk(cache_dir):
        for name in files:
            path = os.path.join(folder, name)
            if ".tmp-" in name:
                problems.append(f"temporary file {name}")
            elif name.endswith(".nbk"):
                data = open(path, "rb").read()
                head = len(cache._MAGIC) + cache._DIGEST_BYTES
                if data[:len(cache._MAGIC)] != cache._MAGIC or hashlib.sha256(data[head:]).digest() != \
                        data[len(cache._MAGIC):head]:
                    problems.append(f"damaged entry {name}")
    return problems


@pytest.mark.parametrize("point", ["trace", "fusion", "compile", "helper", "promotion", "signal"])
def test_an_interrupted_first_call_leaves_nothing_half_done(tmp_path, point: str) -> None:
    cache_dir = str(tmp_path / "cache")
    found = _run(SCRIPT, cache_dir, point)
    print(point, found)
    assert found["interrupted"], found
    assert found["right"] and found["other"], found
    assert found["children"] <= 1 and found["helper_ended"], found
    assert found["gc"] and found["pause"] == 0 and found["foreground"] == 0 and found["depths"] == [0, 0], found
    assert not _whole_entries(cache_dir)
    again = _run(CHECK, cache_dir)
    assert again["rejected"] == 0
