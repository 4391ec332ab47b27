"""A call spreads over the cores or stays on one, by timing whole calls (kernels/cpu/variants.py `CallSpread`):
it waits for every kernel's own choice, keeps the faster way, and a call on one core runs every kernel's serial
variant and every split product's parts on the calling thread, with the bits of a spread call."""
import time

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.build import background, compiler
from jitgrad.kernels.cpu import variants
from jitgrad.kernels.cpu.variants import ONE_CORE, PARALLEL, SERIAL, SPREAD, CallSpread, VariantChooser
from jitgrad.ops import blas_threads
from jitgrad.cores import on_one_core


def test_the_calls_are_timed_once_every_kernel_has_chosen_and_the_faster_way_is_kept() -> None:
    compiler.wait_for_background_compiles()  # earlier tests' compiles would hold the timing back
    kernel = VariantChooser(1 << 30)
    spread = CallSpread([kernel, VariantChooser(10)], host_steps=False)
    ways = []

    def call() -> None:
        ways.append(on_one_core.on)
        if not on_one_core.on:
            time.sleep(0.003)  # spread calls are slower here: memory moving between cores, say

    spread.run(call)
    assert ways == [False] and all(not t for t in spread.chooser.timings.values())  # the kernel is still timing
    kernel.choice = PARALLEL
    while spread.chooser.choice is None:
        spread.run(call)
    # each way runs in a streak whose first call (right after a switch, paying for it) is not timed
    assert ways[1:] == [False] * (VariantChooser.TRIALS + 1) + [True] * (VariantChooser.TRIALS + 1)
    assert spread.chooser.timings[SPREAD] and all(t >= 0.003 for t in spread.chooser.timings[SPREAD])
    assert spread.chooser.choice == ONE_CORE
    spread.run(call)
    assert ways[-1] is True and on_one_core.on is False


def test_no_call_is_timed_while_background_compiles_share_the_cores(monkeypatch) -> None:
    spread = CallSpread([VariantChooser(1 << 30)], host_steps=True)
    spread.kernels[0].choice = PARALLEL
    monkeypatch.setattr(background.scheduler, "idle", lambda: False)
    ways = []
    for _ in range(10):
        spread.run(lambda: ways.append(on_one_core.on))
    assert ways == [False] * 10 and spread.chooser.choice is None and not any(spread.chooser.timings.values())
    monkeypatch.setattr(background.scheduler, "idle", lambda: True)
    while spread.chooser.choice is None:
        spread.run(lambda: None)
    assert len(spread.chooser.timings[ONE_CORE]) == VariantChooser.TRIALS


def test_a_program_with_nothing_to_spread_is_never_timed() -> None:
    spread = CallSpread([VariantChooser(10)], host_steps=False)
    for _ in range(10):
        spread.run(lambda: None)
    assert not spread.active and spread.chooser.choice is None and not spread.chooser.timings[SPREAD]


def _model(w, x):
    return np.sum(np.tanh(x @ w) * np.exp(-x[:, :600] ** 2))


@pytest.mark.skipif(blas_threads._one_thread.found is None, reason="numpy's BLAS is not OpenBLAS: nothing splits")
def test_a_call_on_one_core_runs_serial_kernels_and_a_split_products_parts_on_its_own_thread(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((600, 600)).astype(np.float32), rng.standard_normal((600, 600)).astype(np.float32)
    assert blas_threads.splits(x, w)
    f = jg.trace(_model)
    first = f.value_and_grad(w, x, argnums=(0, 1))
    compiler.wait_for_background_compiles()
    (executable,) = [e for key, e in next(iter(f.plans.plans.values())).executables.items() if key[0] == "joint"]
    kernels = [c for c in executable.calls if hasattr(c, "chooser")]
    assert executable.spread.active and any(not c.chooser.fixed for c in kernels)
    for c in kernels:  # every large kernel on its parallel variant, whenever a call spreads
        if not c.chooser.fixed:
            c.chooser.choice = PARALLEL
    ran, helped = [], []
    for c in kernels:
        real = c.compiled.call
        monkeypatch.setattr(c.compiled, "call", lambda variant, args, real=real: (ran.append(variant),
                                                                                 real(variant, args))[1])
    real_take = blas_threads._helper._take
    monkeypatch.setattr(blas_threads._helper, "_take", lambda job: (helped.append(job), real_take(job))[1])
    results, before = {}, f.cache_info()["one_core_calls"]
    for way in (SPREAD, ONE_CORE):
        executable.spread.kernels, executable.spread.chooser.choice = [], way
        executable.spread.chooser.calls_since_choice = 0
        ran.clear()
        helped.clear()
        results[way] = f.value_and_grad(w, x, argnums=(0, 1))
        assert ran and (set(ran) == {PARALLEL} if way == SPREAD else PARALLEL not in ran)
        if way == ONE_CORE:
            assert helped == [] and f.cache_info()["one_core_calls"] == before + 1
    for got in (results[ONE_CORE], first):
        assert got[0] == results[SPREAD][0]
        for g, want in zip(got[1], results[SPREAD][1]):
            np.testing.assert_array_equal(g, want)


def test_a_forked_child_after_gnu_openmp_keeps_its_calls_on_one_core(monkeypatch) -> None:
    spread = CallSpread([VariantChooser(1 << 30)], host_steps=True)
    monkeypatch.setattr(variants.numba, "threading_layer", lambda: "omp")
    monkeypatch.setattr(variants, "_serial_only", False)
    variants._pin_serial_after_fork()
    assert spread.chooser.fixed and spread.chooser.next() == ONE_CORE
