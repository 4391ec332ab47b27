"""Scans, differences, sorting and selection in the op table's style (tests/test_ops.py): every op's forward
against numpy, its gradient against torch autograd and central finite differences, its second derivatives
with jg.gradgradcheck, over hypothesis-drawn shapes (batched and empty ones, float32 and float64) and the
fixed edge cases. Then what the table cannot say: numpy's numbers bit for bit (float32 cumsum included),
ties and NaNs, every quantile method, no gradient through indices, and the refusals."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jitgrad as jg
from test_ops import EDGE_CASES, EdgeDraw, HypothesisDraw, S, check, dims, values

# ---------------------------------------------------------------------- generators and torch oracles


def distinct(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Values at least 0.15 apart (sorting is differentiable only away from ties), in random order."""
    n = int(np.prod(shape, dtype=np.int64))
    return ((rng.permutation(n) - n / 2) * 0.25 + rng.uniform(0, 0.1, n)).reshape(shape)


def scan_gen(products: bool = False, zeros: bool = False, min_dims: int = 0, none: bool = True):
    """An axis (None flattens); for products, magnitudes in [0.5, 1.5] and, with `zeros`, some exact zeros."""
    def gen(d, rng):
        shape = d.shape(min_dims=min_dims)
        x = values(rng, shape, 0.0, 1.0, away=0.5) if products else values(rng, shape, -2, 2)
        if zeros:
            x.reshape(-1)[d.integers(0, 2)::3] = 0.0
        return [x], {"axis": d.axis(shape, tuples=False, none=none)}
    return gen


def t_scan(fn):
    def call(x, axis=None):
        if axis is None:
            return fn(x.reshape(-1), 0)
        return fn(x.reshape(1) if x.ndim == 0 else x, axis)
    return call


def diff_gen(d, rng):
    shape = d.shape(min_dims=1)
    axis = d.axis(shape, tuples=False, none=False)
    params = {"n": d.choice([1, 2, 0, 3]), "axis": axis}
    edges = d.choice(["scalars", "none", "arrays"])
    if edges == "scalars":
        params.update(prepend=0.5, append=np.float64(-1.0))
    elif edges == "arrays":
        side = tuple(d.integers(1, 2) if k == axis % len(shape) else n for k, n in enumerate(shape))
        params.update(prepend=values(rng, side, -2, 2), append=values(rng, side, -2, 2))
    return [values(rng, shape, -2, 2)], params


def diff_traced_gen(d, rng):
    shape = d.shape(min_dims=1)
    axis = d.axis(shape, tuples=False, none=False)
    side = tuple(d.integers(1, 2) if k == axis % len(shape) else n for k, n in enumerate(shape))
    return [values(rng, s, -2, 2) for s in (shape, side, side)], {"n": d.choice([1, 2]), "axis": axis}


def t_diff(x, *edges, n=1, axis=-1, prepend=None, append=None):
    """torch.diff after joining the edges in numpy's result dtype (a scalar edge is one slice)."""
    edges = list(edges) or [prepend, append]
    side = list(x.shape)
    side[axis] = 1
    parts = [e if torch.is_tensor(e) else torch.as_tensor(np.array(np.broadcast_to(e, side) if np.ndim(e) == 0 else e))
             for e in edges if e is not None]
    dtype = torch.promote_types(x.dtype, parts[0].dtype) if parts else x.dtype
    joined = torch.cat([p.to(dtype) for p in parts[:1]] + [x.to(dtype)] + [p.to(dtype) for p in parts[1:]], axis) \
        if parts else x
    return torch.diff(joined, n, axis) if n else joined


def ediff1d_gen(d, rng):
    return [values(rng, d.shape(), -2, 2)], {"to_begin": d.choice([None, 2.5, np.array([1.0, -1.0])]),
                                             "to_end": d.choice([None, [3.0], np.array(0.5)])}


def t_ediff1d(x, *traced, to_begin=None, to_end=None):
    flat = x.reshape(-1)
    begin = traced[0] if traced else to_begin
    parts = [torch.as_tensor(np.asarray(v), dtype=x.dtype).reshape(-1) if not torch.is_tensor(v) else v.reshape(-1)
             for v in (begin,) if v is not None]
    parts.append(flat[1:] - flat[:-1])
    parts += [torch.as_tensor(np.asarray(to_end), dtype=x.dtype).reshape(-1)] if to_end is not None else []
    return torch.cat(parts)


def gradient_gen(d, rng):
    """Axes long enough for the edge order; spacing none, one scalar, or coordinates (uneven or even) per axis."""
    edge_order = d.choice([1, 2])
    shape = list(d.shape(min_dims=1, max_dims=2))
    shape[-1] = max(shape[-1], edge_order + 1)
    ok = [k for k, n in enumerate(shape) if n >= edge_order + 1]
    axis = d.choice([-1, tuple(reversed(ok))] + ([None] if len(ok) == len(shape) else []))
    axes = list(range(len(shape))) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    kind = d.choice(["coordinates", "none", "scalar", "even"])
    spacing = {"none": (), "scalar": (0.7,),
               "coordinates": tuple(np.cumsum(rng.uniform(0.5, 1.5, shape[k])) for k in axes),
               "even": tuple(np.arange(shape[k]) * 0.5 for k in axes)}[kind]
    return [values(rng, tuple(shape), -2, 2)], {"spacing": spacing, "axis": axis, "edge_order": edge_order}


def gradient_traced_gen(d, rng):
    (x,), params = gradient_gen(d, rng)
    params.pop("spacing")
    return [x, values(rng, (), 0.5, 1.5)], params


def t_gradient(x, *h, spacing=(), axis=None, edge_order=1):
    dim = tuple(range(x.ndim)) if axis is None else axis
    if h or not spacing:
        space: Any = 1.0
    elif np.ndim(spacing[0]) == 0:
        space = float(spacing[0])
    else:
        space = [torch.as_tensor(c, dtype=x.dtype) for c in spacing]
    out = [g / h[0] if h else g for g in torch.gradient(x, spacing=space, dim=dim, edge_order=edge_order)]
    return out[0] if len(out) == 1 else tuple(out)


def sort_gen(d, rng):
    shape = d.shape()
    return [distinct(rng, shape)], {"axis": d.axis(shape, tuples=False),
                                    "kind": d.choice([None, "stable", "heapsort", "mergesort"])}


def t_sort(x, axis=-1, kind=None):
    return torch.sort(x.reshape(-1), 0).values if axis is None else torch.sort(x, dim=axis, stable=True).values


def ties_gen(d, rng):
    """Few distinct values, so indices depend on how ties are ordered."""
    shape = d.shape(min_side=1)
    x = np.round(values(rng, shape, -2, 2))
    axis = d.axis(shape, tuples=False)
    n = x.size if axis is None else shape[axis]
    return [x], {"axis": axis, "kth": d.choice([0, -1, [0, n - 1], n // 2])}


def argsort_ties_gen(d, rng):
    (x,), params = ties_gen(d, rng)
    return [x], {"axis": params["axis"], "kind": d.choice([None, "stable", "heapsort", "mergesort"])}


def partition_gen(d, rng):
    (x,), params = ties_gen(d, rng)
    return [distinct(rng, x.shape)], params


def partition_ref(x, kth, axis=-1):
    """numpy's argpartition applied: what jitgrad's np.partition returns."""
    flat = x.reshape(-1) if axis is None else x
    return np.take_along_axis(flat, np.argpartition(x, kth, axis), -1 if axis is None else axis)


def t_partition(x, kth, axis=-1):
    idx = torch.from_numpy(np.argpartition(x.detach().numpy(), kth, axis))
    return torch.take_along_dim(x.reshape(-1) if axis is None else x, idx, -1 if axis is None else axis)


def topk_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    return [distinct(rng, shape)], {"k": d.integers(1, shape[-1])}


def topk_partition_ref(x, k):
    return np.take_along_axis(x, np.argpartition(x, -k, -1)[..., -k:], -1)


def median_gen(d, rng):
    shape = d.shape(min_side=1)
    return [distinct(rng, shape)], {"axis": d.axis(shape), "keepdims": d.choice([False, True])}


def quantile_gen(qs: list):
    def gen(d, rng):
        (x,), params = median_gen(d, rng)
        params.update(q=d.choice(qs), method=d.choice(["linear", "lower", "higher", "nearest", "midpoint"]))
        return [x], params
    return gen


NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
TORCH_DTYPES = {v: k for k, v in NUMPY_DTYPES.items()}


def t_quantile(x, q=0.5, axis=None, keepdims=False, method="linear", scale=1.0):
    """torch.quantile over numpy's axes (moved last and merged), in numpy's result dtype."""
    ds = dims(axis, x.ndim)
    kept = [k for k in range(x.ndim) if k not in ds]
    weak = type(q) in (int, float)
    dtype = x.dtype if weak else TORCH_DTYPES[np.result_type(NUMPY_DTYPES[x.dtype], np.asarray(q).dtype)]
    moved = (x.permute(kept + list(ds)) if x.ndim else x).reshape([x.shape[k] for k in kept] + [-1]).to(dtype)
    out = torch.quantile(moved, torch.as_tensor(np.asarray(q) / scale, dtype=dtype), dim=-1, interpolation=method)
    if keepdims:
        out = out.reshape(np.shape(q) + tuple(1 if k in ds else n for k, n in enumerate(x.shape)))
    return out


def t_median(x, axis=None, keepdims=False):
    return t_quantile(x, 0.5, axis, keepdims)


SPECS = [
    S("cumsum", np.cumsum, t_scan(torch.cumsum), scan_gen(), host=True),
    S("cumprod", np.cumprod, t_scan(torch.cumprod), scan_gen(True, True)),
    S("add_accumulate", lambda x, axis: np.add.accumulate(x, axis), t_scan(torch.cumsum),
      scan_gen(min_dims=1, none=False), host=True),
    S("multiply_accumulate", lambda x, axis: np.multiply.accumulate(x, axis=axis), t_scan(torch.cumprod),
      scan_gen(True, True, min_dims=1, none=False)),
    S("cumsum_method", lambda x, axis: x.cumsum(axis), t_scan(torch.cumsum), scan_gen(), host=True),
    S("diff", np.diff, t_diff, diff_gen),
    S("diff_traced_edges", lambda x, p, a, **kw: np.diff(x, prepend=p, append=a, **kw), t_diff, diff_traced_gen),
    S("ediff1d", np.ediff1d, t_ediff1d, ediff1d_gen),
    S("ediff1d_traced", lambda x, b: np.ediff1d(x, to_begin=b), t_ediff1d,
      lambda d, rng: ([values(rng, d.shape(), -2, 2), values(rng, d.choice([(2,), ()]), -2, 2)], {})),
    S("gradient", lambda x, spacing, **kw: np.gradient(x, *spacing, **kw), t_gradient, gradient_gen),
    S("sort", np.sort, t_sort, sort_gen, host=True),
    S("argsort", np.argsort, None, argsort_ties_gen, host=True),
    S("argpartition", np.argpartition, None, ties_gen, host=True),
    S("partition", np.partition, t_partition, partition_gen, ref=partition_ref, host=True),
    S("topk_sort", lambda x, k: np.sort(x, axis=-1)[..., ::-1][..., :k],
      lambda x, k: torch.topk(x, k, dim=-1).values, topk_gen, host=True),
    S("topk_argsort", lambda x, k: np.take_along_axis(x, np.argsort(x, axis=-1)[..., -k:], axis=-1),
      lambda x, k: torch.sort(x, -1).values[..., -k:], topk_gen, host=True),
    S("topk_partition", lambda x, k: np.partition(x, -k, axis=-1)[..., -k:],
      lambda x, k: t_partition(x, -k)[..., -k:], topk_gen, ref=topk_partition_ref, host=True),
    S("topk_argpartition", lambda x, k: np.take_along_axis(x, np.argpartition(x, -k, axis=-1)[..., -k:], axis=-1),
      lambda x, k: t_partition(x, -k)[..., -k:], topk_gen, ref=topk_partition_ref, host=True),
    S("median", np.median, t_median, median_gen),
    S("quantile", np.quantile, t_quantile,
      quantile_gen([0.3, [0.1, 0.5, 0.9], np.float64(0.75), 1, 0.0, np.array([0.25, 1.0], np.float32)])),
    S("percentile", np.percentile, lambda x, q, **kw: t_quantile(x, q, scale=100.0, **kw),
      quantile_gen([30, [10.0, 50.0, 90.0], 100, 0.0])),
]


# ---------------------------------------------------------------------- the table

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", list(EDGE_CASES))
def test_edge_cases(spec, kind) -> None:
    check(spec, EdgeDraw(kind))


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.host], ids=lambda s: s.name)
@settings(max_examples=3)
@given(data=st.data())
def test_kernel_op_random(spec, data) -> None:
    check(spec, HypothesisDraw(data))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.host], ids=lambda s: s.name)
@settings(max_examples=8)
@given(data=st.data())
def test_host_op_random(spec, data) -> None:
    """Ops whose forward and backward run on the host only (no kernel compiles): more random examples."""
    check(spec, HypothesisDraw(data))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.torch_fn is not None], ids=lambda s: s.name)
def test_second_derivatives(spec) -> None:
    """Every VJP is differentiable again (gradgradcheck, float64, the rank-2 edge case); cumprod's includes
    zeros, where its exact polynomial gradient still has the right derivatives."""
    raw, params = spec.gen(EdgeDraw("transposed"), np.random.default_rng(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert jg.gradgradcheck(lambda *xs: spec.fn(*xs, **params), raw, atol=1e-5, rtol=1e-4)


def test_gradient_with_a_traced_spacing() -> None:
    """np.gradient(f, h) with h traced: d/df and d/dh against torch and finite differences (float32 strided,
    float64 transposed), and second derivatives."""
    spec = S("gradient_traced_spacing", np.gradient, t_gradient, gradient_traced_gen)
    check(spec, EdgeDraw("strided"))
    check(spec, EdgeDraw("transposed"))
    raw, params = spec.gen(EdgeDraw("transposed"), np.random.default_rng(1))
    assert jg.gradgradcheck(lambda x, h: np.gradient(x, h, **params), raw, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------- numpy's numbers, ties, NaNs

QUANTILE_METHODS = ["inverted_cdf", "averaged_inverted_cdf", "closest_observation", "interpolated_inverted_cdf",
                    "hazen", "weibull", "linear", "median_unbiased", "normal_unbiased", "lower", "higher", "midpoint",
                    "nearest"]
EXACT = {
    "cumsum": lambda x: (np.cumsum(x), np.cumsum(x, axis=0), x.cumsum(1), np.cumsum(x, dtype=np.float64)),
    "cumprod": lambda x: (np.cumprod(1 + x / 64, axis=1), np.multiply.accumulate(x), x.cumprod(axis=0)),
    "accumulate": lambda x: (np.add.accumulate(x, axis=1), np.add.accumulate(x.astype(np.int8))),
    "differences": lambda x: (np.diff(x, 2), np.diff(x > 0, axis=0), np.ediff1d(x, to_begin=[1, 2]),
                              np.diff(x, prepend=0.5, append=x[:, :2])),
    "gradient": lambda x: (np.gradient(x), np.gradient(x, 0.3, edge_order=2),
                           np.gradient(x, np.cumsum(np.arange(1.0, 8.0)), axis=0, edge_order=2),
                           np.gradient(x, np.arange(7) * 0.5, np.linspace(0, 1, 301) ** 2)),
    "sort": lambda x: (np.sort(x), np.sort(x, axis=0, kind="heapsort"), np.sort(x, axis=None, stable=True),
                       np.argsort(x), np.argsort(x, axis=0, kind="stable"), np.argpartition(x, [3, 100])),
    "median": lambda x: (np.median(x), np.median(x, axis=1), np.median(x[:, :300], axis=1, keepdims=True),
                         np.median(x, axis=0, overwrite_input=True)),
    "quantile": lambda x: (np.quantile(x, [0.0, 0.13, 0.5, 0.97, 1.0], axis=1), np.percentile(x, 33.3),
                           np.quantile(x, np.float32(0.4), axis=0, keepdims=True)),
}


def as_list(out: Any) -> list:
    """The arrays of a (possibly nested) tuple of results."""
    return [a for o in out for a in as_list(o)] if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(EXACT))
def test_numbers_are_numpys_bit_for_bit(name, dtype) -> None:
    """Values, dtypes and indices are numpy's exactly: the scans and sorts run numpy's own code on the host, and
    the composites repeat numpy's arithmetic in its order (float32 in float32 where numpy's is)."""
    x = np.random.default_rng(7).standard_normal((7, 301)).astype(dtype)
    got_all, want_all = as_list(jg.trace(EXACT[name])(x)), as_list(EXACT[name](x))
    assert len(got_all) == len(want_all)
    for got, want in zip(got_all, want_all):
        assert np.asarray(got).dtype == want.dtype and np.shape(got) == want.shape
        np.testing.assert_array_equal(got, want)


def test_float32_cumsum_accumulates_in_float32_as_numpy() -> None:
    """numpy's float32 cumsum adds sequentially in float32 (unlike its pairwise np.sum): so does jitgrad's, to the
    bit, on a long axis where a float64 accumulation would round differently."""
    x = np.random.default_rng(3).uniform(0, 1, 100_000).astype(np.float32)
    got = jg.trace(np.cumsum)(x)
    np.testing.assert_array_equal(got, np.cumsum(x))
    assert not np.array_equal(got, np.cumsum(x.astype(np.float64)).astype(np.float32))


def test_nans_sort_to_the_end_and_signed_zeros_as_numpy() -> None:
    x = np.array([[3.0, np.nan, -0.0, 1.0, np.inf, 0.0, -np.inf, np.nan], [0.0, -0.0, 2.0, 1.0, -1.0, 0.5, 0.0, -0.0]])
    fns = [np.sort, lambda x: np.sort(x, axis=None), np.argsort, lambda x: np.argsort(x, kind="stable"), np.median,
           lambda x: np.median(x, axis=1), lambda x: np.quantile(x, [0.2, 0.9], axis=1), lambda x: np.cumsum(x, 1),
           lambda x: np.partition(x, [0, -1])[:, [0, -1]]]
    for fn in fns:
        got, want = jg.trace(fn)(x), fn(x)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_ties_follow_numpys_kind_and_sorts_gradient_goes_in_stable_order() -> None:
    """argsort returns numpy's indices for each kind, ties included; sort's gradient at tied positions goes to the
    tied elements in stable (first occurrence first) order."""
    x = np.random.default_rng(5).integers(0, 3, (4, 40)).astype(np.float64)
    for kind in (None, "quicksort", "heapsort", "mergesort", "stable"):
        np.testing.assert_array_equal(jg.trace(lambda x: np.argsort(x, kind=kind))(x), np.argsort(x, kind=kind))
    w = np.array([1.0, 2.0, 3.0])
    grad = jg.grad(lambda x: np.sum(np.sort(x) * w))(np.array([1.0, 1.0, 0.0]))
    np.testing.assert_array_equal(grad, [2.0, 3.0, 1.0])


@pytest.mark.parametrize("method", QUANTILE_METHODS)
def test_every_quantile_method_is_numpys_and_differentiates(method) -> None:
    """Every numpy method: numpy's values bit for bit (float32, float64, several q, batched) and the gradient
    against finite differences on distinct values (the table checks linear, lower, higher, nearest and midpoint
    against torch)."""
    x = distinct(np.random.default_rng(2), (3, 7))
    q = [0.0, 0.1, 0.45, 0.5, 1.0]
    for dtype in (np.float32, np.float64):
        got = jg.trace(lambda x: np.quantile(x, q, axis=1, method=method))(x.astype(dtype))
        np.testing.assert_array_equal(got, np.quantile(x.astype(dtype), q, axis=1, method=method))
    assert jg.gradcheck(lambda x: np.quantile(x, q, axis=-1, method=method), [x])


@pytest.mark.parametrize("method", ["averaged_inverted_cdf", "hazen"])
def test_quantile_methods_second_derivatives(method) -> None:
    """One method of each other weight rule differentiates twice too."""
    x = distinct(np.random.default_rng(2), (3, 7))
    assert jg.gradgradcheck(lambda x: np.percentile(x, [37.0, 50.0], axis=0, method=method), [x])


def test_median_of_an_empty_axis_is_nan_as_numpy() -> None:
    x = np.zeros((0, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.median(x, axis=0)
        got = jg.trace(lambda x: np.median(x, axis=0))(x)
    np.testing.assert_array_equal(got, want)
    assert jg.trace(lambda x: np.median(x, axis=1))(x).shape == (0,)


def test_indices_carry_no_gradient() -> None:
    """argsort/argpartition results are int64 and carry no gradient; values gathered with them do, like torch's."""
    x, w = distinct(np.random.default_rng(4), (3, 5)), np.random.default_rng(5).standard_normal((3, 2))

    def top2(x):
        return np.sum(np.take_along_axis(x, np.argsort(x, axis=-1)[:, -2:], axis=-1) * w)

    t = torch.tensor(x, requires_grad=True)
    (torch.topk(t, 2, dim=-1, sorted=True).values.flip(-1) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(jg.grad(top2)(x), t.grad.numpy(), rtol=1e-12)
    assert np.all(jg.grad(lambda x: np.sum(np.argpartition(x, 1) * 1.0 + x * 0.0))(x) == 0)
    assert jg.trace(lambda x: np.argsort(x))(x).dtype == np.int64
