"""Custom Functions under forward mode and vmap (issue 37), with torch.func as the oracle: `jvp` static methods
are what jvp/jacfwd use, `generate_vmap_rule = True` and `vmap` static methods map a Function over a batch while
grad of the vmap still runs the user's backward, and a Function with neither is refused, saying what to add."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.func

import jitgrad as jg

RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 3))
W = RNG.standard_normal(3)


# ---------------------------------------------------------------------- the Functions, in both libraries

class Sin(jg.Function):
    """sin, with a jvp that differs from the derivative (2 cos), to tell which rule ran."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * np.cos(x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * 2 * np.cos(x)


class TorchSin(torch.autograd.Function):
    generate_vmap_rule = True  # torch.func.jacfwd vmaps the jvp

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * 2 * torch.cos(x)


class Round(jg.Function):
    """A straight-through estimator: round forward, identity backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(ctx, x):
        return np.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class TorchRound(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.round(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g


class ScaledRound(jg.Function):
    """Round(w * x), its gradient straight through: g * x for w, g * w for x; a vmap static method."""

    @staticmethod
    def forward(ctx, w, x):
        ctx.save_for_backward(w, x)
        return np.round(w * x)

    @staticmethod
    def backward(ctx, g):
        w, x = ctx.saved_tensors
        return g * x, g * w

    @staticmethod
    def vmap(info, in_dims, w, x):
        wd, xd = in_dims
        w = np.moveaxis(w, wd, 0) if wd is not None else np.broadcast_to(w, (info.batch_size,) + w.shape)
        x = np.moveaxis(x, xd, 0) if xd is not None else np.broadcast_to(x, (info.batch_size,) + x.shape)
        return ScaledRound.apply(w, x), 0


class TorchScaledRound(torch.autograd.Function):
    @staticmethod
    def forward(w, x):
        return torch.round(w * x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        w, x = ctx.saved_tensors
        return g * x, g * w

    @staticmethod
    def vmap(info, in_dims, w, x):
        wd, xd = in_dims
        w = w.movedim(wd, 0) if wd is not None else w.expand((info.batch_size,) + w.shape)
        x = x.movedim(xd, 0) if xd is not None else x.expand((info.batch_size,) + x.shape)
        return TorchScaledRound.apply(w, x), 0


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


# ---------------------------------------------------------------------- jvp


def test_jvp_uses_the_functions_jvp_as_torch_func_does() -> None:
    tangent = RNG.standard_normal(X.shape)
    out, tout = jg.jvp(lambda x: Sin.apply(x) * x, (X,), (tangent,))
    ref, tref = torch.func.jvp(lambda x: TorchSin.apply(x) * x, (t(X),), (t(tangent),))
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-14)
    np.testing.assert_allclose(tout, tref.numpy(), rtol=1e-14)
    assert not np.allclose(tout, np.cos(X) * X * tangent + np.sin(X) * tangent)  # not the derivative: the jvp ran


def test_jacfwd_uses_jvp_and_jacrev_uses_backward() -> None:
    x = X[0]
    np.testing.assert_allclose(jg.jacfwd(lambda x: Sin.apply(x))(x), torch.func.jacfwd(TorchSin.apply)(t(x)).numpy())
    np.testing.assert_allclose(jg.jacrev(lambda x: Sin.apply(x))(x), np.diag(np.cos(x)), rtol=1e-14)
    np.testing.assert_allclose(jg.jacfwd(lambda x: Sin.apply(x))(x), np.diag(2 * np.cos(x)), rtol=1e-14)


def test_jvp_inside_a_trace_and_grad_after_it_keeps_backward() -> None:
    tangent = np.ones(3)

    @jg.trace
    def f(x):
        return jg.jvp(lambda x: Sin.apply(x), (x,), (tangent,))[1]

    np.testing.assert_allclose(f(W), 2 * np.cos(W), rtol=1e-14)
    # grad of the jvp's primal output still uses backward
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(jg.jvp(lambda x: Sin.apply(x), (x,), (tangent,))[0]))(W),
                               np.cos(W), rtol=1e-14)


def test_save_for_forward_is_what_jvp_reads() -> None:
    class Cube(jg.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.save_for_forward(3 * x * x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x * x

        @staticmethod
        def jvp(ctx, tx):
            (d,) = ctx.saved_tensors
            return tx * d

    tangent = RNG.standard_normal(3)
    np.testing.assert_allclose(jg.jvp(lambda x: Cube.apply(x), (W,), (tangent,))[1], 3 * W * W * tangent, rtol=1e-14)
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(Cube.apply(x)))(W), 3 * W * W, rtol=1e-14)


def test_without_jvp_forward_mode_transposes_backward() -> None:
    """A straight-through estimator has no jvp: its JVP is its backward's transpose, the identity."""
    tangent = RNG.standard_normal(X.shape)
    _, tout = jg.jvp(lambda x: Round.apply(x) * 2, (X,), (tangent,))
    np.testing.assert_allclose(tout, 2 * tangent, rtol=1e-14)


def test_a_jvp_returning_the_wrong_count_is_reported() -> None:
    class Bad(Sin):
        @staticmethod
        def jvp(ctx, t):
            return t, t

    with pytest.raises(jg.FunctionError, match=r"Bad.jvp returned 2 tangent\(s\), but forward has 1"):
        jg.jvp(lambda x: Bad.apply(x), (W,), (np.ones(3),))


# ---------------------------------------------------------------------- vmap


def test_generate_vmap_rule_maps_forward_and_keeps_the_straight_through_backward() -> None:
    x = X * 3
    np.testing.assert_array_equal(jg.vmap(lambda r: Round.apply(r))(x), np.round(x))

    def loss(w, x):
        return np.sum(jg.vmap(lambda w, r: Round.apply(w * r) * r, in_axes=(None, 0))(w, x))

    def torch_loss(w, x):
        return torch.sum(torch.func.vmap(lambda w, r: TorchRound.apply(w * r) * r, in_dims=(None, 0))(w, x))

    gw, gx = jg.grad(loss, argnums=(0, 1))(W, x)
    tw, tx = torch.func.grad(torch_loss, argnums=(0, 1))(t(W), t(x))
    np.testing.assert_allclose(gw, tw.numpy(), rtol=1e-13)  # summed over the batch: W is shared
    np.testing.assert_allclose(gx, tx.numpy(), rtol=1e-13)
    np.testing.assert_allclose(gw, np.sum(x * x, axis=0), rtol=1e-13)  # straight through, not round's zero


def test_vmap_of_grad_and_nested_vmap_of_a_function() -> None:
    per_example = jg.vmap(jg.grad(lambda r: np.sum(Round.apply(r) * r)))(X)
    ref = torch.func.vmap(torch.func.grad(lambda r: torch.sum(TorchRound.apply(r) * r)))(t(X))
    np.testing.assert_allclose(per_example, ref.numpy(), rtol=1e-14)
    cube = RNG.standard_normal((2, 4, 3))
    nested = jg.grad(lambda c: np.sum(jg.vmap(jg.vmap(lambda r: Round.apply(r) * r))(c)))(cube)
    np.testing.assert_allclose(nested, np.round(cube) + cube, rtol=1e-14)


def test_in_axes_other_than_zero_and_out_axes() -> None:
    x = X.T.copy()  # batch along axis 1
    out = jg.vmap(lambda r: Round.apply(r * 2), in_axes=1, out_axes=1)(x)
    np.testing.assert_array_equal(out, np.round(x * 2))
    g = jg.grad(lambda x: np.sum(jg.vmap(lambda r: Round.apply(r * 2) * r, in_axes=1)(x)))(x)
    np.testing.assert_allclose(g, 2 * x + np.round(2 * x), rtol=1e-14)


def test_a_vmap_static_method_is_called_and_backward_kept() -> None:
    x = X * 2

    def loss(w, x):
        return np.sum(jg.vmap(lambda w, r: ScaledRound.apply(w, r) * r, in_axes=(None, 0))(w, x))

    def torch_loss(w, x):
        return torch.sum(torch.func.vmap(lambda w, r: TorchScaledRound.apply(w, r) * r, in_dims=(None, 0))(w, x))

    assert loss(W, x) == pytest.approx(float(torch_loss(t(W), t(x))), rel=1e-13)
    gw, gx = jg.grad(loss, argnums=(0, 1))(W, x)
    tw, tx = torch.func.grad(torch_loss, argnums=(0, 1))(t(W), t(x))
    np.testing.assert_allclose(gw, tw.numpy(), rtol=1e-13)
    np.testing.assert_allclose(gx, tx.numpy(), rtol=1e-13)


def test_a_function_without_a_rule_is_refused_saying_what_to_add() -> None:
    with pytest.raises(jg.UnsupportedError, match=r"custom Function Sin.*generate_vmap_rule = True.*vmap\(info, "
                                                  r"in_dims, \*args\)"):
        jg.vmap(lambda r: Sin.apply(r))(X)
    # unbatched, it is recorded as it is
    np.testing.assert_allclose(jg.vmap(lambda r, w: r * Sin.apply(w), in_axes=(0, None))(X, W), X * np.sin(W))


def test_both_rules_at_once_are_refused() -> None:
    class Both(ScaledRound):
        generate_vmap_rule = True

    with pytest.raises(jg.FunctionError, match="keep one"):
        jg.vmap(lambda r: Both.apply(W, r))(X)


class MappedSin(Sin):
    generate_vmap_rule = True


def test_jvp_of_vmap_and_vmap_of_jvp_use_the_functions_jvp_as_torch_func_does() -> None:
    xs, ts = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    f, ft = (lambda x: MappedSin.apply(x) * x), (lambda x: TorchSin.apply(x) * x)
    ref = torch.func.jvp(torch.func.vmap(ft), (t(xs),), (t(ts),))[1].numpy()
    np.testing.assert_allclose(jg.jvp(jg.vmap(f), (xs,), (ts,))[1], ref, rtol=1e-14)
    np.testing.assert_allclose(jg.vmap(lambda x, v: jg.jvp(f, (x,), (v,))[1])(xs, ts), ref, rtol=1e-14)
    assert not np.allclose(ref, np.cos(xs) * xs * ts + np.sin(xs) * ts)  # the user's jvp ran, not the derivative
