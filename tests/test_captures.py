"""Arrays a traced function reads from outside its arguments (closures, globals, attributes, dict and
list entries, default arguments) are read again at every call: updates in place and rebinding both
show, computations on them are traced, and a change of shape re-traces."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.errors import ConcretizationError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 4))
W0 = RNG.standard_normal((4, 3))
GLOBAL_W = W0.copy()
Params = namedtuple("Params", "W b")
GLOBAL_PARAMS = Params(W0.copy(), np.zeros(3))


def global_loss(x):
    return np.sum(np.tanh(x @ GLOBAL_W))


def namedtuple_loss(x):
    return np.sum(x @ GLOBAL_PARAMS.W + GLOBAL_PARAMS.b)


def test_closure_array_updated_in_place_and_rebound() -> None:
    w = W0.copy()
    f = jg.trace(lambda x: np.sum(x @ w))
    assert f(X) == pytest.approx(np.sum(X @ w))
    w *= 2
    assert f(X) == pytest.approx(np.sum(X @ w))
    w = W0 * 3  # rebinding the closure variable
    assert f(X) == pytest.approx(np.sum(X @ w))
    assert f.cache_info()["misses"] == 1  # same shape: the plan reads the new array, no re-trace


def test_global_array_rebound_and_updated() -> None:
    global GLOBAL_W
    f = jg.trace(global_loss)
    value, grad = f.value_and_grad(X)
    assert value == pytest.approx(np.sum(np.tanh(X @ GLOBAL_W)))
    GLOBAL_W = GLOBAL_W * 0.5
    for _ in range(3):  # the repeat-call fast path reads it too
        value, grad = f.value_and_grad(X)
        assert value == pytest.approx(np.sum(np.tanh(X @ GLOBAL_W)))
        np.testing.assert_allclose(grad, (1 - np.tanh(X @ GLOBAL_W) ** 2) @ GLOBAL_W.T, rtol=1e-12)
    GLOBAL_W += 1.0
    assert f(X) == pytest.approx(np.sum(np.tanh(X @ GLOBAL_W)))


class Layer:
    """A PyTorch-style model: parameters are attributes an optimizer updates."""

    def __init__(self) -> None:
        self.W = W0.copy()
        self.log_scale = np.zeros(3)

    def loss(self, x):
        return np.sum(np.tanh(x @ self.W.T.T) * np.exp(self.log_scale))


def _layer_reference(layer: Layer, x: np.ndarray) -> float:
    return float(np.sum(np.tanh(x @ layer.W) * np.exp(layer.log_scale)))


def test_attributes_and_computations_on_them_are_read_at_every_call() -> None:
    layer = Layer()
    f = jg.trace(layer.loss)
    W_before = layer.W
    for step in range(4):
        value, gx = f.value_and_grad(X)
        assert value == pytest.approx(_layer_reference(layer, X), rel=1e-12)
        if step % 2:
            layer.W -= 0.1 * W0  # in place, as an optimizer step
        else:
            layer.W = layer.W * 0.9  # rebinding, as a functional update
        layer.log_scale = layer.log_scale + 0.5
    assert W_before is not layer.W and isinstance(layer.W, np.ndarray)  # the trace put the arrays back
    assert f.cache_info()["misses"] == 1


def test_dict_list_and_namedtuple_entries() -> None:
    global GLOBAL_PARAMS
    params = {"W": W0.copy()}
    layers = [W0.copy()]
    f = jg.trace(lambda x: np.sum(x @ params["W"]) + np.sum(x @ layers[0]))
    assert f(X) == pytest.approx(2 * np.sum(X @ W0))
    params["W"] = W0 * 4
    layers[0] *= -1
    assert f(X) == pytest.approx(np.sum(X @ (W0 * 4)) - np.sum(X @ W0))
    g = jg.trace(namedtuple_loss)
    assert g(X) == pytest.approx(np.sum(X @ W0))
    GLOBAL_PARAMS = Params(W0 * 2, np.ones(3))
    assert g(X) == pytest.approx(np.sum(X @ (W0 * 2) + 1))


def test_a_new_shape_retraces() -> None:
    params = {"W": W0.copy()}
    f = jg.trace(lambda x: np.sum(x @ params["W"]))
    f(X)
    params["W"] = np.ones((4, 7))
    assert f(X) == pytest.approx(np.sum(X @ np.ones((4, 7))))
    info = f.cache_info()
    assert info["misses"] == 2 and info["entries"] == 1


def test_default_arguments_and_helpers_reading_globals() -> None:
    scale = np.full(3, 2.0)

    def helper(x):
        return x @ GLOBAL_W

    def loss(x, s=scale):
        return np.sum(helper(x) * s)

    f = jg.trace(loss)
    assert f(X) == pytest.approx(np.sum(X @ GLOBAL_W * 2))
    scale[:] = 5.0
    assert f(X) == pytest.approx(np.sum(X @ GLOBAL_W * 5))


def test_nested_transformations_and_forward_backward_read_captured_arrays() -> None:
    w = W0.copy()
    outer = jg.trace(lambda x: jg.grad(lambda y: np.sum(np.sin(y @ w)))(x).sum())
    expected = lambda: np.sum(np.cos(X @ w) @ w.T)  # noqa: E731
    assert outer(X) == pytest.approx(expected())
    w *= 0.5
    assert outer(X) == pytest.approx(expected())
    f = jg.trace(lambda x: np.sum(np.sin(x @ w)))
    out, ctx = f.forward(X)
    (gx,) = f.backward(ctx, 1.0)
    np.testing.assert_allclose(gx, np.cos(X @ w) @ w.T, rtol=1e-12)


def test_captured_values_that_shape_the_trace_are_guarded_by_value() -> None:
    mask = np.array([True, False, True, True, False])
    counts = np.array([1, 2, 1])
    f = jg.trace(lambda x: np.sum(x[mask]) + np.sum(np.repeat(x[0, :3], counts)))
    assert f(X) == pytest.approx(np.sum(X[mask]) + np.sum(np.repeat(X[0, :3], counts)))
    mask[1] = True
    counts[0] = 3
    assert f(X) == pytest.approx(np.sum(X[mask]) + np.sum(np.repeat(X[0, :3], counts)))
    assert f.cache_info()["misses"] == 2


def test_python_numbers_in_closures_are_constants_of_the_trace() -> None:
    """The documented rule: Python numbers and numpy scalars are read when the function is traced."""
    scale = 2.0
    f = jg.trace(lambda x: np.sum(x) * scale)
    first = f(X)
    scale = 3.0
    assert f(X) == first


def test_control_flow_on_a_large_captured_array_says_what_to_do() -> None:
    big = np.ones(1 << 17)
    f = jg.trace(lambda x: np.sum(x) if big.sum() > 0 else np.sum(-x))
    with pytest.raises(ConcretizationError, match="closure, globals or attributes are traced values too"):
        f(X)


def test_functions_without_captured_arrays_keep_an_empty_capture_list() -> None:
    f = jg.trace(lambda x, w: np.sum(x @ w))
    f(X, W0)
    (plan,) = f.plans.plans.values()
    assert not plan.captures


# ---------------------------------------------------------------------- container structure (issue 32)

def test_a_captured_list_that_grows_is_read_again() -> None:
    arrs = [np.ones(2)]
    f = jg.trace(lambda x: x + sum(arrs))
    np.testing.assert_array_equal(f(np.zeros(2)), [1.0, 1.0])
    arrs.append(np.full(2, 5.0))
    np.testing.assert_array_equal(f(np.zeros(2)), [6.0, 6.0])
    del arrs[0]
    np.testing.assert_array_equal(f(np.zeros(2)), [5.0, 5.0])
    assert f.cache_info()["misses"] == 3


def test_dict_keys_a_rebound_tuple_and_an_empty_list_are_guarded() -> None:
    params = {"a": np.ones(2)}
    extra: list = []
    pair = (np.ones(2),)

    def f(x):
        return x + sum(params.values()) + sum(extra) + sum(pair)

    traced = jg.trace(f)
    np.testing.assert_array_equal(traced(np.zeros(2)), f(np.zeros(2)))
    params["b"] = np.full(2, 3.0)
    np.testing.assert_array_equal(traced(np.zeros(2)), f(np.zeros(2)))
    extra.append(np.full(2, 10.0))
    np.testing.assert_array_equal(traced(np.zeros(2)), f(np.zeros(2)))
    pair = (np.ones(2), np.full(2, 100.0))
    np.testing.assert_array_equal(traced(np.zeros(2)), [115.0, 115.0])
    params["b"][:] = -3.0  # values stay runtime inputs: no new trace
    misses = traced.cache_info()["misses"]
    np.testing.assert_array_equal(traced(np.zeros(2)), f(np.zeros(2)))
    assert traced.cache_info()["misses"] == misses == 4


def test_a_function_or_layer_swapped_in_a_container_is_traced_again() -> None:
    class Scale:
        def __init__(self, w):
            self.w = w

        def __call__(self, x):
            return x * self.w

    class Shift:
        def __init__(self, b):
            self.b = b

        def __call__(self, x):
            return x + self.b

    layers = [Scale(np.full(2, 2.0)), np.tanh]
    f = jg.trace(lambda x: layers[1](layers[0](x)))
    x = np.array([0.1, 0.2])
    np.testing.assert_allclose(f(x), np.tanh(2 * x))
    layers[1] = np.sin
    np.testing.assert_allclose(f(x), np.sin(2 * x))
    layers[0] = Shift(np.full(2, 1.0))
    np.testing.assert_allclose(f(x), np.sin(x + 1))
    assert f.cache_info()["misses"] == 3


def test_a_list_the_trace_does_not_read_from_costs_at_most_one_new_trace() -> None:
    """A log the object keeps beside its parameters (arrays appended at every step) is not a structure the
    trace depends on: only its first append, from empty, traces again."""

    class Model:
        def __init__(self):
            self.W = np.ones(2)
            self.history: list = []

        def loss(self, x):
            return np.sum(x * self.W)

    model = Model()
    step = jg.trace(model.loss)
    for _ in range(5):
        model.history.append(step(np.ones(2)))
    assert step.cache_info()["misses"] == 2


def test_explain_lists_the_guarded_structures() -> None:
    arrs = [np.ones(2), np.ones(2)]
    f = jg.trace(lambda x: x + sum(arrs))
    text = str(f.explain(np.zeros(2)))
    assert "arrs: list of length 2 (structure checked at every call)" in text


# ---------------------------------------------------------------------- Function.backward reads (issue 32)

SCALE_BY = np.full(3, 2.0)


class ScaleBackward(jg.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * SCALE_BY


def test_an_array_read_only_in_a_function_backward_is_read_at_every_call() -> None:
    global SCALE_BY
    f = jg.trace(lambda x: np.sum(ScaleBackward.apply(x)))
    assert f(np.ones(3)) == 3.0  # traced before any gradient: backward runs later, when differentiated
    SCALE_BY[:] = 5.0
    np.testing.assert_array_equal(f.grad(np.ones(3)), [5.0, 5.0, 5.0])
    SCALE_BY[:] = 3.0
    np.testing.assert_array_equal(f.grad(np.ones(3)), [3.0, 3.0, 3.0])
    SCALE_BY = np.full(3, 7.0)  # rebound
    np.testing.assert_array_equal(f.grad(np.ones(3)), [7.0, 7.0, 7.0])
    SCALE_BY = np.full(3, 2.0)


def test_backward_reads_with_unmaterialized_gradients_and_second_order() -> None:
    weights = {"first": np.array([1.0, 2.0]), "second": np.array([10.0, 20.0])}

    class Two(jg.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x * x, x * 1.0

        @staticmethod
        def backward(ctx, g1, g2):
            (x,) = ctx.saved_tensors
            out = np.zeros_like(x)
            if g1 is not None:
                out = out + g1 * 2 * x * weights["first"]
            if g2 is not None:
                out = out + g2 * weights["second"]
            return out

    only_second = jg.trace(lambda x: np.sum(Two.apply(x)[1]))
    both = jg.trace(lambda x: np.sum(jg.grad(lambda y: np.sum(Two.apply(y)[0]))(x) ** 2))
    x = np.array([1.0, 3.0])
    np.testing.assert_array_equal(only_second.grad(x), weights["second"])
    weights["second"][:] = [4.0, 5.0]
    weights["first"][:] = [3.0, 1.0]
    np.testing.assert_array_equal(only_second.grad(x), [4.0, 5.0])
    # d/dx sum((2 x w)^2) = 8 x w^2, with w read at this call
    np.testing.assert_allclose(both.grad(x), 8 * x * weights["first"] ** 2)


def test_an_interrupt_while_the_trace_puts_captured_arrays_back_still_puts_them_all_back() -> None:
    """A KeyboardInterrupt raised by one restore (as Ctrl-C between two of them) does not leave the others
    as traced values: every one is put back before the interrupt goes on."""
    from jitgrad.tracing import captures

    holder = {"a": np.ones(2), "b": np.full(2, 2.0), "c": np.full(2, 3.0)}
    originals = dict(holder)
    restorer = captures.substituted(lambda: holder, lambda x, path: object(), {}, {})
    restorer.__enter__()
    assert all(holder[k] is not originals[k] for k in holder)
    interrupted = []

    def interrupt_once() -> None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt

    restorer.walk.restore.insert(2, interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        restorer.__exit__(None, None, None)
    assert all(holder[k] is originals[k] for k in holder)
    f = jg.trace(lambda x: x * holder["a"])
    np.testing.assert_array_equal(f(np.full(2, 3.0)), [3.0, 3.0])


def test_a_list_the_function_appends_to_while_it_is_traced_is_guarded_as_the_trace_left_it() -> None:
    log: list = []
    weights = [np.full(2, 2.0)]

    def f(x):
        log.append("traced")
        weights.append(np.ones(2))  # grows during the trace: the structure checked is the one it leaves
        return x * weights[0] + weights[-1]

    traced = jg.trace(f)
    for _ in range(3):
        np.testing.assert_array_equal(traced(np.ones(2)), [3.0, 3.0])
    assert log == ["traced"] and traced.cache_info()["misses"] == 1
    weights.append(np.full(2, 5.0))
    np.testing.assert_array_equal(traced(np.ones(2)), [3.0, 3.0])  # traced again, which appends once more
    assert traced.cache_info()["misses"] == 2
