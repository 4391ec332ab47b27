"""Reductions with numpy's axis and keepdims conventions, and composites built on them (var, logsumexp...)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, UnsupportedError
from ..ir import Aval
from ..tracing import bind, where_text
from .core import ArrayLike, aval_of, convert, normalize_axes
from .elementwise import absolute, add, divide, equal, exp, isfinite, log, multiply, sqrt, stop_gradient, subtract, where
from .shapes import ravel, reshape


def reduce(prim: P.Primitive, x: ArrayLike, axes: tuple[int, ...]) -> ArrayLike:
    """Record a keepdims reduction over `axes` (already normalized)."""
    if not axes:
        return x
    return bind(prim, x, axes=axes)


def _squeeze_axes(x: ArrayLike, axes: tuple[int, ...], keepdims: bool) -> ArrayLike:
    if keepdims or not axes:
        return x
    shape = tuple(d for i, d in enumerate(aval_of(x).shape) if i not in axes)
    return reshape(x, shape)


def _accumulation_dtype(a: Aval, dtype: Any) -> np.dtype:
    """numpy's sum/prod dtype: floats keep theirs, unsigned ints give uint64, other ints and bools int64."""
    if dtype is not None:
        return np.dtype(dtype)
    if a.is_float:
        return a.dtype
    return np.dtype(np.uint64 if a.dtype.kind == "u" else np.int64)


def sum(x: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.sum: ints and bools sum as 64-bit ints, floats keep their dtype."""
    a = aval_of(x)
    axes = normalize_axes("sum", a.shape, axis)
    x = convert(x, _accumulation_dtype(a, dtype), a.weak and dtype is None)
    return _squeeze_axes(reduce(P.reduce_sum_p, x, axes), axes, keepdims)


def prod(x: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.prod (1 over empty axes); its gradient is the product of the other elements, zeros included."""
    a = aval_of(x)
    axes = normalize_axes("prod", a.shape, axis)
    x = convert(x, _accumulation_dtype(a, dtype), a.weak and dtype is None)
    return _squeeze_axes(reduce(P.reduce_prod_p, x, axes), axes, keepdims)


def mean(x: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> ArrayLike:
    a = aval_of(x)
    axes = normalize_axes("mean", a.shape, axis)
    count = int(np.prod([a.shape[i] for i in axes], dtype=np.int64))
    target = np.dtype(dtype) if dtype is not None else (a.dtype if a.is_float else np.dtype(np.float64))
    total = sum(convert(x, target, a.weak and dtype is None), axis=axes, keepdims=keepdims)
    return divide(total, float(count)) if count else multiply(total, math.nan)


def _extremum(prim: P.Primitive, op: str, x: ArrayLike, axis: Any, keepdims: bool) -> ArrayLike:
    a = aval_of(x)
    axes = normalize_axes(op, a.shape, axis)
    if any(a.shape[i] == 0 for i in axes):
        raise ShapeError(f"{op}: zero-size reduction over axes {axes} of shape {a.shape} has no identity"
                         f"{where_text()}")
    return _squeeze_axes(reduce(prim, x, axes), axes, keepdims)


def max(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.max; the gradient is split evenly among tied maxima."""
    return _extremum(P.reduce_max_p, "max", x, axis, keepdims)


def min(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    return _extremum(P.reduce_min_p, "min", x, axis, keepdims)


def _arg_extremum(prim: P.Primitive, op: str, x: ArrayLike, axis: Any, keepdims: bool) -> ArrayLike:
    a = aval_of(x)
    if axis is None:
        flat = _arg_extremum(prim, op, ravel(x), 0, False)
        return reshape(flat, (1,) * a.ndim) if keepdims else flat
    if not isinstance(axis, (int, np.integer)):
        raise UnsupportedError(f"{op}: axis must be None or one int, got {axis!r}{where_text()}")
    (ax,) = normalize_axes(op, a.shape, axis)
    if a.shape[ax] == 0:
        raise ShapeError(f"{op}: attempt to get {op} of an empty sequence (axis {axis} of shape {a.shape})"
                         f"{where_text()}")
    return _squeeze_axes(bind(prim, x, axis=ax), (ax,), keepdims)


def argmax(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.argmax: index of the first maximum (int64), no gradient."""
    return _arg_extremum(P.argmax_p, "argmax", x, axis, keepdims)


def argmin(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.argmin: index of the first minimum (int64), no gradient."""
    return _arg_extremum(P.argmin_p, "argmin", x, axis, keepdims)


def var(x: ArrayLike, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> ArrayLike:
    a = aval_of(x)
    axes = normalize_axes("var", a.shape, axis)
    count = int(np.prod([a.shape[i] for i in axes], dtype=np.int64))
    centred = subtract(x, mean(x, axis=axes, keepdims=True))
    return divide(sum(multiply(centred, centred), axis=axes, keepdims=keepdims), float(count - ddof))


def std(x: ArrayLike, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> ArrayLike:
    return sqrt(var(x, axis=axis, ddof=ddof, keepdims=keepdims))


def logsumexp(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """log(sum(exp(x))) computed stably by subtracting the (gradient-free) maximum."""
    axes = normalize_axes("logsumexp", aval_of(x).shape, axis)
    peak = stop_gradient(max(x, axis=axes, keepdims=True))
    peak = where(isfinite(peak), peak, 0.0)
    total = sum(exp(subtract(x, peak)), axis=axes, keepdims=True)
    return _squeeze_axes(add(log(total), peak), axes, keepdims)


def softmax(x: ArrayLike, axis: Any = -1) -> ArrayLike:
    axes = normalize_axes("softmax", aval_of(x).shape, axis)
    e = exp(subtract(x, stop_gradient(max(x, axis=axes, keepdims=True))))
    return divide(e, sum(e, axis=axes, keepdims=True))


def log_softmax(x: ArrayLike, axis: Any = -1) -> ArrayLike:
    return subtract(x, logsumexp(x, axis=axis, keepdims=True))


def _sqrt_zero_grad(s: ArrayLike) -> ArrayLike:
    """sqrt(s) for s >= 0 whose gradient at s == 0 is 0 (not inf), so norms of zero vectors have gradient 0."""
    zero = equal(s, 0)
    return where(zero, 0.0, sqrt(where(zero, 1.0, s)))


def norm(x: ArrayLike, ord: Any = None, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.linalg.norm for vector norms (ord None/2, 1, inf, -inf) and the Frobenius norm of matrices.

    The gradient at a zero vector or matrix is 0 (the subgradient torch.linalg.norm picks)."""
    a = aval_of(x)
    if not a.is_float:
        x = convert(x, np.float64)
    if axis is None and ord is None:
        return _sqrt_zero_grad(sum(multiply(x, x), keepdims=keepdims))
    axes = tuple(range(a.ndim)) if axis is None else normalize_axes("norm", a.shape, axis)
    if len(axes) == 1 and ord in (None, 2) or len(axes) == 2 and ord in (None, "fro"):
        return _sqrt_zero_grad(sum(multiply(x, x), axis=axes, keepdims=keepdims))
    if len(axes) == 1 and ord == 1:
        return sum(absolute(x), axis=axes, keepdims=keepdims)
    if len(axes) == 1 and ord in (np.inf, -np.inf):
        return (max if ord > 0 else min)(absolute(x), axis=axes, keepdims=keepdims)
    raise UnsupportedError(f"norm: ord={ord!r} over {len(axes)} axis/axes of an array of shape {a.shape} is not "
                           f"supported (vector norms: None, 1, 2, inf, -inf; matrix norms: None, 'fro')"
                           f"{where_text()}")
