"""Gradients of many small functions against torch autograd and central finite differences."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jitgrad as jg

# (name, jitgrad/numpy function, torch function, input shapes)
CASES = [
    ("poly", lambda x: np.sum(x ** 3 - 2 * x), lambda x: torch.sum(x ** 3 - 2 * x), [(5,)]),
    ("exp_log", lambda x: np.sum(np.log(np.exp(x) + 1)), lambda x: torch.sum(torch.log(torch.exp(x) + 1)), [(4, 3)]),
    ("trig", lambda x: np.sum(np.sin(x) * np.cos(x)), lambda x: torch.sum(torch.sin(x) * torch.cos(x)), [(6,)]),
    ("tanh_sq", lambda x: np.mean(np.tanh(x) ** 2), lambda x: torch.mean(torch.tanh(x) ** 2), [(3, 4)]),
    ("sigmoid", lambda x: np.sum(jg.sigmoid(x)), lambda x: torch.sum(torch.sigmoid(x)), [(7,)]),
    ("sqrt_abs", lambda x: np.sum(np.sqrt(np.abs(x) + 1)), lambda x: torch.sum(torch.sqrt(torch.abs(x) + 1)), [(5,)]),
    ("div", lambda x, y: np.sum(x / (y * y + 1)), lambda x, y: torch.sum(x / (y * y + 1)), [(4,), (4,)]),
    ("pow_arrays", lambda x, y: np.sum((np.abs(x) + 1) ** y), lambda x, y: torch.sum((torch.abs(x) + 1) ** y),
     [(3,), (3,)]),
    ("broadcast_row", lambda x, b: np.sum(np.exp(x + b)), lambda x, b: torch.sum(torch.exp(x + b)), [(3, 4), (4,)]),
    ("broadcast_col", lambda x, b: np.sum(x * b), lambda x, b: torch.sum(x * b), [(3, 4), (3, 1)]),
    ("broadcast_both", lambda x, y: np.sum(np.tanh(x * y)), lambda x, y: torch.sum(torch.tanh(x * y)),
     [(3, 1), (1, 4)]),
    ("scalar_times_matrix", lambda s, x: np.sum(s * x), lambda s, x: torch.sum(s * x), [(), (2, 3)]),
    ("sum_axis0", lambda x: np.sum(np.sum(x, axis=0) ** 2), lambda x: torch.sum(torch.sum(x, 0) ** 2), [(3, 4)]),
    ("sum_axis1_keep", lambda x: np.sum(x / np.sum(x * x, axis=1, keepdims=True)),
     lambda x: torch.sum(x / torch.sum(x * x, 1, keepdim=True)), [(3, 4)]),
    ("mean_neg_axis", lambda x: np.sum(np.mean(x, axis=-1) ** 2), lambda x: torch.sum(torch.mean(x, -1) ** 2),
     [(2, 3, 4)]),
    ("sum_tuple_axes", lambda x: np.sum(np.sum(x, axis=(0, 2)) ** 2), lambda x: torch.sum(torch.sum(x, (0, 2)) ** 2),
     [(2, 3, 4)]),
    ("max_axis", lambda x: np.sum(np.max(x, axis=1)), lambda x: torch.sum(torch.amax(x, 1)), [(3, 5)]),
    ("max_all", lambda x: np.max(x) * 2, lambda x: torch.amax(x) * 2, [(4, 3)]),
    ("maximum", lambda x, y: np.sum(np.maximum(x, y)), lambda x, y: torch.sum(torch.maximum(x, y)), [(6,), (6,)]),
    ("relu", lambda x: np.sum(np.maximum(x, 0) * x), lambda x: torch.sum(torch.clamp(x, min=0) * x), [(6,)]),
    ("where", lambda x: np.sum(np.where(x > 0, x * x, -x)), lambda x: torch.sum(torch.where(x > 0, x * x, -x)),
     [(8,)]),
    ("softmax", lambda x: np.sum(jg.softmax(x, axis=1) * np.arange(4.0, dtype=x.dtype)),
     lambda x: torch.sum(torch.softmax(x, 1) * torch.arange(4.0, dtype=x.dtype)), [(3, 4)]),
    ("logsumexp", lambda x: np.sum(jg.logsumexp(x, axis=0)), lambda x: torch.sum(torch.logsumexp(x, 0)), [(5, 2)]),
    ("reshape_transpose", lambda x: np.sum(np.exp(x.reshape(4, 3).T) * np.arange(4.0, dtype=x.dtype)),
     lambda x: torch.sum(torch.exp(x.reshape(4, 3).T) * torch.arange(4.0, dtype=x.dtype)), [(2, 6)]),
    ("matmul_tanh", lambda x, w: np.sum(np.tanh(x @ w) ** 2), lambda x, w: torch.sum(torch.tanh(x @ w) ** 2),
     [(3, 4), (4, 2)]),
    ("var_like", lambda x: np.mean((x - np.mean(x)) ** 2), lambda x: torch.var(x, unbiased=False), [(6,)]),
]


def _inputs(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [np.asarray(rng.standard_normal(s) * 0.8 + 0.1, dtype=dtype) for s in shapes]


def _torch_grads(tfn, arrays):
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = tfn(*ts)
    grads = torch.autograd.grad(out, ts)
    return out.detach().numpy(), [g.numpy() for g in grads]


def _finite_difference(fn, arrays, k, eps=1e-6):
    base = [np.array(a, dtype=np.float64) for a in arrays]
    grad = np.zeros_like(base[k])
    for idx in np.ndindex(base[k].shape):
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[k][idx] += eps
        minus[k][idx] -= eps
        grad[idx] = (fn(*plus) - fn(*minus)) / (2 * eps)
    return grad


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, fn, tfn, shapes", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_torch(name, fn, tfn, shapes, dtype) -> None:
    arrays = _inputs(shapes, dtype)
    value, grads = jg.trace(fn).value_and_grad(*arrays, argnums=tuple(range(len(arrays))))
    tvalue, tgrads = _torch_grads(tfn, arrays)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    assert np.asarray(value).dtype == dtype
    np.testing.assert_allclose(value, tvalue, **tol)
    for g, t, a in zip(grads, tgrads, arrays):
        assert g.dtype == dtype and g.shape == a.shape
        np.testing.assert_allclose(g, t, **tol)


@pytest.mark.parametrize("name, fn, tfn, shapes", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, tfn, shapes) -> None:
    arrays = _inputs(shapes, np.float64, seed=3)
    grads = jg.trace(fn).grad(*arrays, argnums=tuple(range(len(arrays))))
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, _finite_difference(fn, arrays, k), rtol=1e-6, atol=1e-7)


def _broadcastable_pair(draw):
    rank = draw(st.integers(1, 3))
    full = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    small = [d if draw(st.booleans()) else 1 for d in full]
    cut = draw(st.integers(0, rank - 1))
    return tuple(full), tuple(small[cut:])


@settings(max_examples=20)
@given(st.data())
def test_broadcasting_gradients_property(data) -> None:
    big, small = _broadcastable_pair(data.draw)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(big), rng.standard_normal(small)
    gx, gy = jg.trace(lambda a, b: np.sum(np.sin(a * b) + b)).grad(x, y, argnums=(0, 1))
    tx, ty = _torch_grads(lambda a, b: torch.sum(torch.sin(a * b) + b), [x, y])[1]
    np.testing.assert_allclose(gx, tx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gy, ty, rtol=1e-10, atol=1e-12)


@settings(max_examples=20)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_reduction_axes_property(shape, data) -> None:
    nd = len(shape)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    keepdims = data.draw(st.booleans())
    x = np.random.default_rng(1).standard_normal(shape)
    fn = jg.trace(lambda a: np.sum(np.exp(np.sum(a, axis=axes, keepdims=keepdims))))
    value, g = fn.value_and_grad(x)
    np.testing.assert_allclose(value, np.sum(np.exp(np.sum(x, axis=axes, keepdims=keepdims))), rtol=1e-12)
    _, (tg,) = _torch_grads(lambda a: torch.sum(torch.exp(torch.sum(a, dim=axes, keepdim=keepdims))), [x])
    np.testing.assert_allclose(g, tg, rtol=1e-10)


def test_sigmoid_gradient_at_zero_and_saturation() -> None:
    """Regression: an exp(-|z|) formulation gave gradient 0 at exactly z == 0."""
    z = np.array([0.0, -800.0, 800.0, 1.5], np.float32)
    g = jg.trace(lambda z: np.sum(jg.sigmoid(z))).grad(z)
    t = torch.tensor(z, requires_grad=True)
    torch.sigmoid(t).sum().backward()
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-6)
    assert g[0] == np.float32(0.25)


def test_cross_entropy_pick_gradient_is_fused_and_matches_torch() -> None:
    """x[arange(B), labels] differentiates to a one-hot select inside the loss kernel (no host scatter)."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((8, 5))
    labels = np.array([0, 4, 4, 1, 2, 3, 0, 0])

    def xent(z, y):
        return np.mean(jg.logsumexp(z, axis=1) - z[np.arange(z.shape[0]), y])

    f = jg.trace(xent)
    value, g = f.value_and_grad(logits, labels)
    t = torch.tensor(logits, requires_grad=True)
    tv = torch.nn.functional.cross_entropy(t, torch.tensor(labels))
    tv.backward()
    np.testing.assert_allclose(value, tv.item(), rtol=1e-12)
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert "scatter_add" not in f.explain(logits, labels).split("# value_and_grad:")[1].split("source")[0]


def test_maximum_and_minimum_ties_follow_numpy() -> None:
    """On ties numpy returns the second operand: maximum(-0.0, 0.0) is +0.0, maximum(0.0, -0.0) is -0.0."""
    a = np.array([-0.0, 0.0, 1.0, np.nan, 2.0])
    b = np.array([0.0, -0.0, 1.0, 1.0, np.nan])
    for fn in (np.maximum, np.minimum):
        got = jg.trace(fn)(a, b)
        want = fn(a, b)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    rows = np.array([[-0.0, 0.0], [0.0, -0.0]])
    np.testing.assert_array_equal(np.signbit(jg.trace(lambda r: np.max(r, axis=1))(rows)),
                                  np.signbit(np.max(rows, axis=1)))
