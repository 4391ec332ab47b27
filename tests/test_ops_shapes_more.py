"""Array building and shape ops, einsum in full, out-of-place writes and the refusals of data-dependent shapes,
in the op-table style of test_ops: forward against numpy, first derivatives against torch autograd and
central differences, second derivatives by jg.gradgradcheck, over hypothesis-drawn shapes (empty ones too)
in float32 and float64."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops import EdgeDraw, HypothesisDraw, S, by_positions, check, values

import jitgrad as jg

windows = np.lib.stride_tricks.sliding_window_view


def quiet(fn):
    """`fn` with numpy's DeprecationWarnings (row_stack, 2-vector cross) silenced."""
    def call(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn(*args, **kwargs)
    return call


def norm_axis(axis: int, ndim: int) -> int:
    return axis % ndim


# ---------------------------------------------------------------------- generators

def tri_gen(d, rng):
    shape = d.shape(min_dims=1)
    return [values(rng, shape, -2, 2)], {"k": d.integers(-2, 2)}


def t_tri(fn):
    def call(x, k):
        return fn(x.expand(x.shape[0], x.shape[0]) if x.ndim == 1 else x, k)
    return call


def diag_gen(d, rng):
    shape = d.shape(min_dims=1, max_dims=2)
    return [values(rng, shape, -2, 2)], {"k": d.integers(-2, 2)}


def diagonal_gen(d, rng):
    shape = d.shape(min_dims=2)
    a1 = d.integers(-len(shape), len(shape) - 1)
    a2 = d.choice([a for a in range(len(shape)) if a != a1 % len(shape)])
    return [values(rng, shape, -2, 2)], {"offset": d.integers(-3, 3), "axis1": a1, "axis2": a2}


def roll_gen(d, rng):
    shape = d.shape()
    nd = len(shape)
    kind = d.choice(["none", "int", "tuple"] if nd else ["none"])
    if kind == "none":
        return [values(rng, shape, -2, 2)], {"shift": d.integers(-7, 7), "axis": None}
    if kind == "int":
        return [values(rng, shape, -2, 2)], {"shift": d.integers(-7, 7), "axis": d.integers(-nd, nd - 1)}
    axes = tuple(d.integers(-nd, nd - 1) for _ in range(d.integers(1, 3)))  # repeats add up, as numpy's
    return [values(rng, shape, -2, 2)], {"shift": tuple(d.integers(-5, 5) for _ in axes), "axis": axes}


def rot90_gen(d, rng):
    shape = d.shape(min_dims=2)
    nd = len(shape)
    a = d.integers(0, nd - 1)
    b = d.choice([k for k in range(nd) if k != a])
    return [values(rng, shape, -2, 2)], {"k": d.integers(-1, 5), "axes": (a, b - nd if d.choice([0, 1]) else b)}


def t_rot90(x, k, axes):
    return torch.rot90(x, k, [norm_axis(a, x.ndim) for a in axes])


def rollaxis_gen(d, rng):
    shape = d.shape(min_dims=1)
    nd = len(shape)
    return [values(rng, shape, -2, 2)], {"axis": d.integers(-nd, nd - 1), "start": d.integers(-nd, nd)}


def swapaxes_gen(d, rng):
    shape = d.shape(min_dims=1)
    nd = len(shape)
    return [values(rng, shape, -2, 2)], {"axis1": d.integers(-nd, nd - 1), "axis2": d.integers(0, nd - 1)}


def split_gen(min_dims: int, axis_of):
    def gen(d, rng):
        shape = d.shape(min_dims=min_dims)
        n = shape[axis_of(len(shape))]
        sections = d.choice([[k for k in (1, 2, 3) if n % k == 0][-1], [1, n + 1], [-1]])
        return [values(rng, shape, -2, 2)], {"indices_or_sections": sections}
    return gen


def column_gen(d, rng):
    m = d.integers(0, 3)
    shapes = [d.choice([(m,), (m, d.integers(0, 2))] + ([()] if m == 1 else [])) for _ in range(d.integers(1, 3))]
    return [values(rng, s, -2, 2) for s in shapes], {}


def row_gen(d, rng):
    n = d.integers(0, 3)
    shapes = [d.choice([(n,), (d.integers(0, 2), n)] + ([()] if n == 1 else [])) for _ in range(d.integers(1, 3))]
    return [values(rng, s, -2, 2) for s in shapes], {}


def append_gen(d, rng):
    shape = d.shape()
    if not shape or d.choice([False, True]):
        return [values(rng, shape, -2, 2), values(rng, d.shape(max_dims=2), -2, 2)], {"axis": None}
    axis = d.integers(-len(shape), len(shape) - 1)
    other = tuple(d.integers(0, 2) if k == axis % len(shape) else n for k, n in enumerate(shape))
    return [values(rng, shape, -2, 2), values(rng, other, -2, 2)], {"axis": axis}


def atleast_gen(d, rng):
    return [values(rng, d.shape(max_dims=3), -2, 2) for _ in range(d.integers(1, 3))], {"nd": d.choice([1, 2, 3])}


def at_least(*xs, nd):
    return {1: np.atleast_1d, 2: np.atleast_2d, 3: np.atleast_3d}[nd](*xs)


def kron_gen(d, rng):
    a, b = d.shape(max_dims=3, max_side=2), d.shape(max_dims=3, max_side=3)
    return [values(rng, a, -2, 2), values(rng, b, -2, 2)], {}


def cross_gen(d, rng):
    sa, sb = d.shapes(2, max_dims=2)
    na, nb = d.choice([3, 2]), d.choice([3, 2])
    kind = d.choice(["last", "axes", "axis"])
    if kind == "last":
        return [values(rng, sa + (na,), -2, 2), values(rng, sb + (nb,), -2, 2)], {}
    if kind == "axis":
        return [values(rng, (na,) + sa, -2, 2), values(rng, (nb,) + sb, -2, 2)], {"axis": 0}
    a, b = np.moveaxis(values(rng, sa + (na,), -2, 2), -1, 0), values(rng, sb + (nb,), -2, 2)
    out_nd = len(np.broadcast_shapes(sa, sb)) + 1
    return [np.ascontiguousarray(a), b], {"axisa": 0, "axisb": -1, "axisc": d.integers(-out_nd, out_nd - 1)}


def t_cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    if axis is not None:
        axisa = axisb = axisc = axis
    a, b = torch.movedim(a, axisa, -1), torch.movedim(b, axisb, -1)
    both2 = a.shape[-1] == b.shape[-1] == 2
    a, b = (F.pad(v, (0, 1)) if v.shape[-1] == 2 else v for v in (a, b))
    a, b = torch.broadcast_tensors(a, b)
    c = torch.linalg.cross(a, b, dim=-1)
    return c[..., 2] if both2 else torch.movedim(c, -1, axisc)


def outer_gen(d, rng):
    return [values(rng, d.shape(), -2, 2), values(rng, d.shape(), -2, 2)], {}


def select_gen(d, rng):
    sx, sy, sz = d.shapes(3)
    return [values(rng, sx, -2, 2), values(rng, sy, -2, 2), values(rng, sz, -2, 2)], {"scalar": d.choice([0, 1])}


def select_fn(x, y, z, scalar):
    return np.select([x > 0.5, y < 0], [x, y * 2], default=-1.5 if scalar else z)


def t_select(x, y, z, scalar):
    x, y, z = torch.broadcast_tensors(x, y, z)
    return torch.where(x > 0.5, x, torch.where(y < 0, y * 2, torch.full_like(z, -1.5) if scalar else z))


def linspace_gen(d, rng):
    sa, sb = d.shapes(2, max_dims=2)
    nd = len(np.broadcast_shapes(sa, sb)) + 1
    return [values(rng, sa, -2, 2), values(rng, sb, -2, 2)], {
        "num": d.integers(0, 5), "endpoint": d.choice([True, False]), "axis": d.integers(-nd, nd - 1)}


def t_linspace(a, b, num, endpoint, axis):
    a, b = torch.broadcast_tensors(a, b)
    div = num - 1 if endpoint else num
    ramp = torch.arange(num, dtype=a.dtype).reshape((-1,) + (1,) * a.ndim)
    y = a + ramp * ((b - a) / div) if div > 0 else a + ramp * (b - a)
    if endpoint and num > 1:
        y = torch.cat([y[:-1], b[None]])
    return torch.movedim(y, 0, axis)


def logspace_gen(d, rng):
    arrays, params = linspace_gen(d, rng)
    return arrays, {**params, "base": d.choice([10.0, 2, "array"])}


def logspace_fn(a, b, base, **kw):
    if base == "array":  # one row per base, broadcast against the endpoints as numpy's
        base = np.array([2.0, 3.0]).reshape((2,) + (1,) * max(np.ndim(a), np.ndim(b)))
    return np.logspace(a, b, base=base, **kw)


def t_logspace(a, b, base, num, endpoint, axis):
    if base != "array":
        return base ** t_linspace(a, b, num, endpoint, axis)
    nd = max(a.ndim, b.ndim)
    bases = torch.tensor([2.0, 3.0], dtype=a.dtype).reshape((2,) + (1,) * nd)
    a, b = (v.reshape((1,) * (nd + 1 - v.ndim) + tuple(v.shape)) for v in (a, b))
    return torch.unsqueeze(bases, axis) ** t_linspace(a, b, num, endpoint, axis)


def pad_gen(d, rng):
    shape = d.shape()
    mode = d.choice(["edge", "reflect", "symmetric", "wrap"])
    widths = [(0, 0) if n == 0 else (d.integers(0, 5), d.integers(0, 5)) for n in shape]
    return [values(rng, shape, -2, 2)], {"pad_width": widths or 0, "mode": mode}


def windows_gen(d, rng):
    shape = d.shape(min_dims=1)
    if d.choice([False, True]):
        return [values(rng, shape, -2, 2)], {"window_shape": tuple(d.integers(0, n) for n in shape), "axis": None}
    axes = [d.integers(-len(shape), len(shape) - 1) for _ in range(d.integers(1, 2))]
    trimmed, window = list(shape), []
    for ax in axes:  # the same axis may be windowed twice, as numpy allows
        window.append(d.integers(0, trimmed[ax]))
        trimmed[ax] -= max(window[-1] - 1, 0)
    return [values(rng, shape, -2, 2)], {"window_shape": tuple(window), "axis": tuple(axes)}


def add_at_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    idx = rng.integers(-shape[0], shape[0], d.integers(1, 4))
    key = d.choice([(idx,), (slice(1, None), ...)] + ([(idx, slice(None, None, -1))] if len(shape) > 1 else []))
    vshape = np.zeros(shape)[key].shape
    vshape = d.choice([vshape, vshape[1:], ()])
    return [values(rng, shape, -2, 2), values(rng, vshape, -2, 2)], {"key": key}


def ref_add_at(a, v, key):
    out = a.copy()
    np.add.at(out, key, v)
    return out


def t_add_at(a, v, key):
    pos = np.arange(a.numel()).reshape(tuple(a.shape))[key]
    flat = torch.tensor(pos.reshape(-1))
    return a.reshape(-1).index_add(0, flat, v.expand(pos.shape).reshape(-1)).reshape(a.shape)


def traced_index_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    return [values(rng, shape, -2, 2), values(rng, (4,) + shape[1:], -2, 2),
            rng.integers(-shape[0], shape[0], 4)], {}


def t_add_at_traced(a, v, i):
    return t_add_at(a, v, (i.numpy(),))


def put_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    axis = d.integers(-len(shape), len(shape) - 1)
    n = shape[axis]
    m = d.integers(0, n)
    ishape = [m if k == axis % len(shape) else d.choice([shape[k], 1]) for k in range(len(shape))]
    moved = np.moveaxis(np.zeros(ishape, np.int64), axis, -1)
    for lane in np.ndindex(*moved.shape[:-1]):  # distinct per lane: torch's scatter agrees with numpy then
        moved[lane] = rng.permutation(n)[:m] - d.choice([0, n])
    indices = np.moveaxis(moved, -1, axis)
    pshape = tuple(m if k == axis % len(shape) else shape[k] for k in range(len(shape)))
    return [values(rng, shape, -2, 2), values(rng, d.choice([pshape, pshape[1:]]), -2, 2)], {
        "indices": indices, "axis": axis}


def ref_put(a, v, indices, axis):
    out = a.copy()
    np.put_along_axis(out, indices, v, axis)
    return out


def t_put(a, v, indices, axis):
    ax = norm_axis(axis, a.ndim)
    pshape = tuple(indices.shape[k] if k == ax else a.shape[k] for k in range(a.ndim))
    idx = torch.tensor(np.broadcast_to(indices % a.shape[ax], pshape))
    return torch.scatter(a, ax, idx, v.expand(pshape))


def take_wrap_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    axis = d.choice([None, 0, -1])
    n = int(np.prod(shape)) if axis is None else shape[axis]
    return [values(rng, shape, -2, 2), rng.integers(-3 * n, 3 * n, d.shape(max_dims=2))], {"axis": axis}


def t_take_wrap(x, i, axis):
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = norm_axis(axis, x.ndim)
    picked = torch.index_select(x, axis, torch.remainder(i.reshape(-1), x.shape[axis]))
    return picked.reshape(tuple(x.shape[:axis]) + tuple(i.shape) + tuple(x.shape[axis + 1:]))


def nonzero_gen(d, rng):
    return [np.round(values(rng, d.shape(min_dims=1), -1, 1))], {"size": d.integers(0, 6)}


def ref_nonzero(x, size):
    return tuple(np.concatenate([i[:size], np.full(max(size - i.size, 0), -1)]).astype(np.int64)
                 for i in np.nonzero(x))


LETTERS = "abcd"


def einsum_gen(d, rng):
    """A random contraction: 1-3 operands, letters repeated within one (diagonals) or across, size-1 dimensions
    that broadcast, '...' (broadcast against each other), explicit or implicit output, string or sublists."""
    sizes = {c: d.integers(0 if c == "a" else 1, 3) for c in LETTERS}
    ellipsis = d.choice([False, True])
    ell_shape = d.shape(max_dims=2) if ellipsis else ()
    terms, shapes = [], []
    for _ in range(d.integers(1, 3)):
        term = [d.choice(list(LETTERS)) for _ in range(d.integers(0, 3))]
        shape = [1 if term.count(c) == 1 and d.choice([False, False, True]) else sizes[c] for c in term]
        if ellipsis:
            at, keep = d.integers(0, len(term)), d.integers(0, len(ell_shape))
            own = [1 if d.choice([False, True]) else n for n in ell_shape[len(ell_shape) - keep:]]
            term, shape = term[:at] + ["..."] + term[at:], shape[:at] + own + shape[at:]
        terms.append(term)
        shapes.append(tuple(shape))
    used = sorted({c for t in terms for c in t if c != "..."})
    out = None
    if d.choice([False, True]):
        out = [c for c in used if d.choice([False, True])]
        out = list(rng.permutation(out)) if out else []
        if ellipsis:
            out.insert(d.integers(0, len(out)), "...")
    return [values(rng, s, -2, 2) for s in shapes], {"terms": terms, "out": out, "sublists": d.choice([False, True])}


def spec_text(terms, out):
    return ",".join("".join(t) for t in terms) + ("" if out is None else "->" + "".join(out))


def einsum_fn(*xs, terms, out, sublists):
    if not sublists:
        return np.einsum(spec_text(terms, out), *xs)
    code = {c: k for k, c in enumerate(LETTERS)}
    lists = [[Ellipsis if c == "..." else code[c] for c in t] for t in terms + ([out] if out is not None else [])]
    interleaved = [v for x, sub in zip(xs, lists) for v in (x, sub)] + (lists[-1:] if out is not None else [])
    return np.einsum(*interleaved)


def t_einsum(*xs, terms, out, sublists):
    """torch.einsum with numpy's implicit output written out ('...' first, then the letters used once)."""
    if out is None:
        flat = [c for t in terms for c in t]
        out = (["..."] if "..." in flat else []) + sorted(c for c in set(flat) if c != "..." and flat.count(c) == 1)
    return torch.einsum(spec_text(terms, out), *xs)


# ---------------------------------------------------------------------- the table

SPECS = [
    S("tril", np.tril, t_tri(torch.tril), tri_gen),
    S("triu", np.triu, t_tri(torch.triu), tri_gen),
    S("diag", np.diag, lambda x, k: torch.diag(x, k), diag_gen),
    S("diagonal", np.diagonal, lambda x, offset, axis1, axis2: torch.diagonal(x, offset, axis1, axis2), diagonal_gen,
      host=True),
    S("diagonal_method", lambda x, offset, axis1, axis2: x.diagonal(offset, axis1=axis1, axis2=axis2),
      lambda x, offset, axis1, axis2: torch.diagonal(x, offset, axis1, axis2), diagonal_gen, host=True),
    S("trace", np.trace, lambda x, offset, axis1, axis2: torch.diagonal(x, offset, axis1, axis2).sum(-1),
      diagonal_gen),
    S("roll", np.roll, by_positions(np.roll), roll_gen, host=True),
    S("rot90", np.rot90, t_rot90, rot90_gen, host=True),
    S("rollaxis", np.rollaxis, by_positions(np.rollaxis), rollaxis_gen, host=True),
    S("swapaxes_keywords", lambda x, axis1, axis2: np.swapaxes(x, axis1=axis1, axis2=axis2),
      lambda x, axis1, axis2: torch.swapaxes(x, axis1, axis2), swapaxes_gen, host=True),
    S("hsplit", np.hsplit, by_positions(np.hsplit), split_gen(1, lambda nd: 1 if nd > 1 else 0), host=True),
    S("vsplit", np.vsplit, by_positions(np.vsplit), split_gen(2, lambda nd: 0), host=True),
    S("dsplit", np.dsplit, by_positions(np.dsplit), split_gen(3, lambda nd: 2), host=True),
    S("column_stack", lambda *xs: np.column_stack(xs), by_positions(lambda *p: np.column_stack(p)), column_gen,
      host=True),
    S("row_stack", quiet(lambda *xs: np.row_stack(xs)), by_positions(lambda *p: np.vstack(p)), row_gen,
      host=True),
    S("append", np.append, by_positions(np.append), append_gen, host=True),
    S("atleast_nd", at_least, by_positions(at_least), atleast_gen, host=True),
    S("kron", np.kron, torch.kron, kron_gen),
    S("cross", quiet(np.cross), t_cross, cross_gen),
    S("outer_nd", np.outer, lambda a, b: torch.outer(a.reshape(-1), b.reshape(-1)), outer_gen),
    S("select", select_fn, t_select, select_gen),
    S("linspace", np.linspace, t_linspace, linspace_gen),
    S("logspace", logspace_fn, t_logspace, logspace_gen),
    S("pad_modes", np.pad, by_positions(np.pad), pad_gen, host=True),
    S("sliding_window_view", windows, by_positions(windows), windows_gen, host=True),
    S("add_at", lambda a, v, key: jg.add_at(a, key, v), t_add_at, add_at_gen, ref=ref_add_at, host=True),
    S("add_at_traced_index", lambda a, v, i: jg.add_at(a, (i,), v), t_add_at_traced, traced_index_gen,
      ref=lambda a, v, i: ref_add_at(a, v, (i,)), host=True),
    S("put_along_axis", lambda a, v, indices, axis: jg.put_along_axis(a, indices, v, axis), t_put, put_gen,
      ref=ref_put, host=True),
    S("take_wrap_traced", lambda x, i, axis: np.take(x, i, axis=axis, mode="wrap"), t_take_wrap, take_wrap_gen,
      ref=lambda x, i, axis: np.take(x, i, axis=axis, mode="wrap"), host=True),
    S("jg_nonzero", lambda x, size: jg.nonzero(x, size=size, fill_value=-1), None, nonzero_gen, ref=ref_nonzero,
      host=True),
    S("einsum_full", einsum_fn, t_einsum, einsum_gen, host=True),
]
EDGES = ["0-d", "empty", "transposed", "strided"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", EDGES)
def test_edge_cases(spec, kind: str) -> None:
    check(spec, EdgeDraw(kind))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.torch_fn is not None], ids=lambda s: s.name)
def test_second_derivatives(spec) -> None:
    """The VJPs differentiate again (jg.gradgradcheck), in float64 on the rank-2 edge case."""
    raw, params = spec.gen(EdgeDraw("transposed"), np.random.default_rng(1))
    args = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in raw]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert jg.gradgradcheck(lambda *xs: spec.fn(*xs, **params), args, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.host], ids=lambda s: s.name)
@settings(max_examples=2)  # each example compiles kernels for its ranks, dtype and layout; the edge cases add four
@given(data=st.data())
def test_kernel_ops_random(spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.host and s.name != "einsum_full"], ids=lambda s: s.name)
@settings(max_examples=6)
@given(data=st.data())
def test_host_ops_random(spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))


@settings(max_examples=14)
@given(data=st.data())
def test_einsum_random_subscripts(data: Any) -> None:
    """einsum over generated subscripts: '...', sublists, repeated letters, size-1 broadcasting, implicit output."""
    check(next(s for s in SPECS if s.name == "einsum_full"), HypothesisDraw(data))


# ---------------------------------------------------------------------- beyond the table

@pytest.mark.parametrize("mode", ["reflect", "symmetric"])
def test_pad_odd_reflection(mode: str) -> None:
    """reflect_type='odd' (2 * edge - reflection, repeated for pads wider than the array) as numpy's in float32 and
    float64, with first and second derivatives by finite differences."""
    x = np.random.default_rng(0).standard_normal((3, 2))
    for width in (1, ((0, 7), (5, 1))):
        for dtype in (np.float32, np.float64):
            got = jg.trace(lambda a, width=width: np.pad(a, width, mode, reflect_type="odd"))(x.astype(dtype))
            np.testing.assert_allclose(got, np.pad(x.astype(dtype), width, mode, reflect_type="odd"), rtol=1e-6)
    def fn(a):
        return np.pad(a, ((0, 3), (1, 0)), mode, reflect_type="odd")  # two chunks on axis 0

    assert jg.gradcheck(fn, [x[:2]]) and jg.gradgradcheck(fn, [x[:2]])


def test_put_along_axis_repeated_indices_keep_the_last_write() -> None:
    """Of repeated indices the last write wins (numpy's assignment); only that value gets a gradient."""
    a, v = np.arange(4.0), np.array([10.0, 20.0, 30.0])
    indices = np.array([1, 3, 1])
    out = jg.trace(lambda a, v: jg.put_along_axis(a, indices, v, 0))(a, v)
    expected = a.copy()
    np.put_along_axis(expected, indices, v, 0)
    np.testing.assert_array_equal(out, expected)
    _, (ga, gv) = jg.trace(lambda a, v: np.sum(jg.put_along_axis(a, indices, v, 0) * np.arange(1.0, 5.0))
                           ).value_and_grad(a, v, argnums=(0, 1))
    np.testing.assert_array_equal(ga, [1.0, 0.0, 3.0, 0.0])
    np.testing.assert_array_equal(gv, [0.0, 4.0, 2.0])
    assert jg.gradcheck(lambda a, v: jg.put_along_axis(a, indices, v, 0), [a, v])


def test_add_at_casts_and_accumulates_as_numpy() -> None:
    """Repeated indices add in numpy's order; values of another dtype follow np.add.at's promotion and casting."""
    a32 = np.full(3, 1e8, np.float32)
    got = jg.trace(lambda a: jg.add_at(a, np.array([0, 0, 0]), np.array([1.0, 2.0, 4.0])))(a32)
    want = a32.copy()
    np.add.at(want, [0, 0, 0], np.array([1.0, 2.0, 4.0]))
    np.testing.assert_array_equal(got, want)
    ints = jg.trace(lambda v: jg.add_at(np.zeros(3, np.int64), [0, 0], v))(np.array([1.5, 1.5]))
    np.testing.assert_array_equal(ints, [2, 0, 0])


def test_linspace_retstep_and_integer_dtype() -> None:
    start, stop = np.array([0.0, 1.0]), np.array(2.0)
    for kw in ({"num": 4, "retstep": True}, {"num": 1, "retstep": True}, {"num": 5, "dtype": np.int64},
               {"num": 3, "endpoint": False, "retstep": True}):
        got, want = jg.trace(lambda a, b, kw=kw: np.linspace(a, b, **kw))(start, stop), np.linspace(start, stop, **kw)
        for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want))):
            np.testing.assert_array_equal(g, w)
            assert np.asarray(g).dtype == np.asarray(w).dtype


def test_a_3x3_convolution_by_sliding_windows() -> None:
    """numpy's way of writing a convolution: its value and gradients match torch's conv2d, and the backward
    pads the window positions (no scatter)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 32, 32)), rng.standard_normal((4, 3, 3, 3))

    def loss(x, w):
        return np.sum(np.tanh(np.einsum("bchwij,ocij->bohw", windows(x, (3, 3), axis=(2, 3)), w)))

    traced = jg.trace(loss)
    value, (gx, gw) = traced.value_and_grad(x, w, argnums=(0, 1))
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    expected = torch.tanh(F.conv2d(xt, wt)).sum()
    expected.backward()
    np.testing.assert_allclose(value, expected.item(), rtol=1e-10)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gw, wt.grad.numpy(), rtol=1e-9, atol=1e-12)
    assert "scatter_add" not in traced.ir(x, w) and "gather" not in traced.ir(x, w)


REFUSED = [
    (lambda x: np.nonzero(x), "jg.nonzero(a, size=N"),
    (lambda x: x.nonzero(), "jg.nonzero(a, size=N"),
    (lambda x: np.argwhere(x), "np.stack(jg.nonzero(a, size=N), axis=-1)"),
    (lambda x: np.flatnonzero(x), "jg.nonzero(np.ravel(a), size=N)[0]"),
    (lambda x: np.unique(x, return_counts=True), "outside the traced function"),
    (lambda x: np.unique_values(x), "outside the traced function"),
    (lambda x: np.extract(x > 0, x), "np.where(condition, arr, 0)"),
    (lambda x: np.compress(x[0] > 0, x, axis=1), "jg.nonzero(np.ravel(condition), size=N)"),
    (lambda x: x[x > 0], "x[jg.nonzero(mask, size=N)]"),
]


@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_data_dependent_shapes_are_refused_with_what_to_write(case: int) -> None:
    fn, instead = REFUSED[case]
    with pytest.raises(jg.UnsupportedError) as info:
        jg.trace(fn)(np.ones((2, 3)))
    text = str(info.value)
    assert "shape depends on the" in text and instead in text and "test_ops_shapes_more.py" in text, text


@pytest.mark.parametrize("fn,instead", [
    (lambda x: np.add.at(x, [0], 1.0), "a = jg.add_at(a, indices, b)"),
    (lambda x: np.add.at(np.zeros(3), [0], x[0]), "a = jg.add_at(a, indices, b)"),
    (lambda x: np.put_along_axis(x, np.array([0, 1, 0]), 1.0, 0),
     "arr = jg.put_along_axis(arr, indices, values, axis)"),
])
def test_in_place_writes_are_refused_with_the_out_of_place_spelling(fn, instead: str) -> None:
    with pytest.raises(jg.UnsupportedError) as info:
        jg.trace(fn)(np.ones(3))
    assert "in place" in str(info.value) and instead in str(info.value)


def test_constant_conditions_compress_and_extract_as_numpy() -> None:
    x = np.arange(12.0).reshape(3, 4)
    cond = np.array([True, False, True])
    for fn in (lambda a: np.compress(cond, a, axis=0), lambda a: np.compress([0, 1], a), lambda a: a.compress(cond, 0),
               lambda a: np.extract(np.eye(3, 4) > 0, a)):
        np.testing.assert_array_equal(jg.trace(fn)(x), fn(x))


@pytest.mark.parametrize("fn,error,words", [
    (lambda x: np.pad(x, 1, "mean"), jg.UnsupportedError, "mode='mean' is not supported"),
    (lambda x: np.pad(x, 1, "reflect", reflect_type="oddish"), jg.TraceError, "reflect_type"),
    (lambda x: np.pad(x[:0], 1, "edge"), jg.ShapeError, "can't extend empty axis 0"),
    (lambda x: np.einsum("...i->i", x), jg.ShapeError, "no '...'"),
    (lambda x: np.einsum("ij->ii", x), jg.ShapeError, "distinct"),
    (lambda x: np.einsum("ii", x[:1]), jg.ShapeError, "diagonal needs equal lengths"),
    (lambda x: np.roll(x, np.int64(1) + x[0, 0].astype(np.int64)), jg.UnsupportedError, "shift must be a Python int"),
    (lambda x: np.diag(x[None]), jg.ShapeError, "1- or 2-d"),
    (lambda x: np.take(x[:0], np.array([1]), mode="wrap"), jg.ShapeError, "non-empty take from an empty axis"),
    (lambda x: jg.nonzero(x[0, 0], size=2), jg.ShapeError, "1 or more dimensions"),
])
def test_mistakes_name_the_op_and_the_line(fn, error, words: str) -> None:
    with pytest.raises(error) as info:
        jg.trace(fn)(np.ones((2, 3)))
    assert words in str(info.value) and "test_ops_shapes_more.py" in str(info.value), str(info.value)
