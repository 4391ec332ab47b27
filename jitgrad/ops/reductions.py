"""Reduction primitives (sum, max, min, prod) declared with how they accumulate, their numpy bindings
(np.sum and friends, ufunc.reduce, with `initial=` and `where=`), argmax/argmin, and the composites
built on them (mean, var, std, logsumexp, softmax)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements
from jitgrad.errors import ArgumentError, ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Lowering, Primitive, Reduction, declare
from jitgrad.tracing.tracer import bind, where_text
from jitgrad.ops.core import (ArrayLike, _unchanged, aval_of, batch_along_axis, batch_rebound, broadcast_to,
                              convert, normalize_axes)
from jitgrad.ops.arithmetic import add, divide, multiply, sqrt, subtract
from jitgrad.ops.comparisons import equal, isfinite, maximum, minimum, stop_gradient, where
from jitgrad.ops.transcendental import exp, log
from jitgrad.ops.shapes import ravel, reshape

NO_VALUE = np._NoValue
_REDUCTIONS = "jitgrad.kernels.cpu.reductions"


def _reduce_rule(avals: Sequence[Aval], *, axes: tuple[int, ...]) -> Aval:
    (a,) = avals
    return Aval(tuple(1 if i in axes else d for i, d in enumerate(a.shape)), a.dtype, a.weak)


def _reduce_impl(fn: Any) -> Any:
    return lambda x, *, axes: fn(x, axis=tuple(axes), keepdims=True)


def _sum_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]) -> list[Any]:
    return [L.broadcast_to(cts[0], ins[0].shape)]


def _extremum_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]
                  ) -> list[Any]:
    """The gradient goes to the extreme elements, split evenly among ties (as torch.amax and JAX)."""
    (x,), (out,), (g,) = ins, outs, cts
    hit = L.convert(L.eq(x, L.broadcast_to(out, x.shape)), g.dtype)
    count = L.reduce_sum(hit, axes)
    return [L.mul(L.broadcast_to(L.div(g, count), x.shape), hit)]


def _prod_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]) -> list[Any]:
    """d prod / d x_i is the product of the other elements, also where some are zero (as torch):
    out / x_i when the row has no zero; the product of the nonzero rest at a row's only zero; else 0."""
    (x,), (out,), (g,) = ins, outs, cts
    is_zero = L.eq(x, 0)
    zeros = L.broadcast_to(L.reduce_sum(L.convert(is_zero, np.int64), axes), x.shape)
    nonzero = L.select(is_zero, 1, x)
    others = L.broadcast_to(L.reduce(reduce_prod_p, nonzero, axes), x.shape)
    no_zero = L.div(L.broadcast_to(out, x.shape), nonzero)
    share = L.select(L.eq(zeros, 0), no_zero, L.select(L.logical_and(is_zero, L.eq(zeros, 1)), others, 0))
    return [L.mul(L.broadcast_to(g, x.shape), share)]


def _lowest(dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    return -math.inf if dtype.kind == "f" else (False if dtype == np.bool_ else int(np.iinfo(dtype).min))


def _highest(dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    return math.inf if dtype.kind == "f" else (True if dtype == np.bool_ else int(np.iinfo(dtype).max))


def _batch_reduce(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """The batch axis stays where it is; the reduced axes after it move by one."""
    d = dims[0]
    return batch_rebound(b, e, args, {"axes": tuple(a + (a >= d) for a in e.params["axes"])}, d)


def _reduction(name: str, fn: Any, vjp: Any, how: Reduction, label: str) -> Primitive:
    return declare(Primitive(name, Kind.REDUCE, _reduce_rule, _reduce_impl(fn), vjp, reduction=how,
                             simplify=_unchanged, backward_label=label, batch=_batch_reduce))


# Float sums add in fixed-order blocks, float32 ones in float64 across blocks; max/min vectorise through LLVM's
# NaN-propagating maximum/minimum, and rescan a zero result for numpy's sign of zero.
reduce_sum_p = L.reduce_sum_p = _reduction("reduce_sum", np.sum, _sum_vjp, Reduction(
    lambda dt: 0, "({0} + {1})", blocked=True, order_dependent=True, widen_floats=True), "SumBackward")
reduce_max_p = _reduction("reduce_max", np.max, _extremum_vjp, Reduction(
    _lowest, "({0} if ({0} > {1} or {0} != {0}) else {1})",
    Lowering("maximum_propagating({0}, {1})", (f"{_REDUCTIONS}.maximum_propagating",)), rescan_zero=True),
    "MaxBackward")
reduce_min_p = _reduction("reduce_min", np.min, _extremum_vjp, Reduction(
    _highest, "({0} if ({0} < {1} or {0} != {0}) else {1})",
    Lowering("minimum_propagating({0}, {1})", (f"{_REDUCTIONS}.minimum_propagating",)), rescan_zero=True),
    "MinBackward")
reduce_prod_p = _reduction("reduce_prod", np.prod, _prod_vjp, Reduction(
    lambda dt: 1, "({0} * {1})", order_dependent=True), "ProdBackward")


def reduce(prim: Primitive, x: ArrayLike, axes: tuple[int, ...]) -> ArrayLike:
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


def _masked(x: ArrayLike, where_mask: Any, fill: Any) -> ArrayLike:
    """x with the elements `where_mask` leaves out replaced by `fill` (the reduction's identity)."""
    if where_mask is True:
        return x
    mask = broadcast_to(where_mask, aval_of(x).shape) if aval_of(where_mask).shape != aval_of(x).shape else where_mask
    return where(mask, x, fill)


def _start_from(total: ArrayLike, initial: Any, combine: Any) -> ArrayLike:
    """numpy's `initial=`: the reduction starts from this value (one more term), in the result's dtype."""
    if initial is NO_VALUE:
        return total
    return combine(np.asarray(initial).astype(aval_of(total).dtype), total)


def _keepdims(value: Any) -> bool:
    return False if value is NO_VALUE else bool(value)


def _accumulate(prim: Primitive, op: str, a: ArrayLike, axis: Any, dtype: Any, keepdims: Any, initial: Any,
                where_mask: Any, identity: int, combine: Any) -> ArrayLike:
    """A sum or product in numpy's accumulation dtype, over the elements `where_mask` selects, from `initial`."""
    av = aval_of(a)
    axes = normalize_axes(op, av.shape, axis)
    x = convert(a, _accumulation_dtype(av, dtype), av.weak and dtype is None)
    total = reduce(prim, _masked(x, where_mask, identity), axes)
    return _squeeze_axes(_start_from(total, initial, combine), axes, _keepdims(keepdims))


@implements(np.sum, method="sum")
def sum(a: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: Any = NO_VALUE, initial: Any = NO_VALUE,
        where: Any = True) -> ArrayLike:
    """numpy.sum: ints and bools sum as 64-bit ints, floats keep their dtype; `initial` and `where` as numpy's."""
    return _accumulate(reduce_sum_p, "sum", a, axis, dtype, keepdims, initial, where, 0, add)


@implements(np.prod, method="prod")
def prod(a: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: Any = NO_VALUE, initial: Any = NO_VALUE,
         where: Any = True) -> ArrayLike:
    """numpy.prod (1 over empty axes); its gradient is the product of the other elements, zeros included."""
    return _accumulate(reduce_prod_p, "prod", a, axis, dtype, keepdims, initial, where, 1, multiply)


def _count(op: str, shape: tuple[int, ...], axes: tuple[int, ...], where_mask: Any, dtype: np.dtype) -> Any:
    """How many elements each result reduces: a number, or (with a mask) an array kept over `axes`."""
    if where_mask is True:
        return float(np.prod([shape[i] for i in axes], dtype=np.int64))
    mask = broadcast_to(where_mask, shape)
    return reduce(reduce_sum_p, convert(mask, dtype), axes)


@implements(np.mean, method="mean")
def mean(a: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: Any = NO_VALUE, *, where: Any = True
         ) -> ArrayLike:
    """numpy.mean: ints average in float64; an empty reduction is nan, as numpy's (with its warning)."""
    av = aval_of(a)
    axes = normalize_axes("mean", av.shape, axis)
    target = np.dtype(dtype) if dtype is not None else (av.dtype if av.is_float else np.dtype(np.float64))
    x = convert(a, target, av.weak and dtype is None)
    total = reduce(reduce_sum_p, _masked(x, where, 0), axes)
    count = _count("mean", av.shape, axes, where, target)
    if isinstance(count, float) and count == 0:
        total = multiply(total, math.nan)
    else:
        total = divide(total, count)
    return _squeeze_axes(total, axes, _keepdims(keepdims))


def _extremum(prim: Primitive, op: str, a: ArrayLike, axis: Any, keepdims: Any, initial: Any, where_mask: Any,
              fill: Any, combine: Any) -> ArrayLike:
    av = aval_of(a)
    axes = normalize_axes(op, av.shape, axis)
    if where_mask is not True and initial is NO_VALUE:
        raise ArgumentError(f"reduction operation {combine.__name__!r} does not have an identity, so to use a where "
                         f"mask one has to specify 'initial'{where_text()}")
    if initial is NO_VALUE and any(av.shape[i] == 0 for i in axes):
        raise ShapeError(f"{op}: zero-size reduction over axes {axes} of shape {av.shape} has no identity; pass "
                         f"initial={where_text()}")
    total = reduce(prim, _masked(a, where_mask, fill(av.dtype)), axes)
    return _squeeze_axes(_start_from(total, initial, combine), axes, _keepdims(keepdims))


@implements(np.max, method="max", aliases=("amax",))
def max(a: ArrayLike, axis: Any = None, keepdims: Any = NO_VALUE, initial: Any = NO_VALUE, where: Any = True
        ) -> ArrayLike:
    """numpy.max; the gradient is split evenly among tied maxima."""
    return _extremum(reduce_max_p, "max", a, axis, keepdims, initial, where, _lowest, maximum)


@implements(np.min, method="min", aliases=("amin",))
def min(a: ArrayLike, axis: Any = None, keepdims: Any = NO_VALUE, initial: Any = NO_VALUE, where: Any = True
        ) -> ArrayLike:
    """numpy.min; the gradient is split evenly among tied minima."""
    return _extremum(reduce_min_p, "min", a, axis, keepdims, initial, where, _highest, minimum)


implements(np.amax, export=False)(max)
implements(np.amin, export=False)(min)

_UFUNC_REDUCE = "(array, /, axis=0, dtype=None, out=None, keepdims=False, initial=NO_VALUE, where=True)"


@implements(np.add, ufunc_method="reduce", signature=_UFUNC_REDUCE, export=False)
def add_reduce(array: ArrayLike, /, axis: Any = 0, dtype: Any = None, keepdims: bool = False,
               initial: Any = NO_VALUE, where: Any = True) -> ArrayLike:
    """np.add.reduce: np.sum with numpy's default axis 0."""
    return sum(array, axis, dtype, keepdims, initial, where)


@implements(np.multiply, ufunc_method="reduce", signature=_UFUNC_REDUCE, export=False)
def multiply_reduce(array: ArrayLike, /, axis: Any = 0, dtype: Any = None, keepdims: bool = False,
                    initial: Any = NO_VALUE, where: Any = True) -> ArrayLike:
    return prod(array, axis, dtype, keepdims, initial, where)


@implements(np.maximum, ufunc_method="reduce", signature=_UFUNC_REDUCE, export=False)
def maximum_reduce(array: ArrayLike, /, axis: Any = 0, keepdims: bool = False, initial: Any = NO_VALUE,
                   where: Any = True) -> ArrayLike:
    return max(array, axis, keepdims, initial, where)


@implements(np.minimum, ufunc_method="reduce", signature=_UFUNC_REDUCE, export=False)
def minimum_reduce(array: ArrayLike, /, axis: Any = 0, keepdims: bool = False, initial: Any = NO_VALUE,
                   where: Any = True) -> ArrayLike:
    return min(array, axis, keepdims, initial, where)


def _arg_rule(avals: Sequence[Aval], *, axis: int) -> Aval:
    (x,) = avals
    return Aval(tuple(1 if k == axis else d for k, d in enumerate(x.shape)), np.dtype(np.int64), False)


argmax_p = declare(Primitive("argmax", Kind.HOST, _arg_rule,
                             lambda x, *, axis: np.argmax(x, axis=axis, keepdims=True).astype(np.int64),
                             batch=batch_along_axis))
argmin_p = declare(Primitive("argmin", Kind.HOST, _arg_rule,
                             lambda x, *, axis: np.argmin(x, axis=axis, keepdims=True).astype(np.int64),
                             batch=batch_along_axis))


def _arg_extremum(prim: Primitive, op: str, a: ArrayLike, axis: Any, keepdims: Any) -> ArrayLike:
    av = aval_of(a)
    keep = _keepdims(keepdims)
    if axis is None:
        flat = _arg_extremum(prim, op, ravel(a), 0, False)
        return reshape(flat, (1,) * av.ndim) if keep else flat
    if not isinstance(axis, (int, np.integer)):
        raise UnsupportedError(f"{op}: axis must be None or one int, got {axis!r}{where_text()}")
    (ax,) = normalize_axes(op, av.shape, axis)
    if av.shape[ax] == 0:
        raise ShapeError(f"{op}: attempt to get {op} of an empty sequence (axis {axis} of shape {av.shape})"
                         f"{where_text()}")
    return _squeeze_axes(bind(prim, a, axis=ax), (ax,), keep)


@implements(np.argmax, method="argmax")
def argmax(a: ArrayLike, axis: Any = None, *, keepdims: Any = NO_VALUE) -> ArrayLike:
    """numpy.argmax: index of the first maximum (int64), no gradient."""
    return _arg_extremum(argmax_p, "argmax", a, axis, keepdims)


@implements(np.argmin, method="argmin")
def argmin(a: ArrayLike, axis: Any = None, *, keepdims: Any = NO_VALUE) -> ArrayLike:
    """numpy.argmin: index of the first minimum (int64), no gradient."""
    return _arg_extremum(argmin_p, "argmin", a, axis, keepdims)


def _ddof(ddof: Any, correction: Any) -> Any:
    if correction is NO_VALUE:
        return ddof
    if ddof != 0:
        raise ArgumentError(f"ddof and correction can't be provided simultaneously{where_text()}")
    return correction


@implements(np.var, method="var")
def var(a: ArrayLike, axis: Any = None, dtype: Any = None, ddof: Any = 0, keepdims: Any = NO_VALUE, *,
        where: Any = True, correction: Any = NO_VALUE) -> ArrayLike:
    """numpy.var: the mean squared deviation, over `count - ddof` (`correction` is numpy 2's name for ddof);
    computed in `dtype` when given, as numpy's."""
    av = aval_of(a)
    axes = normalize_axes("var", av.shape, axis)
    ddof = _ddof(ddof, correction)
    target = np.dtype(dtype) if dtype is not None else (av.dtype if av.is_float else np.dtype(np.float64))
    x = convert(a, target, av.weak and dtype is None)
    centred = subtract(x, mean(x, axis=axes, keepdims=True, where=where))
    squares = reduce(reduce_sum_p, _masked(multiply(centred, centred), where, 0), axes)
    count = _count("var", av.shape, axes, where, target)
    return _squeeze_axes(divide(squares, subtract(count, ddof) if not isinstance(count, float) else count - ddof),
                         axes, _keepdims(keepdims))


@implements(np.std, method="std")
def std(a: ArrayLike, axis: Any = None, dtype: Any = None, ddof: Any = 0, keepdims: Any = NO_VALUE, *,
        where: Any = True, correction: Any = NO_VALUE) -> ArrayLike:
    """numpy.std: the square root of numpy.var; its gradient where the variance is 0 (a constant, one
    element) is 0, as torch.std's."""
    return _sqrt_zero_grad(var(a, axis, dtype, ddof, keepdims, where=where, correction=correction))


@export
def logsumexp(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """log(sum(exp(x))) computed stably by subtracting the (gradient-free) maximum."""
    axes = normalize_axes("logsumexp", aval_of(x).shape, axis)
    peak = stop_gradient(max(x, axis=axes, keepdims=True))
    peak = where(isfinite(peak), peak, 0.0)
    total = sum(exp(subtract(x, peak)), axis=axes, keepdims=True)
    return _squeeze_axes(add(log(total), peak), axes, keepdims)


@export
def softmax(x: ArrayLike, axis: Any = -1) -> ArrayLike:
    axes = normalize_axes("softmax", aval_of(x).shape, axis)
    e = exp(subtract(x, stop_gradient(max(x, axis=axes, keepdims=True))))
    return divide(e, sum(e, axis=axes, keepdims=True))


@export
def log_softmax(x: ArrayLike, axis: Any = -1) -> ArrayLike:
    return subtract(x, logsumexp(x, axis=axis, keepdims=True))


def _sqrt_zero_grad(s: ArrayLike) -> ArrayLike:
    """sqrt(s) for s >= 0 whose gradient at s == 0 is 0 (not inf), so norms of zero vectors have gradient 0."""
    zero = equal(s, 0)
    return where(zero, 0.0, sqrt(where(zero, 1.0, s)))
