"""Repeat calls (issue 36): a call whose arguments match a signature seen before runs through one generated
function (`jitgrad.runtime.plans.RepeatCall`) and, once its kernels have settled, a generated executable
(`Executable.steady`). Everything that changes a result must still be checked on that path: dtypes, shapes,
static values and their types, tree structures, and the arrays a function reads from outside its arguments.
Asserted on plan-cache counters and results; no timing."""
from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.build import compiler

rng = np.random.default_rng(36)


def w1(w, x, b):
    return np.sum(jg.sigmoid(w * x + b) * np.exp(-x * x) + np.tanh(x) * w)


def w1_reference(w, x, b):
    s = 1 / (1 + np.exp(-(w * x + b)))
    e = np.exp(-x * x)
    value = np.sum(s * e + np.tanh(x) * w)
    ds = s * (1 - s) * e
    return value, (ds * x + np.tanh(x), ds * w - 2 * x * s * e + (1 - np.tanh(x) ** 2) * w, ds)


def vectors(n=16, dtype=np.float32):
    return tuple(rng.standard_normal(n).astype(dtype) for _ in range(3))


def check_w1(result, args, rtol=2e-5):
    value, grads = result
    ref_value, ref_grads = w1_reference(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(value, ref_value, rtol=rtol)
    for g, r, a in zip(grads, ref_grads, args):
        assert g.dtype == a.dtype and g.shape == a.shape
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol)


def test_repeat_calls_hit_one_entry_and_give_the_general_paths_results() -> None:
    f = jg.trace(w1)
    args = vectors()
    first = f.value_and_grad(*args, argnums=(0, 1, 2))
    for _ in range(4):
        again = f.value_and_grad(*args, argnums=(0, 1, 2))
        assert type(again[0]) is type(first[0]) and type(again[1]) is tuple
        np.testing.assert_array_equal(again[0], first[0])
        for a, b in zip(again[1], first[1]):
            np.testing.assert_array_equal(a, b)
    check_w1(again, args)
    info = f.cache_info()
    assert (info["misses"], info["hits"], info["entries"]) == (1, 4, 1)
    assert f.plans.repeat_count() == 1
    assert np.shares_memory(f.value_and_grad(*args, argnums=(0, 1, 2))[1][0], first[1][0]) is False


def test_new_values_of_the_same_signature_run_on_the_repeat_path() -> None:
    f = jg.trace(w1)
    for _ in range(6):
        args = vectors()
        check_w1(f.value_and_grad(*args, argnums=(0, 1, 2)), args)
    assert f.cache_info()["misses"] == 1 and f.cache_info()["hits"] == 5


def test_a_changed_dtype_or_shape_traces_again() -> None:
    f = jg.trace(w1)
    for _ in range(3):
        f.value_and_grad(*vectors(), argnums=(0, 1, 2))
    args64 = vectors(dtype=np.float64)
    result = f.value_and_grad(*args64, argnums=(0, 1, 2))
    assert result[1][0].dtype == np.float64 and f.cache_info()["misses"] == 2
    check_w1(result, args64, rtol=1e-12)
    mixed = (args64[0].astype(np.float32), args64[1], args64[2])  # one argument's dtype only
    result = f.value_and_grad(*mixed, argnums=(0, 1, 2))
    assert result[1][0].dtype == np.float32 and result[1][1].dtype == np.float64
    assert f.cache_info()["misses"] == 3
    longer = vectors(20)
    check_w1(f.value_and_grad(*longer, argnums=(0, 1, 2)), longer)
    assert f.cache_info()["misses"] == 4
    matrix = tuple(a.reshape(4, 4) for a in vectors())
    value, grads = f.value_and_grad(*matrix, argnums=(0, 1, 2))
    assert grads[0].shape == (4, 4) and f.cache_info()["misses"] == 5
    before = f.cache_info()["misses"]
    args = vectors()
    check_w1(f.value_and_grad(*args, argnums=(0, 1, 2)), args)  # the first signature's entry is still there
    assert f.cache_info()["misses"] == before


def test_arguments_that_are_not_plain_arrays_leave_the_repeat_path() -> None:
    f = jg.trace(w1)
    args = vectors()
    for _ in range(3):
        f.value_and_grad(*args, argnums=(0, 1, 2))
    strided = tuple(np.repeat(a, 2)[::2] for a in args)  # same shape and dtype, not contiguous
    assert not strided[0].flags.c_contiguous
    check_w1(f.value_and_grad(*strided, argnums=(0, 1, 2)), args)
    readonly = tuple(a.copy() for a in args)
    for a in readonly:
        a.flags.writeable = False
    check_w1(f.value_and_grad(*readonly, argnums=(0, 1, 2)), args)
    memmap_like = tuple(a.view(np.memmap) for a in args)  # a subclass: the general path decides
    check_w1(f.value_and_grad(*memmap_like, argnums=(0, 1, 2)), args)
    with pytest.raises(jg.InputError):
        f.value_and_grad(*args[:2], argnums=0)  # missing an argument: the general path says so


def test_static_values_and_their_types_key_the_repeat_path() -> None:
    def scaled(x, k):
        return np.sum(x * k)

    f = jg.trace(scaled, static_argnums=1)
    x = np.arange(4.0)
    for k in (2, 2, 3, 3, 2.5, 2.5, True, True, 2):
        value, grad = f.value_and_grad(x, k)
        assert value == pytest.approx(np.sum(x) * k)
        np.testing.assert_array_equal(grad, np.full(4, float(k)))
    assert f.cache_info()["misses"] == 4  # 2, 3, 2.5, True (1 == True, but its type differs)
    for k in (1, 1.0, True):
        assert f(x, k) == pytest.approx(np.sum(x))
    assert f.cache_info()["misses"] == 6  # True's plan was there
    tuples = [(1, 2), (1, 2), (1.0, 2)]
    g = jg.trace(lambda x, t: np.sum(x * t[0] + t[1]), static_argnums=1)
    for t in tuples:
        assert g(x, t) == pytest.approx(np.sum(x * t[0] + t[1]))
    assert g.cache_info()["misses"] == 2 and g.cache_info()["hits"] == 1


def test_a_changed_tree_structure_traces_again_and_key_order_does_not() -> None:
    def loss(params):
        return sum(np.sum(np.tanh(params[k]) * (i + 1)) for i, k in enumerate(sorted(params)))

    f = jg.trace(loss)
    params = {f"w{i}": rng.standard_normal(5) for i in range(4)}
    for _ in range(3):
        value, grads = f.value_and_grad(params)
    assert list(grads) == list(params) and f.cache_info()["misses"] == 1
    np.testing.assert_allclose(grads["w2"], 3 * (1 - np.tanh(params["w2"]) ** 2))
    reordered = dict(reversed(list(params.items())))
    value2, grads2 = f.value_and_grad(reordered)
    assert value2 == pytest.approx(value) and f.cache_info()["misses"] == 1  # the same plan, as the general path
    np.testing.assert_array_equal(grads2["w3"], grads["w3"])
    more = {**params, "w9": rng.standard_normal(5)}
    assert set(f.value_and_grad(more)[1]) == set(more) and f.cache_info()["misses"] == 2
    renamed = {("v" + k[1:] if k == "w0" else k): v for k, v in params.items()}
    assert "v0" in f.value_and_grad(renamed)[1] and f.cache_info()["misses"] == 3
    ordered = collections.OrderedDict(params)
    assert isinstance(f.value_and_grad(ordered)[1], collections.OrderedDict)
    assert f.cache_info()["misses"] == 4
    nested = {"a": [np.ones(3), (np.ones(2), None)], "b": 2.0}
    g = jg.trace(lambda t: np.sum(t["a"][0]) * t["b"] + np.sum(t["a"][1][0]))
    for _ in range(3):
        value, grads = g.value_and_grad(nested)
    assert value == 8.0 and grads["a"][1][1] is None and isinstance(grads["a"][1], tuple)
    np.testing.assert_array_equal(grads["a"][0], np.full(3, 2.0))
    assert grads["b"] == 3.0 and g.cache_info()["misses"] == 1 and g.cache_info()["hits"] == 2
    as_list = {"a": [np.ones(3), [np.ones(2), None]], "b": 2.0}  # a tuple became a list
    assert isinstance(g.value_and_grad(as_list)[1]["a"][1], list) and g.cache_info()["misses"] == 2


Pair = collections.namedtuple("Pair", "w b")


@jg.register_dataclass
@dataclasses.dataclass
class Params:
    w: np.ndarray
    b: np.ndarray


def test_namedtuples_dataclasses_and_numbers_on_the_repeat_path() -> None:
    def loss(p, scale, x):
        return np.sum((x * p.w + p.b) ** 2) * scale

    f = jg.trace(loss)
    x = rng.standard_normal(3)
    for p in (Pair(np.ones(3), np.zeros(3)), Params(np.ones(3), np.zeros(3))):
        for scale in (2.0, 2.0, 3.0, np.float64(2.0), np.float64(2.0)):
            value, grads = f.value_and_grad(p, scale, x, argnums=(0, 1))
            assert type(grads[0]) is type(p) and value == pytest.approx(np.sum(x * x) * scale)
            np.testing.assert_allclose(grads[0].w, 2 * x * x * scale)
            assert grads[1] == pytest.approx(np.sum(x * x))
    info = f.cache_info()
    assert info["misses"] == 4 and info["hits"] == 6  # per tree type: a Python float, a numpy float64
    with pytest.raises(jg.InputError, match="int64"):
        f.value_and_grad(Pair(np.ones(3), np.zeros(3)), 2 ** 70, x)


def test_captured_arrays_are_read_at_every_repeat_call() -> None:
    state = {"W": np.ones(4)}

    def g(x):
        return np.sum(x * state["W"])

    f = jg.trace(g)
    x = np.arange(4.0)
    for _ in range(3):
        assert f(x) == 6.0 and f.value_and_grad(x)[0] == 6.0
    state["W"] *= 2  # in place
    assert f(x) == 12.0
    np.testing.assert_array_equal(f.value_and_grad(x)[1], np.full(4, 2.0))
    state["W"] = np.full(4, 3.0)  # rebound to an array of the same shape: no new trace
    assert f(x) == 18.0 and f.value_and_grad(x)[0] == 18.0
    assert f.cache_info()["misses"] == 1
    state["W"] = np.full(3, 1.0)  # another shape: traced again (and x broadcasts no more)
    with pytest.raises(Exception):
        f(x)
    state["W"] = np.ones(4, np.float32)  # another dtype: traced again
    assert f(x) == 6.0 and f.cache_info()["misses"] >= 2
    misses = f.cache_info()["misses"]
    state["W"] = 5.0  # no longer an array: traced again, the number is a constant
    assert f(x) == 30.0 and f.cache_info()["misses"] == misses + 1


def test_a_captured_closure_rebound_on_the_repeat_path() -> None:
    weights = np.ones(3)

    def h(x):
        return np.sum(x * weights) * 2

    f = jg.trace(h)
    x = np.arange(3.0)
    for _ in range(3):
        assert f.value_and_grad(x)[0] == 6.0
    weights = np.full(3, 2.0)  # noqa: F841 - read through the closure cell
    assert f.value_and_grad(x)[0] == 12.0 and f(x) == 12.0


def test_a_traced_function_called_inside_another_trace_is_inlined_not_run() -> None:
    box = {"W": np.ones(3)}
    inner = jg.trace(lambda x: x * box["W"])
    for _ in range(3):
        inner(np.ones(3))  # its repeat entry exists

    @jg.trace
    def outer(y):
        return np.sum(inner(np.ones(3)) * y)  # a concrete argument inside a trace

    y = np.arange(3.0)
    assert outer(y) == 3.0
    box["W"] = np.full(3, 2.0)  # the captured array reaches outer's plan only if inner was inlined
    assert outer(y) == 6.0


def test_options_keywords_and_transforms_share_the_repeat_path_correctly() -> None:
    f = jg.trace(w1)
    args = vectors()
    ref = f.value_and_grad(*args, argnums=(0, 2))
    assert len(ref[1]) == 2
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6)  # noqa: E731 - other programs, other fusion
    for _ in range(3):
        value, grad = f.value_and_grad(*args, argnums=[0, 2])  # a list: the general path, same result
        np.testing.assert_array_equal(grad[1], ref[1][1])
        value, grad = f.value_and_grad(*args)  # argnums 0: one gradient
        close(grad, ref[1][0])
        value, grad = f.value_and_grad(*args, argnames="b")
        close(grad, ref[1][1])
        value, grad = f.value_and_grad(args[0], x=args[1], b=args[2])
        close(grad, ref[1][0])
        close(f.grad(*args, argnums=2), ref[1][1])
        close(jg.grad(w1, argnums=(0, 2))(*args)[1], ref[1][1])
        close(jg.value_and_grad(w1)(*args)[1], ref[1][0])
    assert f.cache_info()["misses"] == 1
    aux = jg.trace(lambda x: (np.sum(x ** 2), {"twice": x * 2}))
    for _ in range(3):
        (value, extra), grad = aux.value_and_grad(np.arange(3.0), has_aux=True)
        assert value == 5.0 and set(extra) == {"twice"}
        np.testing.assert_array_equal(grad, 2 * np.arange(3.0))
    assert aux.cache_info()["misses"] == 1


def test_plain_calls_return_fresh_outputs_of_the_traced_structure() -> None:
    f = jg.trace(lambda x, y: (x + y, {"s": np.sum(x * y), "x": x}, [y * 2]))
    x, y = np.arange(3.0), np.ones(3)
    for _ in range(4):
        a, d, (c,) = f(x, y)
        assert type(d) is dict and list(d) == ["s", "x"] and type(d["s"]) is np.float64
        np.testing.assert_array_equal(a, x + 1)
        assert d["x"] is not x and not np.shares_memory(d["x"], x)  # an input returned is copied
        np.testing.assert_array_equal(c, 2 * y)
    assert f.cache_info()["misses"] == 1 and f.cache_info()["hits"] == 3


def test_forward_backward_and_split_programs_keep_working_beside_the_repeat_path() -> None:
    f = jg.trace(w1)
    args = vectors()
    for _ in range(3):
        f.value_and_grad(*args, argnums=(0, 1, 2))
        out, ctx = f.forward(*args)
        grads = f.backward(ctx, np.float32(1.0))
    check_w1((out, grads), args)


def test_evicted_and_cleared_plans_take_their_repeat_entries_with_them(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_MAX_PLANS", "1")
    f = jg.trace(w1)
    for n in (8, 9, 8, 9, 8):
        args = vectors(n)
        check_w1(f.value_and_grad(*args, argnums=(0, 1, 2)), args)
        assert f.cache_info()["entries"] == 1 and f.plans.repeat_count() <= 1
    assert f.cache_info()["misses"] == 5
    f.clear_cache()
    assert f.plans.repeat_count() == 0
    args = vectors(8)
    check_w1(f.value_and_grad(*args, argnums=(0, 1, 2)), args)
    assert f.cache_info()["misses"] == 6


def test_the_settled_executable_is_generated_and_gives_the_same_bits() -> None:
    f = jg.trace(w1)
    args = vectors()
    results = [f.value_and_grad(*args, argnums=(0, 1, 2)) for _ in range(3)]
    compiler.wait_for_background_compiles()  # a quick kernel's full-level code, had the first call used one
    results += [f.value_and_grad(*args, argnums=(0, 1, 2)) for _ in range(3)]
    plan = f.plan(*args)
    (exe, _, _), = [v for k, v in plan.executables.items() if k[0] == "value_and_grad"]
    assert exe.settled and "o = " not in f.plans.repeats[("value_and_grad", (0, 1, 2), None, False)][0].run.source
    for value, grads in results[1:]:
        assert value == results[0][0]
        for a, b in zip(grads, results[0][1]):
            np.testing.assert_array_equal(a, b)


def test_repeat_calls_from_threads_give_each_caller_its_own_results() -> None:
    f = jg.trace(w1)
    inputs = [vectors() for _ in range(4)]
    expected = [f.value_and_grad(*a, argnums=(0, 1, 2)) for a in inputs]
    failures = []

    def worker(k: int) -> None:
        for _ in range(200):
            value, grads = f.value_and_grad(*inputs[k], argnums=(0, 1, 2))
            if value != expected[k][0] or not all(np.array_equal(a, b) for a, b in zip(grads, expected[k][1])):
                failures.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_dropped_plan_is_freed_at_once_not_by_the_cycle_collector() -> None:
    """Generated functions hold executables and their buffer pools: none may sit in a reference cycle, or memory
    of evicted plans would wait for `gc` (a loop over many shapes grew by the pools' budget)."""
    import gc
    import weakref

    f = jg.trace(lambda a: np.sum(a * a))
    for _ in range(4):
        f.value_and_grad(np.ones(1000))
        f(np.ones(1000))
    plan = f.plan(np.ones(1000))
    executables = [weakref.ref(v[0] if isinstance(v, tuple) else v) for v in plan.executables.values()]
    assert f.plans.repeat_count() == 2 and all(r().settled for r in executables)
    del plan
    enabled = gc.isenabled()
    gc.disable()
    try:
        f.clear_cache()
        assert all(r() is None for r in executables)
    finally:
        if enabled:
            gc.enable()


def test_the_transforms_take_the_repeat_path_and_still_inline_inside_a_trace() -> None:
    vg = jg.value_and_grad(w1, argnums=(0, 2))
    grad_w = jg.grad(w1)
    args = vectors()
    first = vg(*args)
    for _ in range(4):
        value, (gw, gb) = vg(*args)
        assert value == first[0]
        np.testing.assert_array_equal(gb, first[1][1])
        np.testing.assert_allclose(grad_w(*args), gw, rtol=1e-6)
    check_w1((first[0], (first[1][0], w1_reference(*(a.astype(np.float64) for a in args))[1][1].astype(np.float32),
                         first[1][1])), args)

    @jg.trace
    def outer(w, x, b):
        return np.sum(vg(w, x, b)[1][0] * grad_w(w, x, b))

    np.testing.assert_allclose(outer(*args), np.sum(gw * gw), rtol=1e-5)
    np.testing.assert_allclose(jg.grad(lambda w: np.sum(grad_w(w, args[1], args[2])))(args[0]),
                               jg.grad(lambda w: np.sum(jg.grad(w1)(w, args[1], args[2])))(args[0]), rtol=1e-6)


def test_the_repeat_entries_keep_no_arguments_or_results_alive() -> None:
    import gc
    import weakref

    f = jg.trace(lambda x, d: np.sum(np.exp(x) * d["s"]))
    x, d = np.ones(10), {"s": np.full(10, 2.0)}
    value, grads = f.value_and_grad(x, d, argnums=(0, 1))
    g = jg.trace(lambda x, d: np.exp(x) * d["s"])
    out = g(x, d)
    refs = [weakref.ref(a) for a in (x, d["s"], grads[0], grads[1]["s"], out)]
    assert f.plans.repeat_count() == 1 and g.plans.repeat_count() == 1
    enabled = gc.isenabled()
    gc.disable()
    try:
        del x, d, value, grads, out
        assert all(r() is None for r in refs)
    finally:
        if enabled:
            gc.enable()
