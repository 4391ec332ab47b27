"""Forward mode and Jacobians (issue 37): jg.jvp and jg.linearize against torch.func.jvp, jg.jacfwd == jg.jacrev ==
torch's Jacobian on pytrees, jg.hessian against torch.func.hessian, forward-over-reverse HVPs, the transformations
inside a trace and nested, and their input errors. Few distinct shapes: each traced program compiles kernels."""
import numpy as np
import pytest
import torch

import jitgrad as jg
from test_gradcheck import CubeFrozenBackward
from test_seeds_function import Sigmoid

rng = np.random.default_rng(0)
X, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
VX, VW = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))


def layer(x, w, lib=np):
    """Several ops and their compositions: matmul, transcendental, division, where, max, a softmax and sums."""
    if lib is np:
        h, exp, log, where, amax, total = x @ w, np.exp, np.log, np.where, np.max, np.sum
    else:
        h, exp, log, where, amax, total = x @ w, torch.exp, torch.log, torch.where, torch.amax, torch.sum
    shifted = h - amax(h, 1, keepdims=True)
    soft = exp(shifted) / total(exp(shifted), 1, keepdims=True)
    act = where(h > 0, h, 0.1 * h) * soft + log(1 + x[:, :2] ** 2) / (2 + lib.tanh(h))
    return act, total(lib.sin(x) * lib.sqrt(1 + x * x))


def as_torch(*arrays):
    return tuple(torch.tensor(a) for a in arrays)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_jvp_matches_torch(dtype) -> None:
    primals, tangents = tuple(a.astype(dtype) for a in (X, W)), tuple(a.astype(dtype) for a in (VX, VW))
    (act, total), (d_act, d_total) = jg.jvp(layer, primals, tangents)
    (t_act, t_total), (td_act, td_total) = torch.func.jvp(lambda x, w: layer(x, w, torch), as_torch(*primals),
                                                          as_torch(*tangents))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-5)
    assert d_act.dtype == dtype and d_total.dtype == dtype
    for mine, theirs in [(act, t_act), (total, t_total), (d_act, td_act), (d_total, td_total)]:
        np.testing.assert_allclose(mine, theirs.numpy(), **tol)


def test_jvp_on_pytrees_with_an_integer_leaf_and_float0() -> None:
    def f(params, x):
        return {"y": np.tanh(x @ params["w"]) * params["scale"], "n": params["n"] * 2}

    params = {"w": W, "scale": np.array(1.5), "n": np.arange(3)}
    tangents = ({"w": VW, "scale": np.array(0.5), "n": np.zeros(3, jg.float0)}, VX)
    out, tangent_out = jg.jvp(f, (params, X), tangents)
    np.testing.assert_array_equal(out["n"], np.arange(3) * 2)
    assert tangent_out["n"].dtype == jg.float0 and tangent_out["n"].shape == (3,)
    h = np.tanh(X @ W)
    expected = (1 - h * h) * (VX @ W + X @ VW) * 1.5 + h * 0.5
    np.testing.assert_allclose(tangent_out["y"], expected, rtol=1e-12)


def test_a_float0_tangent_comes_out_of_traced_functions_vmap_and_nested_jvp() -> None:
    """An integer output's float0 tangent is no graph value: traced functions, vmap (the batch axis inserted where
    out_axes says) and a jvp of a function returning one give float0 zeros of the right shape, as on arrays."""
    rng = np.random.default_rng(5)
    x, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def arg_and_tangent(x, t):
        return jg.jvp(lambda y: np.argmax(y, -1), (x,), (t,))

    on_arrays = arg_and_tangent(x, t)
    traced = jg.trace(arg_and_tangent)
    for got in [traced(x, t), traced(x, t)]:  # the repeat call builds the result from the plan's structure
        np.testing.assert_array_equal(got[0], on_arrays[0])
        assert got[1].dtype == jg.float0 and got[1].shape == (3,)
    batched = jg.vmap(arg_and_tangent, out_axes=(0, -1))(x, t)
    assert batched[1].dtype == jg.float0 and batched[1].shape == (3,)
    cube = np.stack([x, x + 1])
    (index, tangent) = jg.trace(jg.vmap(arg_and_tangent, in_axes=(2, None)))(cube.transpose(1, 2, 0), t)
    np.testing.assert_array_equal(index, np.argmax(cube, -1))
    assert tangent.dtype == jg.float0 and tangent.shape == (2, 3)

    def count_and_total(x):
        return np.sum(x), np.zeros(x.shape, jg.float0)

    for jvp in [jg.jvp, jg.trace(lambda x, t: jg.jvp(count_and_total, (x,), (t,)))]:
        (total, zeros), (d_total, d_zeros) = jvp(count_and_total, (x,), (t,)) if jvp is jg.jvp else jvp(x, t)
        np.testing.assert_allclose(d_total, np.sum(t), rtol=1e-12)
        assert zeros.dtype == d_zeros.dtype == jg.float0 and d_zeros.shape == x.shape


def test_linearize_and_custom_functions() -> None:
    out, f_jvp = jg.linearize(lambda x: Sigmoid.apply(x) * x, X)
    s = 1 / (1 + np.exp(-X))
    np.testing.assert_allclose(out, s * X, rtol=1e-12)
    for v in (VX, 2 * VX + 1):
        np.testing.assert_allclose(f_jvp(v), (s * (1 - s) * X + s) * v, rtol=1e-12)
    # the derived rule needs the backward to be differentiable in its cotangent only: a stop_gradient on the
    # saved primal (which blocks second derivatives) still gives the exact JVP
    _, tangent = jg.jvp(CubeFrozenBackward.apply, (X,), (VX,))
    np.testing.assert_allclose(tangent, 3 * X * X * VX, rtol=1e-12)


def mlp(params, x):
    return np.tanh(x @ params["w"] + params["b"])


def test_jacfwd_and_jacrev_match_torch_on_pytrees() -> None:
    params, x = {"w": W, "b": rng.standard_normal(2)}, X
    fwd = jg.jacfwd(mlp, argnums=(0, 1))(params, x)
    rev = jg.jacrev(mlp, argnums=(0, 1))(params, x)
    expected = torch.autograd.functional.jacobian(lambda w, b, x: torch.tanh(x @ w + b), as_torch(W, params["b"], x))
    assert fwd[0]["w"].shape == (3, 2, 4, 2) and fwd[0]["b"].shape == (3, 2, 2) and fwd[1].shape == (3, 2, 3, 4)
    for mine in (fwd, rev):
        for got, theirs in [(mine[0]["w"], expected[0]), (mine[0]["b"], expected[1]), (mine[1], expected[2])]:
            np.testing.assert_allclose(got, theirs.numpy(), rtol=1e-12, atol=1e-14)
    assert jg.jacobian is jg.jacrev


def net(params, x):
    return np.sum(np.tanh(x @ params["w"] + params["b"]) ** 2)


def test_hessian_of_a_small_network_matches_torch() -> None:
    params = {"w": W, "b": rng.standard_normal(2)}
    hess = jg.hessian(net)(params, X)

    def torch_net(p):
        return torch.sum(torch.tanh(torch.tensor(X) @ p["w"] + p["b"]) ** 2)

    expected = torch.func.hessian(torch_net)({k: torch.tensor(v) for k, v in params.items()})
    assert hess["w"]["b"].shape == (4, 2, 2)
    for a in ("w", "b"):
        for b in ("w", "b"):
            np.testing.assert_allclose(hess[a][b], expected[a][b].numpy(), rtol=1e-10, atol=1e-12)


def test_forward_over_reverse_hvp_equals_reverse_over_reverse() -> None:
    def loss(w):
        return np.sum(np.tanh(X @ w) ** 2) + np.sum(w ** 4)

    _, forward_over_reverse = jg.jvp(jg.grad(loss), (W,), (VW,))
    reverse_over_reverse = jg.grad(lambda w: np.sum(jg.grad(loss)(w) * VW))(W)
    np.testing.assert_allclose(forward_over_reverse, reverse_over_reverse, rtol=1e-12)
    flat = jg.hessian(loss)(W).reshape(8, 8)
    np.testing.assert_allclose(flat @ VW.reshape(-1), forward_over_reverse.reshape(-1), rtol=1e-12)


def test_transformations_inside_a_trace_and_nested() -> None:
    def inside(x):
        _, tangent = jg.jvp(np.sin, (x,), (np.ones_like(x),))
        return jg.jacobian(np.sin)(x), tangent, jg.jacfwd(jg.jacrev(lambda v: np.sum(v ** 3)))(x)

    x = np.array([0.3, -1.2, 2.0])
    jac, tangent, hess = jg.trace(inside)(x)
    np.testing.assert_allclose(jac, np.diag(np.cos(x)), rtol=1e-14)
    np.testing.assert_allclose(tangent, np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(hess, np.diag(6 * x), rtol=1e-14)
    third = jg.jacfwd(jg.jacfwd(jg.jacrev(lambda v: np.sum(np.sin(v)))))(x)
    np.testing.assert_allclose(np.einsum("iii->i", third), -np.cos(x), rtol=1e-14)


def test_input_errors_name_the_leaf_and_shapes() -> None:
    params = {"w": W, "n": np.arange(3)}
    with pytest.raises(jg.InputError, match=r"primal 0\['n'\] is int64\[3\], which has no tangent"):
        jg.jvp(lambda p: p["w"] * 2, (params,), ({"w": VW, "n": np.ones(3)},))
    with pytest.raises(jg.InputError, match=r"tangent of primal 0\['w'\] is float64\[3\] but the primal is "
                                            r"float64\[4, 2\]"):
        jg.jvp(lambda p: p["w"] * 2, (params,), ({"w": np.ones(3), "n": np.zeros(3, jg.float0)},))
    with pytest.raises(jg.InputError, match=r"tangent of primal 0 is float32\[3, 4\] but the primal is float64"):
        jg.jvp(layer, (X, W), (VX.astype(np.float32), VW))
    with pytest.raises(jg.InputError, match="one tangent per primal"):
        jg.jvp(layer, (X, W), (VX,))
    with pytest.raises(jg.InputError, match="argument 1 is not a float numpy array"):
        jg.jacfwd(lambda a, k: a * k, argnums=1)(X, np.arange(4))
    outer = jg.jacrev(lambda v: np.outer(v, v))
    assert outer(np.ones(20)).shape == (20, 20, 20)  # on arrays: one compiled backward run per output element
    with pytest.raises(jg.InputError, match="inside a traced function unrolls .* 400 elements is over its limit"):
        jg.trace(outer)(np.ones(20))


def test_plain_array_jvps_take_the_short_path_with_the_general_paths_results() -> None:
    from jitgrad.front import forward

    rng = np.random.default_rng(3)
    x, v = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    cases = [lambda a: np.sum(np.tanh(a) * a), lambda a: (np.sin(a), np.argmax(a)), lambda a: np.argmax(a)]
    for fn in cases:
        assert forward._plain_float_arrays((x,), (v,)) and not forward._plain_float_arrays([x], [v])
        short = jg.jvp(fn, (x,), (v,))
        general = jg.jvp(fn, [x], [v])  # lists: leaf by leaf
        for s, g in zip(_leaves(short), _leaves(general)):
            assert type(s) is type(g) and s.dtype == g.dtype and s.shape == g.shape
            np.testing.assert_array_equal(s, g)
    assert jg.jvp(cases[2], (x,), (v,))[1].dtype == jg.float0  # an integer output's tangent
    for bad in [(v[:4],), (v.astype(np.float64),), (v.astype(np.float16),)]:
        assert not forward._plain_float_arrays((x,), bad)
        with pytest.raises(jg.InputError, match="tangent of primal 0"):
            jg.jvp(cases[0], (x,), bad)


def _leaves(tree):
    from jitgrad.tracing import trees
    return trees.tree_flatten(tree)[0]
