"""Elementwise arithmetic, each primitive declared next to its numpy binding: the operators (+ - * / ** % //,
negation), fmod and divmod, abs, sign and copysign, powers and roots, rounding, and ldexp.

A primitive's line gives its numpy reference, its VJP (with `jitgrad.tracing.lax`, exact dtypes), its lowering
(the CPU's template, written with numpy's scalar functions, which numba's CPU target calls; a device backend
registers its own where it differs, in its folder of kernels/) and whether it is costly to recompute; the line
after it binds the numpy ufunc."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import TraceError
from jitgrad.ir.graph import Atom, Aval, Eqn
from jitgrad.ir.primitive import lowerings
from jitgrad.tracing.tracer import bind, where_text
from jitgrad.ops.core import (ArrayLike, _math, aval_of, broadcast_shapes, broadcast_to, check_computable, convert,
                              elementwise, elementwise_primitive, fitting_python_int, result_type, ufunc_binding)

E = elementwise_primitive
EXPONENT_CLAMP = 100_000  # ldexp exponents beyond this saturate any float (float64 needs at most ±2098)


# ---------------------------------------------------------------------- negation, abs, sign, roots, rounding

neg_p = L.neg_p = E("neg", np.negative, lambda g, x, out: L.neg(g), lowerings("(-{0})"),
                    simplify=lambda e, scalar_of, producer_of: _involution(e, producer_of))
sqrt_p = L.sqrt_p = E("sqrt", np.sqrt, lambda g, x, out: L.div(L.mul(g, 0.5), out), _math("sqrt"))
abs_p = E("abs", np.absolute, lambda g, x, out: L.mul(g, _sign_or_zero(x, g)), lowerings("abs({0})"))
sign_p = E("sign", np.sign, None, lowerings("np.sign({0})"))
floor_p = L.floor_p = E("floor", np.floor, None, _math("floor"))
ceil_p = E("ceil", np.ceil, None, _math("ceil"))
rint_p = E("rint", np.rint, None, lowerings("np.rint({0})"))
cbrt_p = E("cbrt", np.cbrt, lambda g, x, out: L.div(g, L.mul(L.mul(out, out), 3)),
           lowerings("np.cbrt({0})"), costly=True)


def _sign_or_zero(x: Any, like: Any) -> Any:
    """(x > 0) - (x < 0) in `like`'s dtype: ±1, and 0 at ±0 and NaN (torch's sgn, which abs's gradient reads)."""
    dtype = L.aval(like).dtype
    return L.sub(L.convert(L.gt(x, 0), dtype), L.convert(L.lt(x, 0), dtype))


def _involution(e: Eqn, producer_of: Any) -> Atom | None:
    """-(-x) is x."""
    inner = producer_of(e.inputs[0])
    return inner.inputs[0] if inner is not None and inner.prim is e.prim else None


negative = ufunc_binding(np.negative, neg_p)
sqrt = ufunc_binding(np.sqrt, sqrt_p)
sign = ufunc_binding(np.sign, sign_p)
floor = ufunc_binding(np.floor, floor_p)
ceil = ufunc_binding(np.ceil, ceil_p)
rint = ufunc_binding(np.rint, rint_p)
absolute = ufunc_binding(np.absolute, abs_p, aliases=("abs",))
ufunc_binding(np.fabs, abs_p, name="fabs")
cbrt = ufunc_binding(np.cbrt, cbrt_p)


@implements(np.round, method="round", aliases=("around",))
def round(a: ArrayLike, decimals: int = 0) -> ArrayLike:
    """numpy.round: halves to even, as x * 10**decimals rounded then scaled back (numpy's own recipe)."""
    av = aval_of(a)
    if not av.is_float:
        return a if decimals >= 0 else convert(multiply(rint(divide(a, 10.0 ** -decimals)), 10 ** -decimals),
                                               av.dtype)
    if decimals == 0:
        return rint(a)
    if decimals > 0:
        return divide(rint(multiply(a, 10.0 ** decimals)), 10.0 ** decimals)
    return multiply(rint(divide(a, 10.0 ** -decimals)), 10.0 ** -decimals)


implements(np.around, export=False)(round)


# ---------------------------------------------------------------------- binary arithmetic

def _pow_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """d/dx = y*x**(y-1) (0 where y == 0); d/dy = out*log(x): 0 where x == 0 and y >= 0, -inf at x == 0 and
    y < 0, as torch. The log reads 1 where its value is masked, so second derivatives stay finite there."""
    gx = L.select(L.eq(y, 0), 0, L.mul(g, L.mul(y, L.pow(x, L.sub(y, 1)))))
    zero_base = L.logical_and(L.eq(x, 0), L.ge(y, 0))
    gy = L.select(zero_base, 0, L.mul(L.mul(g, out), L.log(L.select(zero_base, 1, x))))
    return gx, gy


def _unit_rewrite(unit: float, left: bool) -> Any:
    """x op unit -> x (and unit op x -> x when `left`): exact for every x, -0.0, inf and nan included."""
    def rewrite(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | None:
        x, y = e.inputs
        out = e.outs[0].aval

        def fits(a: Atom) -> bool:
            return a.aval.shape == out.shape and a.aval.dtype == out.dtype

        cy = scalar_of(y)
        if cy is not None and cy == unit and not np.signbit(cy) and fits(x):
            return x
        cx = scalar_of(x) if left else None
        if cx is not None and cx == unit and not np.signbit(cx) and fits(y):
            return y
        return None
    return rewrite


add_p = L.add_p = E("add", np.add, lambda g, x, y, out: (g, g), lowerings("({0} + {1})"))
sub_p = L.sub_p = E("sub", np.subtract, lambda g, x, y, out: (g, L.neg(g)), lowerings("({0} - {1})"),
                    simplify=_unit_rewrite(0.0, left=False))  # x - (+0) is x; x + 0 is not (-0 + 0 is +0)
mul_p = L.mul_p = E("mul", np.multiply, lambda g, x, y, out: (L.mul(g, y), L.mul(g, x)), lowerings("({0} * {1})"),
                    simplify=_unit_rewrite(1.0, left=True))
div_p = L.div_p = E("div", np.true_divide, lambda g, x, y, out: (L.div(g, y), L.neg(L.div(L.mul(g, out), y))),
                    lowerings("({0} / {1})"), simplify=_unit_rewrite(1.0, left=False))


def _pow_simplify(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | Eqn | None:
    """x ** 2 is x * x and x ** 1 is x, bit for bit as numpy computes them (its own `power` binding
    rewrites them; this catches the powers autodiff makes, such as the x ** 2 in the gradient of x ** 3)."""
    x, y = e.inputs
    c = scalar_of(y)
    if c is None or x.aval.shape != e.out.aval.shape or x.aval.dtype != e.out.aval.dtype:
        return None
    if c == 2:
        return Eqn(mul_p, (x, x), {}, e.outs, e.source, e.label)
    if c == 1:
        return x
    return None


pow_p = L.pow_p = E("pow", np.power, _pow_vjp, lowerings("({0} ** {1})"), costly=True, simplify=_pow_simplify)

# numpy's remainder (the sign of the divisor; numpy's float rule, zero signs included): fmod, moved by
# one divisor where the signs differ, -0/+0 as the divisor's sign. Integers: 0 for a zero divisor (and
# for -1, whose remainder is always 0 and whose hardware division of the smallest int would trap).
_FMOD = "{cast}(np.fmod({0}, {1}))"
_REMAINDER = f"({_FMOD} + {{1}} if ({_FMOD} != 0 and (({{1}} < 0) != ({_FMOD} < 0))) else " \
             f"({_FMOD} if {_FMOD} != 0 else np.copysign({{cast}}(0), {{1}})))"
remainder_p = E("remainder", np.remainder, lambda g, x, y, out: (g, L.neg(L.mul(g, L.floor_divide(x, y)))),
                lowerings(_REMAINDER, integer="({cast}(0) if ({1} == 0 or {1} == -1) else {0} % {1})"))

add = ufunc_binding(np.add, add_p)
remainder = ufunc_binding(np.remainder, remainder_p, aliases=("mod",))
subtract = ufunc_binding(np.subtract, sub_p)
multiply = ufunc_binding(np.multiply, mul_p)
divide = ufunc_binding(np.true_divide, div_p, name="divide")


@implements(np.power)
def power(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.power; x ** 2 is x * x (the same numbers, and a cheaper gradient); a float32 x ** 3 is
    (x * x) * x, as torch computes it (its bits; within 2 ulp of the exact cube, 1.27 ulp the largest error
    over a sweep in tests/test_product_power.py, where numpy's powf is within 1 ulp), a vectorised product
    instead of a libm call per element. A float x ** 0.5 is sqrt(x) and x ** -1 is 1 / x, as numpy's loop
    computes a scalar exponent's (so (-0.0) ** 0.5 is -0.0 and (-inf) ** 0.5 is nan, where C's pow gives +0
    and inf)."""
    if isinstance(x2, (int, float)) and not isinstance(x2, bool):
        if x2 == 2:
            return multiply(x1, x1)
        if x2 == 1:
            return elementwise(mul_p, np.multiply, x1, 1)
        a = aval_of(x1)
        if x2 == 3 and a.dtype == np.float32 and not a.weak:
            return multiply(multiply(x1, x1), x1)
        dtype, weak = result_type(np.power, x1, x2)
        if x2 in (0.5, -1) and dtype.kind == "f":
            x = convert(x1, dtype, weak)
            return sqrt(x) if x2 == 0.5 else divide(1.0, x)
    return elementwise(pow_p, np.power, x1, x2)


@implements(np.float_power)
def float_power(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.float_power: power computed in float64."""
    return power(convert(x1, np.float64), x2)


@implements(np.square)
def square(x: ArrayLike, /) -> ArrayLike:
    return multiply(x, x)


@implements(np.reciprocal)
def reciprocal(x: ArrayLike, /) -> ArrayLike:
    return divide(1.0, x) if aval_of(x).is_float else elementwise(div_p, np.reciprocal, 1, x)


@implements(np.positive)
def positive(x: ArrayLike, /) -> ArrayLike:
    return x


# ---------------------------------------------------------------------- fmod, floor division

def _trunc(z: Any) -> Any:
    """z rounded toward zero (floor of |z|, signed)."""
    return L.select(L.lt(z, 0), L.neg(L.floor(L.neg(z))), L.floor(z))


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


# ---------------------------------------------------------------------- copysign

def _copysign_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, None]:
    """d/dx = g * (out / x): g * ±1, g * 0 where x is 0; none to the sign's source: torch.copysign's rule."""
    zero = L.eq(x, 0)
    return L.mul(g, L.select(zero, 0, L.div(out, L.select(zero, 1, x)))), None


copysign_p = E("copysign", np.copysign, _copysign_vjp, lowerings("np.copysign({0}, {1})"))
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
