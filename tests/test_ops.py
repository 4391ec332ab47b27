"""Table-driven tests of the op set: every op's forward against numpy, its gradient against torch
autograd and central finite differences.

Each row of `SPECS` is one op: the function traced (numpy code), an independent numpy reference
when the traced function is a jitgrad-only op, the torch equivalent, and an input generator. The
generator draws shapes, axes and parameters from a `Draw`: hypothesis for random cases
(broadcasting, axes, float32/float64, memory layouts), or `EdgeDraw` for the fixed edge cases
every op runs: a 0-d input, an empty axis, a transposed and a strided input.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitgrad as jg
from jitgrad.passes import recipes

FLOATS = (np.float32, np.float64)
LAYOUTS = ("C", "transposed", "strided")
FORWARD_TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-9, atol=1e-12)}
TORCH_TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-8, atol=1e-10)}
FD_TOL = dict(rtol=1e-5, atol=1e-6)
FD_EPS = 1e-6


# ---------------------------------------------------------------------- drawing inputs

class Draw(Protocol):
    """What an input generator may ask for; `HypothesisDraw` and `EdgeDraw` answer."""

    dtype: Any
    layout: str
    seed: int

    def shape(self, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 3) -> tuple: ...

    def shapes(self, n: int, min_dims: int = 0, max_dims: int = 3, min_side: int = 0) -> list[tuple]: ...

    def integers(self, lo: int, hi: int) -> int: ...

    def choice(self, options: list) -> Any: ...

    def axis(self, shape: tuple, tuples: bool = True, none: bool = True) -> Any: ...


class HypothesisDraw:
    """Random answers: dtype, memory layout, shapes (broadcastable ones for several operands), axes."""

    def __init__(self, data: Any):
        self.data = data
        self.dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
        self.layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
        self.seed = data.draw(st.integers(0, 2 ** 16), label="seed")

    def shape(self, min_dims=0, max_dims=3, min_side=0, max_side=3):
        return self.data.draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                                               max_side=max_side), label="shape")

    def shapes(self, n, min_dims=0, max_dims=3, min_side=0):
        return list(self.data.draw(hnp.mutually_broadcastable_shapes(
            num_shapes=n, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=3),
            label="shapes").input_shapes)

    def integers(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.data.draw(st.sampled_from(options))

    def axis(self, shape, tuples=True, none=True):
        nd = len(shape)
        options = [st.integers(-nd, nd - 1)] if nd else []
        if none or not nd:
            options.append(st.none())
        if tuples and nd:
            options.append(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True)
                           .map(lambda axes: tuple(a - nd if a % 2 else a for a in axes)))
        return self.data.draw(st.one_of(options), label="axis")


EDGE_CASES = {"0-d": np.float64, "empty": np.float32, "transposed": np.float64, "strided": np.float32}


class EdgeDraw:
    """Fixed answers: the smallest rank an op allows ("0-d"), a zero-length first axis ("empty"), or
    rank-2 inputs passed transposed or strided."""

    def __init__(self, kind: str):
        self.kind = kind
        self.dtype = EDGE_CASES[kind]
        self.layout = kind if kind in LAYOUTS else "C"
        self.seed = 0

    def shape(self, min_dims=0, max_dims=3, min_side=0, max_side=3):
        if self.kind == "0-d":
            return (max(min_side, 2),) * min_dims
        rank = min(max(2, min_dims), max_dims)
        dims = [min(d, max_side) for d in (3, 2, 2)[:rank]]
        if self.kind == "empty" and min_side == 0:
            dims[0] = 0
        return tuple(dims)

    def shapes(self, n, min_dims=0, max_dims=3, min_side=0):
        return [self.shape(min_dims, max_dims, min_side)] * n

    def integers(self, lo, hi):
        return lo

    def choice(self, options):
        return options[0]

    def axis(self, shape, tuples=True, none=True):
        if not shape:
            return None
        return 0 if self.kind == "empty" else -1


# ---------------------------------------------------------------------- generators

Gen = Callable[[Draw, np.random.Generator], tuple[list[np.ndarray], dict]]


def values(rng: np.random.Generator, shape: tuple, lo: float, hi: float, away: float = 0.0) -> np.ndarray:
    """Uniform values in [lo, hi]; with `away`, magnitudes of at least `away` and random signs."""
    v = rng.uniform(lo, hi, shape)
    if away:
        v = (np.abs(v) + away) * rng.choice([-1.0, 1.0], shape)
    return np.asarray(v, np.float64)


def unary(lo: float = -2.0, hi: float = 2.0, away: float = 0.0, min_dims: int = 0) -> Gen:
    def gen(d, rng):
        return [values(rng, d.shape(min_dims=min_dims), lo, hi, away)], {}
    return gen


def binary(lo: float = -2.0, hi: float = 2.0, lo2: float | None = None, hi2: float | None = None,
           away2: float = 0.0) -> Gen:
    def gen(d, rng):
        sa, sb = d.shapes(2)
        return [values(rng, sa, lo, hi), values(rng, sb, lo if lo2 is None else lo2, hi if hi2 is None else hi2,
                                                away2)], {}
    return gen


def reduction(lo: float = -2.0, hi: float = 2.0, min_side: int = 0, min_dims: int = 0, tuples: bool = True,
              none: bool = True, **extra: list) -> Gen:
    def gen(d, rng):
        shape = d.shape(min_dims=min_dims, min_side=min_side)
        params = {"axis": d.axis(shape, tuples, none), "keepdims": d.choice([False, True])}
        params.update({k: d.choice(v) for k, v in extra.items()})
        return [values(rng, shape, lo, hi)], params
    return gen


def with_params(make: Callable[[Draw, tuple], dict], min_dims: int = 0, max_dims: int = 3, min_side: int = 0) -> Gen:
    def gen(d, rng):
        shape = d.shape(min_dims=min_dims, max_dims=max_dims, min_side=min_side)
        return [values(rng, shape, -2.0, 2.0)], make(d, shape)
    return gen


def softmax_gen(d, rng):
    """An axis of non-zero length (softmax over an empty axis has no maximum); other axes may be empty."""
    shape = d.shape(min_dims=1)
    shape = shape[:-1] + (max(shape[-1], 1),)
    return [values(rng, shape, -2, 2)], {"axis": d.choice([a for a in range(-1, -len(shape) - 1, -1) if shape[a]])}


def ties(d, rng):
    """Values on a coarse grid, so comparisons see equal operands."""
    sa, sb = d.shapes(2)
    return [np.round(values(rng, sa, -2, 2)), np.round(values(rng, sb, -2, 2))], {}


def clip_gen(d, rng):
    sx, slo, shi = d.shapes(3)
    return [values(rng, sx, -2, 2), values(rng, slo, -1.5, -0.2), values(rng, shi, 0.2, 1.5)], {}


def remainder_gen(d, rng):
    """x = (k + f) * y with whole k and f in [0.1, 0.9], y of either sign: away from remainder's jumps."""
    shape = d.shape()
    y = values(rng, shape, 0.5, 2.0, away=0.5)
    return [(rng.integers(-2, 3, shape) + rng.uniform(0.1, 0.9, shape)) * y, y], {}


def with_nans(gen: Gen) -> Gen:
    """The generator's first input with some NaNs (fmax/fmin ignore a NaN operand)."""
    def nan_gen(d, rng):
        arrays, params = gen(d, rng)
        arrays[0].reshape(-1)[::3] = np.nan
        return arrays, params
    return nan_gen


def specials(d, rng):
    x = values(rng, d.shape(), -2, 2)
    flat = x.reshape(-1)
    flat[::3] = np.inf
    flat[1::4] = np.nan
    flat[2::5] = -np.inf
    return [x], {}


def dims(axis: Any, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in (axis if isinstance(axis, tuple) else (axis,)))


def t_reduce(fn: Callable, identity_on_0d: bool = True) -> Callable:
    """A torch reduction called numpy-style: `axis` (None, int, tuple) and `keepdims`; on a 0-d input
    (no axes) it is the identity, as numpy's, unless `identity_on_0d` is False (var, std)."""
    def call(x, axis=None, keepdims=False, **kw):
        ds = dims(axis, x.ndim)
        return fn(x, ds, keepdims, **kw) if ds or not identity_on_0d else x.clone()
    return call


def t_pad(x, pad_width, constant_values):
    widths = np.broadcast_to(np.asarray(pad_width), (x.ndim, 2))
    return F.pad(x, [int(v) for pair in widths[::-1] for v in pair], value=constant_values) if x.ndim else x.clone()


def t_prod(x, ds, keep):
    for a in sorted(ds, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keep)
    return x


def t_norm(x, axis=None, keepdims=False, ord=None):
    if axis is None and ord is None:
        return torch.linalg.vector_norm(x, keepdim=keepdims) if x.ndim else x.abs()
    return torch.linalg.norm(x, ord=ord, dim=axis, keepdim=keepdims)


def by_positions(np_fn: Callable) -> Callable:
    """torch oracle for data movement: gather x's elements at the flat positions `np_fn` moves an
    arange to (torch's indexing backward scatter-adds repeated positions)."""
    def call(*tensors, **params):
        positions, offset, flats = [], 0, []
        for t in tensors:
            positions.append(np.arange(offset, offset + t.numel()).reshape(tuple(t.shape)))
            offset += t.numel()
            flats.append(t.reshape(-1))
        moved = np_fn(*positions, **params)
        flat = torch.cat(flats)
        if isinstance(moved, (list, tuple)):
            return [flat[torch.from_numpy(np.array(m, order="C"))] for m in moved]
        return flat[torch.from_numpy(np.array(moved, order="C"))]
    return call


def erf_ref(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(np.asarray(x).dtype)


def sigmoid_ref(x):
    return 1 / (1 + np.exp(-x))


def gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def logsumexp_ref(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=dims(axis, x.ndim))


def softmax_ref(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def getitem_key(d: Draw, shape: tuple) -> tuple:
    """A random numpy index: slices with steps and negative bounds, ints, None, ... and integer arrays."""
    key: list[Any] = []
    ellipsis = d.choice([False, True]) and len(shape) > 1
    for k, n in enumerate(shape):
        if ellipsis and k == 1:
            key.append(Ellipsis)
            break
        kind = d.choice(["slice", "int", "array", "none"] if n else ["slice", "none"])
        if kind == "none":
            key.append(None)
            kind = "slice"
        if kind == "slice":
            step = d.choice([1, 2, -1, -2])
            key.append(slice(d.integers(-n - 1, n), d.choice([None, d.integers(-n - 1, n + 1)]), step))
        elif kind == "int":
            key.append(d.integers(-n, n - 1))
        else:
            key.append(np.array([d.integers(-n, n - 1) for _ in range(d.integers(1, 3))]))
    return tuple(key)


def index_gen(d, rng):
    shape = d.shape(min_dims=1)
    return [values(rng, shape, -2, 2)], {"key": getitem_key(d, shape)}


def traced_labels(d, rng):
    b, c = d.integers(1, 4), d.integers(1, 4)
    return [values(rng, (b, c), -2, 2), rng.integers(-c, c, b)], {}


def repeated_index(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    idx = rng.integers(0, shape[0], (d.integers(1, 4), 2))
    idx[0, 0] = idx[-1, -1]  # at least one repeat
    return [values(rng, shape, -2, 2), idx], {}


def mask_gen(d, rng):
    shape = d.shape(min_dims=1)
    return [values(rng, shape, -2, 2)], {"mask": rng.uniform(size=shape[:d.integers(1, len(shape))]) > 0.4}


def take_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    axis = d.choice([None, 0, -1])
    n = int(np.prod(shape)) if axis is None else shape[axis]
    return [values(rng, shape, -2, 2)], {"indices": rng.integers(-n, n, d.shape(max_dims=2)), "axis": axis}


def take_along_gen(d, rng):
    shape = d.shape(min_dims=1, min_side=1)
    axis = d.axis(shape, tuples=False, none=False)
    ishape = tuple(d.integers(0, 3) if k == axis % len(shape) else d.choice([n, 1]) for k, n in enumerate(shape))
    return [values(rng, shape, -2, 2)], {"indices": rng.integers(-shape[axis], shape[axis], ishape), "axis": axis}


def concat_gen(d, rng):
    shape = d.shape(min_dims=1)
    axis = d.axis(shape, tuples=False, none=False)
    shapes = [tuple(d.integers(0, 3) if k == axis % len(shape) else n for k, n in enumerate(shape))
              for _ in range(d.integers(2, 3))]
    return [values(rng, s, -2, 2) for s in shapes], {"axis": axis}


def stack_gen(d, rng):
    shape = d.shape()
    return ([values(rng, shape, -2, 2) for _ in range(d.integers(2, 3))],
            {"axis": d.integers(-len(shape) - 1, len(shape))})


def split_gen(d, rng):
    shape = d.shape(min_dims=1)
    axis = d.axis(shape, tuples=False, none=False)
    n = shape[axis]
    sections = d.choice([[k for k in (1, 2, 3) if n % k == 0][-1], [1, n + 1], [-1]])
    return [values(rng, shape, -2, 2)], {"indices_or_sections": sections, "axis": axis}


def matmul_gen(d, rng):
    m, k, n = d.integers(1, 3), d.integers(0, 3), d.integers(1, 3)
    kind = d.choice(["2d", "batched", "vec-mat", "mat-vec", "vec-vec"])
    a = {"2d": (m, k), "batched": (2, 1, m, k), "vec-mat": (k,), "mat-vec": (m, k), "vec-vec": (k,)}[kind]
    b = {"2d": (k, n), "batched": (3, k, n), "vec-mat": (k, n), "mat-vec": (k,), "vec-vec": (k,)}[kind]
    return [values(rng, a, -2, 2), values(rng, b, -2, 2)], {}


EINSUMS = {"ij,jk->ik": [(2, 3), (3, 4)], "bij,bjk->bik": [(2, 3, 2), (2, 2, 3)], "i,i->": [(3,), (3,)],
           "ij->ji": [(2, 3)], "ii->i": [(3, 3)], "ij->": [(2, 3)], "i,j->ij": [(2,), (3,)],
           "bi,bi->b": [(2, 3), (2, 3)], "ijk,kj->i": [(2, 3, 4), (4, 3)], "ij,jk,kl->il": [(2, 3), (3, 2), (2, 2)]}


def einsum_gen(d, rng):
    spec = d.choice(list(EINSUMS))
    return [values(rng, s, -2, 2) for s in EINSUMS[spec]], {"subscripts": spec}


TENSORDOTS = [(2, [(2, 3, 4), (3, 4, 2)]), (1, [(2, 3), (3, 2)]), (0, [(2,), (3,)]),
              (([0, 2], [1, 0]), [(2, 3, 4), (4, 2)]), (([-1], [0]), [(2, 3), (3, 2, 2)])]


def tensordot_gen(d, rng):
    axes, shapes = TENSORDOTS[d.integers(0, len(TENSORDOTS) - 1)]
    return [values(rng, s, -2, 2) for s in shapes], {"axes": axes}


def repeat_gen(d, rng):
    shape = d.shape(min_dims=1)
    axis = d.choice([-1, None])
    per_element = rng.integers(0, 3, shape[-1]) if axis == -1 else 2
    return [values(rng, shape, -2, 2)], {"repeats": d.choice([2, per_element, 0]), "axis": axis}


def norm_gen(d, rng):
    shape = d.shape(min_side=1)
    if not shape or d.choice([False, True]):
        return [values(rng, shape, -2, 2)], {"ord": None, "axis": None, "keepdims": d.choice([False, True])}
    return [values(rng, shape, -2, 2)], {"ord": d.choice([None, 2, 1, np.inf, -np.inf]),
                                         "axis": d.axis(shape, tuples=False, none=False),
                                         "keepdims": d.choice([False, True])}


def pad_gen(d, rng):
    shape = d.shape()
    width = d.choice([1, (0, 2), [(k % 2, 1) for k in range(len(shape))] or 1])
    return [values(rng, shape, -2, 2)], {"pad_width": width, "constant_values": d.choice([0.0, 1.5])}


# ---------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Spec:
    """One op: `fn` is traced and, unless `ref` is given, also the numpy reference; `torch_fn` is the
    gradient oracle (None: the output is not differentiable)."""

    name: str
    fn: Callable
    torch_fn: Callable | None
    gen: Gen
    ref: Callable | None = None
    host: bool = False  # runs on the host only (no kernel compiles): more random examples
    second: bool = True  # False only where finite differences cannot check it (a float32 cast inside)

    def reference(self, *args, **params):
        return (self.ref or self.fn)(*args, **params)


def S(name, fn, torch_fn, gen=None, ref=None, host=False, second=True):
    return Spec(name, fn, torch_fn, gen or unary(), ref, host, second)


SPECS = [
    # elementwise, one operand
    S("negative", np.negative, torch.neg),
    S("exp", np.exp, torch.exp),
    S("expm1", np.expm1, torch.expm1),
    S("exp2", np.exp2, torch.exp2),
    S("log", np.log, torch.log, unary(0.2, 3)),
    S("log1p", np.log1p, torch.log1p, unary(-0.5, 2)),
    S("log2", np.log2, torch.log2, unary(0.2, 3)),
    S("log10", np.log10, torch.log10, unary(0.2, 3)),
    S("sqrt", np.sqrt, torch.sqrt, unary(0.2, 3)),
    S("square", np.square, torch.square),
    S("reciprocal", np.reciprocal, torch.reciprocal, unary(0, 2, away=0.3)),
    S("sin", np.sin, torch.sin),
    S("cos", np.cos, torch.cos),
    S("tan", np.tan, torch.tan, unary(-1.2, 1.2)),
    S("arcsin", np.arcsin, torch.arcsin, unary(-0.9, 0.9)),
    S("arccos", np.arccos, torch.arccos, unary(-0.9, 0.9)),
    S("arctan", np.arctan, torch.arctan),
    S("sinh", np.sinh, torch.sinh),
    S("cosh", np.cosh, torch.cosh),
    S("tanh", np.tanh, torch.tanh),
    S("arcsinh", np.arcsinh, torch.arcsinh),
    S("arctanh", np.arctanh, torch.arctanh, unary(-0.9, 0.9)),
    S("abs", np.abs, torch.abs, unary(0, 2, away=0.1)),
    S("sign", np.sign, torch.sign, unary(0, 2, away=0.1)),
    S("floor", np.floor, torch.floor, unary(-3, 3)),
    S("ceil", np.ceil, torch.ceil, unary(-3, 3)),
    S("rint", np.rint, torch.round, unary(-3, 3)),
    S("round", lambda x: np.round(x, 1), lambda x: torch.round(x, decimals=1), unary(-3, 3)),
    S("erf", jg.erf, torch.erf, ref=erf_ref),
    S("sigmoid", jg.sigmoid, torch.sigmoid, unary(-30, 30), ref=sigmoid_ref),
    S("relu", jg.relu, torch.relu, unary(0, 2, away=0.1), ref=lambda x: np.maximum(x, 0)),
    S("softplus", jg.softplus, F.softplus, unary(-30, 30), ref=lambda x: np.logaddexp(0, x)),
    S("gelu", jg.gelu, lambda x: F.gelu(x, approximate="tanh"), unary(-4, 4), ref=gelu_ref),
    S("astype", lambda x: x.astype(np.float32 if x.dtype == np.float64 else np.float64) * 2,
      lambda x: x.to(torch.float32 if x.dtype == torch.float64 else torch.float64) * 2, second=False),
    # elementwise, two or three operands with broadcasting
    S("add", np.add, torch.add, binary()),
    S("subtract", np.subtract, torch.sub, binary()),
    S("multiply", np.multiply, torch.mul, binary()),
    S("divide", np.divide, torch.div, binary(lo2=0, hi2=2, away2=0.3)),
    S("power", np.power, torch.pow, binary(0.3, 2, -2, 2)),
    S("power_scalar", lambda x: x ** 3 + x ** 0.5 + 2.0 ** x, lambda x: x ** 3 + x ** 0.5 + 2.0 ** x,
      unary(0.2, 2)),
    S("maximum", np.maximum, torch.maximum, binary()),
    S("minimum", np.minimum, torch.minimum, binary()),
    S("arctan2", np.arctan2, torch.atan2, binary(lo2=0, hi2=2, away2=0.3)),
    S("remainder", np.remainder, torch.remainder, remainder_gen),
    S("where", lambda x, y: np.where(x > y, x, y * 2), lambda x, y: torch.where(x > y, x, y * 2), binary()),
    S("clip", lambda x: np.clip(x, -0.5, 1.0), lambda x: torch.clip(x, -0.5, 1.0)),
    S("clip_arrays", np.clip, lambda x, lo, hi: torch.clamp(*torch.broadcast_tensors(x, lo, hi)), clip_gen),
    S("fmax", np.fmax, torch.fmax, with_nans(binary())),
    S("fmin", np.fmin, torch.fmin, with_nans(binary())),
    # comparisons and logical ops: bool results, no gradient
    S("less", np.less, None, ties),
    S("less_equal", np.less_equal, None, ties),
    S("greater", np.greater, None, ties),
    S("greater_equal", np.greater_equal, None, ties),
    S("equal", np.equal, None, ties),
    S("not_equal", np.not_equal, None, ties),
    S("logical_ops", lambda x, y: np.logical_xor(np.logical_and(x > 0, y < 0), np.logical_or(x == y, ~(y > 1))),
      None, ties),
    S("logical_not", lambda x: np.logical_not(x > 0), None),
    S("isfinite", np.isfinite, None, specials),
    S("isnan", np.isnan, None, specials),
    # reductions
    S("sum", np.sum, t_reduce(torch.sum), reduction()),
    S("mean", np.mean, t_reduce(torch.mean), reduction()),
    S("prod", np.prod, t_reduce(t_prod), reduction(0.5, 1.5)),
    S("max", np.max, t_reduce(torch.amax), reduction(min_side=1)),
    S("min", np.min, t_reduce(torch.amin), reduction(min_side=1)),
    S("var", np.var, t_reduce(lambda x, d, k, ddof: torch.var(x, d, correction=ddof, keepdim=k), False),
      reduction(min_side=2, ddof=[0, 1])),
    S("std", np.std, t_reduce(lambda x, d, k, ddof: torch.std(x, d, correction=ddof, keepdim=k), False),
      reduction(min_side=2, min_dims=1, ddof=[1, 0])),
    S("logsumexp", jg.logsumexp, t_reduce(torch.logsumexp), reduction(-30, 30, min_side=1), ref=logsumexp_ref),
    S("softmax", jg.softmax, lambda x, axis: torch.softmax(x, axis), softmax_gen, ref=softmax_ref),
    S("log_softmax", jg.log_softmax, lambda x, axis: torch.log_softmax(x, axis), softmax_gen,
      ref=lambda x, axis: np.log(softmax_ref(x, axis))),
    S("norm", np.linalg.norm, t_norm, norm_gen),
    S("norm_fro", lambda x, ord: np.linalg.norm(x, ord, axis=(0, -1)),
      lambda x, ord: torch.linalg.norm(x, ord, dim=(0, -1)),
      with_params(lambda d, s: {"ord": d.choice([None, "fro"])}, min_dims=2)),
    S("argmax", np.argmax, None, reduction(min_side=1, tuples=False)),
    S("argmin", np.argmin, None, reduction(min_side=1, tuples=False)),
    # shapes
    S("reshape", lambda x: x.reshape(-1, 1), lambda x: x.reshape(-1, 1), host=True),
    S("transpose", np.transpose, lambda x: x.permute(tuple(reversed(range(x.ndim)))), host=True),
    S("T", lambda x: x.T * 1.0, lambda x: x.permute(tuple(reversed(range(x.ndim)))), host=True),
    S("swapaxes", lambda x, a, b: np.swapaxes(x, a, b), lambda x, a, b: torch.swapaxes(x, a, b),
      with_params(lambda d, s: {"a": d.integers(-len(s), len(s) - 1), "b": d.integers(0, len(s) - 1)}, min_dims=1),
      host=True),
    S("moveaxis", np.moveaxis, torch.movedim,
      with_params(lambda d, s: {"source": d.integers(-len(s), len(s) - 1),
                                "destination": d.integers(-len(s), len(s) - 1)}, min_dims=1), host=True),
    S("expand_dims", np.expand_dims, lambda x, axis: x.unsqueeze(axis),
      with_params(lambda d, s: {"axis": d.integers(-len(s) - 1, len(s))}), host=True),
    S("squeeze", lambda x: np.squeeze(x[None]), lambda x: x[None].squeeze(), host=True),
    S("broadcast_to", lambda x: np.broadcast_to(x, (2,) + x.shape), lambda x: x.expand((2,) + x.shape), host=True),
    S("ravel", np.ravel, lambda x: x.reshape(-1), host=True),
    S("concatenate", lambda *xs, axis: np.concatenate(xs, axis=axis), lambda *xs, axis: torch.cat(xs, axis),
      concat_gen, host=True),
    S("stack", lambda *xs, axis: np.stack(xs, axis=axis), lambda *xs, axis: torch.stack(xs, axis), stack_gen,
      host=True),
    S("split", np.split, by_positions(np.split), split_gen, host=True),
    S("flip", np.flip, lambda x, axis: torch.flip(x, dims(axis, x.ndim)),
      with_params(lambda d, s: {"axis": d.axis(s)}), host=True),
    S("pad", np.pad, t_pad, pad_gen, host=True),
    S("tile", np.tile, lambda x, reps: torch.tile(x, reps if isinstance(reps, tuple) else (reps,)),
      with_params(lambda d, s: {"reps": d.choice([2, (2, 1), (1, 3, 2), 0])}), host=True),
    S("repeat", np.repeat, by_positions(np.repeat), repeat_gen, host=True),
    # indexing
    S("getitem", lambda x, key: x[key], by_positions(lambda p, key: p[key]), index_gen, host=True),
    S("getitem_traced_labels", lambda x, labels: x[np.arange(x.shape[0]), labels],
      lambda x, labels: x[torch.arange(x.shape[0]), labels], traced_labels, host=True),
    S("getitem_repeated", lambda x, idx: x[idx], lambda x, idx: x[idx], repeated_index, host=True),
    S("getitem_mask", lambda x, mask: x[mask], by_positions(lambda p, mask: p[mask]), mask_gen, host=True),
    S("take", np.take, by_positions(np.take), take_gen, host=True),
    S("take_along_axis", np.take_along_axis, by_positions(np.take_along_axis), take_along_gen, host=True),
    # linear algebra
    S("matmul", np.matmul, torch.matmul, matmul_gen, host=True),
    S("dot", np.dot, lambda a, b: torch.tensordot(a, b, ([-1], [0 if b.ndim == 1 else -2])),
      lambda d, rng: ([values(rng, (2, 3, 2), -2, 2), values(rng, d.choice([(2,), (2, 2), (4, 2, 3)]), -2, 2)], {}),
      host=True),
    S("outer", np.outer, torch.outer, lambda d, rng: ([values(rng, (d.integers(0, 3),), -2, 2),
                                                       values(rng, (3,), -2, 2)], {}), host=True),
    S("inner", np.inner, torch.inner, lambda d, rng: ([values(rng, (2, 3), -2, 2), values(rng, (3,), -2, 2)], {}),
      host=True),
    S("einsum", lambda *xs, subscripts: np.einsum(subscripts, *xs),
      lambda *xs, subscripts: torch.einsum(subscripts, *xs), einsum_gen, host=True),
    S("tensordot", np.tensordot, lambda a, b, axes: torch.tensordot(a, b, dims=axes), tensordot_gen, host=True),
]


# ---------------------------------------------------------------------- checking

def lay_out(a: np.ndarray, layout: str) -> np.ndarray:
    """The same values in a transposed (column-major) or strided (every other element) buffer."""
    if layout == "transposed" and a.ndim >= 2:
        return np.asfortranarray(a)
    if layout == "strided" and a.ndim >= 1:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    return a


def as_list(out: Any) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def finite_differences(spec: Spec, args: list[np.ndarray], params: dict, w: list[np.ndarray], k: int
                       ) -> np.ndarray:
    """d/d args[k] of sum(ref(args) * w), by central differences in float64."""
    def loss(arg):
        full = list(args)
        full[k] = arg
        return sum(np.sum(np.asarray(o, np.float64) * c) for o, c in zip(as_list(spec.reference(*full, **params)), w))

    x = args[k]
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += FD_EPS
        down[i] -= FD_EPS
        grad[i] = (loss(up) - loss(down)) / (2 * FD_EPS)
    return grad


def check(spec: Spec, d: Draw) -> None:
    rng = np.random.default_rng(d.seed)
    raw, params = spec.gen(d, rng)
    args = [lay_out(a.astype(d.dtype), d.layout) if a.dtype == np.float64 else a for a in raw]
    floats = [k for k, a in enumerate(args) if a.dtype.kind == "f"]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "Mean of empty slice"
        expected = as_list(spec.reference(*args, **params))
    traced = jg.trace(lambda *xs: spec.fn(*xs, **params))
    if spec.torch_fn is None:
        got = as_list(traced(*args))
    else:
        out, pullback = traced.vjp(*args)
        got = as_list(out)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert np.shape(g) == e.shape and np.asarray(g).dtype == e.dtype, (np.shape(g), np.asarray(g).dtype, e)
        np.testing.assert_allclose(g, e, **FORWARD_TOL[d.dtype])
    if spec.torch_fn is None:
        return
    w = [rng.standard_normal(np.shape(e)).astype(np.asarray(e).dtype) for e in expected]
    grads = pullback(*w) if len(w) > 1 else pullback(w[0])
    tensors = [torch.tensor(np.array(a, order="C"), requires_grad=a.dtype.kind == "f") for a in args]
    outs = as_list(spec.torch_fn(*tensors, **params))
    pairs = [(o, torch.tensor(c)) for o, c in zip(outs, w) if o.requires_grad]
    if pairs:
        torch.autograd.backward(*zip(*pairs))
    for k in floats:
        want = tensors[k].grad.numpy() if tensors[k].grad is not None else np.zeros_like(args[k])
        assert grads[k].dtype == args[k].dtype
        np.testing.assert_allclose(grads[k], want, **TORCH_TOL[d.dtype], err_msg=f"torch, input {k}")
        if d.dtype == np.float64 and all(np.asarray(e).dtype == np.float64 for e in expected):
            fd = finite_differences(spec, [np.array(a) for a in args], params, w, k)
            np.testing.assert_allclose(grads[k], fd, **FD_TOL, err_msg=f"finite differences, input {k}")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", list(EDGE_CASES))
def test_op_edge_cases(spec: Spec, kind: str) -> None:
    check(spec, EdgeDraw(kind))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.torch_fn is not None and s.second], ids=lambda s: s.name)
def test_op_second_derivatives(spec: Spec) -> None:
    """Every VJP is differentiable again: the gradient's own derivatives against finite differences of the
    gradient (jg.gradgradcheck), in float64 on the rank-2 edge case."""
    d = EdgeDraw("transposed")
    raw, params = spec.gen(d, np.random.default_rng(1))
    args = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in raw]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert jg.gradgradcheck(lambda *xs: spec.fn(*xs, **params), args, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.torch_fn is not None], ids=lambda s: s.name)
def test_float32_gradients_stay_float32(spec: Spec) -> None:
    """No VJP rule computes a float32 gradient through float64: every float value of the differentiated
    program is float32 (where the op's own result is)."""
    raw, params = spec.gen(EdgeDraw("strided"), np.random.default_rng(2))
    args = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in raw]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = as_list(spec.reference(*args, **params))
    if any(np.asarray(o).dtype != np.float32 for o in outs):
        return  # numpy computes this op in float64 for float32 inputs (float_power): nothing to keep
    f = jg.trace(lambda *xs: sum(jg.sum(o) for o in as_list(spec.fn(*xs, **params))))
    plan = f.plan(*args)
    wrt = [k for k, a in enumerate(args) if a.dtype.kind == "f"]
    graph = recipes.value_and_grad_graph(plan.graph, plan.differentiable(wrt))
    wide = [f"{e.prim.name} -> {o.aval}" for e in graph.eqns for o in e.outs if o.aval.dtype == np.float64]
    assert not wide, wide


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.host], ids=lambda s: s.name)
@settings(max_examples=3)
@given(data=st.data())
def test_kernel_op_random(spec: Spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.host], ids=lambda s: s.name)
@settings(max_examples=8)
@given(data=st.data())
def test_host_op_random(spec: Spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))
