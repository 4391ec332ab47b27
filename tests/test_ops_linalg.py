"""numpy.linalg's decompositions in the op-table style of test_ops: forward against numpy, gradients against
torch.linalg and central finite differences (`check`), over hypothesis-drawn batch shapes (empty ones too),
float32 and float64, and the fixed edge cases (transposed and strided inputs); second derivatives with
jg.gradgradcheck; the conventions docs/ops.md states at degenerate points; and the errors.

Inputs are well conditioned: matrices built from random orthogonal factors and well-separated eigen- or
singular values. Eigen-, singular and QR vectors are checked through functions their sign gauge does not
change (their squares); symmetric-input ops against finite differences of op((A + A^T) / 2), the
symmetric gradient torch and jitgrad return (numpy reads one triangle).
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops import EdgeDraw, HypothesisDraw, S, Spec, check

import jitgrad as jg

INF = np.inf


# ---------------------------------------------------------------------- well-conditioned inputs

def _batch(d) -> tuple:
    """Leading axes: none or one when drawn (a zero-length one too), two in the edge cases."""
    return d.shape(max_dims=1 if isinstance(d, HypothesisDraw) else 2, max_side=2)


def _orthogonal(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Random orthogonal matrices of `shape` (..., n, n)."""
    return np.linalg.qr(rng.standard_normal(shape))[0]


def _spectrum(rng: np.random.Generator, shape: tuple, lo: float, gap: float) -> np.ndarray:
    """Sorted values lo, lo + gap, ... each moved by up to gap / 3: distinct, well separated."""
    return lo + gap * np.arange(shape[-1]) + rng.uniform(0, gap / 3, shape)


def _with_singular_values(rng: np.random.Generator, batch: tuple, m: int, n: int) -> np.ndarray:
    """U diag(s) V^T with s in [1, ...] spaced by 0.7: distinct singular values, condition number < 4."""
    k = min(m, n)
    s = _spectrum(rng, batch + (k,), 1.0, 0.7)
    return _orthogonal(rng, batch + (m, m))[..., :k] * s[..., None, :] @ _orthogonal(rng, batch + (n, n))[..., :k, :]


def square(d, rng):
    """Well-conditioned square matrices, determinants of either sign."""
    n = d.integers(1, 3)
    return [_with_singular_values(rng, _batch(d), n, n) * rng.choice([-1.0, 1.0], (n, 1))], {}


def rectangular(**params):
    """Tall, wide or square matrices with distinct singular values; `params` drawn from their options."""
    def gen(d, rng):
        m, n = d.integers(1, 4), d.integers(1, 3)
        return [_with_singular_values(rng, _batch(d), m, n)], {k: d.choice(v) for k, v in params.items()}
    return gen


def symmetric(**params):
    """Q diag(w) Q^T with eigenvalues spaced by 0.6 (positive definite: they start at 0.5)."""
    def gen(d, rng):
        batch, n = _batch(d), d.integers(1, 3)
        q = _orthogonal(rng, batch + (n, n))
        w = _spectrum(rng, batch + (n,), 0.5, 0.6)
        return [sym(q * w[..., None, :] @ np.swapaxes(q, -1, -2))], {k: d.choice(v) for k, v in params.items()}
    return gen


def solve_gen(d, rng):
    """a with b a vector, stacked matrices, or matrices with one more (broadcast) batch axis."""
    (a,), _ = square(d, rng)
    n, batch = a.shape[-1], a.shape[:-2]
    kind = d.choice(["vector", "matrix", "broadcast"])
    shape = {"vector": (n,), "matrix": batch + (n, d.integers(1, 2)), "broadcast": (2,) + (1,) * len(batch) + (n, 1)}
    return [a, rng.standard_normal(shape[kind])], {}


def vector_norm_gen(d, rng):
    """Entries away from 0 (|x| is smooth there), every vector ord."""
    shape = d.shape(min_dims=1, min_side=1)
    x = (rng.uniform(0.2, 2, shape)) * rng.choice([-1.0, 1.0], shape)
    return [x], {"ord": d.choice([None, 3, 0, 1, 2, 0.5, -1, -2.5, INF, -INF]),
                 "axis": d.integers(-len(shape), len(shape) - 1), "keepdims": d.choice([False, True])}


def matrix_norm_gen(d, rng):
    """A matrix with axis=None, or a stack of two whose rows and columns lie along `axis` (either order)."""
    m, n = d.integers(1, 4), d.integers(1, 3)
    x = _with_singular_values(rng, (2,), m, n)
    axis = d.choice([(-2, -1), (-1, -2), (0, 2), (2, 0), None])
    x = x[0] if axis is None else np.moveaxis(x, (1, 2), axis)
    return [x], {"ord": d.choice(["fro", "nuc", 2, -2, 1, -1, INF, -INF, None]), "axis": axis,
                 "keepdims": d.choice([False, True])}


# ---------------------------------------------------------------------- numpy functions and torch oracles

def sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def t_solve(a, b):
    """numpy's rule: `b` is a vector only when 1-D (torch also reads (*, n) stacks as vectors)."""
    vector = b.ndim == 1
    b = b[:, None] if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    x = torch.linalg.solve(a.expand(batch + a.shape[-2:]), b.expand(batch + b.shape[-2:]))
    return x[..., 0] if vector else x


def gauge_free_svd(res, k):
    """Squares of the first min(m, n) singular vectors (their sign is LAPACK's choice) and the values."""
    u, s, vh = res
    return u[..., :k] ** 2, s, vh[..., :k, :] ** 2


def np_svd(a, full_matrices):
    return gauge_free_svd(np.linalg.svd(a, full_matrices), min(a.shape[-2:]))


def t_svd(a, full_matrices):
    return gauge_free_svd(torch.linalg.svd(a, full_matrices), min(a.shape[-2:]))


def np_qr(a, mode):
    res = np.linalg.qr(a, mode)
    return res ** 2 if mode == "r" else (res[0] ** 2, res[1] ** 2)


def t_qr(a, mode):
    q, r = torch.linalg.qr(a, "reduced" if mode == "r" else mode)
    return r ** 2 if mode == "r" else (q ** 2, r ** 2)


def np_eigh(a, UPLO):
    w, v = np.linalg.eigh(a, UPLO)
    return w, v ** 2


def t_eigh(a, UPLO):
    w, v = torch.linalg.eigh(a, UPLO)
    return w, v ** 2


def symmetrized(fn):
    """`fn` of (A + A^T) / 2: the reference whose finite differences give the symmetric gradient (numpy reads one
    triangle, so perturbing the other changes nothing), which is the one jitgrad and torch return."""
    return lambda a, **params: fn(sym(a), **params)


def t_vector_norm(x, ord, axis, keepdims):
    return torch.linalg.vector_norm(x, 2 if ord is None else ord, dim=axis, keepdim=keepdims)


def t_matrix_norm(x, ord, axis, keepdims):
    return torch.linalg.matrix_norm(x, "fro" if ord is None else ord, dim=axis or (-2, -1), keepdim=keepdims)


def wide_or_square(**params):
    """rectangular() with m <= n (qr mode='complete' of a tall matrix is not differentiable)."""
    def gen(d, rng):
        m, n = sorted((d.integers(1, 4), d.integers(1, 4)))
        return [_with_singular_values(rng, _batch(d), m, n)], {k: d.choice(v) for k, v in params.items()}
    return gen


SPECS = [
    S("inv", np.linalg.inv, torch.linalg.inv, square),
    S("solve", np.linalg.solve, t_solve, solve_gen),
    S("det", np.linalg.det, torch.linalg.det, square),
    S("slogdet", np.linalg.slogdet, lambda a: tuple(torch.linalg.slogdet(a)), square),
    S("cholesky", np.linalg.cholesky, torch.linalg.cholesky, symmetric(upper=[False, True]),
      ref=symmetrized(np.linalg.cholesky)),
    S("eigh", np_eigh, t_eigh, symmetric(UPLO=["L", "U"]), ref=symmetrized(np_eigh)),
    S("eigvalsh", np.linalg.eigvalsh, torch.linalg.eigvalsh, symmetric(), ref=symmetrized(np.linalg.eigvalsh)),
    S("svd", np_svd, t_svd, rectangular(full_matrices=[False, True])),
    S("svd_vectors", lambda a, full_matrices: np.linalg.svd(a, full_matrices), None,
      rectangular(full_matrices=[True, False])),
    S("svd_values", lambda a: np.linalg.svd(a, compute_uv=False), torch.linalg.svdvals, rectangular()),
    S("svdvals", np.linalg.svdvals, torch.linalg.svdvals, rectangular()),
    S("pinv", np.linalg.pinv, torch.linalg.pinv, rectangular()),
    S("qr", np_qr, t_qr, rectangular(mode=["reduced", "r"])),
    S("qr_complete", np_qr, t_qr, wide_or_square(mode=["complete"])),
    S("qr_vectors", np.linalg.qr, None, rectangular(mode=["complete", "reduced", "r"])),
    S("norm_vector", np.linalg.norm, t_vector_norm, vector_norm_gen),
    S("norm_matrix", np.linalg.norm, t_matrix_norm, matrix_norm_gen),
]


class _Edge(EdgeDraw):
    """test_ops' edge cases (an empty batch axis, transposed and strided inputs) with the largest matrices a
    generator allows rather than 1x1 ones."""

    def integers(self, lo, hi):
        return hi


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", ["empty", "transposed", "strided"])
def test_linalg_edge_cases(spec: Spec, kind: str) -> None:
    check(spec, _Edge(kind))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(max_examples=2)
@given(data=st.data())
def test_linalg_random(spec: Spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))


# ---------------------------------------------------------------------- second derivatives

def _square_matrix(rng):
    return _with_singular_values(rng, (2,), 3, 3)


SECOND = {
    "inv": (np.linalg.inv, _square_matrix),
    "solve": (lambda a: np.linalg.solve(a, np.arange(1.0, 4.0)), _square_matrix),
    "det": (np.linalg.det, _square_matrix),
    "slogdet": (lambda a: np.linalg.slogdet(a)[1], _square_matrix),
    "cholesky": (lambda a: np.linalg.cholesky(sym(a), upper=True), lambda rng: symmetric()(_Small(), rng)[0][0]),
    "eigh": (lambda a: np_eigh(sym(a), "L"), lambda rng: symmetric()(_Small(), rng)[0][0]),
    "eigvalsh": (lambda a: np.linalg.eigvalsh(sym(a)), lambda rng: symmetric()(_Small(), rng)[0][0]),
    "svd_tall": (lambda a: np_svd(a, False), lambda rng: _with_singular_values(rng, (), 4, 3)),
    "svd_wide": (lambda a: np_svd(a, True), lambda rng: _with_singular_values(rng, (), 2, 3)),
    "svdvals": (np.linalg.svdvals, lambda rng: _with_singular_values(rng, (2,), 3, 2)),
    "pinv": (np.linalg.pinv, lambda rng: _with_singular_values(rng, (), 3, 2)),
    "qr_tall": (lambda a: np_qr(a, "reduced"), lambda rng: _with_singular_values(rng, (), 4, 3)),
    "qr_wide": (lambda a: np_qr(a, "reduced"), lambda rng: _with_singular_values(rng, (), 2, 4)),
    "norm_nuc": (lambda a: np.linalg.norm(a, "nuc", axis=(-1, -2)), lambda rng: _with_singular_values(rng, (2,), 3, 2)),
    "norm_p": (lambda x: np.linalg.norm(x, -1.5, axis=0), lambda rng: rng.uniform(0.5, 2, (3, 2))),
}


class _Small(EdgeDraw):
    """A batch of two 3x3 matrices."""

    def __init__(self):
        super().__init__("transposed")

    def shape(self, min_dims=0, max_dims=3, min_side=0, max_side=3):
        return (2,)

    def integers(self, lo, hi):
        return hi


@pytest.mark.parametrize("name", list(SECOND))
def test_linalg_second_derivatives(name: str) -> None:
    """Every VJP is differentiable again, in float64."""
    fn, make = SECOND[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert jg.gradgradcheck(fn, [make(np.random.default_rng(3))], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------- conventions at degenerate points

def test_repeated_eigenvalues_give_finite_value_gradients_and_infinite_vector_ones() -> None:
    """At A = I every eigenvalue repeats: losses of the eigenvalues have their gradient; a loss of the
    eigenvectors whose cotangent mixes the repeated ones is not differentiable: ±inf/nan there, as torch."""
    eye = np.eye(3)
    np.testing.assert_array_equal(jg.grad(lambda a: np.sum(np.linalg.eigh(a)[0] ** 2))(eye), 2 * eye)
    np.testing.assert_array_equal(jg.grad(lambda a: np.sum(np.linalg.eigvalsh(a)))(eye), eye)
    weights = np.arange(9.0).reshape(3, 3)
    with np.errstate(all="ignore"):
        grad = jg.grad(lambda a: np.sum(np.linalg.eigh(a)[1] * weights))(eye)
    assert not np.isfinite(grad).all()


def test_rank_deficient_svd_values_have_finite_gradients() -> None:
    """A rank-1 tall matrix: zero and repeated singular values, yet the largest one's gradient is u1 v1^T,
    from the full decomposition as from the values alone."""
    a = np.outer([1.0, 2.0, 2.0, 4.0], [1.0, 0.0, 2.0])
    u, _, vh = np.linalg.svd(a)
    want = np.outer(u[:, 0], vh[0])
    np.testing.assert_allclose(jg.grad(lambda x: np.linalg.svd(x, full_matrices=False)[1][0])(a), want, atol=1e-12)
    np.testing.assert_allclose(jg.grad(lambda x: np.linalg.svd(x, compute_uv=False)[0])(a), want, atol=1e-12)


def test_det_gradient_of_a_singular_matrix_is_the_cofactor_matrix() -> None:
    a = np.array([[1.0, 2.0], [2.0, 4.0]])
    np.testing.assert_allclose(jg.grad(np.linalg.det)(a), [[4.0, -2.0], [-2.0, 1.0]], atol=1e-12)
    assert jg.gradcheck(np.linalg.det, [np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 3.0]])])


@pytest.mark.parametrize("ord", [None, "nuc", 2, -2, 1, -INF])
def test_matrix_norm_gradient_at_zero_is_zero(ord) -> None:
    np.testing.assert_array_equal(jg.grad(lambda x: np.linalg.norm(x, ord))(np.zeros((3, 2))), np.zeros((3, 2)))


@pytest.mark.parametrize("ord", [None, 0, 0.5, 3, INF, -1])
def test_vector_norm_gradient_at_zero_is_zero(ord) -> None:
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(jg.grad(lambda x: np.linalg.norm(x, ord))(np.zeros(3)), np.zeros(3))


def test_negative_p_norm_with_a_zero_element_is_zero_with_zero_gradient() -> None:
    x = np.array([1.0, 0.0, 2.0])
    with np.errstate(divide="ignore"):
        assert jg.trace(lambda v: np.linalg.norm(v, -1))(x) == np.linalg.norm(x, -1) == 0.0
        np.testing.assert_array_equal(jg.grad(lambda v: np.linalg.norm(v, -1))(x), np.zeros(3))


def test_pinv_drops_small_singular_values_like_numpy() -> None:
    a = np.outer([1.0, 2.0, 3.0], [1.0, -1.0]) + 1e-17
    for kwargs in ({}, {"rcond": 0.5}, {"rtol": None}, {"rtol": 1e-3}):
        np.testing.assert_allclose(jg.trace(lambda x: np.linalg.pinv(x, **kwargs))(a), np.linalg.pinv(a, **kwargs),
                                   rtol=1e-12, atol=1e-15)
    assert np.isfinite(jg.grad(lambda x: np.sum(np.linalg.pinv(x)))(a)).all()


# ---------------------------------------------------------------------- results, dtypes, empty matrices

def test_results_are_numpys_named_tuples_and_dtypes_follow_numpy() -> None:
    a = np.array([[2.0, 1.0], [1.0, 3.0]])
    res = jg.trace(np.linalg.eigh)(a)
    assert type(res) is type(np.linalg.eigh(a))
    np.testing.assert_array_equal(res.eigenvectors, np.linalg.eigh(a).eigenvectors)
    assert jg.trace(lambda x: np.linalg.svd(x).S)(a).shape == (2,)
    assert jg.trace(lambda x: np.linalg.qr(x).R)(a).shape == (2, 2)
    assert jg.trace(lambda x: np.linalg.slogdet(x).logabsdet)(a) == np.linalg.slogdet(a).logabsdet
    assert jg.trace(np.linalg.inv)(a.astype(np.float32)).dtype == np.float32
    assert jg.trace(np.linalg.det)(np.eye(2, dtype=np.int64)).dtype == np.float64
    assert jg.trace(lambda x: np.linalg.norm(x, 3))(np.arange(3)).dtype == np.float64


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)])
def test_empty_matrices_and_batches_as_numpy(shape) -> None:
    a = np.zeros(shape)
    for fn in (np.linalg.inv, np.linalg.det, np.linalg.slogdet, np.linalg.cholesky, np.linalg.eigh, np.linalg.svd,
               np.linalg.qr, np.linalg.pinv, lambda x: np.linalg.norm(x, "nuc", axis=(-2, -1))):
        got, want = jg.trace(fn)(a), fn(a)
        for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            assert np.shape(g) == np.shape(w)
            np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------- errors

def test_singular_and_indefinite_matrices_raise_linalgerror_when_the_function_runs() -> None:
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    for fn, name, x in [(np.linalg.inv, "inv", singular), (lambda a: np.linalg.solve(a, np.ones(2)), "solve", singular),
                        (np.linalg.cholesky, "cholesky", -np.eye(2))]:
        traced = jg.trace(fn)
        traced(np.eye(2))
        with pytest.raises(np.linalg.LinAlgError, match=f"numpy.linalg.{name} at .*test_ops_linalg.py"):
            traced(x)
    with pytest.raises(np.linalg.LinAlgError, match="the gradient of numpy.linalg.slogdet"):
        jg.grad(lambda a: np.linalg.slogdet(a)[1])(singular)


@pytest.mark.parametrize("fn, error, words", [
    (lambda a: np.linalg.inv(a[0]), jg.ShapeError, "at least two-dimensional"),
    (lambda a: np.linalg.det(a[:, :2]), jg.ShapeError, "must be square"),
    (lambda a: np.linalg.solve(a, np.ones(2)), jg.ShapeError, "does not match"),
    (lambda a: np.linalg.svd(a, hermitian=True), jg.UnsupportedError, "hermitian=False"),
    (lambda a: np.linalg.pinv(a, hermitian=True), jg.UnsupportedError, "hermitian=False"),
    (lambda a: np.linalg.qr(a, "raw"), jg.UnsupportedError, "Householder"),
    (lambda a: np.linalg.lstsq(a, a), jg.UnsupportedError, "data-dependent"),
    (lambda a: np.linalg.matrix_rank(a), jg.UnsupportedError, "depends on the values"),
    (lambda a: np.linalg.eig(a), jg.UnsupportedError, "np.linalg.eigh"),
    (lambda a: np.linalg.eigh(a, "X"), ValueError, "UPLO"),
    (lambda a: np.linalg.pinv(a, rcond=0.1, rtol=0.1), ValueError, "both set"),
    (lambda a: np.linalg.norm(a, "fro", axis=0), ValueError, "for vectors"),
    (lambda a: np.linalg.norm(a, 3), ValueError, "for matrices"),
    (lambda a: np.linalg.norm(a, axis=(0, 0)), ValueError, "Duplicate axes"),
    (lambda a: np.linalg.norm(a[None], 2), ValueError, "Improper number of dimensions"),
])
def test_mistakes_and_refusals_name_the_op_and_the_line(fn, error, words) -> None:
    with pytest.raises(error, match=words) as info:
        jg.trace(fn)(np.eye(3))
    assert "test_ops_linalg.py" in str(info.value)


def test_complete_qr_of_a_tall_matrix_runs_but_refuses_its_gradient() -> None:
    a = np.arange(6.0).reshape(3, 2) + np.eye(3, 2)
    q, r = jg.trace(lambda x: np.linalg.qr(x, "complete"))(a)
    np.testing.assert_array_equal(q, np.linalg.qr(a, "complete")[0])
    with pytest.raises(jg.UnsupportedError, match="mode='reduced'"):
        jg.grad(lambda x: np.sum(np.linalg.qr(x, "complete")[1]))(a)
