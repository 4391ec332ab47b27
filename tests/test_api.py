"""The core engine's contract: trace forms, inputs and outputs, gradient conventions, transformations."""
import numpy as np
import pytest

import jitgrad as jg


def loss(w, x, b):
    y = w * x + b
    return np.sum(np.exp(y) * 2 + np.tanh(x))


def loss_reference(w, x, b):
    e = np.exp(w * x + b) * 2
    t = np.tanh(x)
    return np.sum(e + t), (e * x, e * w + (1 - t * t), e)


@pytest.fixture
def wxb():
    rng = np.random.default_rng(1)
    return tuple(rng.random(1000).astype(np.float32) for _ in range(3))


def test_all_entry_points_agree(wxb) -> None:
    f = jg.trace(loss)
    value_ref, grads_ref = loss_reference(*wxb)
    value = f(*wxb)
    assert value.dtype == np.float32
    np.testing.assert_allclose(value, value_ref, rtol=1e-5)
    v2, grads = f.value_and_grad(*wxb, argnums=(0, 1, 2))
    assert v2 == value
    for g, r in zip(grads, grads_ref):
        assert g.dtype == np.float32 and g.shape == (1000,)
        np.testing.assert_allclose(g, r, rtol=1e-5)
    for g, r in zip(f.grad(*wxb, argnums=(0, 1, 2)), grads_ref):
        np.testing.assert_allclose(g, r, rtol=1e-5)
    out, ctx = f.forward(*wxb)
    assert out == value
    for _ in range(2):
        for g, r in zip(f.backward(ctx, np.float32(1.0)), grads_ref):
            np.testing.assert_allclose(g, r, rtol=1e-5)
    out, pullback = f.vjp(*wxb)
    for g, r in zip(pullback(np.float32(3.0)), grads_ref):
        np.testing.assert_allclose(g, 3 * r, rtol=1e-5)


def test_decorator_forms_and_static_argnums() -> None:
    @jg.trace(static_argnums=(1,))
    def power_sum(x, n):
        out = x
        for _ in range(n - 1):  # Python control flow on a static argument is fine
            out = out * x
        return np.sum(out)

    x = np.arange(1.0, 4.0)
    assert power_sum(x, 2) == 14.0
    assert power_sum(x, 3) == 36.0
    np.testing.assert_allclose(power_sum.grad(x, 3), 3 * x ** 2)
    assert power_sum.cache_info()["entries"] == 2
    assert isinstance(jg.trace(loss), jg.Traced)


def test_python_scalars_are_weak_and_keep_float32() -> None:
    f = jg.trace(lambda x, s: x * s + 1.5)
    out = f(np.ones(3, np.float32), 2.0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [3.5, 3.5, 3.5])
    g = jg.trace(lambda x, s: np.sum(x * s)).grad(np.ones(3, np.float32), 2.0, argnums=(0, 1))
    assert g[0].dtype == np.float32 and float(g[1]) == 3.0


def test_the_method_forms_default_to_argument_0_as_jg_grad_and_refuse_int_arguments() -> None:
    f = jg.trace(lambda x, k: np.sum(x * k))
    x, k = np.ones(4), np.arange(4)
    gx = f.grad(x, k)  # argnums=0, as jg.grad(f)(x, k) and JAX: one array, not a tuple
    np.testing.assert_array_equal(gx, k.astype(float))
    np.testing.assert_array_equal(jg.grad(f)(x, k), gx)
    value, gx2 = f.value_and_grad(x, k)
    assert value == 6.0 and isinstance(gx2, np.ndarray)
    np.testing.assert_array_equal(f.grad(x, k, argnums=None), gx)  # None is the default, not "every argument"
    with pytest.raises(jg.InputError, match="argument 1"):
        f.grad(x, k, argnums=1)
    with pytest.raises(jg.InputError, match="argument 1"):
        f.grad(x, k, argnums=(0, 1))


def test_argnums_int_and_tuple() -> None:
    f = jg.trace(lambda a, b, c: np.sum(a * b * c))
    a, b, c = np.full(2, 2.0), np.full(2, 3.0), np.full(2, 4.0)
    np.testing.assert_array_equal(f.grad(a, b, c, argnums=1), [8.0, 8.0])
    ga, gc = f.grad(a, b, c, argnums=(0, 2))
    np.testing.assert_array_equal(ga, [12.0, 12.0])
    np.testing.assert_array_equal(gc, [6.0, 6.0])


def test_structured_outputs_tuple_list_dict() -> None:
    x = np.arange(4.0)
    out = jg.trace(lambda x: {"double": x * 2, "parts": [x + 1, np.sum(x)]})(x)
    np.testing.assert_array_equal(out["double"], x * 2)
    np.testing.assert_array_equal(out["parts"][0], x + 1)
    assert out["parts"][1] == 6.0
    a, b = jg.trace(lambda x: (x, np.exp(x)))(x)
    np.testing.assert_array_equal(a, x)
    assert a is not x


def test_vjp_of_non_scalar_multi_output() -> None:
    f = jg.trace(lambda x, y: (x * y, np.sin(x)))
    x, y = np.linspace(0, 1, 5), np.linspace(1, 2, 5)
    (p, s), pullback = f.vjp(x, y)
    gp, gs = np.full(5, 2.0), np.full(5, 0.5)
    gx, gy = pullback(gp, gs)
    np.testing.assert_allclose(gx, gp * y + gs * np.cos(x))
    np.testing.assert_allclose(gy, gp * x)


@pytest.mark.parametrize("fn, d2", [
    (np.sin, lambda t: -np.sin(t)),
    (np.exp, np.exp),
    (np.tanh, lambda t: -2 * np.tanh(t) * (1 - np.tanh(t) ** 2)),
    (lambda t: t ** 3, lambda t: 6 * t),
])
def test_second_derivatives(fn, d2) -> None:
    t = np.float64(0.7)
    assert np.isclose(jg.grad(jg.grad(fn))(t), d2(t), rtol=1e-12)


def test_second_derivative_of_product_and_third_order() -> None:
    t = np.float64(0.5)
    assert np.isclose(jg.grad(jg.grad(lambda t: np.sin(t) * t))(t), 2 * np.cos(t) - t * np.sin(t))
    assert np.isclose(jg.grad(jg.grad(jg.grad(lambda t: t ** 4)))(t), 24 * t)


def test_transformations_inside_traced_functions() -> None:
    @jg.trace
    def gradient_norm(x):
        g = jg.grad(lambda v: np.sum(np.sin(v) * v))(x)
        return np.sum(g * g)

    x = np.linspace(-1, 1, 7)
    g = np.cos(x) * x + np.sin(x)
    assert np.isclose(gradient_norm(x), np.sum(g * g))
    value, vjp_fn = jg.vjp(lambda v: np.exp(v), x)
    np.testing.assert_allclose(vjp_fn(np.ones(7))[0], np.exp(x))


def test_value_and_grad_transformation() -> None:
    v, g = jg.value_and_grad(lambda x, y: np.sum(x * y), argnums=(0, 1))(np.ones(3), np.full(3, 2.0))
    assert v == 6.0
    np.testing.assert_array_equal(g[0], [2.0, 2.0, 2.0])


def test_stop_gradient_and_no_grad() -> None:
    x = np.array([1.0, 2.0])

    def with_stop(x):
        return np.sum(x * jg.stop_gradient(x))

    def with_block(x):
        with jg.no_grad():
            frozen = x * 3
        return np.sum(frozen * x)

    np.testing.assert_array_equal(jg.grad(with_stop)(x), x)
    np.testing.assert_array_equal(jg.grad(with_block)(x), 3 * x)


def test_control_flow_on_traced_value_is_a_clear_error() -> None:
    def branchy(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(jg.ConcretizationError, match=r"np\.where.*static_argnums") as info:
        jg.trace(branchy)(np.ones(3))
    assert "if x.sum() > 0" in str(info.value)


def test_unsupported_numpy_function_names_it_and_the_line() -> None:
    with pytest.raises(jg.UnsupportedError, match="numpy.fft") as info:
        jg.trace(lambda x: np.fft.fft(x))(np.ones(4))
    assert "lambda x: np.fft.fft(x)" in str(info.value)


def test_shape_mismatch_names_op_and_shapes() -> None:
    with pytest.raises(jg.ShapeError, match=r"add.*\(3,\).*\(4,\)"):
        jg.trace(lambda a, b: a + b)(np.ones(3), np.ones(4))


def test_grad_needs_scalar_output() -> None:
    with pytest.raises(jg.InputError, match="one float scalar"):
        jg.trace(lambda x: x * 2).grad(np.ones(3))


def test_ir_is_readable_and_names_backward_nodes() -> None:
    text = jg.trace(lambda a, b: np.sum(a * b)).ir(np.ones(3), np.ones(3))
    assert "mul" in text and "reduce_sum" in text
    assert "MulBackward" in text and "SumBackward" in text


def test_numpy_scalars_are_not_weak_but_python_scalars_are() -> None:
    x = np.ones(2, np.float32)
    assert jg.trace(lambda x: x * 2.0)(x).dtype == np.float32
    with pytest.warns(jg.PrecisionWarning):
        assert jg.trace(lambda x: x * np.float64(2.0))(x).dtype == (x * np.float64(2.0)).dtype


def test_bitwise_operators_on_traced_ints_raise_and_work_on_bools() -> None:
    with pytest.raises(jg.UnsupportedError, match="bitwise_and"):
        jg.trace(lambda i: i & 3)(np.arange(4))
    with pytest.raises(jg.UnsupportedError, match="invert"):
        jg.trace(lambda i: ~i)(np.arange(4))
    out = jg.trace(lambda a, b: (a & ~b) | (a ^ b))(np.array([True, False, True]), np.array([True, True, False]))
    np.testing.assert_array_equal(out, [False, True, True])


def test_keyword_arguments_are_bound_to_positions() -> None:
    f = jg.trace(lambda x, scale: x * scale)
    np.testing.assert_array_equal(f(np.ones(2), scale=3.0), [3.0, 3.0])
    with pytest.raises(jg.InputError, match="unexpected keyword"):
        f(np.ones(2), 1.0, factor=3.0)


def test_repeat_calls_take_the_fast_path_and_agree_with_the_first() -> None:
    f = jg.trace(lambda x, s, k: np.sum(np.sin(x) * s * k))
    x, k = np.linspace(0, 1, 5), np.arange(5)
    first = f.value_and_grad(x, 2.0, k, argnums=(0, 1))
    for _ in range(3):
        again = f.value_and_grad(x, 2.0, k, argnums=(0, 1))
        assert again[0] == first[0] and len(again[1]) == 2 and isinstance(again[1][1], np.floating)
        np.testing.assert_array_equal(again[1][0], first[1][0])
    np.testing.assert_allclose(f.value_and_grad(x, 3.0, k, argnums=0)[1], 3 * np.cos(x) * k)
    with pytest.raises(jg.InputError):
        f.value_and_grad(x, 2.0, k, argnums=2)  # an int array: refused on the fast path too
    assert f.cache_info()["misses"] == 1


def test_argnums_as_a_list_works_like_a_tuple() -> None:
    f = jg.trace(lambda a, b: np.sum(a * b))
    ga, gb = f.grad(np.ones(2), np.full(2, 3.0), argnums=[0, 1])
    np.testing.assert_array_equal(ga, [3.0, 3.0])
    np.testing.assert_array_equal(gb, [1.0, 1.0])
