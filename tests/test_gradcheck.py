"""jg.gradcheck / jg.gradgradcheck against finite differences, and jg.jacobian against torch."""
import warnings

import numpy as np
import pytest
import torch

import jitgrad as jg
from test_seeds_function import Sigmoid  # the tutorial's Sigmoid Function, as the seed writes it


class WrongAtTwo(jg.Function):
    """x**2 whose backward flips the sign of element 2's gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2 * x * np.array([1.0, 1.0, -1.0, 1.0])


class CubeFrozenBackward(jg.Function):
    """x**3 whose backward is right once but blocks its own derivative (stop_gradient on the saved x*x)."""

    @staticmethod
    def forward(ctx, x):
        square = x * x
        ctx.save_for_backward(square)
        return square * x

    @staticmethod
    def backward(ctx, g):
        square, = ctx.saved_tensors
        return g * 3 * jg.stop_gradient(square)


X4 = np.array([0.5, -1.25, 0.75, 2.0])


def test_sigmoid_passes_with_eps_1e_3_and_default_eps() -> None:
    x = np.array([-0.4646, -0.4403, 1.2525, -0.5953])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 inputs: no precision warning
        assert jg.gradcheck(Sigmoid.apply, (x,), eps=1e-3) is True
        assert jg.gradcheck(Sigmoid.apply, (x,)) is True
        assert jg.gradcheck(Sigmoid.apply, x) is True  # a single input need not be wrapped


def test_single_precision_inputs_warn() -> None:
    x = np.array([-0.4646, -0.4403, 1.2525, -0.5953], np.float32)
    with pytest.warns(UserWarning, match="input 0 is float32, not float64"):
        assert jg.gradcheck(Sigmoid.apply, (x,), eps=1e-3)


def test_wrong_backward_points_at_the_wrong_element() -> None:
    with pytest.raises(jg.GradcheckError) as info:
        jg.gradcheck(WrongAtTwo.apply, (X4,))
    text = str(info.value)
    assert "WrongAtTwo.apply" in text
    assert "output 0 with respect to input 0: 1 of 16 entries differ" in text
    assert "the worst is d output 0[2] / d input 0[2]: analytic -1.5 vs numerical 1.5" in text
    assert jg.gradcheck(WrongAtTwo.apply, (X4,), raise_exception=False) is False


def test_mismatch_names_the_input_position_among_flags() -> None:
    def f(flag, a, b):
        return WrongAtTwo.apply(a) * b if flag else a * b

    a, b = X4.copy(), np.full(4, 2.0)
    assert jg.gradcheck(f, (False, a, b))
    with pytest.raises(jg.GradcheckError, match=r"with respect to input 1: .* d output 0\[2\] / d input 1\[2\]"):
        jg.gradcheck(f, (True, a, b))


def test_plain_functions_with_several_inputs_and_outputs() -> None:
    def f(x, y, k):
        return np.sin(x) * y, np.sum(np.exp(np.outer(x, y)) * k)

    rng = np.random.default_rng(5)
    x, y, k = rng.standard_normal(3), rng.standard_normal(3), np.arange(3)  # k is an integer array: not checked
    assert jg.gradcheck(f, (x, y, k))
    assert jg.gradgradcheck(f, (x, y, k))


def test_no_float_input_is_an_error() -> None:
    with pytest.raises(jg.InputError, match="none of the inputs is a float array"):
        jg.gradcheck(lambda k: k * 2, (np.arange(3),))


def test_gradgradcheck_differentiates_the_backward() -> None:
    assert jg.gradgradcheck(Sigmoid.apply, (X4,))
    assert jg.gradgradcheck(Sigmoid.apply, (X4,), (np.array([1.0, -2.0, 0.5, 3.0]),))
    assert jg.gradcheck(CubeFrozenBackward.apply, (X4,))  # right once...
    with pytest.raises(jg.GradcheckError, match=r"gradgradcheck failed for vjp of CubeFrozenBackward\.apply: "
                                                r"Jacobian mismatch for grad\(input 0\) with respect to input 0"):
        jg.gradgradcheck(CubeFrozenBackward.apply, (X4,))  # ...but its own derivative is blocked
    assert jg.gradgradcheck(CubeFrozenBackward.apply, (X4,), raise_exception=False) is False


def test_gradgradcheck_grad_outputs_must_match_the_outputs() -> None:
    with pytest.raises(jg.InputError, match="grad_outputs for output 0 has shape"):
        jg.gradgradcheck(Sigmoid.apply, (X4,), (np.ones(3),))


def test_jacobian_matches_torch() -> None:
    x = np.array([[0.1, -0.4, 2.0], [1.5, 0.0, -0.3]])
    jac = jg.jacobian(lambda v: jg.softmax(v, axis=1))(x)
    expected = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, dim=1), torch.tensor(x))
    assert jac.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(jac, expected.numpy(), rtol=1e-12, atol=1e-15)


def test_jacobian_argnums_structure_and_dtype() -> None:
    x, y = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0, 5.0], np.float32)
    jx, jy = jg.jacobian(lambda a, b: np.outer(a, b), argnums=(0, 1))(x, y)
    assert jx.shape == (2, 3, 2) and jy.shape == (2, 3, 3) and jx.dtype == np.float32
    np.testing.assert_array_equal(jx, np.einsum("ik,j->ijk", np.eye(2), y))
    np.testing.assert_array_equal(jy, np.einsum("i,jk->ijk", x, np.eye(3)))
    total, doubled = jg.jacobian(lambda a: (np.sum(a), a * 2))(x)
    np.testing.assert_array_equal(total, [1.0, 1.0])
    np.testing.assert_array_equal(doubled, 2 * np.eye(2))
    with pytest.raises(jg.InputError, match="argument 1 is not a float numpy array"):
        jg.jacobian(lambda a, k: a * k, argnums=1)(x, np.arange(2))


def test_checks_refuse_traced_values() -> None:
    with pytest.raises(jg.UnsupportedError, match="jg.gradcheck evaluates on numpy arrays"):
        jg.trace(lambda v: jg.gradcheck(np.sin, (v,)))(np.ones(2))
