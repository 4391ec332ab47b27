"""More elementwise ops: fmod, floor division and divmod, hypot, logaddexp and logaddexp2, copysign, ldexp,
cbrt and arccosh as primitives; sinc, the degree/radian conversions, heaviside and nan_to_num as composites
of existing primitives, each numpy's own recipe (so numpy's numbers). Apart from `elementwise` so that
module stays one readable table; this one is imported after it and reads its bindings.

Templates are written with numpy's scalar functions (numba's CPU target calls those); a device backend
derives its own from them in its folder of kernels/ (naming `math` instead, say)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, TraceError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import lowerings
from jitgrad.tracing.tracer import bind, where_text
from jitgrad.ops.core import (ArrayLike, aval_of, broadcast_shapes, broadcast_to, check_computable, convert,
                              elementwise_primitive, fitting_python_int, result_type, ufunc_binding)
from jitgrad.ops.elementwise import divide, equal, isnan, less, multiply, not_equal, remainder, sin, where

E = elementwise_primitive
LN2 = "0.693147180559945309417232121458176568"  # numpy's NPY_LOGE2, rounded to the operands' type
LOG2E = "1.442695040888963407359924681001892137"  # numpy's NPY_LOG2E
EXPONENT_CLAMP = 100_000  # ldexp exponents beyond this saturate any float (float64 needs at most ±2098)


def _trunc(z: Any) -> Any:
    """z rounded toward zero (floor of |z|, signed)."""
    return L.select(L.lt(z, 0), L.neg(L.floor(L.neg(z))), L.floor(z))


# ---------------------------------------------------------------------- fmod, floor division

# fmod: C's, the sign of the dividend. Integers: 0 for a zero divisor and for -1 (whose hardware division of
# the smallest int would trap), else the floor remainder moved by one divisor where it has the wrong sign.
_MOD = "{0} % {1}"
_FMOD_INT = (f"({{cast}}(0) if ({{1}} == 0 or {{1}} == -1) else ({_MOD} - {{1}} if ({_MOD} != 0 and "
             f"(({_MOD} < 0) != ({{0}} < 0))) else {_MOD}))")
fmod_p = E("fmod", np.fmod, lambda g, x, y, out: (g, L.neg(L.mul(g, _trunc(L.div(x, y))))),
           lowerings("{cast}(np.fmod({0}, {1}))", integer=_FMOD_INT))

# numpy's float floor division (npy_divmod): the quotient (x - fmod(x, y)) / y, one less where the remainder
# is nonzero and the signs of x and y differ, snapped to the nearest whole number (up only past .5), with the
# sign of x / y (numpy's: a zero quotient takes it explicitly, any other already has it); x / y where y is 0.
# Subtracting +0 leaves every value (-0, nan) as it is. Integers: 0 for a zero divisor, -x for -1 (the
# smallest int stays itself, without the hardware trap), else Python's floor division.
_M = "np.fmod({0}, {1})"
_D = f"((({{0}} - {_M}) / {{1}}) - ({{cast}}(1) if ({_M} != 0 and (({{1}} < 0) != ({{0}} < 0))) else {{cast}}(0)))"
_FLOOR = f"np.floor({_D})"
_SNAP = f"({_FLOOR} - ({{cast}}(-1) if {_D} - {_FLOOR} > {{cast}}(0.5) else {{cast}}(0)))"
_FLOOR_DIVIDE = f"({{0}} / {{1}} if {{1}} == 0 else np.copysign({_SNAP}, {{0}} / {{1}}))"
floor_divide_p = L.floor_divide_p = E("floor_divide", np.floor_divide, None, lowerings(
    _FLOOR_DIVIDE, integer="({cast}(0) if {1} == 0 else ((-{0}) if {1} == -1 else {0} // {1}))"))

fmod = ufunc_binding(np.fmod, fmod_p)
floor_divide = ufunc_binding(np.floor_divide, floor_divide_p)


@implements(np.divmod, export="divmod")
def divmod_pair(x1: ArrayLike, x2: ArrayLike, /) -> tuple[ArrayLike, ArrayLike]:
    """numpy.divmod: (x1 // x2, x1 % x2), each numpy's bits (numpy computes both by the same rule)."""
    return floor_divide(x1, x2), remainder(x1, x2)


# ---------------------------------------------------------------------- hypot, logaddexp, copysign

def _hypot_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """d/dx = x / out, d/dy = y / out; both 0 at the origin (np.linalg.norm's convention; torch.hypot gives NaN)."""
    origin = L.eq(out, 0)
    safe = L.select(origin, 1, out)
    return L.select(origin, 0, L.div(L.mul(g, x), safe)), L.select(origin, 0, L.div(L.mul(g, y), safe))


def _copysign_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, None]:
    """d/dx = g * (out / x): g * ±1, g * 0 where x is 0; none to the sign's source: torch.copysign's rule."""
    zero = L.eq(x, 0)
    return L.mul(g, L.select(zero, 0, L.div(out, L.select(zero, 1, x)))), None


def _logaddexp_template(log_term: str, tie: str) -> str:
    """numpy's npy_logaddexp (and 2): equal operands (infinities too) add `tie`; else the larger operand plus
    `log_term` of the negative difference (its `DIFF`); a NaN difference is returned as it is."""
    neg, pos = log_term.replace("DIFF", "(-({0} - {1}))"), log_term.replace("DIFF", "({0} - {1})")
    return (f"({{0}} + {tie} if {{0}} == {{1}} else ({{0}} + {neg} if {{0}} - {{1}} > 0 else "
            f"({{1}} + {pos} if {{0}} - {{1}} <= 0 else {{0}} - {{1}})))")


_LOGADDEXP = _logaddexp_template("np.log1p(np.exp(DIFF))", "{cast}(" + LN2 + ")")
_LOGADDEXP2 = _logaddexp_template("{cast}(" + LOG2E + ") * np.log1p(np.exp2(DIFF))", "{cast}(1)")

hypot_p = E("hypot", np.hypot, _hypot_vjp, lowerings("np.hypot({0}, {1})"), costly=True)
logaddexp_p = E("logaddexp", np.logaddexp,
                lambda g, x, y, out: (L.div(g, L.add(L.exp(L.sub(y, x)), 1)), L.div(g, L.add(L.exp(L.sub(x, y)), 1))),
                lowerings(_LOGADDEXP), costly=True)
logaddexp2_p = E("logaddexp2", np.logaddexp2,
                 lambda g, x, y, out: (L.div(g, L.add(L.pow(2, L.sub(y, x)), 1)),
                                       L.div(g, L.add(L.pow(2, L.sub(x, y)), 1))),
                 lowerings(_LOGADDEXP2), costly=True)
copysign_p = E("copysign", np.copysign, _copysign_vjp, lowerings("np.copysign({0}, {1})"))

hypot = ufunc_binding(np.hypot, hypot_p)
logaddexp = ufunc_binding(np.logaddexp, logaddexp_p)
logaddexp2 = ufunc_binding(np.logaddexp2, logaddexp2_p)
copysign = ufunc_binding(np.copysign, copysign_p)


# ---------------------------------------------------------------------- ldexp

def _ldexp_rule(avals: Any, **_: Any) -> Aval:
    """The mantissa's shape and dtype (the exponent is an int64 operand of the same shape)."""
    return Aval(avals[0].shape, avals[0].dtype, all(a.weak for a in avals))


def _ldexp_vjp(g: Any, x: Any, e: Any, out: Any) -> tuple[Any, None]:
    """d/dx = 2**e (ldexp of the cotangent, exact); none to the integer exponent."""
    return bind(ldexp_p, g, e), None


# numpy clamps exponents outside int32 (its loop takes a C int); clamping further changes no result.
_CLAMPED = f"np.int32(max(-{EXPONENT_CLAMP}, min({EXPONENT_CLAMP}, {{1}})))"
ldexp_p = E("ldexp", np.ldexp, _ldexp_vjp,
            lowerings(f"np.ldexp({{0}}, {_CLAMPED})"),
            rule=_ldexp_rule)


@implements(np.ldexp)
def ldexp(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.ldexp: x1 * 2**x2, exactly, for an integer x2 (a Python int must fit numpy's int32 loop)."""
    try:
        dtype, weak = result_type(np.ldexp, x1, x2)
    except TypeError:
        raise TraceError(f"numpy.ldexp of {aval_of(x1)} and {aval_of(x2)}: the exponent must be integers that "
                         f"cast safely to int64 (numpy refuses floats and uint64){where_text()}") from None
    check_computable("ldexp", dtype, (x1, x2))
    shape = broadcast_shapes("ldexp", x1, x2)
    exponent = convert(fitting_python_int(x2, np.dtype(np.int32)), np.int64)
    return bind(ldexp_p, broadcast_to(convert(x1, dtype, weak), shape), broadcast_to(exponent, shape))


# ---------------------------------------------------------------------- cbrt, arccosh

cbrt_p = E("cbrt", np.cbrt, lambda g, x, out: L.div(g, L.mul(L.mul(out, out), 3)),
           lowerings("np.cbrt({0})"), costly=True)
arccosh_p = E("arccosh", np.arccosh, lambda g, x, out: L.div(g, L.sqrt(L.sub(L.mul(x, x), 1))),
              lowerings("np.arccosh({0})"), costly=True)

cbrt = ufunc_binding(np.cbrt, cbrt_p)
arccosh = ufunc_binding(np.arccosh, arccosh_p)


# ---------------------------------------------------------------------- composites

@implements(np.sinc)
def sinc(x: ArrayLike) -> ArrayLike:
    """numpy.sinc, numpy's recipe: y = pi * x, the dtype's epsilon where y is 0, sin(y) / y (so the gradient at
    0 is 0, as torch.sinc's)."""
    y = multiply(x, math.pi)
    eps = np.asarray(np.finfo(aval_of(y).dtype).eps)
    y = where(not_equal(y, 0), y, eps)
    return divide(sin(y), y)


def _angle(ufunc: np.ufunc, numerator: float, denominator: float) -> None:
    """A degree/radian conversion: x * (numerator / denominator), the ratio taken in x's float type as numpy
    does (180.0f / NPY_PIf for float32), so the same single rounding as numpy's."""
    def op(x: ArrayLike, /) -> ArrayLike:
        dtype, weak = result_type(ufunc, x)
        check_computable(ufunc.__name__, dtype, (x,))
        return multiply(convert(x, dtype, weak), np.asarray(dtype.type(numerator) / dtype.type(denominator)))
    op.__name__ = op.__qualname__ = ufunc.__name__
    op.__doc__ = f"numpy.{ufunc.__name__}: x * ({numerator!r} / {denominator!r}), the ratio in x's float type."
    implements(ufunc)(op)


_angle(np.deg2rad, math.pi, 180.0)
_angle(np.radians, math.pi, 180.0)
_angle(np.rad2deg, 180.0, math.pi)
_angle(np.degrees, 180.0, math.pi)


@implements(np.heaviside)
def heaviside(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.heaviside: 0 where x1 < 0, x2 where x1 == 0, 1 where x1 > 0, NaN where x1 is NaN; the gradient
    reaches x2 where x1 == 0 only."""
    dtype, weak = result_type(np.heaviside, x1, x2)
    check_computable("heaviside", dtype, (x1, x2))
    shape = broadcast_shapes("heaviside", x1, x2)
    x, h0 = (broadcast_to(convert(v, dtype, weak), shape) for v in (x1, x2))
    zero, one, nan = (np.asarray(v, dtype) for v in (0, 1, np.nan))
    return where(isnan(x), nan, where(equal(x, 0), h0, where(less(x, 0), zero, one)))


@implements(np.nan_to_num)
def nan_to_num(x: ArrayLike, copy: bool = True, nan: ArrayLike = 0.0, posinf: ArrayLike = None,
               neginf: ArrayLike = None) -> ArrayLike:
    """numpy.nan_to_num: NaN, +inf and -inf replaced (by default with 0 and the dtype's largest and smallest
    values), cast to x's dtype; integer and bool arrays unchanged. copy=False (numpy's update in place) is
    refused: traced arrays are immutable."""
    if not copy:
        raise UnsupportedError(f"numpy.nan_to_num(..., copy=False) updates its argument in place, and traced "
                               f"arrays are immutable: use the returned value, x = np.nan_to_num(x){where_text()}")
    a = aval_of(x)
    if not a.is_float:
        return x
    info = np.finfo(a.dtype)
    replaced = [(isnan(x), nan), (equal(x, np.inf), info.max if posinf is None else posinf),
                (equal(x, -np.inf), info.min if neginf is None else neginf)]
    out = x
    for mask, value in replaced:
        out = where(mask, _replacement(value, a), out)
    return out


def _replacement(value: ArrayLike, a: Aval) -> ArrayLike:
    """A nan_to_num replacement in x's dtype; it must broadcast to x's shape (numpy's copyto rule)."""
    shape = aval_of(value).shape
    try:
        fits = np.broadcast_shapes(shape, a.shape) == a.shape
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(f"nan_to_num: a replacement of shape {shape} does not broadcast to the array's shape "
                         f"{a.shape}{where_text()}")
    return convert(value, a.dtype, a.weak)
