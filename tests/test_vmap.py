"""vmap (issue 37): every op of the op table (tests/test_ops.py) mapped over a batch against a Python loop of its
numpy reference, with the batch axis on each argument in turn (negative axes, the others None) and on all of
them; out_axes; pytrees of in_axes; nesting; composition with grad, value_and_grad, jvp and trace; per-example
gradients of an MLP and of bench/models.py's transformer block against a loop of grad calls, from one
program; the refusal of an op without a batching rule and of a custom Function."""
from __future__ import annotations

import importlib
import pathlib
import sys
import warnings

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.ir.primitive import PRIMITIVES
from test_ops import SPECS, EdgeDraw, as_list
from test_seeds_function import Sigmoid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
models = importlib.import_module("models")

B = 3


def _examples(spec) -> tuple[list[list[np.ndarray]], dict]:
    """B draws of the spec's arguments (of one shape: the edge case of rank-2 float64 inputs), and its params."""
    draws = [spec.gen(EdgeDraw("transposed"), np.random.default_rng(seed)) for seed in range(B)]
    first, params = draws[0]
    same = all(len(a) == len(first) and all(np.shape(x) == np.shape(y) and np.asarray(x).dtype == np.asarray(y).dtype
                                            for x, y in zip(a, first)) and p.keys() == params.keys()
               for a, p in draws)
    per_example = [a for a, _ in draws] if same and all(repr(p) == repr(params) for _, p in draws) else [first] * B
    return [[np.asarray(x) for x in args] for args in per_example], params


def _reference(spec, params, per_example, batched_args):
    """Per example, the numpy reference on that example's batched arguments and the shared others."""
    outs = []
    for i in range(B):
        args = [per_example[i][k] if k in batched_args else per_example[0][k] for k in range(len(per_example[0]))]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outs.append(as_list(spec.reference(*args, **params)))
    return outs


def _check(spec, batched: dict[int, int], out_axis: int) -> None:
    """vmap(fn) with argument k batched at axis batched[k] (the others shared), outputs batched at out_axis."""
    per_example, params = _examples(spec)
    n = len(per_example[0])
    args = [np.moveaxis(np.stack([ex[k] for ex in per_example]), 0, batched[k]) if k in batched else per_example[0][k]
            for k in range(n)]
    in_axes = tuple(batched.get(k) for k in range(n))
    got = as_list(jg.vmap(lambda *xs: spec.fn(*xs, **params), in_axes=in_axes, out_axes=out_axis)(*args))
    expected = _reference(spec, params, per_example, batched)
    assert len(got) == len(expected[0])
    for j, g in enumerate(got):
        want = np.stack([np.asarray(e[j]) for e in expected])
        want = np.moveaxis(want, 0, out_axis)
        assert np.shape(g) == want.shape and np.asarray(g).dtype == want.dtype, (np.shape(g), want.shape)
        np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-12)


def _nargs(spec) -> int:
    return len(_examples(spec)[0][0])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_vmap_of_every_op_equals_a_loop(spec) -> None:
    """Every argument batched at axis 0, outputs at 0; then each argument alone batched at its last axis (a
    negative axis; the others None), outputs at their last axis."""
    _check(spec, {k: 0 for k in range(_nargs(spec))}, 0)
    for k in range(_nargs(spec)):
        rank = np.ndim(_examples(spec)[0][0][k])
        _check(spec, {k: -1 if rank else 0}, -1)


def test_every_primitive_but_nonzero_has_a_batching_rule() -> None:
    assert sorted(n for n, p in PRIMITIVES.items() if p.batch is None) == ["nonzero"]


# ---------------------------------------------------------------------- axes, pytrees, nesting

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3))
W = rng.standard_normal((3, 2))


def test_in_axes_pytrees_none_and_out_axes() -> None:
    def f(p, x):
        return {"y": np.tanh(x @ p["w"] + p["b"]), "s": np.sum(p["w"])}

    params = {"w": np.stack([W, 2 * W]), "b": np.ones(2)}  # w batched, b shared
    out = jg.vmap(f, in_axes=({"w": 0, "b": None}, None), out_axes={"y": 1, "s": 0})(params, X)
    for i in range(2):
        np.testing.assert_allclose(out["y"][:, i], np.tanh(X @ params["w"][i] + 1), rtol=1e-12)
        np.testing.assert_allclose(out["s"][i], np.sum(params["w"][i]), rtol=1e-12)
    # an output that depends on no batched argument is broadcast; out_axes None keeps it unbatched
    both = jg.vmap(lambda x, w: (x @ w, np.sum(w)), in_axes=(0, None), out_axes=(0, None))(X, W)
    np.testing.assert_allclose(both[0], X @ W, rtol=1e-12)
    assert np.shape(both[1]) == () and np.isclose(both[1], np.sum(W))
    assert jg.vmap(lambda x, w: np.sum(w), in_axes=(0, None))(X, W).shape == (4,)


def test_nesting_and_negative_axes() -> None:
    a, b = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 5))
    out = jg.vmap(jg.vmap(lambda x, y: x * np.sin(y), in_axes=(0, 0)), in_axes=(0, None))(a, b.T)
    np.testing.assert_allclose(out, a * np.sin(b.T)[None], rtol=1e-12)
    outer = jg.vmap(jg.vmap(lambda x, y: np.dot(x, y), in_axes=(None, -1)), in_axes=(-1, None), out_axes=-1)
    np.testing.assert_allclose(outer(X.T, W), (X @ W).T, rtol=1e-12)  # rows of X (columns of X.T) by columns of W


def test_composition_with_grad_jvp_and_trace() -> None:
    def f(w, x):
        return np.sum(np.tanh(x @ w) ** 2)

    # vmap of value_and_grad over x, inside a traced function
    @jg.trace
    def step(w, xs):
        values, grads = jg.vmap(jg.value_and_grad(f), in_axes=(None, 0))(w, xs)
        return np.sum(values), grads

    xs = rng.standard_normal((5, 2, 3))
    total, grads = step(W, xs)
    for i in range(5):
        v, g = jg.value_and_grad(f)(W, xs[i])
        np.testing.assert_allclose(grads[i], g, rtol=1e-10)
    np.testing.assert_allclose(total, sum(f(W, xs[i]) for i in range(5)), rtol=1e-12)
    # grad of a vmapped function, jvp of one, and vmap of jvp
    g = jg.grad(lambda w: np.sum(jg.vmap(f, in_axes=(None, 0))(w, xs)))(W)
    np.testing.assert_allclose(g, sum(jg.grad(f)(W, xs[i]) for i in range(5)), rtol=1e-10)
    v = rng.standard_normal(W.shape)
    _, t = jg.jvp(lambda w: jg.vmap(f, in_axes=(None, 0))(w, xs), (W,), (v,))
    np.testing.assert_allclose(t, [jg.jvp(lambda w: f(w, xs[i]), (W,), (v,))[1] for i in range(5)], rtol=1e-10)
    vs = rng.standard_normal((5,) + W.shape)
    _, ts = jg.vmap(lambda v: jg.jvp(lambda w: f(w, xs[0]), (W,), (v,)))(vs)
    np.testing.assert_allclose(ts, [jg.jvp(lambda w: f(w, xs[0]), (W,), (vs[i],))[1] for i in range(5)], rtol=1e-10)


# ---------------------------------------------------------------------- per-example gradients


def mlp_loss(params, x, y):
    h = np.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return -jg.log_softmax(logits)[y]


def mlp_params():
    r = np.random.default_rng(1)
    return {"w1": r.standard_normal((6, 8)) * 0.5, "b1": r.standard_normal(8) * 0.1,
            "w2": r.standard_normal((8, 4)) * 0.5, "b2": r.standard_normal(4) * 0.1}


def _assert_trees_close(got, loop) -> None:
    for k in got:
        want = np.stack([g[k] for g in loop])
        scale = np.max(np.abs(want))
        np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-6 * scale)


def test_per_example_gradients_of_an_mlp_equal_a_loop_of_grads() -> None:
    params, xs, ys = mlp_params(), rng.standard_normal((7, 6)), rng.integers(0, 4, 7)
    per_example = jg.vmap(jg.grad(mlp_loss), in_axes=(None, 0, 0))(params, xs, ys)
    _assert_trees_close(per_example, [jg.grad(mlp_loss)(params, xs[i], ys[i]) for i in range(7)])


def test_per_example_gradients_of_the_transformer_block_equal_a_loop_of_grads() -> None:
    size = models.transformer_size("test", 1, 4, 8)
    inputs = [a.astype(np.float64) for a in models.transformer_inputs(size, np.random.default_rng(2))]
    xs = np.random.default_rng(3).standard_normal((3,) + inputs[0].shape)
    weights = tuple(range(1, 13))
    grad = jg.grad(models.transformer_numpy, argnums=weights)
    got = jg.vmap(grad, in_axes=(0,) + (None,) * 12)(xs, *inputs[1:])
    loop = [grad(xs[i], *inputs[1:]) for i in range(3)]
    _assert_trees_close(dict(enumerate(got)), [dict(enumerate(g)) for g in loop])


def test_per_example_gradients_are_one_program_whatever_the_batch() -> None:
    """The batched program has as many equations for a batch of 2 as of 9 (nothing is unrolled per example),
    no more products than one example's gradient, and a second call compiles nothing."""
    params = mlp_params()
    per_example = jg.vmap(jg.grad(mlp_loss), in_axes=(None, 0, 0))
    traced = jg.trace(lambda p, x, y: per_example(p, x, y))
    sizes = []
    for n in (2, 9):
        graph = traced.plan(params, rng.standard_normal((n, 6)), np.arange(n) % 4).graph
        sizes.append((len(graph.eqns), sum(e.prim.name == "matmul" for e in graph.eqns)))
    single = jg.trace(jg.grad(mlp_loss)).plan(params, X[0, :3].repeat(2), 1).graph
    # (the per-example outer products of the weight gradients become elementwise products, which fuse)
    assert sizes[0] == sizes[1] and 0 < sizes[0][1] <= sum(e.prim.name == "matmul" for e in single.eqns)
    xs, ys = rng.standard_normal((9, 6)), np.arange(9) % 4
    per_example(params, xs, ys)
    from jitgrad.kernels.build import compiler
    before = compiler.thread_builds()  # this thread's: a background compile may run at any moment
    per_example(params, xs + 1, ys)
    assert compiler.thread_builds() == before


# ---------------------------------------------------------------------- refusals


def test_an_op_without_a_batching_rule_is_refused_by_name() -> None:
    with pytest.raises(jg.UnsupportedError, match="'nonzero'.*no batching rule"):
        jg.vmap(lambda x: jg.nonzero(x > 0, size=2)[0])(X)
    # unbatched, it is only recorded again
    out = jg.vmap(lambda x, m: x * jg.nonzero(m > 0, size=1)[0][0], in_axes=(0, None))(X, np.array([0.0, 1.0]))
    np.testing.assert_allclose(out, X)


def test_a_custom_function_without_a_batching_rule_is_refused_by_name() -> None:
    with pytest.raises(jg.UnsupportedError, match="custom Function Sigmoid.*generate_vmap_rule = True"):
        jg.vmap(lambda x: Sigmoid.apply(x))(X)


def test_input_errors() -> None:
    with pytest.raises(jg.InputError, match="different sizes"):
        jg.vmap(lambda x, y: x + y)(X, np.ones((5, 3)))
    with pytest.raises(jg.InputError, match="no argument is batched"):
        jg.vmap(lambda x: x, in_axes=None)(X)
    with pytest.raises(jg.InputError, match="out of range"):
        jg.vmap(lambda x: x, in_axes=2)(X)
    with pytest.raises(jg.InputError, match="does not match the structure of the arguments"):
        jg.vmap(lambda x, y: x, in_axes=(0,))(X, X)
    with pytest.raises(jg.InputError, match="out_axes is None"):
        jg.vmap(lambda x: x, out_axes=None)(X)
    np.testing.assert_allclose(jg.vmap(lambda w: np.sum(w), in_axes=None, axis_size=3)(W), np.full(3, np.sum(W)))
