"""jg.Function: PyTorch's custom-Function protocol, recorded as one node, fused into the kernels,
differentiable again, with clear errors naming the Function."""
import numpy as np
import pytest

import jitgrad as jg


class GuidedReLU(jg.Function):
    @staticmethod
    def forward(ctx, x):
        y = np.maximum(x, 0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        y, = ctx.saved_tensors
        return grad_out * (y > 0) * (grad_out > 0)


class Exp(jg.Function):
    @staticmethod
    def forward(ctx, x):
        out = np.exp(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out, = ctx.saved_tensors
        return grad_out * out


class Cube(jg.Function):
    """Saves an intermediate (x*x): its second derivative needs the forward ops differentiated."""

    @staticmethod
    def forward(ctx, x):
        square = x * x
        ctx.save_for_backward(square)
        return square * x

    @staticmethod
    def backward(ctx, grad_out):
        square, = ctx.saved_tensors
        return grad_out * 3 * square


@pytest.fixture
def x23():
    return np.random.default_rng(3).standard_normal((2, 3))


def test_one_node_in_the_trace_with_readable_names(x23) -> None:
    text = jg.trace(lambda x: GuidedReLU.apply(x)).ir(x23)
    traced = text.split("# optimised forward")[0]
    assert "custom_function[fn=GuidedReLU]" in traced and "# GuidedReLU" in traced
    assert "maximum" not in traced  # the forward is inside the one node
    assert "maximum a b  # GuidedReLU" in text  # inlined for fusion, labelled with the Function
    assert "# GuidedReLUBackward" in text


def test_function_fuses_with_its_neighbours(x23) -> None:
    @jg.trace
    def loss(x):
        return np.sum(GuidedReLU.apply(x * 2) + 1)

    counts = loss.kernel_counts(x23)
    assert counts["call"] == 1 and counts["value_and_grad"] == 1
    explained = loss.explain(x23)
    assert "# call: 1 kernel(s)" in explained
    assert "4 ops: mul maximum add reduce_sum" in explained  # GuidedReLU's maximum sits between mul and add
    value, grad = loss.value_and_grad(x23)
    assert value == pytest.approx(np.sum(np.maximum(x23 * 2, 0) + 1), rel=1e-15)
    np.testing.assert_array_equal(grad, 2.0 * (x23 > 0))


def test_apply_outside_a_trace_runs_forward_on_numpy(x23) -> None:
    y = GuidedReLU.apply(x23)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, np.maximum(x23, 0))
    np.testing.assert_array_equal(jg.trace(lambda x: GuidedReLU.apply(x))(x23), y)


def test_the_node_has_a_numpy_reference(x23) -> None:
    """The custom_function equation evaluates like any primitive: one output bare, several as a list."""
    (node,) = jg.trace(lambda x: GuidedReLU.apply(x)).plan(x23).graph.eqns
    y, saved = node.prim.impl(x23, **node.params)
    np.testing.assert_array_equal(y, np.maximum(x23, 0))
    np.testing.assert_array_equal(saved, y)

    class Twice(jg.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    (node,) = jg.trace(lambda x: Twice.apply(x)).plan(x23).graph.eqns
    out = node.prim.impl(x23, **node.params)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, x23 * 2)


def test_gradient_through_jg_vjp_of_a_lambda(x23) -> None:
    y, pullback = jg.vjp(lambda x: GuidedReLU.apply(x), x23)
    g = np.random.default_rng(4).standard_normal((2, 3))
    (gx,) = pullback(g)
    np.testing.assert_array_equal(gx, g * (x23 > 0) * (g > 0))


def test_repeated_backward_with_the_same_residuals_gives_the_same_gradients(x23) -> None:
    f = jg.trace(lambda x: Exp.apply(x))
    out, ctx = f.forward(x23)
    g = np.full((2, 3), 0.5)
    first = f.backward(ctx, g)
    second = f.backward(ctx, g)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_allclose(first[0], 0.5 * np.exp(x23), rtol=1e-15)


def test_gradients_are_returned_not_accumulated() -> None:
    _, pullback = jg.vjp(lambda x: Exp.apply(x) * 2, np.float64(1.0))
    first, = pullback(np.float64(1.0))
    second, = pullback(np.float64(1.0))
    assert first == second == pytest.approx(2 * np.exp(1.0), rel=1e-15)
    total = first + second  # what PyTorch's .grad would hold after two backward calls
    assert total == 2 * first


def test_float32_stays_float32() -> None:
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    y, pullback = jg.vjp(lambda v: Exp.apply(v), x)
    (gx,) = pullback(np.ones(5, np.float32))
    assert y.dtype == gx.dtype == np.float32
    np.testing.assert_array_equal(gx, y)  # the saved output, times 1
    np.testing.assert_allclose(gx, np.exp(x), rtol=2e-7)


def test_second_and_third_derivatives_through_functions() -> None:
    t = np.float64(0.7)
    assert jg.grad(jg.grad(lambda v: Exp.apply(v) * 2))(t) == pytest.approx(2 * np.exp(t), rel=1e-14)
    assert jg.grad(jg.grad(jg.grad(lambda v: Exp.apply(v))))(t) == pytest.approx(np.exp(t), rel=1e-14)
    # the saved x*x is an intermediate: its cotangent flows back through the traced forward ops
    assert jg.grad(jg.grad(lambda v: Cube.apply(v)))(t) == pytest.approx(6 * t, rel=1e-14)


def test_several_outputs_get_several_grad_outputs() -> None:
    class SumAndProduct(jg.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a + b, a * b

        @staticmethod
        def backward(ctx, g_sum, g_product):
            a, b = ctx.saved_tensors
            return g_sum + g_product * b, g_sum + g_product * a

    a, b = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    (s, p), pullback = jg.vjp(lambda a, b: SumAndProduct.apply(a, b), a, b)
    np.testing.assert_array_equal(s, [4.0, 7.0])
    np.testing.assert_array_equal(p, [3.0, 10.0])
    ga, gb = pullback(np.array([1.0, 1.0]), np.array([2.0, 0.5]))
    np.testing.assert_array_equal(ga, [7.0, 3.5])
    np.testing.assert_array_equal(gb, [3.0, 2.0])
    # an output the loss does not use gets a zero grad_output, as PyTorch materialises it
    ga = jg.grad(lambda a, b: np.sum(SumAndProduct.apply(a, b)[1]))(a, b)
    np.testing.assert_array_equal(ga, b)


def test_flags_numbers_integer_arrays_and_needs_input_grad() -> None:
    seen = []

    class Gather(jg.Function):
        @staticmethod
        def forward(ctx, x, scale, index, negate=False):
            seen.append(ctx.needs_input_grad)
            ctx.scale, ctx.negate = scale, negate
            ctx.save_for_backward(index)
            sign = -1.0 if negate else 1.0
            return x * scale * sign * (index > 0)

        @staticmethod
        def backward(ctx, g):
            index, = ctx.saved_tensors
            sign = -1.0 if ctx.negate else 1.0
            return g * ctx.scale * sign * (index > 0), None, None, None

    x, index = np.array([1.0, 2.0, 3.0]), np.array([0, 1, 2])
    gx = jg.grad(lambda v: np.sum(Gather.apply(v, 2.5, index, negate=True)))(x)
    np.testing.assert_array_equal(gx, [-0.0, -2.5, -2.5])
    assert seen[-1] == (True, False, False, False)
    assert all(type(b) is bool for b in seen[-1])
    gx = jg.grad(lambda v: np.sum(Gather.apply(v, 2.0, index)))(x)  # negate takes its default
    np.testing.assert_array_equal(gx, [0.0, 2.0, 2.0])


def test_keyword_arguments_forward_takes() -> None:
    class Scale(jg.Function):
        @staticmethod
        def forward(ctx, x, factor=2.0):
            ctx.factor = factor
            return x * factor

        @staticmethod
        def backward(ctx, g):
            return g * ctx.factor, None

    x = np.array([1.0, -1.0])
    np.testing.assert_array_equal(jg.grad(lambda v: np.sum(Scale.apply(v, factor=3.0)))(x), [3.0, 3.0])
    np.testing.assert_array_equal(jg.grad(lambda v: np.sum(Scale.apply(v)))(x), [2.0, 2.0])


def test_saved_none_and_inputs_saved_directly() -> None:
    class Square(jg.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(None, x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            nothing, x = ctx.saved_tensors
            assert nothing is None
            return 2 * x * g

    t = np.float64(1.5)
    assert jg.grad(lambda v: Square.apply(v))(t) == 3.0
    assert jg.grad(jg.grad(lambda v: Square.apply(v)))(t) == 2.0


def test_nested_functions_and_grad_inside_a_traced_function() -> None:
    class DoubleExp(jg.Function):
        @staticmethod
        def forward(ctx, x):
            y = Exp.apply(x) * 2
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            y, = ctx.saved_tensors
            return g * y

    @jg.trace
    def gradient_norm(x):
        g = jg.grad(lambda v: np.sum(DoubleExp.apply(v)))(x)
        return np.sum(g * g) + np.sum(Exp.apply(x))

    x = np.linspace(-1, 1, 4)
    assert gradient_norm(x) == pytest.approx(np.sum(4 * np.exp(2 * x)) + np.sum(np.exp(x)), rel=1e-14)
    gx = gradient_norm.grad(x)
    np.testing.assert_allclose(gx, 8 * np.exp(2 * x) + np.exp(x), rtol=1e-14)


def test_no_grad_around_apply_blocks_the_gradient() -> None:
    def f(x):
        with jg.no_grad():
            frozen = Exp.apply(x)
        return np.sum(frozen * x)

    x = np.array([0.0, 1.0])
    np.testing.assert_allclose(jg.grad(f)(x), np.exp(x), rtol=1e-15)  # not exp(x) * (1 + x)


# ---------------------------------------------------------------- errors, raised at trace time

def _backward_returning(make_grads):
    class Broken(jg.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return make_grads(g, x, y)

    return Broken


@pytest.mark.parametrize("make_grads, message", [
    (lambda g, x, y: g * y, r"Broken\.backward returned 1 gradient\(s\), but Broken\.apply was given 2 input\(s\) "
                            r"\(x, y\)"),
    (lambda g, x, y: (g * y, g * x, g), r"Broken\.backward returned 3 gradient\(s\)"),
    (lambda g, x, y: (g * y, np.sum(g * x)), r"Broken\.backward: gradient 1 \(for input 'y'\) has shape \(\), but the "
                                             r"input has shape \(3,\)"),
    (lambda g, x, y: (g * y, (g * x).astype(np.float64)), r"gradient 1 \(for input 'y'\) has dtype float64, but the "
                                                          r"input is float32"),
    (lambda g, x, y: (g * y, 1.0), r"gradient 1 \(for input 'y'\) is a float, not an array"),
])
def test_wrong_gradients_name_the_function_and_what_is_wrong(make_grads, message) -> None:
    broken = _backward_returning(make_grads)
    x = np.ones(3, np.float32)
    f = jg.trace(lambda a, b: np.sum(broken.apply(a, b)))
    assert f(x, x) == 3.0  # the forward is fine; the backward is checked when it is traced
    with pytest.raises(jg.FunctionError, match=message) as info:
        f.grad(x, x)
    assert "Broken.backward is defined at" in str(info.value) and __file__ in str(info.value)


def test_gradient_for_a_flag_is_an_error() -> None:
    class FlagGrad(jg.Function):
        @staticmethod
        def forward(ctx, x, flag):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, g

    with pytest.raises(jg.FunctionError, match=r"FlagGrad\.backward: gradient 1 \(for input 'flag'\) is not None, "
                                               r"but that input is not an array"):
        jg.grad(lambda v: np.sum(FlagGrad.apply(v, True)))(np.ones(2))


def test_saving_a_non_array_names_the_function_and_the_line() -> None:
    class SavesNumber(jg.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3.0)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(jg.FunctionError, match=r"SavesNumber\.forward: ctx\.save_for_backward got a float as value 1"
                       ) as info:
        jg.trace(lambda v: SavesNumber.apply(v))(np.ones(2))
    assert "ctx.save_for_backward(x, 3.0)" in str(info.value)
    with pytest.raises(jg.FunctionError, match="SavesNumber"):
        SavesNumber.apply(np.ones(2))  # eagerly too


def test_traced_array_stored_on_ctx_is_an_error() -> None:
    class StoresTracer(jg.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.kept = x
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(jg.FunctionError, match=r"StoresTracer\.forward stored a traced array as ctx\.kept"):
        jg.trace(lambda v: StoresTracer.apply(v))(np.ones(2))


def test_apply_with_keywords_forward_does_not_take() -> None:
    with pytest.raises(jg.FunctionError, match=r"GuidedReLU\.apply: got an unexpected keyword argument 'inplace'; "
                                               r"GuidedReLU\.forward takes \(ctx, x\)") as info:
        jg.trace(lambda v: GuidedReLU.apply(v, inplace=True))(np.ones(2))
    assert "GuidedReLU.apply(v, inplace=True)" in str(info.value)
    with pytest.raises(jg.FunctionError, match="missing a required argument"):
        GuidedReLU.apply()


def test_forward_and_backward_must_be_static_methods() -> None:
    class NotStatic(jg.Function):
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(jg.FunctionError, match=r"NotStatic\.forward must be defined as a @staticmethod"):
        NotStatic.apply(np.ones(2))
