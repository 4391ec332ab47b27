"""Memory stays bounded when shapes vary: per-function plan caches are least-recently-used with a limit,
pooled output buffers are bounded in bytes and released with their plans, and the caches can be cleared;
within a call, each intermediate is dropped after its last use."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.ops import blas_threads
from jitgrad.kernels import buffers, pool_limit
from jitgrad.runtime import plans


def test_varying_shapes_keep_rss_bounded(tmp_path) -> None:
    """The loop of the issue: 100 lengths of one function, each result dropped (a fresh interpreter, so the
    resident size measures only this)."""
    script = textwrap.dedent("""
        import numpy as np, jitgrad as jg
        def rss_mb():
            return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
        f = jg.trace(lambda a: np.sum(a * a))
        v, g = f.value_and_grad(np.ones(400_000)); del v, g
        start = rss_mb()
        for n in range(500_000, 600_000, 1000):
            v, g = f.value_and_grad(np.ones(n)); del v, g
        grown = rss_mb() - start
        info = f.cache_info()
        jg.clear_caches()
        print(grown, info["entries"], info["misses"], rss_mb() - start)
        """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_MAX") and k != "JITGRAD_BUFFER_POOL_MB"}
    env["JITGRAD_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    grown, entries, misses, after_clear = out.stdout.split()
    assert float(grown) < 150
    assert int(entries) == plans.DEFAULT_MAX_PLANS and int(misses) == 101
    assert float(after_clear) < float(grown)


def test_plan_cache_is_least_recently_used(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_MAX_PLANS", "3")
    f = jg.trace(lambda a: np.sum(a * 2))
    arrays = [np.ones(n) for n in (2, 3, 4, 5)]
    for a in arrays[:3]:
        f(a)
    f(arrays[0])  # the oldest becomes the most recent
    f(arrays[3])  # evicts length 3, the least recently used
    assert f.cache_info()["entries"] == 3
    misses = f.cache_info()["misses"]
    f(arrays[0])
    assert f.cache_info()["misses"] == misses
    assert f(arrays[1]) == 6.0
    assert f.cache_info()["misses"] == misses + 1


def test_clear_cache_drops_plans_and_buffers() -> None:
    f = jg.trace(lambda a: np.sum(np.sin(a) * a))
    x = np.ones(200_000)
    f.value_and_grad(x)
    f.value_and_grad(x)
    assert buffers.budget.held > 0
    f.clear_cache()
    assert f.cache_info()["entries"] == 0
    value, grad = f.value_and_grad(x)
    np.testing.assert_allclose(grad, np.cos(x) * x + np.sin(x))
    jg.clear_caches()
    assert buffers.budget.held == 0 and f.cache_info()["entries"] == 0


def test_pooled_bytes_respect_the_limit(monkeypatch) -> None:
    jg.clear_caches()
    monkeypatch.setenv("JITGRAD_BUFFER_POOL_MB", "2")
    f = jg.trace(lambda a: np.sum(np.exp(a) * a))
    for n in (100_000, 120_000, 140_000, 160_000):  # 0.8-1.3 MB gradients: at most about two fit
        x = np.linspace(0, 1, n)
        for _ in range(3):
            value, grad = f.value_and_grad(x)
            np.testing.assert_allclose(grad, np.exp(x) * (x + 1), rtol=1e-12)
        assert buffers.budget.held <= 2 * 2**20
    monkeypatch.setenv("JITGRAD_BUFFER_POOL_MB", "0")
    jg.clear_caches()
    f.value_and_grad(np.ones(100_000))
    assert buffers.budget.held == 0


def test_the_default_pool_limit_is_a_share_of_the_memory_the_process_may_use(monkeypatch, tmp_path) -> None:
    """1/32 of the machine's memory or of a lower cgroup limit, never below 256 MB."""
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    unlimited, limited = tmp_path / "unlimited", tmp_path / "limited"
    unlimited.write_text("max\n")
    limited.write_text(f"{machine // 4}\n")
    for files, usable in [([str(unlimited), str(tmp_path / "absent")], machine), ([str(limited)], machine // 4)]:
        monkeypatch.setattr(pool_limit, "_cgroup_memory_limit_files", lambda files=files: files)
        pool_limit.default_pool_bytes.cache_clear()
        assert pool_limit.usable_memory_bytes() == usable
        assert pool_limit.default_pool_bytes() == max(256 * 2**20, usable // 32)
    monkeypatch.undo()
    pool_limit.default_pool_bytes.cache_clear()
    monkeypatch.delenv("JITGRAD_BUFFER_POOL_MB", raising=False)
    assert pool_limit.pool_limit_bytes() == pool_limit.default_pool_bytes() >= 256 * 2**20


def test_a_result_dropped_by_the_next_call_is_reused_when_two_fit_the_limit(monkeypatch) -> None:
    """`r = f(x)` in a loop holds one result while the next call runs: with room for two arrays of it, calls
    alternate between them (no fresh memory, no page faults); with room for one, every other call allocates."""
    f = jg.trace(lambda a: np.exp(a) * 2.0)
    x = np.linspace(0, 1, 2**17)  # a 1 MB result
    for limit_mb, reused in (("2.5", 6), ("1.5", 3)):
        monkeypatch.setenv("JITGRAD_BUFFER_POOL_MB", limit_mb)
        jg.clear_caches()
        r = f(x)
        memories: list[weakref.ref] = []  # the array under each result (weak: holding it would stop its reuse)
        found = 0
        for _ in range(8):
            r = f(x)
            found += any(m() is r.base for m in memories)
            memories.append(weakref.ref(r.base))
            np.testing.assert_allclose(r, np.exp(x) * 2.0, rtol=1e-15)
        assert found == (reused if buffers.POOLING else 0)
        assert buffers.budget.held <= float(limit_mb) * 2**20


def test_a_result_the_user_keeps_is_never_reused() -> None:
    f = jg.trace(lambda a: a * 2.0)
    x = np.ones(100_000)
    kept = [f(x) for _ in range(5)]
    view = f(x)[10:]
    later = f(x + 1)
    assert all(np.all(k == 2.0) for k in kept) and np.all(view == 2.0) and np.all(later == 4.0)


def test_reference_counts_show_sole_ownership_on_this_interpreter() -> None:
    """The rule buffer reuse relies on is checked at import; on this interpreter it holds, so pooling is on."""
    assert buffers._sole_ownership_is_visible() is buffers.POOLING
    if sys.implementation.name == "cpython" and sys.version_info < (3, 14):
        assert buffers.POOLING


@pytest.mark.parametrize("name, value", [("JITGRAD_MAX_PLANS", "zero"), ("JITGRAD_BUFFER_POOL_MB", "-1")])
def test_bad_settings_fall_back_to_the_defaults(monkeypatch, caplog, name, value) -> None:
    monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING"):
        limit = plans.max_plans() if name == "JITGRAD_MAX_PLANS" else pool_limit.pool_limit_bytes()
    assert limit == (plans.DEFAULT_MAX_PLANS if name == "JITGRAD_MAX_PLANS" else pool_limit.default_pool_bytes())
    assert name in caplog.text


def test_intermediates_are_dropped_after_their_last_use() -> None:
    """Twenty matmul results of 512 KB each: the call holds about one at a time, not all twenty."""
    import tracemalloc

    w = np.random.default_rng(0).standard_normal((256, 256)) / 16

    def chain(x):
        for _ in range(20):
            x = np.tanh(x @ w)
        return np.sum(x)

    f = jg.trace(chain)
    x = np.random.default_rng(1).standard_normal((256, 256))
    expected = chain(x)
    for _ in range(3):  # the kernels' pooled output buffers exist from here on
        f(x)
    tracemalloc.start()
    try:
        value = f(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert value == pytest.approx(expected, rel=1e-12)
    assert peak < 4 * 256 * 256 * 8, f"peak {peak / 2**20:.1f} MB: intermediates kept until the call ends"


def test_outputs_share_pooled_buffers_by_size() -> None:
    """The same chain: forty outputs of 512 KB (twenty matmuls written through `out=`, twenty tanh kernels)
    reuse the few arrays live at once, whatever their shape, instead of keeping one per output."""
    w = np.random.default_rng(0).standard_normal((256, 256)) / 16

    def chain(x):
        for _ in range(20):
            x = np.tanh((x @ w).reshape(128, 512)).reshape(256, 256)
        return np.sum(x)

    jg.clear_caches()
    f = jg.trace(chain)
    x = np.random.default_rng(1).standard_normal((256, 256))
    for _ in range(3):
        value = f(x)
    assert value == pytest.approx(chain(x), rel=1e-12)
    assert buffers.budget.held <= 4 * 256 * 256 * 8, f"{buffers.budget.held / 2**20:.1f} MB pooled"


@pytest.mark.parametrize("shapes", [((256, 256), (256, 256)), ((4, 64, 128), (128, 96)),
                                    ((2, 3, 64, 48), (2, 3, 48, 80))])
def test_matmul_into_pooled_buffers_gives_numpys_bits(shapes) -> None:
    """Written through `out=` into pooled arrays, matmul gives the bits of its own call into a new array
    (for (..., M, K) @ (K, N) that is one GEMM over the flattened rows, as jitgrad runs it; small products on
    one OpenBLAS thread, `blas_threads`)."""
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    f = jg.trace(lambda p, q: (p @ q) * 1.0)
    kept = [f(a, b) for _ in range(3)]
    if b.ndim == 2:
        expected = blas_threads.matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    else:
        expected = blas_threads.matmul(a, b)
    assert all(np.array_equal(k, expected) for k in kept)
    assert len({id(k if k.base is None else k.base) for k in kept}) == 3


def test_outputs_of_different_sizes_share_the_arena() -> None:
    """A chain whose intermediates alternate between two sizes (and two dtypes): values whose lifetimes do not
    overlap share the arena's bytes whatever their size or dtype, so the pool holds about the three values live
    at once."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((256, 128)) / 16, rng.standard_normal((128, 256)) / 16

    def chain(x):
        for _ in range(10):
            x = np.tanh(np.tanh(x @ w1).astype(np.float32).astype(np.float64) @ w2)
        return np.sum(x)

    jg.clear_caches()
    f = jg.trace(chain)
    x = rng.standard_normal((256, 256))
    for _ in range(3):
        value = f(x)
    assert value == pytest.approx(chain(x), rel=1e-12)
    assert buffers.budget.held <= 4 * 256 * 256 * 8, f"{buffers.budget.held / 2**20:.1f} MB pooled"


def _share_bytes_while_live(values, offsets) -> list[tuple[int, int]]:
    """Pairs of values (bytes, first step, last step) live at a common step whose places share a byte."""
    return [(u, v) for u in range(len(values)) for v in range(u) if values[u][1] <= values[v][2]
            and values[v][1] <= values[u][2] and offsets[u] < offsets[v] + values[v][0]
            and offsets[v] < offsets[u] + values[u][0]]


def test_place_keeps_values_live_together_apart() -> None:
    """Random lifetimes and sizes: values live at a common step never share a byte, every offset is aligned, the
    arena is at least the most bytes live at once, and the same values always get the same places."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        n = int(rng.integers(1, 60))
        firsts = rng.integers(0, 40, n)
        values = [(int(rng.integers(1, 1 << 20)), int(f), int(f + rng.integers(0, 12))) for f in firsts]
        offsets, arena = buffers.place(values)
        assert not _share_bytes_while_live(values, offsets)
        assert all(o % buffers.ALIGN == 0 and o + nbytes <= arena for o, (nbytes, _, _) in zip(offsets, values))
        assert buffers.live_peak(values) <= arena and buffers.place(values) == (offsets, arena)


def test_place_of_values_of_one_size_needs_no_more_than_their_peak() -> None:
    """Values of one size, placed earliest first into the tightest gap, take slots like intervals coloured in order
    of their starts: exactly as many slots as values live at once."""
    rng = np.random.default_rng(6)
    for _ in range(20):
        firsts = rng.integers(0, 50, 40)
        values = [(4096, int(f), int(f + rng.integers(0, 15))) for f in firsts]
        assert buffers.place(values)[1] == buffers.live_peak(values)


def test_place_packs_the_conv_nets_values_into_their_peak(monkeypatch) -> None:
    """The dying values of the bench's medium conv net step (bytes, first step, last step): no assignment of bins
    (each as large as its largest value) holds them in less than 11.53 MB; largest-first placement alone needs
    9.97 MB; the search over orders finds a placement in the 8.91 MB live at once."""
    mb, half, quarter = 1 << 20, 1 << 19, 1 << 18
    values = [(3538944, 0, 3), (2 * mb, 3, 37), (half, 5, 35), (half, 5, 35), (4718592, 6, 10), (mb, 10, 26),
              (quarter, 12, 24), (quarter, 12, 24), (quarter, 22, 24), (mb, 24, 26), (mb, 26, 32), (4718592, 27, 30),
              (4718592, 32, 34), (663552, 34, 35), (2 * mb, 35, 37), (2 * mb, 37, 41), (3538944, 38, 41)]
    offsets, arena = buffers.place(values)
    assert arena == buffers.live_peak(values) == 8912896 and not _share_bytes_while_live(values, offsets)
    monkeypatch.setattr(buffers, "SEARCH_WORK", 0)
    assert buffers.place(values)[1] == 9961472


def _arena_pool():
    """A pool planned for four 512 KB outputs: slots 0, 1 and 2 die within the call (0 and 2 are never live at one
    step, so they share bytes), slot 3 outlives it."""
    pool = buffers.BufferPool()
    sites = [pool.site([(256, 256)], [np.float64]) for _ in range(3)] + [pool.site([(512, 256)], [np.float32])]
    steps = [((), (0,), sites[0], False), ((0,), (1,), sites[1], False), ((1,), (2,), sites[2], False),
             ((2,), (3,), sites[3], False)]
    pool.plan(steps, [(), (0,), (1,), (2,)], [3])
    return pool, sites


def test_a_place_in_the_arena_is_not_reused_while_its_bytes_are_held() -> None:
    """Slot 2 shares slot 0's bytes; while slot 0's array or a view of it is held (past the plan's lifetime), slot
    2 gets a new array; once nothing holds them, the arena's bytes again."""
    if not buffers.POOLING:
        pytest.skip("reference counts cannot show sole ownership on this interpreter")
    pool, sites = _arena_pool()
    assert pool.arena_bytes == 2 * 256 * 256 * 8
    first = sites[0].take()[0]
    first[:] = 1.0
    second = sites[1].take()[0]
    assert not np.shares_memory(first, second)
    third = sites[2].take()[0]
    assert not np.shares_memory(third, first) and not np.shares_memory(third, second)
    view = first[1:, ::2]
    del first, third
    third = sites[2].take()[0]
    third[:] = 2.0
    assert not np.shares_memory(third, view) and np.all(view == 1.0)
    del view, third
    reused = sites[2].take()[0]
    regions = pool.arena.regions
    assert reused.base is regions[sites[2].homes[0]] and np.shares_memory(regions[0], regions[2])
    assert not np.shares_memory(sites[0].take()[0], reused)  # slot 0's bytes are `reused`'s now
    assert pool.nbytes == pool.arena.nbytes


def test_results_are_the_same_with_pooling_off(monkeypatch) -> None:
    """A step with values of several sizes and dtypes (packed together in the arena) gives the same bits whether
    output buffers are pooled or not, call after call, and results kept from earlier calls keep theirs."""
    rng = np.random.default_rng(7)
    w1, w2 = rng.standard_normal((256, 192)) / 16, rng.standard_normal((192, 256)).astype(np.float32) / 16
    x = rng.standard_normal((256, 256))

    def step(x, w1, w2):
        h = np.tanh(x @ w1)
        g = np.exp(-h * h).astype(np.float32) @ w2
        return np.sum(np.tanh(g) * np.sin(x))

    monkeypatch.delenv("JITGRAD_BUFFER_POOL_MB", raising=False)
    jg.clear_caches()
    f = jg.trace(step)
    pooled = [f.value_and_grad(x, w1, w2, argnums=(0, 1, 2)) for _ in range(4)]
    (executable,) = [e for key, e in next(iter(f.plans.plans.values())).executables.items() if key[0] == "joint"]
    assert executable.buffers.arena is not None or not buffers.POOLING
    monkeypatch.setenv("JITGRAD_BUFFER_POOL_MB", "0")
    jg.clear_caches()
    g = jg.trace(step)
    unpooled = [g.value_and_grad(x, w1, w2, argnums=(0, 1, 2)) for _ in range(2)]
    assert buffers.budget.held == 0
    for value, grads in pooled + unpooled[1:]:
        assert value == unpooled[0][0]
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(grads, unpooled[0][1]))


def test_values_still_held_are_never_overwritten() -> None:
    """Residuals a Context keeps, results kept from earlier calls and views of them keep their numbers while
    later calls reuse the pool's bins."""
    f = jg.trace(lambda a, b: np.sum(np.tanh(a @ b) * np.exp(a @ b)))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 256)) / 16
    expected = f.value_and_grad(a, b, argnums=(0, 1))
    contexts = [f.forward(a, b) for _ in range(3)]
    kept = [f.value_and_grad(a, b, argnums=(0, 1)) for _ in range(3)]
    views = [g[0][1:] for _, g in kept]
    for _ in range(3):
        f.value_and_grad(a + 1, b, argnums=(0, 1))
    for value, grads in kept:
        assert value == expected[0] and all(np.array_equal(g, e) for g, e in zip(grads, expected[1]))
    assert all(np.array_equal(v, expected[1][0][1:]) for v in views)
    for out, ctx in contexts:
        assert out == expected[0]
        grads = f.backward(ctx, 1.0)
        assert all(np.array_equal(g, e) for g, e in zip(grads, expected[1]))


def test_a_gradient_summed_over_steps_adds_each_term_as_it_comes() -> None:
    """An unrolled RNN's weight gradient is the sum of one matmul per step: the terms are added as they come
    (pairwise, in the same order, so the same numbers), not all kept until the last one exists."""
    rng = np.random.default_rng(4)
    steps, hidden = 16, 128
    xs, wh = rng.standard_normal((steps, 64, hidden)), rng.standard_normal((hidden, hidden)) / 16

    def rnn(xs, wh):
        h = np.zeros((64, hidden))
        for t in range(steps):
            h = np.tanh(xs[t] + h @ wh)
        return np.sum(h * h)

    jg.clear_caches()
    f = jg.trace(rnn)
    for _ in range(3):
        value, (grad,) = f.value_and_grad(xs, wh, argnums=(1,))
    eps, d = 1e-6, np.zeros_like(wh)
    d[3, 5] = eps
    assert grad[3, 5] == pytest.approx((rnn(xs, wh + d) - rnn(xs, wh - d)) / (2 * eps), rel=1e-5)
    # two residuals of 64 KB per step and a few gradient terms of 128 KB (4.1 MB when all 16 terms were kept)
    assert buffers.budget.held <= 2 * steps * 64 * hidden * 8 + 8 * hidden * hidden * 8, buffers.budget.held
