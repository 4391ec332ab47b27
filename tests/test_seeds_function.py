"""Every torch.autograd.Function example of the tutorials in ../shared/seeds/, rewritten for jitgrad,
with the tutorials' numbers (and torch running the same Function as the oracle where they are random)."""
import math

import numpy as np
import torch

import jitgrad as jg


# ---------------------------------------------------------------- 1. y = w*x + b (Mul)

class Mul(jg.Function):
    # The tutorial's backward reads a global `x` (it saved w and b); this one saves w and x, as the
    # second tutorial's version of the same Mul does.
    @staticmethod
    def forward(ctx, w, x, b, x_requires_grad=True):
        ctx.x_requires_grad = x_requires_grad
        ctx.save_for_backward(w, x)
        return w * x + b

    @staticmethod
    def backward(ctx, grad_output):
        w, x = ctx.saved_variables  # the old name of saved_tensors
        grad_w = grad_output * x
        grad_x = grad_output * w if ctx.x_requires_grad else None
        grad_b = grad_output * 1
        return grad_w, grad_x, grad_b, None


X, W, B = np.float32(1.0), np.float32(2.0), np.float32(3.0)


def test_mul_forward_is_5_and_gradients_2_1_1() -> None:
    assert Mul.apply(W, X, B) == 5.0  # y = 2*1 + 3 (eager)
    loss = jg.trace(lambda w, x, b: np.sum(Mul.apply(w, x, b)))
    value, (gw, gx, gb) = loss.value_and_grad(W, X, B, argnums=(0, 1, 2))  # loss.backward()
    assert value == 5.0
    assert (gx, gw, gb) == (2.0, 1.0, 1.0)  # x.grad, w.grad, b.grad


def test_mul_backward_twice_is_retain_graph_and_sums_only_on_request() -> None:
    y, pullback = jg.vjp(lambda w, x, b: Mul.apply(w, x, b), W, X, B)
    assert y == 5.0
    gw1, gx1, gb1 = pullback(np.float32(1.0))  # loss1.backward(retain_graph=True)
    gw2, gx2, gb2 = pullback(np.float32(1.0))  # loss2.backward(torch.tensor(1.)): the residuals are still there
    assert (gx1, gw1, gb1) == (gx2, gw2, gb2) == (2.0, 1.0, 1.0)  # returned, not accumulated: no zero_() needed
    assert (gx1 + gx2, gw1 + gw2, gb1 + gb2) == (4.0, 2.0, 2.0)  # PyTorch's accumulated .grad, when you want it


def test_mul_with_x_requires_grad_flag_on_ctx() -> None:
    grads = jg.grad(lambda w, x, b: np.sum(Mul.apply(w, x, b, True)), argnums=(0, 1, 2))(W, X, B)
    assert grads == (1.0, 2.0, 1.0)
    # x_requires_grad=False: backward returns None for x, so x gets a zero gradient; differentiate
    # only w and b, as PyTorch would with x.requires_grad=False
    grads = jg.grad(lambda w, x, b: np.sum(Mul.apply(w, x, b, x_requires_grad=False)), argnums=(0, 1, 2))(W, X, B)
    assert grads == (1.0, 0.0, 1.0)
    assert jg.grad(lambda w, b: np.sum(Mul.apply(w, X, b, False)), argnums=(0, 1))(W, B) == (1.0, 1.0)


# ---------------------------------------------------------------- 2. MultiplyAdd

class MultiplyAdd(jg.Function):
    @staticmethod
    def forward(ctx, w, x, b):
        ctx.save_for_backward(w, x)  # the tutorial calls save_for_backward() empty, then unpacks two values
        return w * x + b

    @staticmethod
    def backward(ctx, grad_output):
        w, x = ctx.saved_variables
        return grad_output * x, grad_output * w, grad_output * 1


class TorchMultiplyAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, x, b):
        ctx.save_for_backward(w, x)
        return w * x + b

    @staticmethod
    def backward(ctx, grad_output):
        w, x = ctx.saved_tensors
        return grad_output * x, grad_output * w, grad_output * 1


def test_multiply_add_with_x_ones_and_random_w_b() -> None:
    rng = np.random.default_rng(7)
    x, w, b = np.ones(1, np.float32), rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
    z, pullback = jg.vjp(lambda w, b: MultiplyAdd.apply(w, x, b), w, b)  # x does not require grad
    gw, gb = pullback(np.ones(1, np.float32))  # z.backward()

    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    tz = TorchMultiplyAdd.apply(tw, torch.tensor(x), tb)
    tz.backward(torch.ones(1))
    np.testing.assert_array_equal(z, tz.detach().numpy())
    np.testing.assert_array_equal(gw, [1.0])  # w.grad = x = 1
    np.testing.assert_array_equal(gb, [1.0])
    np.testing.assert_array_equal(gw, tw.grad.numpy())
    np.testing.assert_array_equal(gb, tb.grad.numpy())


# ---------------------------------------------------------------- 3. y = exp(x) * 2

class Exp(jg.Function):
    @staticmethod
    def forward(ctx, x):
        output = np.exp(x)  # the tutorial's x.exp()
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_outputs):
        output = ctx.saved_tensors[0]
        return output * grad_outputs


def test_exp_then_times_two_at_one() -> None:
    x = np.float32(1.0)
    assert math.isclose(Exp.apply(x), math.e, rel_tol=1e-7)  # tensor(2.7183)
    g = jg.grad(lambda v: np.sum(Exp.apply(v) * 2))(x)  # dloss/dy = 2
    assert g.dtype == np.float32
    assert math.isclose(g, 2 * math.e, rel_tol=1e-7)  # tensor(5.4366)


# ---------------------------------------------------------------- 4. GuidedReLU

class GuideReLU(jg.Function):
    @staticmethod
    def forward(ctx, input):
        output = np.clip(input, 0, None)  # torch.clamp(input, min=0)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_outputs):
        output = ctx.saved_tensors[0]
        return grad_outputs * (output > 0) * (grad_outputs > 0)


class TorchGuideReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        output = torch.clamp(input, min=0)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_outputs):
        output = ctx.saved_tensors[0]
        return grad_outputs * (output > 0).float() * (grad_outputs > 0).float()


def test_guided_relu_on_2x3_with_a_random_cotangent() -> None:
    torch.manual_seed(0)
    tx = torch.randn(2, 3, requires_grad=True)
    grad_y = torch.randn(2, 3)
    ty = TorchGuideReLU.apply(tx)
    ty.backward(grad_y)

    x = tx.detach().numpy()
    y, pullback = jg.vjp(lambda v: GuideReLU.apply(v), x)
    (gx,) = pullback(grad_y.numpy())
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(gx, tx.grad.numpy())
    expected = grad_y.numpy() * (x > 0) * (grad_y.numpy() > 0)  # only where x > 0 and grad_y > 0
    np.testing.assert_array_equal(gx, expected)
    assert 0 < np.count_nonzero(gx) < 6


# ---------------------------------------------------------------- 5. Sigmoid + gradcheck

class Sigmoid(jg.Function):
    @staticmethod
    def forward(ctx, x):
        output = 1 / (1 + np.exp(-x))
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        output, = ctx.saved_tensors
        grad_x = output * (1 - output) * grad_output
        return grad_x


class TorchSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        output = 1 / (1 + torch.exp(-x))
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        output, = ctx.saved_tensors
        return output * (1 - output) * grad_output


def test_sigmoid_gradcheck_with_eps_1e_3() -> None:
    test_input = np.array([-0.4646, -0.4403, 1.2525, -0.5953])  # the tutorial's torch.randn(4)
    assert jg.gradcheck(Sigmoid.apply, (test_input,), eps=1e-3) is True
    assert torch.autograd.gradcheck(TorchSigmoid.apply, (torch.tensor(test_input, requires_grad=True),), eps=1e-3)


# ---------------------------------------------------------------- 6. MyFunction: y = 2x

class MyFunction(jg.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        output = input * 2
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, = ctx.saved_tensors
        grad_input = grad_output * 2
        return grad_input


def test_my_function_doubles_and_has_gradient_2() -> None:
    x = np.array([1.0], np.float32)
    f = jg.trace(lambda v: MyFunction.apply(v))
    y, pullback = f.vjp(x)
    (gx,) = pullback(np.ones(1, np.float32))  # y.backward()
    np.testing.assert_array_equal(gx, [2.0])  # Input gradient: tensor([2.])
    np.testing.assert_array_equal(y, [2.0])  # tensor([2.], grad_fn=<MyFunctionBackward>)
    assert "# MyFunctionBackward" in f.ir(x)
