"""Pytrees as arguments and results: dicts, lists, tuples, namedtuples, registered dataclasses and
classes; gradients in each argument's structure; plans keyed by structure; `has_aux` and `argnames`;
the composable transformations on trees, nested inside traces too."""
from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import numpy as np
import pytest
import torch

import jitgrad as jg

rng = np.random.default_rng(7)


def mlp_params(din: int = 4, dh: int = 5) -> dict:
    return {"w1": rng.standard_normal((din, dh)), "b1": np.zeros(dh), "w2": rng.standard_normal((dh, 1)),
            "b2": np.zeros(1)}


def mlp_loss(params: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    h = np.tanh(x @ params["w1"] + params["b1"])
    return np.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def torch_grads(params: dict, x: np.ndarray, y: np.ndarray) -> dict:
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h = torch.tanh(torch.tensor(x) @ tp["w1"] + tp["b1"])
    loss = torch.mean((h @ tp["w2"] + tp["b2"] - torch.tensor(y)) ** 2)
    loss.backward()
    return {k: t.grad.numpy() for k, t in tp.items()}


def test_dict_of_parameters_gives_dict_of_gradients_matching_torch() -> None:
    params, x, y = mlp_params(), rng.standard_normal((8, 4)), rng.standard_normal((8, 1))
    loss = jg.trace(mlp_loss)
    value, grads = loss.value_and_grad(params, x, y, argnums=0)
    assert isinstance(grads, dict) and list(grads) == list(params)
    expected = torch_grads(params, x, y)
    for k in params:
        np.testing.assert_allclose(grads[k], expected[k], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(value, mlp_loss(params, x, y), rtol=1e-12)


def test_plans_are_keyed_by_structure_not_only_leaves() -> None:
    f = jg.trace(lambda t: t[0] * 2.0 + t[1] if isinstance(t, tuple) else t[0] * 3.0 + t[1])
    a, b = np.ones(3), np.full(3, 2.0)
    np.testing.assert_allclose(f((a, b)), 4.0)
    np.testing.assert_allclose(f([a, b]), 5.0)  # same leaves, a list: another plan
    assert f.cache_info()["misses"] == 2
    g = jg.trace(lambda d: d["a"] - d["b"])
    np.testing.assert_allclose(g({"a": a, "b": b}), -1.0)
    np.testing.assert_allclose(g({"b": a, "a": b}), 1.0)
    np.testing.assert_allclose(g({"a": a, "b": b, "c": b}), -1.0)  # an extra key: a new structure
    assert g.cache_info()["misses"] == 2
    np.testing.assert_allclose(g({"a": a, "b": b}), -1.0)
    assert g.cache_info()["misses"] == 2


def test_outputs_keep_their_structure_and_dict_key_order() -> None:
    f = jg.trace(lambda x: {"z": x + 1.0, "a": [x * 2.0, (x, x - 1.0)]})
    out = f(np.zeros(2))
    assert list(out) == ["z", "a"] and isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    np.testing.assert_allclose(out["a"][1][1], -1.0)


class Point(NamedTuple):
    x: np.ndarray
    y: np.ndarray


@jg.register_dataclass
@dataclasses.dataclass
class Layer:
    weight: np.ndarray
    bias: np.ndarray


class Pair:
    def __init__(self, first: np.ndarray, second: np.ndarray):
        self.first, self.second = first, second


jg.register_pytree_node(Pair, lambda p: ((p.first, p.second), None), lambda _, children: Pair(*children))


def test_namedtuples_dataclasses_and_registered_classes() -> None:
    @jg.trace
    def f(p: Point, layer: Layer, pair: Pair) -> np.ndarray:
        return np.sum((p.x * layer.weight + layer.bias) * pair.first - p.y * pair.second)

    p = Point(rng.standard_normal(3), rng.standard_normal(3))
    layer = Layer(rng.standard_normal(3), rng.standard_normal(3))
    pair = Pair(rng.standard_normal(3), rng.standard_normal(3))
    _, (gp, glayer, gpair) = f.value_and_grad(p, layer, pair, argnums=(0, 1, 2))
    assert isinstance(gp, Point) and isinstance(glayer, Layer) and isinstance(gpair, Pair)
    np.testing.assert_allclose(gp.x, layer.weight * pair.first)
    np.testing.assert_allclose(glayer.bias, pair.first)
    np.testing.assert_allclose(gpair.second, -p.y)


def test_unregistered_object_is_refused_with_a_hint() -> None:
    class Opaque:
        pass

    with pytest.raises(jg.InputError, match="register"):
        jg.trace(lambda o, x: x)(Opaque(), np.ones(2))


def test_integer_leaves_get_no_gradient_and_static_arguments_none() -> None:
    f = jg.trace(lambda d, scale: np.sum(d["x"] * d["n"]) * scale, static_argnums=1)
    grads = f.grad({"x": np.ones(3), "n": np.arange(3)}, 2.0)
    assert grads["n"] is None
    np.testing.assert_allclose(grads["x"], 2.0 * np.arange(3))
    with pytest.raises(jg.InputError, match="static argument"):
        f.grad({"x": np.ones(3), "n": np.arange(3)}, 2.0, argnums=(0, 1))


def test_has_aux_returns_aux_without_differentiating_it() -> None:
    @jg.trace
    def loss(w: np.ndarray, x: np.ndarray):
        pred = x @ w
        return np.sum(pred ** 2), {"pred": pred, "norm": np.sqrt(np.sum(w * w))}

    w, x = rng.standard_normal(3), rng.standard_normal((4, 3))
    (value, aux), gw = loss.value_and_grad(w, x, argnums=0, has_aux=True)
    np.testing.assert_allclose(gw, 2 * x.T @ (x @ w))
    np.testing.assert_allclose(aux["pred"], x @ w)
    np.testing.assert_allclose(value, np.sum((x @ w) ** 2))
    gw2, aux2 = loss.grad(w, x, argnums=0, has_aux=True)
    np.testing.assert_allclose(gw2, gw)
    np.testing.assert_allclose(aux2["norm"], np.linalg.norm(w))
    with pytest.raises(jg.InputError, match="one float scalar"):
        loss.value_and_grad(w, x)  # without has_aux the output is not a scalar
    with pytest.raises(jg.InputError, match=r"\(loss, aux\)"):
        jg.trace(lambda w: np.sum(w)).value_and_grad(w, has_aux=True)


def test_argnames_and_keyword_arguments() -> None:
    @jg.trace
    def f(w: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.sum(np.tanh(x * w + b))

    w, b, x = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3)
    by_name = f.grad(w, b=b, x=x, argnames="b")
    by_num = f.grad(w, b, x, argnums=1)
    np.testing.assert_allclose(by_name, by_num)
    both = f.grad(w, b, x, argnames=("w", "x"))
    np.testing.assert_allclose(both[1], (1 - np.tanh(x * w + b) ** 2) * w)
    with pytest.raises(jg.InputError, match="no parameter named 'q'"):
        f.grad(w, b, x, argnames="q")
    with pytest.raises(jg.InputError, match="not both"):
        f.grad(w, b, x, argnums=0, argnames="w")


def test_module_level_transformations_take_trees_and_nest() -> None:
    params, x, y = mlp_params(), rng.standard_normal((8, 4)), rng.standard_normal((8, 1))
    grads = jg.grad(mlp_loss)(params, x, y)
    expected = torch_grads(params, x, y)
    for k in params:
        np.testing.assert_allclose(grads[k], expected[k], rtol=1e-10, atol=1e-12)

    @jg.trace
    def sgd_step(params: dict, x: np.ndarray, y: np.ndarray) -> dict:  # a gradient inside a trace, on a tree
        g = jg.grad(mlp_loss)(params, x, y)
        return jg.tree_map(lambda p, gp: p - 0.1 * gp, params, g)

    stepped = sgd_step(params, x, y)
    for k in params:
        np.testing.assert_allclose(stepped[k], params[k] - 0.1 * expected[k], rtol=1e-10, atol=1e-12)

    def with_aux(params: dict, x: np.ndarray, y: np.ndarray):
        return mlp_loss(params, x, y), x @ params["w1"]

    g_aux, aux = jg.grad(with_aux, has_aux=True)(params, x, y)
    np.testing.assert_allclose(aux, x @ params["w1"])
    np.testing.assert_allclose(g_aux["w2"], expected["w2"], rtol=1e-10)
    nested = jg.trace(lambda p: jg.grad(with_aux, has_aux=True)(p, x, y)[0]["b1"])(params)
    np.testing.assert_allclose(nested, expected["b1"], rtol=1e-10, atol=1e-12)


def test_vjp_on_trees_eager_and_nested() -> None:
    def f(d: dict) -> tuple:
        return d["a"] * d["b"], np.sin(d["a"])

    d = {"a": rng.standard_normal(3), "b": rng.standard_normal(3)}
    out, pullback = jg.vjp(f, d)
    (g,) = pullback((np.ones(3), np.full(3, 2.0)))
    np.testing.assert_allclose(g["a"], d["b"] + 2.0 * np.cos(d["a"]))
    np.testing.assert_allclose(g["b"], d["a"])

    @jg.trace
    def inside(d: dict) -> np.ndarray:
        _, pb = jg.vjp(f, d)
        return pb(np.ones(3), np.ones(3))[0]["a"]

    np.testing.assert_allclose(inside(d), d["b"] + np.cos(d["a"]))


def test_repeat_calls_with_dict_arguments_hit_the_fast_path() -> None:
    params, x, y = mlp_params(), rng.standard_normal((8, 4)), rng.standard_normal((8, 1))
    loss = jg.trace(mlp_loss)
    for _ in range(5):
        loss.value_and_grad(params, x, y, argnums=0)
    info = loss.cache_info()
    assert info["misses"] == 1 and info["hits"] == 4 and loss.plans.repeat_count() == 1


def test_gradcheck_and_jacobian_on_trees() -> None:
    def f(params: dict, x: np.ndarray) -> np.ndarray:
        return np.tanh(x @ params["w"] + params["b"])

    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((4, 3))
    assert jg.gradcheck(f, (params, x))
    jac = jg.jacobian(f)(params, x)
    assert set(jac) == {"w", "b"} and jac["w"].shape == (4, 2, 3, 2) and jac["b"].shape == (4, 2, 2)
    h = 1 - np.tanh(x @ params["w"] + params["b"]) ** 2
    np.testing.assert_allclose(jac["b"], h[:, :, None] * np.eye(2)[None], rtol=1e-12)
    jac_both = jg.jacobian(f, argnums=(0, 1))(params, x)
    np.testing.assert_allclose(jac_both[0]["w"], jac["w"])
    assert jac_both[1].shape == (4, 2, 4, 3)
    bad = {"w": params["w"], "b": params["b"] + 0.0}

    def wrong(params: dict, x: np.ndarray) -> np.ndarray:  # a custom Function with a wrong backward for b
        return np.tanh(x @ params["w"]) + Doubled.apply(params["b"])

    with pytest.raises(jg.GradcheckError, match=r"input 0\['b'\]"):
        jg.gradcheck(wrong, (bad, x))


class Doubled(jg.Function):
    @staticmethod
    def forward(ctx, b):
        return b * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_a_numpy_float64_learning_rate_warns_once_and_follows_numpy() -> None:
    @jg.trace
    def step(w: np.ndarray, g: np.ndarray, lr):
        return w - lr * g

    w, g = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    with pytest.warns(jg.PrecisionWarning, match=r"float\(lr\)") as record:
        out = step(w, g, np.float64(0.1))
    assert out.dtype == np.float64 == (w - np.float64(0.1) * g).dtype  # numpy's promotion, kept
    assert len([r for r in record if issubclass(r.category, jg.PrecisionWarning)]) == 1
    assert "lr * g" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jg.PrecisionWarning)
        assert step(w, g, 0.1).dtype == np.float32  # a Python float is weak: float32 stays
        assert step(w, g, np.float32(0.1)).dtype == np.float32
