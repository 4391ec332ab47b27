"""The cheap paths of a call (issue 36): a repeat call checks a dict's keys, a registered dataclass's type and
each array's type, shape and dtype in generated code (no generic pytree flattening), and builds the gradient
tree as a display; the general path keys plain dicts and lists by a fast key. Whatever the path, a call hits
or misses exactly as the plan cache's signature says. Asserted on the plan-cache counters and on results."""
from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.tracing import trees

rng = np.random.default_rng(3601)
NAMES = [f"w{i}" for i in range(10)]


def loss(params):
    return sum(np.sum(np.tanh(params[n]) * (i + 1)) for i, n in enumerate(NAMES))


def reference_grads(params):
    return {n: ((i + 1) * (1 - np.tanh(params[n].astype(np.float64)) ** 2)) for i, n in enumerate(NAMES)}


def make_params(shape=(16,), dtype=np.float32, names=NAMES):
    return {n: rng.standard_normal(shape).astype(dtype) for n in names}


def counts(f):
    info = f.cache_info()
    return info["misses"], info["hits"]


def entry_calls(f, fn) -> bool:
    """Does the repeat-call function of `f`'s one entry name `fn` (`trees.tree_flatten`, say) among its constants?"""
    (entries,) = f.plans.repeats.values()
    return any(v is fn for v in entries[0].run.__globals__.values())


@pytest.mark.parametrize("general", [False, True], ids=["repeat path", "general path"])
def test_a_dict_of_arrays_hits_and_misses_as_its_signature_says(general, monkeypatch) -> None:
    f = jg.trace(loss)
    if general:  # no repeat entries: every call through prepare, the fast key and the plan's signature
        monkeypatch.setattr(f.plans, "remember", lambda *args, **kwargs: None)
    params = make_params()
    value, grads = f.value_and_grad(params)
    for _ in range(3):
        again_value, again = f.value_and_grad(params)  # the same dict again: hits
        assert type(again) is dict and list(again) == NAMES and again_value == value
        for n in NAMES:
            np.testing.assert_array_equal(again[n], grads[n])
            np.testing.assert_allclose(again[n], reference_grads(params)[n], rtol=2e-6, atol=2e-6)
    assert counts(f) == (1, 3)
    assert f.plans.repeat_count() == (0 if general else 1)

    reordered = dict(reversed(list(params.items())))  # key order: the same plan (optree's structures are equal)
    _, grads2 = f.value_and_grad(reordered)
    assert counts(f) == (1, 4) and list(grads2) == NAMES  # in the plan's order, as before
    np.testing.assert_array_equal(grads2["w3"], grads["w3"])

    f.value_and_grad({**params, "extra": np.ones(16, np.float32)})  # an extra key
    assert counts(f) == (2, 4)
    f.value_and_grad({**params, "w4": params["w4"].astype(np.float64)})  # one leaf's dtype
    assert counts(f) == (3, 4)
    for shape in [(17,), (16, 1), (1, 16), (4, 4)]:  # a length, a rank, the same size in another shape
        changed = {**params, "w7": rng.standard_normal(shape).astype(np.float32)}
        g = f.value_and_grad(changed)[1]["w7"]
        assert g.shape == shape
    assert counts(f) == (7, 4)
    f.value_and_grad({**params, "w7": params["w7"].reshape(4, 4)})  # the (4, 4) plan again
    assert counts(f) == (7, 5)
    f.value_and_grad(collections.OrderedDict(params))  # another node type
    assert counts(f) == (8, 5)
    f.value_and_grad(params)
    assert counts(f) == (8, 6)


def test_zero_and_one_dimensional_arrays_are_told_apart_on_the_repeat_path() -> None:
    f = jg.trace(lambda p: np.sum(p["a"] * p["b"]))
    scalar, one = np.float64(2.0) * np.ones(()), np.full((1,), 2.0)
    for a in [scalar, scalar, one, one, scalar, np.full((1, 1), 2.0), np.full((1, 1), 2.0)]:
        value, grads = f.value_and_grad({"a": a, "b": np.array(3.0)})
        assert value == 6.0 and grads["a"].shape == a.shape
    assert counts(f) == (3, 4)


def test_nested_dicts_and_leaves_that_are_not_arrays() -> None:
    def nested_loss(p):
        return np.sum(p["layer"]["w"] * p["scale"]) + np.sum(p["layer"]["b"]) * p["k"]

    f = jg.trace(nested_loss)
    params = {"layer": {"w": np.ones(3), "b": np.ones(2)}, "scale": 2.0, "k": np.float64(3.0)}
    for _ in range(3):
        value, grads = f.value_and_grad(params)
        assert value == 12.0 and list(grads) == ["layer", "scale", "k"] and list(grads["layer"]) == ["w", "b"]
        np.testing.assert_array_equal(grads["layer"]["w"], np.full(3, 2.0))
        assert grads["scale"] == 3.0 and grads["k"] == 2.0
    assert counts(f) == (1, 2)
    assert not entry_calls(f, trees.tree_flatten) and not entry_calls(f, trees.tree_unflatten)  # no generic pytrees
    f.value_and_grad({**params, "scale": 2})  # a float leaf became an int: another signature
    assert counts(f) == (2, 2)
    f.value_and_grad({**params, "k": 3.0})  # a numpy float64 became a Python float
    assert counts(f) == (3, 2)
    f.value_and_grad({**params, "layer": {"w": np.ones(3), "b": np.ones(2), "c": None}})  # a nested key more
    assert counts(f) == (4, 2)
    f.value_and_grad({**params, "layer": {"w": np.zeros(3), "b": np.zeros(2)}})  # new nested values: a hit
    assert counts(f) == (4, 3)
    with pytest.raises(jg.InputError, match="is a str"):  # a leaf that is no array nor number: refused
        f.value_and_grad({**params, "scale": "2.0"})
    assert counts(f) == (4, 3)


@jg.register_dataclass
@dataclasses.dataclass
class Layer:
    w: np.ndarray
    b: dict


@dataclasses.dataclass
class LayerSubclass(Layer):
    pass


def test_registered_dataclasses_are_checked_and_rebuilt_without_flattening() -> None:
    def layer_loss(layer):
        return np.sum(np.tanh(layer.w)) + np.sum(layer.b["bias"] * 2.0)

    f = jg.trace(layer_loss)
    layer = Layer(rng.standard_normal(4), {"bias": rng.standard_normal(2)})
    first = f.value_and_grad(layer)
    for _ in range(3):
        value, grads = f.value_and_grad(layer)
        assert type(grads) is Layer and type(grads.b) is dict and value == first[0]
        np.testing.assert_array_equal(grads.w, first[1].w)
        np.testing.assert_allclose(grads.w, 1 - np.tanh(layer.w) ** 2)
        np.testing.assert_array_equal(grads.b["bias"], np.full(2, 2.0))
    assert counts(f) == (1, 3)
    assert not entry_calls(f, trees.tree_flatten) and not entry_calls(f, trees.tree_unflatten)
    f.value_and_grad(Layer(layer.w.astype(np.float32), layer.b))  # a field's dtype
    assert counts(f) == (2, 3)
    f.value_and_grad(Layer(layer.w, {"bias": layer.b["bias"], "more": np.ones(1)}))  # a field's structure
    assert counts(f) == (3, 3)
    with pytest.raises(jg.InputError):  # a subclass is not the registered class (optree's registry is exact)
        f.value_and_grad(LayerSubclass(layer.w, layer.b))
    assert counts(f) == (3, 3)


TREES = [
    {"y": 1, "x": (2, {"b": 3, "a": None}), "z": [4, 5, (6,)]},
    Layer(1, {"q": 2, "p": [3]}),
    (), [], {}, (1,), None, 7,
    {1: 2, "a": 3},  # keys that do not sort: optree keeps their order
    [collections.namedtuple("Pair", "x y")(1, 2), collections.OrderedDict(b=1, a=2)],
]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_generated_tree_expressions_build_what_unflatten_builds(tree) -> None:
    leaves, treedef = trees.tree_flatten(tree)
    src = trees.Source()
    built = eval(trees.expression(src, treedef, [f"L[{i}]" for i in range(len(leaves))]), {**src.names, "L": leaves})
    expected = trees.tree_unflatten(treedef, leaves)
    assert type(built) is type(expected) and repr(built) == repr(expected)
    assert trees.tree_structure(built) == treedef


@pytest.mark.parametrize("shape", [(), (1,), (16,), (16, 1), (2, 3, 4)])
def test_the_generated_array_test_accepts_exactly_its_shape_and_dtype(shape) -> None:
    src = trees.Source(ndarray=np.ndarray)
    check = src.function("check", "x", [f"return not ({trees.array_test('x', shape, src.const(np.dtype(np.float32)))})"])
    assert check(np.zeros(shape, np.float32))
    assert check(np.zeros(shape, np.dtype(np.float32).newbyteorder("=")))
    assert not check(np.zeros(shape, np.float64))
    assert not check(np.zeros(shape, np.float32).view(np.memmap))  # a subclass: the general path decides
    others = [(), (1,), (16,), (16, 1), (1, 16), (2, 3, 4), (4, 3, 2)]
    for other in others:
        assert check(np.zeros(other, np.float32)) == (other == shape)
    assert not check(float(1.0)) and not check([0.0] * 16)
