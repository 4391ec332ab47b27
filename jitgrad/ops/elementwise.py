"""Elementwise primitives, each declared next to its numpy binding: arithmetic, math, comparisons,
logic and `where`; and the elementwise composites built from them (clip, fmax, square...).
Over 400 lines: the elementwise op set is one table, a primitive and its binding a line or two each;
split by theme it would scatter that table.

A primitive's line gives its numpy reference, its VJP (with `jitgrad.tracing.lax`, exact dtypes), its lowering
(the CPU's template; a device backend registers its own where it differs, in its folder of kernels/) and
whether it is costly to recompute; the line after it binds the numpy ufunc."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements, register_method
from jitgrad.errors import UnsupportedError
from jitgrad.ir.graph import Atom, Aval, Eqn
from jitgrad.ir.primitive import Kind, Primitive, batch_elementwise, declare, lowerings, stop_gradient_p
from jitgrad.tracing.tracer import Tracer, bind, where_text
from jitgrad.ops.core import (VECMATH, ArrayLike, aval_of, bool_aval, broadcast_shapes, broadcast_to,
                              check_computable, compare, convert, elementwise, elementwise_primitive, result_type,
                              ufunc_binding)

E = elementwise_primitive


def _math(name: str, vec: str | None = None) -> dict:
    """The lowering of a math function: numpy's, or vecmath's `vec`."""
    cpu = f"{vec}({{0}})" if vec else f"np.{name}({{0}})"
    return lowerings(cpu, imports=(f"{VECMATH}.{vec}",) if vec else ())


def _exact(name: str) -> dict:
    """The lowering of exp2, log2 or log10: vecmath's (exact at integers and powers of two, where
    exp(x ln 2) and log(x) / ln 2 are not)."""
    return lowerings(f"v{name}({{0}})", imports=(f"{VECMATH}.v{name}",))


# ---------------------------------------------------------------------- unary math

neg_p = L.neg_p = E("neg", np.negative, lambda g, x, out: L.neg(g), lowerings("(-{0})"),
                    simplify=lambda e, scalar_of, producer_of: _involution(e, producer_of))
exp_p = L.exp_p = E("exp", np.exp, lambda g, x, out: L.mul(g, out), _math("exp", "vexp"), costly=True)
expm1_p = E("expm1", np.expm1, lambda g, x, out: L.mul(g, L.add(out, 1)), _math("expm1", "vexpm1"), costly=True)
exp2_p = E("exp2", np.exp2, lambda g, x, out: L.mul(L.mul(g, out), math.log(2.0)), _exact("exp2"), costly=True)
log_p = L.log_p = E("log", np.log, lambda g, x, out: L.div(g, x), _math("log", "vlog"), costly=True)
log1p_p = E("log1p", np.log1p, lambda g, x, out: L.div(g, L.add(x, 1)), _math("log1p", "vlog1p"), costly=True)
log2_p = E("log2", np.log2, lambda g, x, out: L.div(L.div(g, x), math.log(2.0)), _exact("log2"), costly=True)
log10_p = E("log10", np.log10, lambda g, x, out: L.div(L.div(g, x), math.log(10.0)), _exact("log10"), costly=True)
sin_p = L.sin_p = E("sin", np.sin, lambda g, x, out: L.mul(g, L.cos(x)), _math("sin"), costly=True)
cos_p = L.cos_p = E("cos", np.cos, lambda g, x, out: L.neg(L.mul(g, L.sin(x))), _math("cos"), costly=True)
tan_p = E("tan", np.tan, lambda g, x, out: L.mul(g, L.add(L.mul(out, out), 1)), _math("tan"), costly=True)
tanh_p = E("tanh", np.tanh, lambda g, x, out: L.mul(g, L.sub(1, L.mul(out, out))), _math("tanh", "vtanh"),
           costly=True)
sinh_p = L.sinh_p = E("sinh", np.sinh, lambda g, x, out: L.mul(g, L.cosh(x)), _math("sinh"), costly=True)
cosh_p = L.cosh_p = E("cosh", np.cosh, lambda g, x, out: L.mul(g, L.sinh(x)), _math("cosh"), costly=True)
arcsin_p = E("arcsin", np.arcsin, lambda g, x, out: L.div(g, L.sqrt(L.sub(1, L.mul(x, x)))),
             _math("arcsin"), costly=True)
arccos_p = E("arccos", np.arccos, lambda g, x, out: L.neg(L.div(g, L.sqrt(L.sub(1, L.mul(x, x))))),
             _math("arccos"), costly=True)
arctan_p = E("arctan", np.arctan, lambda g, x, out: L.div(g, L.add(L.mul(x, x), 1)), _math("arctan"),
             costly=True)
arcsinh_p = E("arcsinh", np.arcsinh, lambda g, x, out: L.div(g, L.sqrt(L.add(L.mul(x, x), 1))),
              _math("arcsinh"), costly=True)
arctanh_p = E("arctanh", np.arctanh, lambda g, x, out: L.div(g, L.sub(1, L.mul(x, x))),
              _math("arctanh"), costly=True)
sqrt_p = L.sqrt_p = E("sqrt", np.sqrt, lambda g, x, out: L.div(L.mul(g, 0.5), out), _math("sqrt"))
abs_p = E("abs", np.absolute, lambda g, x, out: L.mul(g, _sign_or_zero(x, g)), lowerings("abs({0})"))
sign_p = E("sign", np.sign, None, lowerings("np.sign({0})"))
floor_p = L.floor_p = E("floor", np.floor, None, _math("floor"))
ceil_p = E("ceil", np.ceil, None, _math("ceil"))
rint_p = E("rint", np.rint, None, lowerings("np.rint({0})"))
isnan_p = E("isnan", np.isnan, None, _math("isnan"), rule=bool_aval)
isfinite_p = E("isfinite", np.isfinite, None, _math("isfinite"), rule=bool_aval)


def _sign_or_zero(x: Any, like: Any) -> Any:
    """(x > 0) - (x < 0) in `like`'s dtype: ±1, and 0 at ±0 and NaN (torch's sgn, which abs's gradient reads)."""
    dtype = L.aval(like).dtype
    return L.sub(L.convert(L.gt(x, 0), dtype), L.convert(L.lt(x, 0), dtype))


def _erf_impl(x: Any) -> np.ndarray:
    """numpy has no erf: evaluate math.erf per element in float64, round once to the input's dtype."""
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _logistic_impl(x: Any) -> Any:
    """1 / (1 + exp(-x)) without overflow: exp is only ever taken of -|x|."""
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


erf_p = E("erf", _erf_impl, lambda g, x, out: L.mul(g, L.mul(L.exp(L.neg(L.mul(x, x))), 2.0 / math.sqrt(math.pi))),
          lowerings("{cast}(math.erf({0}))"), costly=True)
logistic_p = E("logistic", _logistic_impl, lambda g, x, out: L.mul(L.mul(g, out), L.sub(1, out)),
               lowerings("vsigmoid({0})", imports=(f"{VECMATH}.vsigmoid",)), costly=True)


def _involution(e: Eqn, producer_of: Any) -> Atom | None:
    """-(-x) is x."""
    inner = producer_of(e.inputs[0])
    return inner.inputs[0] if inner is not None and inner.prim is e.prim else None


negative = ufunc_binding(np.negative, neg_p)
exp = ufunc_binding(np.exp, exp_p)
expm1 = ufunc_binding(np.expm1, expm1_p)
exp2 = ufunc_binding(np.exp2, exp2_p)
log = ufunc_binding(np.log, log_p)
log1p = ufunc_binding(np.log1p, log1p_p)
log2 = ufunc_binding(np.log2, log2_p)
log10 = ufunc_binding(np.log10, log10_p)
sin = ufunc_binding(np.sin, sin_p)
cos = ufunc_binding(np.cos, cos_p)
tan = ufunc_binding(np.tan, tan_p)
tanh = ufunc_binding(np.tanh, tanh_p)
sinh = ufunc_binding(np.sinh, sinh_p)
cosh = ufunc_binding(np.cosh, cosh_p)
arcsin = ufunc_binding(np.arcsin, arcsin_p)
arccos = ufunc_binding(np.arccos, arccos_p)
arctan = ufunc_binding(np.arctan, arctan_p)
arcsinh = ufunc_binding(np.arcsinh, arcsinh_p)
arctanh = ufunc_binding(np.arctanh, arctanh_p)
sqrt = ufunc_binding(np.sqrt, sqrt_p)
sign = ufunc_binding(np.sign, sign_p)
floor = ufunc_binding(np.floor, floor_p)
ceil = ufunc_binding(np.ceil, ceil_p)
rint = ufunc_binding(np.rint, rint_p)
absolute = ufunc_binding(np.absolute, abs_p, aliases=("abs",))
ufunc_binding(np.fabs, abs_p, name="fabs")


@implements(np.isnan)
def isnan(x: ArrayLike, /) -> ArrayLike:
    """numpy.isnan (False everywhere for integer arrays)."""
    return bind(isnan_p, x) if aval_of(x).is_float else _zeros_bool(x)


@implements(np.isfinite)
def isfinite(x: ArrayLike, /) -> ArrayLike:
    """numpy.isfinite (True everywhere for integer arrays)."""
    return bind(isfinite_p, x) if aval_of(x).is_float else logical_not(_zeros_bool(x))


def _zeros_bool(x: ArrayLike) -> ArrayLike:
    return broadcast_to(np.zeros((), bool), aval_of(x).shape)


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


@export
def erf(x: ArrayLike) -> ArrayLike:
    """The error function, elementwise; ints promote to float as numpy's float functions do (np.sin's rule)."""
    return elementwise(erf_p, np.sin, x)


@export
def sigmoid(x: ArrayLike) -> ArrayLike:
    """1 / (1 + exp(-x)), a primitive: stable for large |x|, gradient out * (1 - out) everywhere."""
    return elementwise(logistic_p, np.exp, x)


# ---------------------------------------------------------------------- binary arithmetic

def _pow_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """d/dx = y*x**(y-1) (0 where y == 0); d/dy = out*log(x): 0 where x == 0 and y >= 0, -inf at x == 0 and
    y < 0, as torch. The log reads 1 where its value is masked, so second derivatives stay finite there."""
    gx = L.select(L.eq(y, 0), 0, L.mul(g, L.mul(y, L.pow(x, L.sub(y, 1)))))
    zero_base = L.logical_and(L.eq(x, 0), L.ge(y, 0))
    gy = L.select(zero_base, 0, L.mul(L.mul(g, out), L.log(L.select(zero_base, 1, x))))
    return gx, gy


def _extremum_vjp(wins: str) -> Any:
    """The gradient goes to the operand that wins, half of it to each on ties; where either is NaN (the result
    is NaN) both get it; a losing operand gets +0 whatever the cotangent's sign: torch.maximum/minimum's rule."""
    def vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
        x_loses, y_loses = (L.lt(x, y), L.gt(x, y)) if wins == "max" else (L.gt(x, y), L.lt(x, y))
        won = L.select(L.eq(x, y), L.mul(g, 0.5), g)
        return L.select(x_loses, 0, won), L.select(y_loses, 0, won)
    return vjp


def _atan2_vjp(g: Any, y: Any, x: Any, out: Any) -> tuple[Any, Any]:
    """d/dy = x / (x² + y²), d/dx = -y / (x² + y²); both 0 at the origin, as torch."""
    denom = L.add(L.mul(x, x), L.mul(y, y))
    origin = L.eq(denom, 0)
    safe = L.select(origin, 1, denom)
    return L.select(origin, 0, L.div(L.mul(g, x), safe)), L.select(origin, 0, L.neg(L.div(L.mul(g, y), safe)))


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
# Ties return the second operand, as numpy's do (maximum(-0.0, 0.0) is 0.0); NaN in either operand propagates.
maximum_p = E("maximum", np.maximum, _extremum_vjp("max"), lowerings("({0} if ({0} > {1} or {0} != {0}) else {1})"))
minimum_p = E("minimum", np.minimum, _extremum_vjp("min"), lowerings("({0} if ({0} < {1} or {0} != {0}) else {1})"))
atan2_p = E("atan2", np.arctan2, _atan2_vjp, lowerings("np.arctan2({0}, {1})"), costly=True)

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
maximum = ufunc_binding(np.maximum, maximum_p)
minimum = ufunc_binding(np.minimum, minimum_p)
arctan2 = ufunc_binding(np.arctan2, atan2_p)


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


# ---------------------------------------------------------------------- comparisons and logic

lt_p = L.lt_p = E("lt", np.less, None, lowerings("({0} < {1})"), rule=bool_aval)
le_p = L.le_p = E("le", np.less_equal, None, lowerings("({0} <= {1})"), rule=bool_aval)
gt_p = L.gt_p = E("gt", np.greater, None, lowerings("({0} > {1})"), rule=bool_aval)
ge_p = L.ge_p = E("ge", np.greater_equal, None, lowerings("({0} >= {1})"), rule=bool_aval)
eq_p = L.eq_p = E("eq", np.equal, None, lowerings("({0} == {1})"), rule=bool_aval)
ne_p = L.ne_p = E("ne", np.not_equal, None, lowerings("({0} != {1})"), rule=bool_aval)
logical_and_p = L.logical_and_p = E("logical_and", np.logical_and, None, lowerings("({0} and {1})"), rule=bool_aval)
logical_or_p = L.logical_or_p = E("logical_or", np.logical_or, None, lowerings("({0} or {1})"), rule=bool_aval)
logical_xor_p = E("logical_xor", np.logical_xor, None, lowerings("({0} != {1})"), rule=bool_aval)
logical_not_p = L.logical_not_p = E("logical_not", np.logical_not, None, lowerings("(not {0})"), rule=bool_aval)

less = ufunc_binding(np.less, lt_p, compute=lambda x, y: compare(lt_p, x, y))
less_equal = ufunc_binding(np.less_equal, le_p, compute=lambda x, y: compare(le_p, x, y))
greater = ufunc_binding(np.greater, gt_p, compute=lambda x, y: compare(gt_p, x, y))
greater_equal = ufunc_binding(np.greater_equal, ge_p, compute=lambda x, y: compare(ge_p, x, y))
equal = ufunc_binding(np.equal, eq_p, compute=lambda x, y: compare(eq_p, x, y))
not_equal = ufunc_binding(np.not_equal, ne_p, compute=lambda x, y: compare(ne_p, x, y))


def _as_bool(x: ArrayLike) -> ArrayLike:
    return x if aval_of(x).dtype == np.bool_ else not_equal(x, 0)


def _logical(prim: Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    shape = broadcast_shapes(prim.name, x, y)
    return bind(prim, broadcast_to(_as_bool(x), shape), broadcast_to(_as_bool(y), shape))


logical_and = ufunc_binding(np.logical_and, logical_and_p, compute=lambda x, y: _logical(logical_and_p, x, y))
logical_or = ufunc_binding(np.logical_or, logical_or_p, compute=lambda x, y: _logical(logical_or_p, x, y))
logical_xor = ufunc_binding(np.logical_xor, logical_xor_p, compute=lambda x, y: _logical(logical_xor_p, x, y))
logical_not = ufunc_binding(np.logical_not, logical_not_p, compute=lambda x: bind(logical_not_p, _as_bool(x)))


def _on_bools(ufunc: np.ufunc, logical: Any) -> None:
    """Bitwise ops are their logical counterparts on bool arrays; on integers they are not supported."""
    def op(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
        avals = [aval_of(v) for v in (x1, x2)]
        if any(a.dtype != np.bool_ for a in avals):
            raise UnsupportedError(f"numpy.{ufunc.__name__} of {avals[0]} and {avals[1]}: bitwise ops are supported "
                                   f"on bool arrays only{where_text()}")
        return logical(x1, x2)
    op.__name__ = op.__qualname__ = ufunc.__name__
    implements(ufunc, export=False)(op)


_on_bools(np.bitwise_and, logical_and)
_on_bools(np.bitwise_or, logical_or)
_on_bools(np.bitwise_xor, logical_xor)


@implements(np.invert, export=False)
def invert(x: ArrayLike, /) -> ArrayLike:
    """~x: logical not of a bool array (bitwise inversion of integers is not supported)."""
    if aval_of(x).dtype != np.bool_:
        raise UnsupportedError(f"numpy.invert of {aval_of(x)}: bitwise ops are supported on bool arrays only"
                               f"{where_text()}")
    return logical_not(x)


# ---------------------------------------------------------------------- where, casts, stop_gradient

def _where_rule(avals: Any, **_: Any) -> Aval:
    return Aval(avals[1].shape, avals[1].dtype, avals[1].weak and avals[2].weak)


def _where_simplify(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | None:
    """A condition that is one constant everywhere (a gradient rule's `y == 0` for a constant exponent)
    selects one operand for every element: that operand."""
    c = scalar_of(e.inputs[0])
    if c is None:
        return None
    chosen = e.inputs[1] if c else e.inputs[2]
    return chosen if chosen.aval.shape == e.out.aval.shape and chosen.aval.dtype == e.out.aval.dtype else None


where_p = L.where_p = declare(Primitive(
    "where", Kind.ELEMENTWISE, _where_rule, np.where,
    lambda cts, ins, outs: [None, L.select(ins[0], cts[0], 0), L.select(ins[0], 0, cts[0])],
    lowerings("({1} if {0} else {2})"), simplify=_where_simplify, batch=batch_elementwise))


@implements(np.where, signature="(condition, x=NO_VALUE, y=NO_VALUE, /)")
def where(condition: ArrayLike, x: ArrayLike = np._NoValue, y: ArrayLike = np._NoValue, /) -> ArrayLike:
    """numpy.where with three arguments: `x` where `condition` holds, else `y`."""
    if x is np._NoValue or y is np._NoValue:
        raise UnsupportedError(f"numpy.where with one argument (the indices of nonzero elements) has a "
                               f"data-dependent shape and cannot be traced; use np.where(cond, a, b) to select "
                               f"values, or jg.nonzero(cond, size=N) for the first N indices (padded){where_text()}")
    shape = broadcast_shapes("where", condition, x, y)
    dtype, weak = result_type(np.add, x, y)
    if aval_of(x).dtype == aval_of(y).dtype == np.bool_:
        dtype, weak = np.dtype(bool), False
    c = broadcast_to(_as_bool(condition), shape)
    return bind(where_p, c, broadcast_to(convert(x, dtype, weak), shape), broadcast_to(convert(y, dtype, weak), shape))


@implements(np.clip, method="clip", method_signature="(self, /, min=NO_VALUE, max=NO_VALUE, out=None, **kwargs)")
def clip(a: ArrayLike, a_min: ArrayLike = np._NoValue, a_max: ArrayLike = np._NoValue, *,
         min: ArrayLike = np._NoValue, max: ArrayLike = np._NoValue) -> ArrayLike:
    """numpy.clip (also with numpy 2.1's min=/max= names): NaN in any operand gives NaN, the upper bound wins
    when the bounds cross. torch.clamp's gradient: to `a` on the closed interval, else to the bound taken (to
    `hi` if the bounds cross; to neither where `a < lo == hi`); none to anything where the result is NaN."""
    lo = _one_bound("min", a_min, min)
    hi = _one_bound("max", a_max, max)
    if lo is None and hi is None:
        return a
    if hi is None:
        return where(greater_equal(a, lo), a, where(less(a, lo), lo, stop_gradient(maximum(a, lo))))
    if lo is None:
        return where(less_equal(a, hi), a, where(greater(a, hi), hi, stop_gradient(minimum(a, hi))))
    at_least_lo = maximum(a, lo)
    inside = logical_and(greater_equal(a, lo), less_equal(a, hi))
    to_lo = logical_and(less(a, lo), less(lo, hi))
    nan_or_tied = stop_gradient(minimum(at_least_lo, hi))  # a NaN operand, or a < lo == hi: no gradient
    return where(inside, a, where(greater(at_least_lo, hi), hi, where(to_lo, lo, nan_or_tied)))


def _one_bound(name: str, positional: Any, keyword: Any) -> Any:
    given = [v for v in (positional, keyword) if v is not np._NoValue]
    if len(given) > 1:
        raise TypeError(f"numpy.clip: pass the {name} bound once (a_{name}= or {name}=, not both){where_text()}")
    return given[0] if given else None


@implements(np.fmax)
def fmax(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.fmax: the maximum, ignoring a NaN operand; a tie goes to x1 (value and gradient), as torch.fmax."""
    return where(logical_or(greater_equal(x1, x2), isnan(x2)), x1, x2)


@implements(np.fmin)
def fmin(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:
    """numpy.fmin: the minimum, ignoring a NaN operand; a tie goes to x1 (value and gradient), as torch.fmin."""
    return where(logical_or(less_equal(x1, x2), isnan(x2)), x1, x2)


@export
def stop_gradient(x: ArrayLike) -> ArrayLike:
    """The same values, but no gradient flows back through them."""
    if not isinstance(x, Tracer):
        return x
    return bind(stop_gradient_p, x)


def astype(x: ArrayLike, dtype: Any, order: str = "K", casting: str = "unsafe", subok: bool = True,
           copy: bool = True) -> ArrayLike:
    """ndarray.astype: values cast to `dtype` (casting checked as numpy does; order and copy change no value)."""
    dtype = np.dtype(dtype)
    check_computable("astype", dtype, [x])
    if casting != "unsafe" and not np.can_cast(aval_of(x).dtype, dtype, casting=casting):
        raise TypeError(f"Cannot cast array data from {aval_of(x).dtype!r} to {dtype!r} according to the rule "
                        f"{casting!r}{where_text()}")
    return convert(x, dtype)


export(astype)
register_method("astype", astype, "(self, /, dtype, order='K', casting='unsafe', subok=True, copy=True)")
