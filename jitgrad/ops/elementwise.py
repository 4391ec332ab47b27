"""Elementwise ops with numpy's broadcasting and promotion: arithmetic, math, comparisons, logic, where."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import primitives as P
from ..tracing import Tracer, bind
from .core import ArrayLike, aval_of, broadcast_shapes, broadcast_to, check_computable, compare, convert, elementwise, result_type


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
