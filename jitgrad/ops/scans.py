"""Scans and differences: the host primitives cumsum, cumprod and linear_scan, and the numpy bindings
np.cumsum, np.cumprod, np.add.accumulate, np.multiply.accumulate (and .cumsum, .cumprod), np.diff,
np.ediff1d and np.gradient.

cumsum and cumprod run numpy's own accumulate on the host, so their numbers are numpy's bit for bit
(float32 sums accumulate sequentially in float32, as numpy's). Their VJPs are exact polynomials in the
inputs, written with primitives, so they are differentiable again: cumsum's is a reversed cumsum;
cumprod's is `exclusive_cumprod(x) * R` with `R[k] = g[k] + x[k+1] * R[k+1]`, a reversed linear
recurrence (`linear_scan`), which divides by nothing, so zeros in the input get torch's gradient and
exact second derivatives. The differences are composites of slices and arithmetic in numpy's order."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, TraceError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import (ArrayLike, aval_of, batch_along_axis, broadcast_to, convert, normalize_axes, result_type)
from jitgrad.ops.arithmetic import add, divide, multiply, subtract
from jitgrad.ops.comparisons import not_equal
from jitgrad.ops.reductions import _accumulation_dtype
from jitgrad.ops.regions import slice_region
from jitgrad.ops.shapes import concatenate, ravel, reshape

NO_VALUE = np._NoValue


# ---------------------------------------------------------------------- primitives

def _scan_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    """A scan's result has its (last) operand's shape and dtype."""
    return Aval(avals[-1].shape, avals[-1].dtype, False)


def _accumulate_impl(ufunc: np.ufunc) -> Any:
    """The host implementation of a scan by `ufunc`: numpy's own accumulate, so the numbers are numpy's."""
    def impl(x: Any, *, axis: int, reverse: bool = False) -> np.ndarray:
        """numpy's `ufunc.accumulate` along `axis` (from the far end when `reverse`), C-contiguous."""
        x = np.asarray(x)
        if not reverse:
            return np.ascontiguousarray(ufunc.accumulate(x, axis=axis))
        return np.ascontiguousarray(np.flip(ufunc.accumulate(np.flip(x, axis), axis=axis), axis))
    return impl


def _linear_scan_impl(a: Any, b: Any, *, axis: int, reverse: bool) -> np.ndarray:
    """h[k] = b[k] + a[k] * h[k-1] (h[k+1] when `reverse`), starting from h = b at the first position
    (where `a` is not read): one vectorised step per element of `axis`."""
    a, b = (np.moveaxis(np.asarray(v), axis, 0) for v in (a, b))
    h = np.array(b, copy=True)
    n = h.shape[0]
    for k in (range(n - 2, -1, -1) if reverse else range(1, n)):
        h[k] += a[k] * h[k + 1 if reverse else k - 1]
    return np.ascontiguousarray(np.moveaxis(h, 0, axis))


def shift(v: Any, axis: int, by: int, fill: Any) -> Any:
    """`v` moved one place along `axis` (out[k] = v[k - by], `by` +1 or -1), the vacated end holding `fill`."""
    shape = L.aval(v).shape
    nd, n = len(shape), shape[axis]
    if n == 0:
        return v
    kept = tuple(n - 1 if k == axis else d for k, d in enumerate(shape))
    src = tuple(int(k == axis and by < 0) for k in range(nd))
    dst = tuple(int(k == axis and by > 0) for k in range(nd))
    return L.pad_region(L.slice_region(v, src, (1,) * nd, kept), dst, (1,) * nd, shape, fill)


def linear_scan(a: Any, b: Any, axis: int, reverse: bool) -> Any:
    """The linear recurrence h[k] = b[k] + a[k] * h[k -+ 1] along `axis` (a host step)."""
    return bind(linear_scan_p, a, b, axis=axis, reverse=reverse)


def _cumsum_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int, reverse: bool = False
                ) -> list[Any]:
    """Each input reaches every later partial sum: the gradient is the cumsum run from the other end."""
    return [bind(cumsum_p, cts[0], axis=axis, reverse=not reverse)]


def _cumprod_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int) -> list[Any]:
    """d/dx[k] of sum(g * cumprod(x)) = prod(x[:k]) * (g[k] + x[k+1] * (g[k+1] + x[k+2] * ...)): no division,
    so exact at zeros, and differentiable again (through cumprod and linear_scan)."""
    (x,), (y,), (g,) = ins, outs, cts
    exclusive = shift(y, axis, 1, 1)
    return [L.mul(exclusive, linear_scan(shift(x, axis, -1, 0), g, axis, reverse=True))]


def _linear_scan_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int, reverse: bool
                     ) -> list[Any]:
    """The adjoint recurrence runs the other way: lam[k] = g[k] + a[k+1] * lam[k+1] (forward scans);
    d b = lam, d a[k] = lam[k] * h[k-1]."""
    (a, _), (h,), (g,) = ins, outs, cts
    toward = 1 if reverse else -1
    lam = linear_scan(shift(a, axis, toward, 0), g, axis, not reverse)
    return [L.mul(lam, shift(h, axis, -toward, 0)), lam]


cumsum_p = declare(Primitive("cumsum", Kind.HOST, _scan_rule, _accumulate_impl(np.add), _cumsum_vjp,
                             backward_label="CumsumBackward", batch=batch_along_axis))
cumprod_p = declare(Primitive("cumprod", Kind.HOST, _scan_rule, _accumulate_impl(np.multiply), _cumprod_vjp,
                              backward_label="CumprodBackward", batch=batch_along_axis))
linear_scan_p = declare(Primitive("linear_scan", Kind.HOST, _scan_rule, _linear_scan_impl, _linear_scan_vjp,
                                  backward_label="LinearScanBackward", batch=batch_along_axis))


# ---------------------------------------------------------------------- cumulative sums and products

def _scan_axis(op: str, a: ArrayLike, axis: Any) -> tuple[ArrayLike, int]:
    """numpy's cumsum axis: None scans the flattened array, a 0-d array scans as one element."""
    if axis is None:
        return ravel(a), 0
    axis = constant_of(axis)
    if not isinstance(axis, (int, np.integer)):
        raise TraceError(f"{op}: axis must be None or one int, got {axis!r}{where_text()}")
    if aval_of(a).ndim == 0:
        a = reshape(a, (1,))
    return a, normalize_axes(op, aval_of(a).shape, axis)[0]


def _scan(prim: Primitive, a: ArrayLike, axis: int, dtype: Any) -> ArrayLike:
    """Accumulate in numpy's dtype: floats keep theirs, ints and bools widen to 64 bits, or `dtype`."""
    return bind(prim, convert(a, _accumulation_dtype(aval_of(a), dtype)), axis=axis)


@implements(np.cumsum, method="cumsum")
def cumsum(a: ArrayLike, axis: Any = None, dtype: Any = None) -> ArrayLike:
    """numpy.cumsum: numpy's sequential sums, bit for bit; the gradient is the reversed cumsum."""
    x, ax = _scan_axis("cumsum", a, axis)
    return _scan(cumsum_p, x, ax, dtype)


@implements(np.cumprod, method="cumprod")
def cumprod(a: ArrayLike, axis: Any = None, dtype: Any = None) -> ArrayLike:
    """numpy.cumprod: numpy's sequential products, bit for bit; the gradient is exact with zeros in the input."""
    x, ax = _scan_axis("cumprod", a, axis)
    return _scan(cumprod_p, x, ax, dtype)


def _accumulate_axis(op: str, array: ArrayLike, axis: Any) -> int:
    """ufunc.accumulate's axis: one int (or a 1-tuple) of an array of at least one dimension."""
    shape = aval_of(array).shape
    if not shape:
        raise TraceError(f"{op}: cannot accumulate on a scalar (a 0-d array){where_text()}")
    axis = constant_of(axis)
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    if axis is None or isinstance(axis, tuple):
        raise ShapeError(f"{op}: accumulate does not allow multiple axes (axis={axis!r}, shape {shape})"
                         f"{where_text()}")
    return normalize_axes(op, shape, axis)[0]


_ACCUMULATE = "(array, /, axis=0, dtype=None, out=None)"


@implements(np.add, ufunc_method="accumulate", signature=_ACCUMULATE, export=False)
def add_accumulate(array: ArrayLike, /, axis: Any = 0, dtype: Any = None) -> ArrayLike:
    """np.add.accumulate: np.cumsum along one axis (numpy's default 0), with the same dtype rules."""
    return _scan(cumsum_p, array, _accumulate_axis("add.accumulate", array, axis), dtype)


@implements(np.multiply, ufunc_method="accumulate", signature=_ACCUMULATE, export=False)
def multiply_accumulate(array: ArrayLike, /, axis: Any = 0, dtype: Any = None) -> ArrayLike:
    """np.multiply.accumulate: np.cumprod along one axis (numpy's default 0)."""
    return _scan(cumprod_p, array, _accumulate_axis("multiply.accumulate", array, axis), dtype)


# ---------------------------------------------------------------------- differences

def _part(x: ArrayLike, axis: int, start: int, length: int) -> ArrayLike:
    """`length` consecutive elements of `axis` from `start`, the other axes whole."""
    shape = aval_of(x).shape
    return slice_region(x, [start if k == axis else 0 for k in range(len(shape))], [1] * len(shape),
                        [length if k == axis else d for k, d in enumerate(shape)])


def _forward_difference(x: ArrayLike, axis: int) -> ArrayLike:
    """x[1:] - x[:-1] along `axis` (x[1:] != x[:-1] for bools, as numpy's diff)."""
    m = max(aval_of(x).shape[axis] - 1, 0)
    op = not_equal if aval_of(x).dtype == np.bool_ else subtract
    return op(_part(x, axis, 1, m), _part(x, axis, 0, m))


def _one_slice(name: str, value: Any, shape: tuple[int, ...], axis: int) -> ArrayLike:
    """diff's prepend/append: a scalar broadcast to one slice of `axis`, or an array that matches the others."""
    value = value if isinstance(value, Tracer) else np.asarray(value)
    given = aval_of(value).shape
    if not given:
        return broadcast_to(value, tuple(1 if k == axis else d for k, d in enumerate(shape)))
    if len(given) != len(shape) or any(g != d for k, (g, d) in enumerate(zip(given, shape)) if k != axis):
        raise ShapeError(f"diff: {name} of shape {given} must match the array of shape {shape} except along axis "
                         f"{axis}{where_text()}")
    return value


@implements(np.diff)
def diff(a: ArrayLike, n: Any = 1, axis: Any = -1, prepend: Any = NO_VALUE, append: Any = NO_VALUE) -> ArrayLike:
    """numpy.diff: the n-th forward difference along `axis`, after joining `prepend` and `append`."""
    n, shape = constant_of(n), aval_of(a).shape
    if isinstance(n, Tracer) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ShapeError(f"diff: order n must be a non-negative int, got {n!r} (array of shape {shape})"
                         f"{where_text()}")
    if n == 0:
        return a
    if not shape:
        raise ShapeError(f"diff requires input that is at least one dimensional (got shape ()){where_text()}")
    if not isinstance(constant_of(axis), (int, np.integer)):
        raise TraceError(f"diff: axis must be one int, got {axis!r}{where_text()}")
    (ax,) = normalize_axes("diff", shape, axis)
    parts = [_one_slice("prepend", prepend, shape, ax)] if prepend is not NO_VALUE else []
    parts += [a] + ([_one_slice("append", append, shape, ax)] if append is not NO_VALUE else [])
    x = concatenate(parts, axis=ax) if len(parts) > 1 else a
    for _ in range(int(n)):
        x = _forward_difference(x, ax)
    return x


def _ediff1d_end(name: str, value: Any, dtype: np.dtype) -> ArrayLike:
    """ediff1d's to_begin/to_end, flattened and cast to the input's dtype (which numpy's `same_kind` must allow)."""
    value = value if isinstance(value, Tracer) else np.asarray(value)
    if not np.can_cast(aval_of(value).dtype, dtype, casting="same_kind"):
        raise TraceError(f"ediff1d: dtype of `{name}` ({aval_of(value).dtype}) must be compatible with input `ary` "
                         f"({dtype}) under the `same_kind` rule{where_text()}")
    return convert(ravel(value), dtype)


@implements(np.ediff1d)
def ediff1d(ary: ArrayLike, to_end: Any = None, to_begin: Any = None) -> ArrayLike:
    """numpy.ediff1d: differences of the flattened array, in its dtype, between `to_begin` and `to_end`."""
    x = ravel(ary)
    dtype = aval_of(x).dtype
    if dtype == np.bool_:
        raise TraceError(f"ediff1d: numpy boolean subtract is not supported (array of shape {aval_of(ary).shape}); "
                         f"use np.diff, which compares bools with !={where_text()}")
    parts = [] if to_begin is None else [_ediff1d_end("to_begin", to_begin, dtype)]
    parts.append(_forward_difference(x, 0))
    parts += [] if to_end is None else [_ediff1d_end("to_end", to_end, dtype)]
    return concatenate(parts) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------------- np.gradient

def _gradient_axes(shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    """np.gradient's axes in the order given (its results follow that order)."""
    if axis is None:
        return tuple(range(len(shape)))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(normalize_axes("gradient", shape, a)[0] for a in items)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"gradient: repeated axis in {axis!r} (array of shape {shape}){where_text()}")
    return axes


def _spacing(value: Any, length: int) -> Any:
    """One axis's spacing: a scalar as given (traced or not), or the steps between constant coordinates, one
    scalar when they are uniform (numpy then uses its uniform formulas). Coordinates read from outside the
    arguments are constants of the trace, checked at every call."""
    value = value if aval_of(value).ndim == 0 else constant_of(value)
    if aval_of(value).ndim == 0:
        return value
    if isinstance(value, Tracer):
        raise UnsupportedError(f"gradient: coordinates of shape {value.shape} must be constants, not traced: numpy "
                               f"picks its formula by whether they are evenly spaced{where_text()}")
    coords = np.asanyarray(value)
    if coords.ndim != 1 or len(coords) != length:
        raise ShapeError(f"gradient: distances must be scalars or 1-d of the axis length {length}, got shape "
                         f"{coords.shape}{where_text()}")
    steps = np.diff(coords.astype(np.float64) if coords.dtype.kind in "iu" else coords)
    return steps[0] if steps.size and (steps == steps[0]).all() else steps


def _spacings(varargs: tuple, shape: tuple[int, ...], axes: tuple[int, ...]) -> list[Any]:
    """np.gradient's spacing per axis: 1, one scalar for every axis, or one value per axis (numpy's rules)."""
    if not varargs:
        return [1.0] * len(axes)
    if len(varargs) == 1 and aval_of(varargs[0]).ndim == 0:
        return [varargs[0]] * len(axes)
    if len(varargs) != len(axes):
        raise TraceError(f"gradient: invalid number of arguments: {len(varargs)} spacings for {len(axes)} axes "
                         f"(array of shape {shape}){where_text()}")
    return [_spacing(v, shape[ax]) for v, ax in zip(varargs, axes)]


def _scaled(op: Any, coefficient: Any, x: ArrayLike) -> ArrayLike:
    """multiply(coefficient, x) or divide(x, coefficient), x first cast to the dtype numpy computes it in (a
    float64 coefficient computes a float32 x in float64, as numpy's, without a widening warning: the
    coefficient is numpy's, not the user's)."""
    x = convert(x, result_type(np.multiply if op is multiply else np.true_divide, x, coefficient)[0])
    return op(coefficient, x) if op is multiply else op(x, coefficient)


def _weighted(f: ArrayLike, axis: int, terms: Sequence[tuple[Any, int, int]]) -> ArrayLike:
    """sum of coefficient * f[start:start + length] along `axis`, added left to right as numpy does."""
    total = None
    for coefficient, start, length in terms:
        term = _scaled(multiply, coefficient, _part(f, axis, start, length))
        total = term if total is None else add(total, term)
    return total


def _along_axis(coefficients: Any, ndim: int, axis: int) -> Any:
    """Per-position coefficients shaped to broadcast along `axis`."""
    return np.reshape(coefficients, [-1 if k == axis else 1 for k in range(ndim)])


def _interior(f: ArrayLike, axis: int, dx: Any) -> ArrayLike:
    """Second-order central differences at the interior points (numpy's formulas and order)."""
    n, nd = aval_of(f).shape[axis], aval_of(f).ndim
    if aval_of(dx).ndim == 0:
        return _scaled(divide, 2. * dx, subtract(_part(f, axis, 2, n - 2), _part(f, axis, 0, n - 2)))
    dx1, dx2 = dx[0:-1], dx[1:]
    a = -(dx2) / (dx1 * (dx1 + dx2))
    b = (dx2 - dx1) / (dx1 * dx2)
    c = dx1 / (dx2 * (dx1 + dx2))
    return _weighted(f, axis, [(_along_axis(a, nd, axis), 0, n - 2), (_along_axis(b, nd, axis), 1, n - 2),
                               (_along_axis(c, nd, axis), 2, n - 2)])


def _edges(f: ArrayLike, axis: int, dx: Any, edge_order: int) -> tuple[ArrayLike, ArrayLike]:
    """One-sided differences at both ends, first or second order (numpy's coefficients)."""
    n = aval_of(f).shape[axis]
    uniform = aval_of(dx).ndim == 0
    if edge_order == 1:
        first = _scaled(divide, dx if uniform else dx[0], subtract(_part(f, axis, 1, 1), _part(f, axis, 0, 1)))
        last = subtract(_part(f, axis, n - 1, 1), _part(f, axis, n - 2, 1))
        return first, _scaled(divide, dx if uniform else dx[-1], last)
    if uniform:
        head, tail = (-1.5 / dx, 2. / dx, -0.5 / dx), (0.5 / dx, -2. / dx, 1.5 / dx)
    else:
        d1, d2 = dx[0], dx[1]
        head = (-(2. * d1 + d2) / (d1 * (d1 + d2)), (d1 + d2) / (d1 * d2), - d1 / (d2 * (d1 + d2)))
        d1, d2 = dx[-2], dx[-1]
        tail = ((d2) / (d1 * (d1 + d2)), - (d2 + d1) / (d1 * d2), (2. * d2 + d1) / (d2 * (d1 + d2)))
    return (_weighted(f, axis, [(c, k, 1) for k, c in enumerate(head)]),
            _weighted(f, axis, [(c, n - 3 + k, 1) for k, c in enumerate(tail)]))


@implements(np.gradient, signature="(f, /, *varargs, axis=None, edge_order=1)")
def gradient(f: ArrayLike, /, *varargs: Any, axis: Any = None, edge_order: Any = 1) -> Any:
    """numpy.gradient: central differences inside, one-sided ones (first or second order) at the ends, per
    axis; spacing a scalar (traced or not) or constant coordinates per axis. A tuple for several axes."""
    shape, dtype = aval_of(f).shape, aval_of(f).dtype
    if dtype == np.bool_:
        raise TraceError(f"gradient: numpy boolean subtract is not supported (array of shape {shape}); cast to "
                         f"float first{where_text()}")
    if edge_order not in (1, 2):
        raise UnsupportedError(f"gradient: edge_order must be 1 or 2, got {edge_order!r}{where_text()}")
    axes = _gradient_axes(shape, axis)
    otype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    f = convert(f, otype)
    results = []
    for ax, dx in zip(axes, _spacings(varargs, shape, axes)):
        if shape[ax] < edge_order + 1:
            raise ShapeError(f"gradient: axis {ax} of shape {shape} is too small to calculate a numerical gradient: "
                             f"at least edge_order + 1 = {edge_order + 1} elements are required{where_text()}")
        first, last = _edges(f, ax, dx, edge_order)
        results.append(concatenate([convert(v, otype) for v in (first, _interior(f, ax, dx), last)], axis=ax))
    return results[0] if len(results) == 1 else tuple(results)
