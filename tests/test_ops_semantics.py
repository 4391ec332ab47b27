"""numpy semantics the op table's generic tests do not pin down: indexing rules, gradient
conventions at non-smooth points and repeated indices, dtype promotion, constants made inside a
traced function, and what stays on the host."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jitgrad as jg

X = np.arange(60, dtype=np.float64).reshape(3, 4, 5)
A = np.array([0, 2, -1])

KEYS = [
    np.s_[1], np.s_[-1, 2], np.s_[::2], np.s_[::-1], np.s_[1:-1, ::-2, 3:0:-2], np.s_[..., 1], np.s_[None, 1, ...],
    np.s_[:, None, :, None], np.s_[5:], np.s_[-10:10:3], np.s_[2:1], np.s_[...],
    np.s_[A], np.s_[A, 1], np.s_[1, :, A], np.s_[A, :, A], np.s_[:, A, A[:2, None]], np.s_[A, None, A],
    np.s_[None, A, A], np.s_[:, None, A], np.s_[..., A], np.s_[[[0], [2]], 1:3, [1, 4]], np.s_[[]],
    np.s_[X[:, 0, 0] > 10], np.s_[:, X[0] % 3 == 0], np.s_[X > 30], np.s_[1, [True, False, True, True]],
]


@pytest.mark.parametrize("key", KEYS, ids=[str(i) for i in range(len(KEYS))])
def test_indexing_matches_numpy(key):
    got = jg.trace(lambda x: x[key])(X)
    expected = X[key]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_index_gradient_scatter_adds_repeated_indices(rng):
    x = rng.standard_normal((4, 3))
    idx = np.array([[0, 2, 2], [3, 0, 2]])
    w = rng.standard_normal((2, 3, 3))
    grad = jg.grad(lambda x: np.sum(x[idx] * w))(x)
    expected = np.zeros_like(x)
    np.add.at(expected, idx, w)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_scatter_add_has_the_bits_of_numpys_add_at(dtype):
    """Rows picked by index arrays (an embedding's gradient) go through flat positions; each element must still
    get its addends in index order from 0, as np.add.at adds them (signed zeros included)."""
    from jitgrad.ops.indexing import _scatter_add_impl
    rng = np.random.default_rng(7)
    for _ in range(300):
        shape = tuple(int(d) for d in rng.integers(1, 6, rng.integers(1, 4)))
        picked = tuple(int(d) for d in rng.integers(0, 5, rng.integers(0, 3)))
        indices = [rng.integers(-d, d, picked) for d in shape[:rng.integers(1, len(shape) + 1)]]
        g = np.asarray(rng.standard_normal(picked + shape[len(indices):]) * 10).astype(dtype)
        if rng.random() < 0.2:
            g = -np.zeros_like(g)
        expected = np.zeros(shape, dtype)
        np.add.at(expected, tuple(indices), g)
        got = _scatter_add_impl(g, *indices, shape=shape)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes(), (shape, indices)
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 4"):
        _scatter_add_impl(np.ones((2, 3)), np.array([0, 5]), shape=(4, 3))


def test_traced_integer_labels_pick_one_entry_per_row(rng):
    logits, labels = rng.standard_normal((5, 3)), np.array([2, 0, 0, -1, 1])

    def picked(logits, labels):
        return logits[np.arange(5), labels]

    np.testing.assert_array_equal(jg.trace(picked)(logits, labels), logits[np.arange(5), labels])
    grad = jg.grad(lambda z, y: np.sum(picked(z, y) ** 2))(logits, labels)
    expected = np.zeros_like(logits)
    expected[np.arange(5), labels] = 2 * logits[np.arange(5), labels]
    np.testing.assert_allclose(grad, expected)


def test_iterating_a_tracer_yields_its_rows(rng):
    x = rng.standard_normal((3, 2))
    np.testing.assert_allclose(jg.trace(lambda x: sum(row * k for k, row in enumerate(x)))(x), x[1] + 2 * x[2])


def torch_grad(fn, x: np.ndarray) -> np.ndarray:
    t = torch.tensor(x, requires_grad=True)
    fn(t).backward()
    return t.grad.numpy()


def test_max_and_min_split_the_gradient_among_ties_like_torch_amax():
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, -1.0]])
    for np_fn, torch_fn in [(np.max, torch.amax), (np.min, torch.amin)]:
        grad = jg.grad(lambda x: np.sum(np_fn(x, axis=1)))(x)
        np.testing.assert_allclose(grad, torch_grad(lambda t: torch.sum(torch_fn(t, dim=1)), x))
    np.testing.assert_allclose(jg.grad(lambda x: np.max(x))(x)[1], [1 / 3, 1 / 3, 1 / 3, 0])


def test_maximum_minimum_ties_split_evenly_abs_and_relu_have_zero_gradient_at_zero():
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(np.maximum(x, 0.0)))(x), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(np.minimum(x, 0.0)))(x), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(np.abs(x)))(x), [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(jg.relu(x)))(x), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(np.floor(x) + np.sign(x) + np.round(x)))(x), 0.0)


def test_clip_passes_the_gradient_on_its_closed_interval_like_torch_clamp():
    x = np.array([-2.0, -1.0, 0.0, 1.0, 3.0])
    lo, hi = np.full(5, -1.0), np.full(5, 1.0)
    grads = jg.grad(lambda x, lo, hi: np.sum(np.clip(x, lo, hi) * np.arange(1.0, 6.0)), argnums=(0, 1, 2))(x, lo, hi)
    tensors = [torch.tensor(v, requires_grad=True) for v in (x, lo, hi)]
    torch.sum(torch.clamp(*tensors) * torch.arange(1.0, 6.0, dtype=torch.float64)).backward()
    for got, t in zip(grads, tensors):
        np.testing.assert_array_equal(got, t.grad.numpy())
    np.testing.assert_array_equal(grads[0], [0, 2, 3, 4, 0])


def test_fmax_fmin_ignore_nan_maximum_propagates_it():
    x, y = np.array([np.nan, 1.0, np.nan, 3.0]), np.array([2.0, np.nan, np.nan, 1.0])
    f = jg.trace(lambda x, y: (np.fmax(x, y), np.fmin(x, y), np.maximum(x, y), np.clip(x, 0.0, 2.0)))
    for got, expected in zip(f(x, y), (np.fmax(x, y), np.fmin(x, y), np.maximum(x, y), np.clip(x, 0.0, 2.0))):
        np.testing.assert_array_equal(got, expected)


def test_prod_gradient_with_zeros_matches_torch():
    x = np.array([[2.0, 0.0, 3.0, 4.0], [0.0, 1.5, 0.0, 2.0], [1.0, 2.0, 3.0, -0.5]])
    grad = jg.grad(lambda x: np.sum(np.prod(x, axis=1) * np.array([1.0, 2.0, 3.0])))(x)
    expected = torch_grad(lambda t: torch.sum(torch.prod(t, 1) * torch.tensor([1.0, 2.0, 3.0], dtype=t.dtype)), x)
    np.testing.assert_allclose(grad, expected)
    np.testing.assert_allclose(grad[0], [0.0, 24.0, 0.0, 0.0])
    np.testing.assert_allclose(grad[1], 0.0)


def test_norm_of_zero_has_zero_gradient():
    x = np.zeros((2, 3))
    np.testing.assert_array_equal(jg.grad(lambda x: np.linalg.norm(x))(x), 0.0)
    np.testing.assert_array_equal(jg.grad(lambda x: np.sum(np.linalg.norm(x, axis=1)))(x), 0.0)


def test_argmax_is_the_first_occurrence_and_has_no_gradient():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    f = jg.trace(lambda x: (np.argmax(x, axis=1), x.argmin(), np.argmax(x, keepdims=True)))
    first, flat_min, kept = f(x)
    np.testing.assert_array_equal(first, [1, 0])
    assert flat_min == 5 and kept.shape == (1, 1) and first.dtype == np.int64
    np.testing.assert_array_equal(jg.grad(lambda x: np.sum(x * np.argmax(x, axis=1)[:, None]))(x),
                                  np.array([[1, 1, 1], [0, 0, 0]]))


def test_var_and_std_take_ddof(rng):
    x = rng.standard_normal((4, 5))
    f = jg.trace(lambda x: (np.var(x, axis=0, ddof=1), x.std(ddof=1), np.std(x, axis=1, ddof=2, keepdims=True)))
    for got, expected in zip(f(x), (np.var(x, axis=0, ddof=1), x.std(ddof=1), np.std(x, axis=1, ddof=2,
                                                                                        keepdims=True))):
        np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_python_scalars_keep_float32_and_numpy_promotion_holds():
    x32 = np.ones(3, np.float32)
    ints = np.arange(3, dtype=np.int32)
    f = jg.trace(lambda x, i: (x * 2.0 + 1, x + i, i * np.float32(2.0), i * 2, i / 2, (x > 0) * i, x ** 2))
    for got, expected in zip(f(x32, ints), (x32 * 2.0 + 1, x32 + ints, ints * np.float32(2.0), ints * 2, ints / 2,
                                           (x32 > 0) * ints, x32 ** 2)):
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected)


def test_integer_and_bool_arguments_flow_through_without_gradients(rng):
    x, counts, mask = rng.standard_normal(4), np.array([1, 2, 3, 4]), np.array([True, False, True, True])
    f = jg.trace(lambda x, c, m: np.sum(x * c * m))
    np.testing.assert_allclose(f.grad(x, counts, mask), counts * mask)
    with pytest.raises(jg.InputError, match="argument 1, which is of dtype int64"):
        f.grad(x, counts, mask, argnums=(0, 1))


def test_astype_between_floats_is_differentiable(rng):
    x = rng.standard_normal(3)
    value, grad = jg.trace(lambda x: np.sum(x.astype(np.float32) ** 2)).value_and_grad(x, argnums=0)
    assert value.dtype == np.float32 and grad.dtype == np.float64
    np.testing.assert_allclose(grad, 2 * x.astype(np.float32), rtol=1e-6)


CLOSURE = np.linspace(0.0, 1.0, 12).reshape(3, 4)


def test_constants_created_inside_the_traced_function(rng):
    def f(x):
        n, m = x.shape
        return (x * np.arange(n)[:, None] + np.eye(n, m) + np.ones((n, 1)) + np.zeros_like(x) + np.ones_like(x)
                + np.full_like(x, 2.5) + CLOSURE + np.zeros(x.shape))

    x = rng.standard_normal((3, 4))
    np.testing.assert_allclose(jg.trace(f)(x), f(x))
    np.testing.assert_allclose(jg.grad(lambda x: np.sum(f(x)))(x), np.broadcast_to(np.arange(3)[:, None], (3, 4)))
    like = jg.trace(lambda x: (np.zeros_like(x, dtype=np.int32), np.full_like(x, 7), np.ones_like(x, shape=(2,))))
    zeros, sevens, ones = like(x)
    assert zeros.dtype == np.int32 and zeros.shape == (3, 4) and ones.shape == (2,)
    np.testing.assert_array_equal(sevens, 7.0)


def test_split_returns_every_part_and_stack_concatenate_roundtrip(rng):
    x = rng.standard_normal((4, 6))
    parts = jg.trace(lambda x: np.split(x, [1, 4], axis=1))(x)
    for got, expected in zip(parts, np.split(x, [1, 4], axis=1)):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(jg.trace(lambda x: np.concatenate(np.array_split(x, 3), axis=0))(x), x)
    np.testing.assert_array_equal(jg.trace(lambda x: np.vstack([x[0], x[1:]]) + np.hstack([x[:, :2], x[:, 2:]]))(x),
                                  2 * x)


def test_einsum_contractions_use_one_matmul_on_the_host(rng):
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    f = jg.trace(lambda a, b: np.einsum("bij,bjk->bik", a, b))
    np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-12)
    assert f.kernel_counts(a, b)["call"] == 0
    assert "host matmul" in f.explain(a, b)


def test_data_movement_runs_on_the_host_without_kernels(rng):
    def f(x):
        return np.concatenate([x[::-2], x[1:2]], axis=0)[[0, 0, 2]]  # three views: numpy's, no kernel

    x = rng.standard_normal((3, 4))
    traced = jg.trace(f)
    np.testing.assert_array_equal(traced(x), f(x))
    counts = traced.kernel_counts(x)
    assert counts["call"] == counts["forward"] == 0
    assert counts["backward"] == 1  # only the add joining x's two gradient paths is computed in a kernel


def test_a_long_chain_of_data_movement_is_one_copy_kernel(rng):
    """A concatenate of views of views (five view steps on the host) is one copy kernel reading x in place."""
    def f(x):
        return np.concatenate([np.flip(x[::2], 0), np.pad(x, 1)[:2, 1:5]], axis=0)[[0, 0, 3]]

    x = rng.standard_normal((3, 4))
    traced = jg.trace(f)
    np.testing.assert_array_equal(traced(x), f(x))
    counts = traced.kernel_counts(x)
    assert counts["call"] == counts["forward"] == 1
    assert "host slice" not in traced.explain(x).split("# forward:")[0].split("# call:")[1]
