"""What a kernel compile changes around it. A call that waits for a kernel to compile, or for its plan to
trace, differentiate and fuse, runs it with Python's garbage collector paused (`jitgrad.kernels.build.collector`);
the collector is back as it was afterwards, from any thread and after an error. numba's per-function
optimisation round is skipped, and its whole-module round runs at a lower LLVM level, only inside a kernel's
compile (`jitgrad.kernels.build.numba_passes`), with the same bits as numba's own level."""
import gc
import threading

import numba
import numpy as np
import pytest
from numba.core import codegen as numba_codegen
from numba.core import event as numba_event

import jitgrad as jg
from jitgrad.kernels.build import background, compiler, numba_passes, quick_codegen


class _CompileProbe(numba_event.Listener):
    """Records, at the start of each foreground kernel compile, whether the collector is on, and at the start
    of every numba compile the count of kernel compiles under way, kernels and other functions apart (jitgrad's
    own listener, registered at import, has run by then). Compiles on the background thread (a parallel
    variant an earlier test queued may start at any moment) leave the collector on by design: not recorded."""

    def __init__(self) -> None:
        self.enabled_at_start: list[bool] = []
        self.depth_at_kernels: list[int] = []
        self.depth_at_others: list[int] = []

    def on_start(self, event: numba_event.Event) -> None:
        if threading.current_thread() is background.scheduler.worker:
            return
        if compiler._is_kernel(event.data["dispatcher"]):
            self.enabled_at_start.append(gc.isenabled())
            self.depth_at_kernels.append(numba_passes.depth())
        else:
            self.depth_at_others.append(numba_passes.depth())

    def on_end(self, event: numba_event.Event) -> None:
        pass


@pytest.fixture
def probe(tmp_path, monkeypatch):
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))  # cold: the kernels must build
    listener = _CompileProbe()
    numba_event.register("numba:compile", listener)
    yield listener
    numba_event.unregister("numba:compile", listener)


def test_collector_off_while_a_kernel_compiles_and_on_after(probe) -> None:
    assert gc.isenabled()
    builds = compiler.stats()["builds"]
    f = jg.trace(lambda x: np.sum(np.arcsinh(x) * x))
    x = np.linspace(0, 1, 50, dtype=np.float32)
    value, grad = f.value_and_grad(x)
    assert compiler.stats()["builds"] > builds
    assert probe.enabled_at_start and not any(probe.enabled_at_start)
    assert gc.isenabled()
    np.testing.assert_allclose(value, np.sum(np.arcsinh(x) * x), rtol=1e-5)
    np.testing.assert_allclose(grad, np.arcsinh(x) + x / np.sqrt(x * x + 1), rtol=1e-5)


def test_collector_the_process_turned_off_stays_off(probe) -> None:
    builds = compiler.stats()["builds"]
    gc.disable()
    try:
        out = jg.trace(lambda x: np.arctan(x) * 3 - x)(np.ones(8))
        assert compiler.stats()["builds"] > builds
        assert not gc.isenabled()
    finally:
        gc.enable()
    np.testing.assert_allclose(out, np.arctan(1.0) * 3 - 1)


def test_concurrent_first_calls_leave_the_collector_on(probe) -> None:
    fns = [jg.trace(lambda x, k=k: np.sum(np.cos(x) ** (k + 2) + x * k)) for k in range(4)]
    barrier = threading.Barrier(len(fns))
    x = np.linspace(-1, 1, 64)
    results: dict[int, float] = {}

    def work(k: int) -> None:
        barrier.wait()
        results[k] = float(fns[k](x))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.isenabled()
    assert not any(probe.enabled_at_start)
    for k in range(len(fns)):
        assert results[k] == pytest.approx(np.sum(np.cos(x) ** (k + 2) + x * k), rel=1e-12)


def test_a_child_forked_during_a_compile_gets_the_collector_back() -> None:
    import multiprocessing

    pause = compiler.collector.pause
    pause.enter()  # as a compiling thread would hold it
    try:
        assert not gc.isenabled()
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            assert pool.apply(gc.isenabled) is True
    finally:
        pause.exit()
    assert gc.isenabled()


def test_collector_off_while_tracing_and_on_after_a_trace_error() -> None:
    seen: list[bool] = []

    def loss(x):
        seen.append(gc.isenabled())
        return np.sum(np.sin(x) * x)

    f = jg.trace(loss)
    x = np.linspace(-1, 1, 16)
    value, grad = f.value_and_grad(x)
    assert seen == [False] and gc.isenabled()
    np.testing.assert_allclose(grad, np.cos(x) * x + np.sin(x), rtol=1e-12)

    def broken(x):
        seen.append(gc.isenabled())
        return np.sum(x @ x[:3])

    with pytest.raises(jg.JitgradError):
        jg.trace(broken)(np.ones(4))
    assert seen == [False, False] and gc.isenabled()


def test_a_traced_cycle_is_collected_by_the_closing_pass() -> None:
    import weakref

    class Node:
        pass

    refs = []

    def loss(x):
        node = Node()
        node.self = node  # a reference cycle the paused collector cannot free during the trace
        refs.append(weakref.ref(node))
        return np.sum(x * 2)

    jg.trace(loss)(np.ones(3))
    assert refs[0]() is None  # freed by the youngest-generation pass at the end of the pause


def test_function_passes_skipped_in_kernel_compiles_only(probe) -> None:
    f = jg.trace(lambda x: np.sum(np.tanh(x) * np.log1p(x * x)))
    x = np.linspace(0.1, 1, 77, dtype=np.float32)
    value, grad = f.value_and_grad(x)
    assert probe.depth_at_kernels and min(probe.depth_at_kernels) >= 1
    assert numba_passes.depth() == 0

    @numba.njit
    def users_own(a):
        return a * a + a

    np.testing.assert_array_equal(users_own(x), x * x + x)
    assert probe.depth_at_others[-1] == 0
    assert numba_codegen.CPUCodeLibrary._optimize_functions.__module__ == numba_passes.__name__
    np.testing.assert_allclose(value, np.sum(np.tanh(x) * np.log1p(x * x)), rtol=1e-5)
    want = (1 - np.tanh(x) ** 2) * np.log1p(x * x) + np.tanh(x) * 2 * x / (1 + x * x)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def _kernel_calls(monkeypatch) -> list[tuple]:
    """Every generated kernel's first call from here on: (its Python function, numba options, argument copies)."""
    calls: list[tuple] = []
    seen: set[tuple] = set()
    original = compiler.CompiledSource.call

    def call(self, variant, args):
        key = (self.name, variant)
        if key not in seen:
            seen.add(key)
            copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            calls.append((self.functions[variant].py_func, self.options[variant], copies))
        return original(self, variant, args)

    monkeypatch.setattr(compiler.CompiledSource, "call", call)
    return calls


def test_kernel_module_level_only_in_kernel_compiles_and_same_bits(probe, monkeypatch) -> None:
    levels: list[tuple[int, int]] = []  # (kernel compiles under way, LLVM level) of every pass pipeline built
    create = numba_codegen.create_pass_builder

    def recording(tm, opt=2, **kwargs):
        levels.append((numba_passes.depth(), opt))
        return create(tm, opt=opt, **kwargs)

    monkeypatch.setattr(numba_codegen, "create_pass_builder", recording)
    calls = _kernel_calls(monkeypatch)

    def loss(x, w):
        z = np.tanh(x @ w)
        e = np.exp(z - np.max(z, axis=1, keepdims=True))
        return np.sum(np.log(np.sum(e, axis=1)) + np.mean(z * z, axis=1))

    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(37, 19)).astype(np.float32), rng.normal(size=(19, 23)).astype(np.float32)
    jg.trace(loss).value_and_grad(x, w, argnums=(0, 1))
    kernel_levels = {opt for d, opt in levels if d}
    assert kernel_levels == {0, numba_passes.KERNEL_MODULE_OPT}  # numba's cheap round, then the module round

    @numba.njit
    def users_own(a):
        return a * a + 1

    levels.clear()
    users_own(x)
    assert {opt for _, opt in levels} == {0, numba.config.OPT} and not any(d for d, _ in levels)

    assert len(calls) >= 2
    for py_func, options, args in calls:  # each kernel compiled again at numba's level: the same bits
        outputs = {}
        for level in (numba.config.OPT, numba_passes.KERNEL_MODULE_OPT):
            monkeypatch.setattr(numba_passes, "KERNEL_MODULE_OPT", level)
            copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            numba.njit(error_model="numpy", **quick_codegen.numba_options(options))(py_func)(*copies)
            outputs[level] = copies
        for at_numba_level, at_kernel_level in zip(*outputs.values()):
            if isinstance(at_numba_level, np.ndarray):
                assert at_numba_level.tobytes() == at_kernel_level.tobytes()


def test_kernel_module_level_in_disk_cache_key(tmp_path) -> None:
    from numba.core.registry import cpu_target

    entry = compiler.DiskCache(str(tmp_path), "jitgrad_kernel_x", "serial_kernel", {})
    codegen = cpu_target.target_context.codegen()
    assert repr(numba_passes.cache_tag()) in entry.entry_key("(float32,)", codegen)
