"""The autograd tutorials' examples (../shared/seeds/) with their exact numbers."""
import math

import numpy as np

import jitgrad as jg


def test_linear_gradients_at_w2_x1_b3() -> None:
    loss = jg.trace(lambda w, x, b: np.sum(w * x + b))
    value, (gw, gx, gb) = loss.value_and_grad(np.float32(2.0), np.float32(1.0), np.float32(3.0), argnums=(0, 1, 2))
    assert value == 5.0
    assert (gw, gx, gb) == (1.0, 2.0, 1.0)


def test_exp_times_two_at_one_gives_2e() -> None:
    g = jg.grad(lambda x: np.sum(np.exp(x) * 2))(np.float32(1.0))
    assert np.isclose(g, 2 * math.e, rtol=1e-6)
    assert g.dtype == np.float32


def test_mean_of_3_times_x_plus_2_squared() -> None:
    @jg.trace
    def out(x):
        y = x + 2
        z = y * y * 3
        return z.mean()

    assert out(np.ones((2, 2), np.float32)) == 27.0
    gx = out.grad(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(gx, np.full((2, 2), 4.5, np.float32))


def test_vector_jacobian_product_of_2x() -> None:
    y, pullback = jg.trace(lambda x: x * 2).vjp(np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_array_equal(y, [2.0, 4.0, 6.0])
    (gx,) = pullback(np.array([2.0, 1.0, 1.0], np.float32))
    np.testing.assert_array_equal(gx, [4.0, 2.0, 2.0])


def test_chain_of_products_at_2_3_4() -> None:
    e = jg.trace(lambda a, b, d: (a * b) * d)
    assert e.grad(np.float64(2.0), np.float64(3.0), np.float64(4.0), argnums=(0, 1, 2)) == (12.0, 8.0, 6.0)


def test_only_requested_input_gets_gradient() -> None:
    """c = a*b with only a requiring grad: a.grad is 3 and b gets none (seed example 2)."""
    c = jg.trace(lambda a, b: a * b)
    assert c.grad(np.float32(2.0), np.float32(3.0), argnums=0) == 3.0


def test_repeated_backward_with_same_residuals_is_not_accumulated() -> None:
    """retain_graph is implicit and gradients are returned, never summed into .grad."""
    f = jg.trace(lambda w, x, b: np.sum(w * x + b))
    out, ctx = f.forward(np.float32(2.0), np.float32(1.0), np.float32(3.0))
    first = f.backward(ctx, np.float32(1.0))
    second = f.backward(ctx, np.float32(1.0))
    assert out == 5.0
    assert first == second == (1.0, 2.0, 1.0)
