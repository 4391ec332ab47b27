"""Quick kernels (jitgrad.kernels.build.quick_codegen): a cold first call's kernels get machine code at LLVM's lowest
code generation level, with the same bits as the full level's, and their full-level code replaces them in the
background. The first-call tests run in fresh interpreters with empty caches, so every kernel is really built."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numba
import numpy as np
import pytest
from numba import types

from jitgrad.kernels.build import background, compiler, quick_codegen

VECMATH = textwrap.dedent("""
    from jitgrad.kernels.cpu.vecmath import vexp, vexpm1, vlog, vlog1p, vsigmoid, vtanh


    def serial_kernel(n0, a0, o0, o1, o2, o3, o4, o5):
        for i in range(n0):
            x = a0[i]
            o0[i] = vexp(x)
            o1[i] = vexpm1(x)
            o2[i] = vlog(x)
            o3[i] = vlog1p(x)
            o4[i] = vsigmoid(x)
            o5[i] = vtanh(x)
        return 0


    quick_kernel = serial_kernel
    """)


VECMATH_RUN = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    from jitgrad.kernels.build import compiler, quick_codegen

    variant = sys.argv[1]
    compiled = compiler.load(SOURCE, {"serial_kernel": {}, "quick_kernel": quick_codegen.QUICK})
    rng = np.random.default_rng(0)
    digests = {}
    for dtype in (np.float32, np.float64):
        magnitudes = np.exp2(rng.uniform(-40, 12, 200_003))
        x = np.concatenate([magnitudes * rng.choice([-1.0, 1.0], magnitudes.size),
                            [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1.0, 1.0]]).astype(dtype)
        out = [np.empty_like(x) for _ in range(6)]
        with np.errstate(all="ignore"):
            compiled.call(variant, [x.size, x, *out])
        digests[np.dtype(dtype).name] = [hashlib.sha256(o.tobytes()).hexdigest() for o in out]
    library = compiled.functions[variant].overloads[compiled.functions[variant].signatures[-1]].library
    print(json.dumps({"digests": digests, "code": hashlib.sha256(library._get_compiled_object()).hexdigest()}))
    """)


def test_quick_machine_code_differs_from_the_full_levels_and_gives_the_same_bits() -> None:
    """vecmath's polynomials let LLVM fuse multiplies and adds (`contract`); quick code must fuse the same ones,
    over every binade and the special values, in the vectorised loop, its scalar remainder and the functions
    not inlined (float64 log1p: with FastISel it differed in 0.1% of values). Each variant runs in a fresh
    process with the disk cache off: the JIT links a function two kernels share from the first that defines it."""
    found = {}
    for variant in ("serial_kernel", "quick_kernel"):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_")}
        environ["JITGRAD_FIRST_CALL"] = "compiled"  # the compiled first call is under test
        environ["JITGRAD_CACHE"] = "0"
        script = f"SOURCE = {VECMATH!r}\n" + VECMATH_RUN
        out = subprocess.run([sys.executable, "-c", script, variant], capture_output=True, text=True, env=environ,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        found[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["quick_kernel"]["digests"] == found["serial_kernel"]["digests"]
    assert found["quick_kernel"]["code"] != found["serial_kernel"]["code"]


def test_quick_kernels_are_a_separate_disk_cache_entry() -> None:
    compiled = compiler.load(VECMATH + "# entries\n", {"serial_kernel": {}, "quick_kernel": quick_codegen.QUICK})
    sig = (types.int64, *[types.float64[::1]] * 7)
    codegen = compiled.functions["serial_kernel"].targetctx.codegen()
    keys = {compiled.functions[v]._cache.entry_key(sig, codegen) for v in ("serial_kernel", "quick_kernel")}
    assert len(keys) == 2
    assert all(repr(quick_codegen.cache_tag()) in key for key in keys)
    assert quick_codegen.numba_options({"parallel": True, **quick_codegen.QUICK}) == {"parallel": True}


def test_urgent_background_jobs_run_before_the_others_in_the_order_given() -> None:
    scheduler = background.Scheduler()
    order: list[str] = []
    gate = threading.Event()
    scheduler.submit(gate.wait)  # holds the worker until every job below is queued
    for name, urgent in (("parallel 1", False), ("full 1", True), ("parallel 2", False), ("full 2", True)):
        scheduler.submit(lambda name=name: order.append(name), urgent)
    gate.set()
    scheduler.wait()
    assert order == ["full 1", "full 2", "parallel 1", "parallel 2"]


FIRST_CALL = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    import jitgrad as jg
    from jitgrad.kernels.cpu import executor as runtime
    from jitgrad.kernels.build import compiler

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    x = rng.standard_normal((128, 64)).astype(np.float32)

    def loss(w, b, x):
        h = np.tanh(x @ w + b)
        z = h - np.max(h, axis=1, keepdims=True)
        return np.sum(np.log(np.sum(np.exp(z), axis=1)) + np.mean(h * h, axis=1))

    f = jg.trace(loss)
    first = f.value_and_grad(w, b, x, argnums=(0, 1))
    calls = [c for c in gc.get_objects() if isinstance(c, runtime._KernelCall)]
    after_first = sorted(c.serial for c in calls)
    compiler.wait_for_background_compiles()
    once = sorted(c.serial for c in calls)  # nothing compiles again for a kernel run once
    f.value_and_grad(w, b, x, argnums=(0, 1))  # run again: the full-level code compiles in the background
    compiler.wait_for_background_compiles()
    later = f.value_and_grad(w, b, x, argnums=(0, 1))
    bits = lambda r: [float(r[0]).hex()] + [g.tobytes().hex() for g in r[1]]
    print(json.dumps({"after_first": after_first, "once": once, "later": sorted(c.serial for c in calls),
                      "same": bits(first) == bits(later), "value": bits(first)}))
    """)


def first_call(cache, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_")}
    environ["JITGRAD_FIRST_CALL"] = "compiled"  # the compiled first call is under test
    environ.update(JITGRAD_CACHE_DIR=str(cache), **env)
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, env=environ,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cold_first_call_runs_quick_kernels_until_their_full_level_code_is_in(tmp_path) -> None:
    cold = first_call(tmp_path / "cache")
    assert len(cold["after_first"]) >= 3 and set(cold["after_first"]) == {"quick_kernel"} == set(cold["once"])
    assert set(cold["later"]) == {"serial_kernel"}
    assert cold["same"]
    # the full-level code is on disk now: the next process runs it from its first call (after a process that
    # ran the function once, only the quick code would be there)
    warm = first_call(tmp_path / "cache")
    assert set(warm["after_first"]) == {"serial_kernel"} and warm["value"] == cold["value"]
    # without quick kernels, or without the compile helper, the first call runs full-level code, same bits
    for env in ({"JITGRAD_QUICK_KERNELS": "0"}, {"JITGRAD_COMPILE_HELPER": "0"}):
        plain = first_call(tmp_path / "-".join(env), **env)
        assert set(plain["after_first"]) == {"serial_kernel"} and plain["value"] == cold["value"]
