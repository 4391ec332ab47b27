"""jitgrad's ops with numpy semantics: broadcasting, dtype promotion, axis handling.

Each function works on tracers (recording IR through `bind`) and, outside a trace, on numpy
arrays (evaluating the numpy reference). Composite ops (sigmoid, softmax, logsumexp...) are
written here from primitives, so they fuse and differentiate with no rule of their own.
"""
from __future__ import annotations

import builtins
import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from . import primitives as P
from .errors import ShapeError, TraceError, UnsupportedError
from .ir import Aval
from .tracing import Tracer, bind, builder_aval, where_text

ArrayLike = Any


def aval_of(x: ArrayLike) -> Aval:
    return builder_aval(x)


def _dummy(a: Aval) -> Any:
    """A stand-in value numpy can type: a Python scalar for weak values, a 1-element array otherwise."""
    if a.weak:
        return {"b": True, "i": 1, "u": 1, "f": 1.0}[a.dtype.kind]
    return np.ones(1, a.dtype)


@lru_cache(maxsize=None)
def _numpy_result(fn: Any, keys: tuple[tuple[str, bool], ...]) -> tuple[np.dtype, bool]:
    avals = [Aval((), np.dtype(d), w) for d, w in keys]
    with np.errstate(all="ignore"):
        out = fn(*[_dummy(a) for a in avals])
    return np.asarray(out).dtype, all(w for _, w in keys)


def result_type(fn: Any, *xs: ArrayLike) -> tuple[np.dtype, bool]:
    """The dtype numpy's `fn` gives for these operands (NEP 50: Python scalars are weak) and weakness."""
    keys = tuple((aval_of(x).dtype.str, aval_of(x).weak) for x in xs)
    return _numpy_result(fn, keys)


def broadcast_shapes(op: str, *xs: ArrayLike) -> tuple[int, ...]:
    shapes = [aval_of(x).shape for x in xs]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{op}: operands of shapes {' and '.join(str(s) for s in shapes)} do not broadcast "
                         f"together{where_text()}") from None


def convert(x: ArrayLike, dtype: Any, weak: bool = False) -> ArrayLike:
    """Cast to `dtype`; a no-op when it already has it. Constants are cast right away."""
    dtype = np.dtype(dtype)
    a = aval_of(x)
    if a.dtype == dtype and a.weak == weak:
        return x
    if not isinstance(x, Tracer):
        if weak and np.ndim(x) == 0:
            return np.asarray(x).astype(dtype).item()
        return np.asarray(x).astype(dtype)
    return bind(P.convert_p, x, dtype=dtype, weak=weak)


def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> ArrayLike:
    shape = tuple(int(d) for d in shape)
    a = aval_of(x)
    if a.shape == shape:
        return x
    try:
        np.broadcast_shapes(a.shape, shape)
        if len(a.shape) > len(shape) or np.broadcast_shapes(a.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"broadcast_to: cannot broadcast shape {a.shape} to {shape}{where_text()}") from None
    return bind(P.broadcast_to_p, x, shape=shape)


def elementwise(prim: P.Primitive, numpy_fn: Any, *xs: ArrayLike, compute_dtype: np.dtype | None = None
                ) -> ArrayLike:
    """Apply an elementwise primitive with numpy's broadcasting and promotion.

    Operands are cast to `compute_dtype` (default: the result dtype numpy gives) and broadcast
    to the common shape before the primitive is recorded.
    """
    shape = broadcast_shapes(prim.name, *xs)
    dtype, weak = result_type(numpy_fn, *xs)
    check_computable(prim.name, dtype, xs)
    cdt = dtype if compute_dtype is None else compute_dtype
    args = [broadcast_to(convert(x, cdt, weak), shape) for x in xs]
    return bind(prim, *args)


def check_computable(op: str, dtype: np.dtype, xs: Sequence[ArrayLike]) -> None:
    if dtype.kind not in "biuf" or dtype == np.float16:
        raise UnsupportedError(f"{op}: dtype {dtype} (from operands {[str(aval_of(x)) for x in xs]}) is not "
                               f"supported{where_text()}")


def compare(prim: P.Primitive, numpy_fn: Any, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Comparisons: operands promoted to their common type, result bool."""
    common, weak = result_type(np.add, x, y)
    shape = broadcast_shapes(prim.name, x, y)
    return bind(prim, *[broadcast_to(convert(v, common, weak), shape) for v in (x, y)])


# ------------------------------------------------------------------ elementwise

def _float_unary(prim: P.Primitive, numpy_fn: Any) -> Any:
    def op(x: ArrayLike) -> ArrayLike:
        return elementwise(prim, numpy_fn, x)

    op.__name__ = numpy_fn.__name__
    op.__doc__ = f"Elementwise {numpy_fn.__name__}, as numpy's (ints promote to float)."
    return op


exp = _float_unary(P.exp_p, np.exp)
expm1 = _float_unary(P.expm1_p, np.expm1)
log = _float_unary(P.log_p, np.log)
log1p = _float_unary(P.log1p_p, np.log1p)
sin = _float_unary(P.sin_p, np.sin)
cos = _float_unary(P.cos_p, np.cos)
tan = _float_unary(P.tan_p, np.tan)
tanh = _float_unary(P.tanh_p, np.tanh)
sinh = _float_unary(P.sinh_p, np.sinh)
cosh = _float_unary(P.cosh_p, np.cosh)
arcsin = _float_unary(P.arcsin_p, np.arcsin)
arccos = _float_unary(P.arccos_p, np.arccos)
arctan = _float_unary(P.arctan_p, np.arctan)
arcsinh = _float_unary(P.arcsinh_p, np.arcsinh)
arctanh = _float_unary(P.arctanh_p, np.arctanh)
sqrt = _float_unary(P.sqrt_p, np.sqrt)
negative = _float_unary(P.neg_p, np.negative)
absolute = _float_unary(P.abs_p, np.absolute)
sign = _float_unary(P.sign_p, np.sign)
floor = _float_unary(P.floor_p, np.floor)
ceil = _float_unary(P.ceil_p, np.ceil)
rint = _float_unary(P.rint_p, np.rint)


def erf(x: ArrayLike) -> ArrayLike:
    """The error function, elementwise; ints promote to float as numpy's float functions do (np.sin's rule)."""
    return elementwise(P.erf_p, np.sin, x)


def round(x: ArrayLike, decimals: int = 0) -> ArrayLike:
    """numpy.round: halves to even, as x * 10**decimals rounded then scaled back (numpy's own recipe)."""
    a = aval_of(x)
    if not a.is_float:
        return x if decimals >= 0 else convert(multiply(rint(divide(x, 10.0 ** -decimals)), 10 ** -decimals), a.dtype)
    if decimals == 0:
        return rint(x)
    if decimals > 0:
        return divide(rint(multiply(x, 10.0 ** decimals)), 10.0 ** decimals)
    return multiply(rint(divide(x, 10.0 ** -decimals)), 10.0 ** -decimals)


def isnan(x: ArrayLike) -> ArrayLike:
    return bind(P.isnan_p, x) if aval_of(x).is_float else _zeros_bool(x)


def isfinite(x: ArrayLike) -> ArrayLike:
    return bind(P.isfinite_p, x) if aval_of(x).is_float else logical_not(_zeros_bool(x))


def _zeros_bool(x: ArrayLike) -> ArrayLike:
    return broadcast_to(np.zeros((), bool), aval_of(x).shape)


def add(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.add_p, np.add, x, y)


def subtract(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.sub_p, np.subtract, x, y)


def multiply(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.mul_p, np.multiply, x, y)


def divide(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.div_p, np.true_divide, x, y)


def power(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    if isinstance(y, (int, float)) and not isinstance(y, bool):
        if y == 2:
            return multiply(x, x)
        if y == 1:
            return elementwise(P.mul_p, np.multiply, x, 1)
    return elementwise(P.pow_p, np.power, x, y)


def maximum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.maximum_p, np.maximum, x, y)


def minimum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return elementwise(P.minimum_p, np.minimum, x, y)


def arctan2(y: ArrayLike, x: ArrayLike) -> ArrayLike:
    return elementwise(P.atan2_p, np.arctan2, y, x)


def less(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.lt_p, np.less, x, y)


def less_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.le_p, np.less_equal, x, y)


def greater(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.gt_p, np.greater, x, y)


def greater_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.ge_p, np.greater_equal, x, y)


def equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.eq_p, np.equal, x, y)


def not_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return compare(P.ne_p, np.not_equal, x, y)


def _as_bool(x: ArrayLike) -> ArrayLike:
    return x if aval_of(x).dtype == np.bool_ else not_equal(x, 0)


def _logical(prim: P.Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    shape = broadcast_shapes(prim.name, x, y)
    return bind(prim, broadcast_to(_as_bool(x), shape), broadcast_to(_as_bool(y), shape))


def logical_and(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return _logical(P.logical_and_p, x, y)


def logical_or(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return _logical(P.logical_or_p, x, y)


def logical_xor(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return _logical(P.logical_xor_p, x, y)


def logical_not(x: ArrayLike) -> ArrayLike:
    return bind(P.logical_not_p, _as_bool(x))


def where(cond: ArrayLike, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Select `x` where `cond` holds, else `y` (numpy.where with three arguments)."""
    shape = broadcast_shapes("where", cond, x, y)
    dtype, weak = result_type(np.add, x, y)
    if aval_of(x).dtype == aval_of(y).dtype == np.bool_:
        dtype, weak = np.dtype(bool), False
    c = broadcast_to(_as_bool(cond), shape)
    return bind(P.where_p, c, broadcast_to(convert(x, dtype, weak), shape), broadcast_to(convert(y, dtype, weak), shape))


def clip(x: ArrayLike, lo: ArrayLike | None = None, hi: ArrayLike | None = None) -> ArrayLike:
    """numpy.clip (NaN stays NaN, hi wins when lo > hi); the gradient is 1 on the closed interval and goes
    to the bound outside it, as torch.clamp."""
    if lo is not None:
        x = where(less(x, lo), lo, x)
    if hi is not None:
        x = where(greater(x, hi), hi, x)
    return x


def fmax(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.fmax: the maximum, ignoring a NaN operand."""
    return where(isnan(y), x, where(isnan(x), y, maximum(x, y)))


def fmin(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.fmin: the minimum, ignoring a NaN operand."""
    return where(isnan(y), x, where(isnan(x), y, minimum(x, y)))


def square(x: ArrayLike) -> ArrayLike:
    return multiply(x, x)


def reciprocal(x: ArrayLike) -> ArrayLike:
    return divide(1.0, x)


def stop_gradient(x: ArrayLike) -> ArrayLike:
    """The same values, but no gradient flows back through them."""
    if not isinstance(x, Tracer):
        return x
    return bind(P.stop_gradient_p, x)


def astype(x: ArrayLike, dtype: Any) -> ArrayLike:
    dtype = np.dtype(dtype)
    check_computable("astype", dtype, [x])
    return convert(x, dtype)


# ------------------------------------------------------------------ reductions

def normalize_axes(op: str, shape: Sequence[int], axis: Any) -> tuple[int, ...]:
    """numpy's axis argument (None, int, tuple, negative) as a sorted tuple of non-negative axes."""
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, Tracer) or not isinstance(a, (int, np.integer)):
            raise UnsupportedError(f"{op}: axis must be a Python int or a tuple of ints, got {a!r}{where_text()}")
        if not -nd <= a < nd:
            raise ShapeError(f"{op}: axis {a} is out of range for an array of shape {tuple(shape)} "
                             f"(ndim {nd}){where_text()}")
        out.append(int(a) % nd if nd else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis!r}{where_text()}")
    return tuple(sorted(out))


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


# ------------------------------------------------------------------ activations

def sigmoid(x: ArrayLike) -> ArrayLike:
    """1 / (1 + exp(-x)), a primitive: stable for large |x|, gradient out * (1 - out) everywhere."""
    return elementwise(P.logistic_p, np.exp, x)


def relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0) with gradient 0 at x == 0, as torch.relu."""
    return where(greater(x, 0), x, 0.0)


def softplus(x: ArrayLike) -> ArrayLike:
    """log(1 + exp(x)), stable for large |x|."""
    return add(log1p(exp(negative(absolute(x)))), maximum(x, 0.0))


def gelu(x: ArrayLike) -> ArrayLike:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    inner = multiply(math.sqrt(2.0 / math.pi), add(x, multiply(0.044715, multiply(x, multiply(x, x)))))
    return multiply(multiply(0.5, x), add(1.0, tanh(inner)))


# ------------------------------------------------------------------ shapes

def reshape(x: ArrayLike, shape: Any) -> ArrayLike:
    a = aval_of(x)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(shape)
    if any(isinstance(d, Tracer) for d in shape):
        raise UnsupportedError(f"reshape: sizes must be Python ints, not traced values{where_text()}")
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension, got {shape}{where_text()}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or a.size % known:
            raise ShapeError(f"reshape: cannot reshape array of shape {a.shape} into {shape}{where_text()}")
        shape = tuple(a.size // known if d == -1 else int(d) for d in shape)
    if int(np.prod(shape, dtype=np.int64)) != a.size:
        raise ShapeError(f"reshape: cannot reshape array of size {a.size} (shape {a.shape}) into shape "
                         f"{shape}{where_text()}")
    if shape == a.shape:
        return x
    return bind(P.reshape_p, x, shape=tuple(int(d) for d in shape))


def transpose(x: ArrayLike, axes: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    nd = len(shape)
    if axes is None:
        perm = tuple(reversed(range(nd)))
    elif len(axes) != nd:
        raise ShapeError(f"transpose: axes {tuple(axes)} don't match an array of shape {shape}{where_text()}")
    else:
        perm = tuple(normalize_axes("transpose", shape, a)[0] for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ShapeError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape {shape}"
                         f"{where_text()}")
    if perm == tuple(range(nd)):
        return x
    return bind(P.transpose_p, x, perm=perm)


def swapaxes(x: ArrayLike, a: int, b: int) -> ArrayLike:
    nd = aval_of(x).ndim
    perm = list(range(nd))
    a, b = normalize_axes("swapaxes", aval_of(x).shape, a)[0], normalize_axes("swapaxes", aval_of(x).shape, b)[0]
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def swap_last(x: ArrayLike) -> ArrayLike:
    return swapaxes(x, -1, -2)


def expand_dims(x: ArrayLike, axis: Any) -> ArrayLike:
    shape = list(aval_of(x).shape)
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out_ndim = len(shape) + len(items)
    for a in normalize_axes("expand_dims", (1,) * out_ndim, axis):
        shape.insert(a, 1)
    return reshape(x, tuple(shape))


def squeeze(x: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    axes = tuple(i for i, d in enumerate(shape) if d == 1) if axis is None else normalize_axes("squeeze", shape, axis)
    if any(shape[i] != 1 for i in axes):
        raise ShapeError(f"squeeze: cannot select an axis to squeeze out which has size not equal to one "
                         f"(shape {shape}, axis {axis}){where_text()}")
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


def ravel(x: ArrayLike) -> ArrayLike:
    return reshape(x, (-1,))


def moveaxis(x: ArrayLike, source: Any, destination: Any) -> ArrayLike:
    """numpy.moveaxis: move axes to new positions, the others keeping their order."""
    shape = aval_of(x).shape
    src = [normalize_axes("moveaxis", shape, a)[0] for a in (source if isinstance(source, (tuple, list)) else [source])]
    dst = [normalize_axes("moveaxis", shape, a)[0]
           for a in (destination if isinstance(destination, (tuple, list)) else [destination])]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must be the same number of "
                         f"distinct axes (array of shape {shape}){where_text()}")
    order = [a for a in range(len(shape)) if a not in src]
    for d, a in sorted(zip(dst, src)):
        order.insert(d, a)
    return transpose(x, order)


def slice_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> ArrayLike:
    """The elements `starts[k] + steps[k] * i` (i < shape[k]) of each axis; a strided slice."""
    starts, steps, shape = tuple(int(v) for v in starts), tuple(int(v) for v in steps), tuple(int(v) for v in shape)
    if shape == aval_of(x).shape and all(v == 0 for v in starts) and all(v == 1 for v in steps):
        return x
    return bind(P.slice_p, x, starts=starts, steps=steps, shape=shape)


def pad_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int], value: Any
               ) -> ArrayLike:
    """An array of `shape` filled with `value`, holding `x` at the region `slice_region` would read."""
    starts, steps, shape = tuple(int(v) for v in starts), tuple(int(v) for v in steps), tuple(int(v) for v in shape)
    if shape == aval_of(x).shape and all(v == 0 for v in starts) and all(v == 1 for v in steps):
        return x
    return bind(P.pad_p, x, starts=starts, steps=steps, shape=shape, value=value)


def flip(x: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    axes = normalize_axes("flip", shape, axis)
    return slice_region(x, [shape[k] - 1 if k in axes and shape[k] else 0 for k in range(len(shape))],
                        [-1 if k in axes else 1 for k in range(len(shape))], shape)


def pad(x: ArrayLike, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> ArrayLike:
    """numpy.pad with mode='constant' and one scalar constant (not traced)."""
    a = aval_of(x)
    if mode != "constant":
        raise UnsupportedError(f"pad: mode={mode!r} is not supported (only 'constant'){where_text()}")
    if isinstance(constant_values, Tracer) or np.ndim(constant_values) != 0:
        raise UnsupportedError(f"pad: constant_values must be one constant number, got {constant_values!r}"
                               f"{where_text()}")
    if isinstance(pad_width, Tracer):
        raise UnsupportedError(f"pad: pad_width must be Python ints, not traced values{where_text()}")
    try:
        widths = np.broadcast_to(np.asarray(pad_width), (a.ndim, 2))
    except ValueError:
        raise ShapeError(f"pad: pad_width {pad_width!r} does not fit an array of shape {a.shape}{where_text()}") \
            from None
    if widths.dtype.kind not in "iu" or (widths < 0).any():
        raise ShapeError(f"pad: pad_width {pad_width!r} must be non-negative ints{where_text()}")
    shape = tuple(int(d + lo + hi) for d, (lo, hi) in zip(a.shape, widths))
    fill = np.asarray(constant_values).astype(a.dtype).item()
    return pad_region(x, [int(lo) for lo, _ in widths], [1] * a.ndim, shape, fill)


def concatenate(arrays: Sequence[ArrayLike], axis: Any = 0, dtype: Any = None) -> ArrayLike:
    """numpy.concatenate (axis=None joins the flattened arrays)."""
    arrays = list(arrays)
    if not arrays:
        raise ShapeError(f"concatenate: need at least one array to concatenate{where_text()}")
    if axis is None:
        arrays, axis = [ravel(x) for x in arrays], 0
    shapes = [aval_of(x).shape for x in arrays]
    if any(len(sh) == 0 for sh in shapes):
        raise ShapeError(f"concatenate: zero-dimensional arrays cannot be concatenated (shapes {shapes})"
                         f"{where_text()}")
    (ax,) = normalize_axes("concatenate", shapes[0], axis)
    if any(len(sh) != len(shapes[0]) or sh[:ax] + sh[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:]
           for sh in shapes):
        raise ShapeError(f"concatenate: shapes {shapes} must match except along axis {axis}{where_text()}")
    target = np.dtype(dtype) if dtype is not None else np.result_type(*[aval_of(x).dtype for x in arrays])
    arrays = [convert(x, target) for x in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return bind(P.concatenate_p, *arrays, axis=ax)


def stack(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    arrays = list(arrays)
    shapes = [aval_of(x).shape for x in arrays]
    if not arrays or any(sh != shapes[0] for sh in shapes):
        raise ShapeError(f"stack: all input arrays must have the same shape, got {shapes}{where_text()}")
    return concatenate([expand_dims(x, axis) for x in arrays], axis=axis)


def hstack(arrays: Sequence[ArrayLike]) -> ArrayLike:
    arrays = [reshape(x, (1,)) if aval_of(x).ndim == 0 else x for x in arrays]
    return concatenate(arrays, axis=0 if arrays and aval_of(arrays[0]).ndim == 1 else 1)


def vstack(arrays: Sequence[ArrayLike]) -> ArrayLike:
    return concatenate([reshape(x, (1, -1)) if aval_of(x).ndim < 2 else x for x in arrays], axis=0)


def _split(op: str, x: ArrayLike, indices_or_sections: Any, axis: int, equal: bool) -> list[ArrayLike]:
    shape = aval_of(x).shape
    (ax,) = normalize_axes(op, shape, axis)
    n = shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or equal and n % sections:
            raise ShapeError(f"{op}: cannot split axis {axis} of length {n} (shape {shape}) into {sections} equal "
                             f"sections{where_text()}")
        sizes = [n // sections + (1 if k < n % sections else 0) for k in range(sections)]
        bounds = [int(b) for b in np.cumsum([0] + sizes)]
    else:
        bounds = [0] + [int(np.clip(b if b >= 0 else b + n, 0, n)) for b in indices_or_sections] + [n]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        size = builtins.max(hi - lo, 0)
        parts.append(slice_region(x, [lo if k == ax else 0 for k in range(len(shape))], [1] * len(shape),
                                  [size if k == ax else d for k, d in enumerate(shape)]))
    return parts


def split(x: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("split", x, indices_or_sections, axis, equal=True)


def array_split(x: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("array_split", x, indices_or_sections, axis, equal=False)


def tile(x: ArrayLike, reps: Any) -> ArrayLike:
    """numpy.tile as a broadcast of interleaved unit axes, then a reshape merging each pair."""
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    if any(not isinstance(r, (int, np.integer)) or r < 0 for r in reps):
        raise ShapeError(f"tile: reps must be non-negative ints, got {reps!r}{where_text()}")
    shape = aval_of(x).shape
    nd = builtins.max(len(shape), len(reps))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    interleaved = reshape(x, [v for d in shape for v in (1, d)])
    spread = broadcast_to(interleaved, [v for r, d in zip(reps, shape) for v in (r, d)])
    return reshape(spread, [r * d for r, d in zip(reps, shape)])


def repeat(x: ArrayLike, repeats: Any, axis: Any = None) -> ArrayLike:
    """numpy.repeat with constant repeats (one count, or one per element along the axis)."""
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    (ax,) = normalize_axes("repeat", shape, axis)
    if isinstance(repeats, Tracer):
        raise UnsupportedError(f"repeat: traced repeats give a data-dependent shape; pass constant counts"
                               f"{where_text()}")
    counts = np.asarray(repeats)
    if counts.dtype.kind not in "iu" or (counts < 0).any() or counts.ndim > 1 or \
            counts.ndim == 1 and counts.shape[0] not in (1, shape[ax]):
        raise ShapeError(f"repeat: repeats {repeats!r} must be non-negative ints, one or one per element of axis "
                         f"{axis} (shape {shape}){where_text()}")
    if counts.size == 1:
        r = int(counts.reshape(-1)[0])
        spread = broadcast_to(expand_dims(x, ax + 1), shape[:ax + 1] + (r,) + shape[ax + 1:])
        return reshape(spread, shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])
    return take(x, np.repeat(np.arange(shape[ax]), counts), axis=ax)


# ------------------------------------------------------------------ indexing

def gather(x: ArrayLike, indices: Sequence[ArrayLike]) -> ArrayLike:
    """x[i0, i1, ...] for integer arrays of one shape indexing the leading axes (a host step)."""
    return bind(P.gather_p, x, *indices)


def scatter_add(g: ArrayLike, indices: Sequence[ArrayLike], shape: Sequence[int]) -> ArrayLike:
    """zeros(shape) with `g` added at [i0, i1, ...]; repeated indices accumulate, as np.add.at."""
    return bind(P.scatter_add_p, g, *indices, shape=tuple(int(d) for d in shape))


def _index_array(k: Any, shape: tuple[int, ...]) -> Any:
    """An integer index array (traced, or a constant as int64); anything else is a mistake we name."""
    if isinstance(k, Tracer):
        if k.dtype == np.bool_:
            raise UnsupportedError(f"indexing an array of shape {shape} with a traced boolean mask gives a "
                                   f"data-dependent shape; use np.where(mask, x, 0) or a constant mask"
                                   f"{where_text()}")
        if k.dtype.kind not in "iu":
            raise TraceError(f"indexing an array of shape {shape}: arrays used as indices must be of integer (or "
                             f"boolean) type, got {k.aval}{where_text()}")
        return k
    arr = np.asarray(k)
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iub":
        raise TraceError(f"indexing an array of shape {shape}: only integers, slices, None, ..., and integer or "
                         f"boolean arrays are valid indices, got {k!r}{where_text()}")
    return arr if arr.dtype == np.bool_ else arr.astype(np.int64)


def _index_entries(shape: tuple[int, ...], key: Any) -> list[tuple[str, Any]]:
    """The key as one entry per indexed axis or new axis: ("slice", s), ("int", i), ("array", a), ("new", None)."""
    items = key if isinstance(key, tuple) else (key,)
    parsed: list[tuple[str, Any]] = []
    for k in items:
        if k is None:
            parsed.append(("new", None))
        elif k is Ellipsis:
            parsed.append(("ellipsis", None))
        elif isinstance(k, slice):
            parsed.append(("slice", k))
        elif isinstance(k, (bool, np.bool_)) or isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype == np.bool_:
            raise UnsupportedError(f"indexing with a scalar boolean is not supported (array of shape {shape})"
                                   f"{where_text()}")
        elif isinstance(k, (int, np.integer)):
            parsed.append(("int", int(k)))
        else:
            arr = _index_array(k, shape)
            parsed.append(("mask" if isinstance(arr, np.ndarray) and arr.dtype == np.bool_ else "array", arr))
    if [kind for kind, _ in parsed].count("ellipsis") > 1:
        raise ShapeError(f"an index can only have a single ellipsis ('...'), got {key!r}{where_text()}")
    used = builtins.sum(v.ndim if kind == "mask" else 1 for kind, v in parsed if kind not in ("new", "ellipsis"))
    if used > len(shape):
        raise ShapeError(f"too many indices for array: array of shape {shape} is {len(shape)}-dimensional, but "
                         f"{used} were indexed{where_text()}")
    fill = [("slice", slice(None))] * (len(shape) - used)
    at = next((i for i, (kind, _) in enumerate(parsed) if kind == "ellipsis"), len(parsed))
    parsed = parsed[:at] + fill + parsed[at + 1:]
    entries: list[tuple[str, Any]] = []
    axis = 0
    for kind, v in parsed:
        if kind == "mask":
            if v.shape != shape[axis:axis + v.ndim]:
                raise ShapeError(f"boolean index of shape {v.shape} does not match the indexed axes "
                                 f"{shape[axis:axis + v.ndim]} of an array of shape {shape}{where_text()}")
            entries += [("array", i.astype(np.int64)) for i in np.nonzero(v)]
        else:
            entries.append((kind, v))
        axis += 0 if kind == "new" else v.ndim if kind == "mask" else 1
    return entries


def getitem(x: ArrayLike, key: Any) -> ArrayLike:
    """x[key] with numpy semantics: basic slicing (steps, negative indices, None, ...) is a strided slice
    and reshape; integer-array and constant boolean-mask indexing is a gather whose gradient scatter-adds."""
    shape = aval_of(x).shape
    entries = _index_entries(shape, key)
    advanced = any(kind == "array" for kind, _ in entries)
    if advanced:
        entries = [("array", np.asarray(v, np.int64)) if kind == "int" else (kind, v) for kind, v in entries]
    picks: list[tuple[int, int, int]] = []  # per indexed axis: (start, step, length) of the basic slice
    axes: list[int | None] = []  # per entry: the array axis it indexes (None for a new axis)
    for kind, v in entries:
        if kind == "new":
            axes.append(None)
            continue
        axes.append(len(picks))
        picks.append(_basic_pick(kind, v, len(picks), shape))
    starts, steps, lengths = ([p[j] for p in picks] for j in range(3))
    y = slice_region(x, starts, steps, lengths)
    if not advanced:
        out = [1 if ax is None else lengths[ax] for (kind, _), ax in zip(entries, axes) if kind != "int"]
        return reshape(y, out)
    return _advanced_index(y, entries, axes, lengths)


def _basic_pick(kind: str, v: Any, axis: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(start, step, length) a slice, an int or an index array (the whole axis) selects from `axis`."""
    n = shape[axis]
    if kind == "slice":
        if builtins.any(isinstance(b, Tracer) for b in (v.start, v.stop, v.step)):
            raise UnsupportedError(f"slice bounds must be Python ints, not traced values (array of shape {shape})"
                                   f"{where_text()}")
        if v.step == 0:
            raise ShapeError(f"slice step cannot be zero (array of shape {shape}){where_text()}")
        start, stop, step = v.indices(n)
        length = len(range(start, stop, step))
        return (start if length else 0), step, length
    bad = None
    if kind == "int" and not -n <= v < n:
        bad = v
    elif isinstance(v, np.ndarray) and v.size and not ((-n <= v) & (v < n)).all():
        bad = v[(v < -n) | (v >= n)][0]
    if bad is not None:
        raise ShapeError(f"index {bad} is out of bounds for axis {axis} with size {n} (array of shape {shape})"
                         f"{where_text()}")
    return (v % n, 1, 1) if kind == "int" else (0, 1, n)


def _advanced_index(y: ArrayLike, entries: list[tuple[str, Any]], axes: list[int | None],
                    lengths: list[int]) -> ArrayLike:
    """Gather along the array-indexed axes of `y`; the index dimensions go where the first index array was
    when the index arrays are adjacent in the key, else first (numpy's rule)."""
    positions = [k for k, (kind, _) in enumerate(entries) if kind == "array"]
    arrays = [entries[k][1] for k in positions]
    try:
        batch = tuple(np.broadcast_shapes(*[aval_of(a).shape for a in arrays]))
    except ValueError:
        raise ShapeError(f"shape mismatch: indexing arrays could not be broadcast together with shapes "
                         f"{' '.join(str(aval_of(a).shape) for a in arrays)}{where_text()}") from None
    indexed = [axes[k] for k in positions]
    rest = [ax for (kind, _), ax in zip(entries, axes) if kind == "slice"]
    moved = transpose(y, indexed + rest)
    taken = gather(moved, [broadcast_to(a, batch) for a in arrays])
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    before = builtins.sum(1 for kind, _ in entries[:positions[0]] if kind == "slice") if adjacent else 0
    nb = len(batch)
    order = [nb + k for k in range(before)] + list(range(nb)) + [nb + k for k in range(before, len(rest))]
    taken = transpose(taken, order)
    out: list[int] = [] if adjacent else list(batch)
    for k, ((kind, _), ax) in enumerate(zip(entries, axes)):
        if kind == "new":
            out.append(1)
        elif kind == "slice":
            out.append(lengths[ax])
        elif adjacent and k == positions[0]:
            out.extend(batch)
    return reshape(taken, out)


def take(x: ArrayLike, indices: Any, axis: Any = None) -> ArrayLike:
    """numpy.take: the index dimensions replace `axis` (the flattened array when axis is None)."""
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    (ax,) = normalize_axes("take", shape, axis)
    return getitem(x, (slice(None),) * ax + (_take_index("take", indices, shape),))


def _take_index(op: str, indices: Any, shape: tuple[int, ...]) -> Any:
    idx = _index_array(indices, shape)
    if isinstance(idx, np.ndarray) and idx.dtype == np.bool_:
        raise TraceError(f"{op}: indices must be integers, got a boolean array (array of shape {shape})"
                         f"{where_text()}")
    return idx


def take_along_axis(x: ArrayLike, indices: Any, axis: Any) -> ArrayLike:
    """numpy.take_along_axis: `indices` (same ndim as x) picks along `axis`, broadcasting the other axes."""
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    idx = _take_index("take_along_axis", indices, shape)
    if aval_of(idx).ndim != len(shape):
        raise ShapeError(f"take_along_axis: indices of shape {aval_of(idx).shape} must have as many dimensions as "
                         f"the array of shape {shape}{where_text()}")
    (ax,) = normalize_axes("take_along_axis", shape, axis)
    key = tuple(idx if k == ax else np.arange(d).reshape([-1 if j == k else 1 for j in range(len(shape))])
                for k, d in enumerate(shape))
    return getitem(x, key)


# ------------------------------------------------------------------ linear algebra

def matmul(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.matmul: 1-D operands are promoted and squeezed, batch dimensions broadcast."""
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        raise ShapeError(f"matmul: operands must not be 0-d (shapes {ax.shape}, {ay.shape}); use *{where_text()}")
    dtype, weak = result_type(np.add, x, y)
    check_computable("matmul", dtype, (x, y))
    x2 = reshape(x, (1,) + ax.shape) if ax.ndim == 1 else x
    y2 = reshape(y, ay.shape + (1,)) if ay.ndim == 1 else y
    sx, sy = aval_of(x2).shape, aval_of(y2).shape
    if sx[-1] != sy[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {ax.shape} @ {ay.shape} ({sx[-1]} != {sy[-2]})"
                         f"{where_text()}")
    try:
        batch = tuple(np.broadcast_shapes(sx[:-2], sy[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions of {ax.shape} and {ay.shape} do not broadcast{where_text()}") \
            from None
    x2 = broadcast_to(convert(x2, dtype, weak), batch + sx[-2:])
    y2 = broadcast_to(convert(y2, dtype, weak), batch + sy[-2:])
    out = bind(P.matmul_p, x2, y2)
    out_shape = batch + ((sx[-2],) if ax.ndim > 1 else ()) + ((sy[-1],) if ay.ndim > 1 else ())
    return reshape(out, out_shape)


def matmul_nd(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """matmul of operands that already have equal batch shapes and dtype (used by VJP rules)."""
    return bind(P.matmul_p, x, y)


def dot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.dot: products for 0-d operands, matmul up to 2-D, else a sum over x's last and y's
    second-to-last axis."""
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        return multiply(x, y)
    if ax.ndim <= 2 and ay.ndim <= 2:
        return matmul(x, y)
    return tensordot(x, y, ([-1], [0 if ay.ndim == 1 else -2]), op="dot")


def inner(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.inner: a sum over the last axes of both operands."""
    if aval_of(x).ndim == 0 or aval_of(y).ndim == 0:
        return multiply(x, y)
    return tensordot(x, y, ([-1], [-1]), op="inner")


def outer(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return multiply(reshape(x, (-1, 1)), reshape(y, (1, -1)))


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tensordot(x: ArrayLike, y: ArrayLike, axes: Any = 2, op: str = "tensordot") -> ArrayLike:
    """numpy.tensordot: sum over `axes` (a count of x's last / y's first axes, or two axis lists)."""
    sx, sy = aval_of(x).shape, aval_of(y).shape
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= builtins.min(len(sx), len(sy)):
            raise ShapeError(f"{op}: cannot sum over {axes} axes of shapes {sx} and {sy}{where_text()}")
        ax_x, ax_y = list(range(len(sx) - axes, len(sx))), list(range(axes))
    else:
        ax_x, ax_y = ([a] if isinstance(a, (int, np.integer)) else list(a) for a in axes)
        ax_x = [normalize_axes(op, sx, a)[0] for a in ax_x]
        ax_y = [normalize_axes(op, sy, a)[0] for a in ax_y]
    if len(ax_x) != len(ax_y) or any(sx[a] != sy[b] for a, b in zip(ax_x, ax_y)):
        raise ShapeError(f"{op}: shape-mismatch for sum: axes {ax_x} of {sx} and {ax_y} of {sy}{where_text()}")
    if len(sx) + len(sy) - len(ax_x) > len(_LETTERS):
        raise UnsupportedError(f"{op}: too many dimensions ({sx}, {sy}){where_text()}")
    lx = _LETTERS[:len(sx)]
    fresh = iter(_LETTERS[len(sx):])
    ly = "".join(lx[ax_x[ax_y.index(k)]] if k in ax_y else next(fresh) for k in range(len(sy)))
    out = "".join(c for k, c in enumerate(lx) if k not in ax_x) + "".join(c for k, c in enumerate(ly)
                                                                         if k not in ax_y)
    return einsum(f"{lx},{ly}->{out}", x, y)


def einsum(subscripts: str, *operands: ArrayLike) -> ArrayLike:
    """numpy.einsum without '...': contracts operands left to right, each pair by transposes, reshapes and one
    (batched) matmul, or a broadcast multiply when nothing is summed; repeated letters take diagonals."""
    if not isinstance(subscripts, str):
        raise UnsupportedError(f"einsum: only the subscripts-string form is supported{where_text()}")
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise UnsupportedError(f"einsum: '...' in {subscripts!r} is not supported{where_text()}")
    lhs, arrow, out = spec.partition("->")
    terms = lhs.split(",")
    shapes = [aval_of(x).shape for x in operands]
    if len(terms) != len(operands) or not builtins.all(c.isalpha() for c in lhs.replace(",", "") + out):
        raise ShapeError(f"einsum: subscripts {subscripts!r} do not fit {len(operands)} operand(s) of shapes "
                         f"{shapes}{where_text()}")
    if not arrow:
        out = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    if len(set(out)) != len(out) or any(c not in lhs for c in out):
        raise ShapeError(f"einsum: output subscripts {out!r} must be distinct letters of the inputs "
                         f"({subscripts!r}){where_text()}")
    sizes: dict[str, int] = {}
    for term, sh in zip(terms, shapes):
        if len(term) != len(sh):
            raise ShapeError(f"einsum: subscripts {term!r} have {len(term)} letters for an operand of shape {sh} "
                             f"({subscripts!r}){where_text()}")
        for c, d in zip(term, sh):
            if sizes.get(c, 1) not in (1, d) and d != 1:
                raise ShapeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {d} in operands of shapes "
                                 f"{shapes} ({subscripts!r}){where_text()}")
            sizes[c] = builtins.max(sizes.get(c, 1), d)
    dtype = np.result_type(*[aval_of(x).dtype for x in operands])
    check_computable("einsum", dtype, operands)
    pairs = []
    for term, x in zip(terms, operands):
        x = broadcast_to(convert(x, dtype), [sizes[c] for c in term])
        pairs.append(_unique_letters(x, term))
    acc, acc_term = pairs[0]
    for k, (x, term) in enumerate(pairs[1:], start=1):
        needed = set(out).union(*[t for _, t in pairs[k + 1:]])
        acc, acc_term = _contract(acc, acc_term, x, term, needed)
    acc, acc_term = _sum_letters(acc, acc_term, set(acc_term) - set(out))
    return transpose(acc, [acc_term.index(c) for c in out])


def _unique_letters(x: ArrayLike, term: str) -> tuple[ArrayLike, str]:
    """Take the diagonal over each letter repeated in `term` ('ii' -> 'i')."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        where_c = [k for k, t in enumerate(term) if t == c]
        rest = [k for k, t in enumerate(term) if t != c]
        n = aval_of(x).shape[where_c[0]]
        x = gather(transpose(x, where_c + rest), [np.arange(n)] * len(where_c))
        term = c + "".join(term[k] for k in rest)
    return x, term


def _sum_letters(x: ArrayLike, term: str, letters: set[str]) -> tuple[ArrayLike, str]:
    axes = tuple(k for k, c in enumerate(term) if c in letters)
    return (sum(x, axis=axes), "".join(c for c in term if c not in letters)) if axes else (x, term)


def _contract(x: ArrayLike, tx: str, y: ArrayLike, ty: str, needed: set[str]) -> tuple[ArrayLike, str]:
    """Contract two operands over their shared letters that no later operand or the output needs."""
    x, tx = _sum_letters(x, tx, set(tx) - set(ty) - needed)
    y, ty = _sum_letters(y, ty, set(ty) - set(tx) - needed)
    batch = [c for c in tx if c in ty and c in needed]
    summed = [c for c in tx if c in ty and c not in needed]
    only_x = [c for c in tx if c not in ty]
    only_y = [c for c in ty if c not in tx]
    sx = dict(zip(tx, aval_of(x).shape))
    sy = dict(zip(ty, aval_of(y).shape))
    dims = [sx[c] for c in batch]
    if not summed:
        xt = reshape(transpose(x, [tx.index(c) for c in batch + only_x]),
                     dims + [sx[c] for c in only_x] + [1] * len(only_y))
        yt = reshape(transpose(y, [ty.index(c) for c in batch + only_y]),
                     dims + [1] * len(only_x) + [sy[c] for c in only_y])
        return multiply(xt, yt), "".join(batch + only_x + only_y)
    m = int(np.prod([sx[c] for c in only_x], dtype=np.int64))
    k = int(np.prod([sx[c] for c in summed], dtype=np.int64))
    n = int(np.prod([sy[c] for c in only_y], dtype=np.int64))
    xt = reshape(transpose(x, [tx.index(c) for c in batch + only_x + summed]), dims + [m, k])
    yt = reshape(transpose(y, [ty.index(c) for c in batch + summed + only_y]), dims + [k, n])
    product = matmul(xt, yt)
    return reshape(product, dims + [sx[c] for c in only_x] + [sy[c] for c in only_y]), "".join(batch + only_x + only_y)


# ------------------------------------------------------------------ constants

def full_like(x: ArrayLike, fill_value: Any, dtype: Any = None, shape: Any = None) -> ArrayLike:
    """An array of x's shape and dtype (or the given ones) holding `fill_value`, a constant of the graph
    unless the fill value itself is traced."""
    a = aval_of(x)
    dtype = np.dtype(dtype) if dtype is not None else a.dtype
    check_computable("full_like", dtype, [x])
    shape = a.shape if shape is None else ((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
    fill = convert(fill_value, dtype) if isinstance(fill_value, Tracer) else np.asarray(fill_value).astype(dtype)
    return broadcast_to(fill, shape)


def zeros_like(x: ArrayLike, dtype: Any = None, shape: Any = None) -> ArrayLike:
    return full_like(x, 0, dtype, shape)


def ones_like(x: ArrayLike, dtype: Any = None, shape: Any = None) -> ArrayLike:
    return full_like(x, 1, dtype, shape)


# ------------------------------------------------------------------ indexing syntax on tracers

def _tracer_iter(t: Tracer) -> Any:
    if t.ndim == 0:
        raise TypeError(f"iteration over a 0-d traced array{where_text()}")
    return (getitem(t, k) for k in range(t.shape[0]))


def _tracer_setitem(t: Tracer, key: Any, value: Any) -> None:
    raise UnsupportedError(f"traced arrays are immutable: x[...] = v cannot be traced (array of shape {t.shape}); "
                           f"build the result with np.where, np.concatenate or np.pad{where_text()}")


Tracer.__getitem__ = getitem
Tracer.__iter__ = _tracer_iter
Tracer.__setitem__ = _tracer_setitem
