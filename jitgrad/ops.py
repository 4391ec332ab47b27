"""jitgrad's ops with numpy semantics: broadcasting, dtype promotion, axis handling.

Each function works on tracers (recording IR through `bind`) and, outside a trace, on numpy
arrays (evaluating the numpy reference). Composite ops (sigmoid, softmax, logsumexp...) are
written here from primitives, so they fuse and differentiate with no rule of their own.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from . import primitives as P
from .errors import ShapeError, UnsupportedError
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
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


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


def sum(x: ArrayLike, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.sum: ints and bools sum as int64, floats keep their dtype."""
    a = aval_of(x)
    axes = normalize_axes("sum", a.shape, axis)
    target = np.dtype(dtype) if dtype is not None else (a.dtype if a.is_float else np.dtype(np.int64))
    x = convert(x, target, a.weak and dtype is None)
    return _squeeze_axes(reduce(P.reduce_sum_p, x, axes), axes, keepdims)


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


# ------------------------------------------------------------------ activations

def sigmoid(x: ArrayLike) -> ArrayLike:
    """1 / (1 + exp(-x)), evaluated through exp(-|x|) so neither value nor gradient overflows."""
    e = exp(negative(absolute(x)))
    r = divide(1.0, add(e, 1.0))
    return where(greater_equal(x, 0), r, multiply(e, r))


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
    nd = aval_of(x).ndim
    perm = tuple(reversed(range(nd))) if axes is None else tuple(int(a) % nd for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ShapeError(f"transpose: axes {axes} are not a permutation of {nd} axes{where_text()}")
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
    nd = len(shape) + len(items)
    for a in sorted(int(i) % nd for i in items):
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


# ------------------------------------------------------------------ linear algebra

def matmul(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """numpy.matmul: 1-D operands are promoted and squeezed, batch dimensions broadcast."""
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        raise ShapeError(f"matmul: operands must not be 0-d (shapes {ax.shape}, {ay.shape}); use *{where_text()}")
    dtype, weak = result_type(np.add, x, y)
    check_computable("matmul", dtype, (x, y))
    if not dtype.kind == "f":
        dtype = np.dtype(np.float64)
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
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        return multiply(x, y)
    if ax.ndim <= 2 and ay.ndim <= 2:
        return matmul(x, y)
    raise UnsupportedError(f"dot: operands of {ax.ndim} and {ay.ndim} dimensions; use matmul or einsum"
                           f"{where_text()}")


def outer(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    return multiply(reshape(x, (-1, 1)), reshape(y, (1, -1)))
