"""Elementwise transcendental functions: exp and log (bases e, 2, 10; expm1, log1p), trigonometric and hyperbolic
functions and inverses, arctan2, hypot, logaddexp(2), erf, sigmoid; sinc and degrees/radians, numpy's recipes."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements
from jitgrad.ir.primitive import lowerings
from jitgrad.ops.core import (VECMATH, ArrayLike, _math, aval_of, check_computable, convert, elementwise,
                              elementwise_primitive, result_type, ufunc_binding)
from jitgrad.ops.arithmetic import divide, multiply
from jitgrad.ops.comparisons import not_equal, where

E = elementwise_primitive
LN2 = "0.693147180559945309417232121458176568"  # numpy's NPY_LOGE2, rounded to the operands' type
LOG2E = "1.442695040888963407359924681001892137"  # numpy's NPY_LOG2E


def _exact(name: str) -> dict:
    """The lowering of exp2, log2 or log10: vecmath's (exact at integers and powers of two, where
    exp(x ln 2) and log(x) / ln 2 are not)."""
    return lowerings(f"v{name}({{0}})", imports=(f"{VECMATH}.v{name}",))


# ---------------------------------------------------------------------- exp, log, trigonometric, hyperbolic

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
arccosh_p = E("arccosh", np.arccosh, lambda g, x, out: L.div(g, L.sqrt(L.sub(L.mul(x, x), 1))),
              lowerings("np.arccosh({0})"), costly=True)


def _erf_impl(x: Any) -> np.ndarray:
    """numpy has no erf: evaluate math.erf per element in float64, round once to the input's dtype."""
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _logistic_impl(x: Any) -> Any:
    """1 / (1 + exp(-x)) without overflow (exp is only ever taken of -|x|); a narrower float is evaluated in
    float64 and rounded once, so the reference is within 1 ulp of the exact result (the first call's numbers)."""
    x = np.asarray(x)
    wide = x.astype(np.float64) if x.dtype.itemsize < 8 else x
    e = np.exp(-np.abs(wide))
    return np.where(wide >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


erf_p = E("erf", _erf_impl, lambda g, x, out: L.mul(g, L.mul(L.exp(L.neg(L.mul(x, x))), 2.0 / math.sqrt(math.pi))),
          lowerings("{cast}(math.erf({0}))"), costly=True)
logistic_p = E("logistic", _logistic_impl, lambda g, x, out: L.mul(L.mul(g, out), L.sub(1, out)),
               lowerings("vsigmoid({0})", imports=(f"{VECMATH}.vsigmoid",)), costly=True)

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
arccosh = ufunc_binding(np.arccosh, arccosh_p)


@export
def erf(x: ArrayLike) -> ArrayLike:
    """The error function, elementwise; ints promote to float as numpy's float functions do (np.sin's rule)."""
    return elementwise(erf_p, np.sin, x)


@export
def sigmoid(x: ArrayLike) -> ArrayLike:
    """1 / (1 + exp(-x)), a primitive: stable for large |x|, gradient out * (1 - out) everywhere."""
    return elementwise(logistic_p, np.exp, x)


# ---------------------------------------------------------------------- arctan2, hypot, logaddexp

def _atan2_vjp(g: Any, y: Any, x: Any, out: Any) -> tuple[Any, Any]:
    """d/dy = x / (x² + y²), d/dx = -y / (x² + y²); both 0 at the origin, as torch."""
    denom = L.add(L.mul(x, x), L.mul(y, y))
    origin = L.eq(denom, 0)
    safe = L.select(origin, 1, denom)
    return L.select(origin, 0, L.div(L.mul(g, x), safe)), L.select(origin, 0, L.neg(L.div(L.mul(g, y), safe)))


def _hypot_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """d/dx = x / out, d/dy = y / out; both 0 at the origin (np.linalg.norm's convention; torch.hypot gives NaN)."""
    origin = L.eq(out, 0)
    safe = L.select(origin, 1, out)
    return L.select(origin, 0, L.div(L.mul(g, x), safe)), L.select(origin, 0, L.div(L.mul(g, y), safe))


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
atan2_p = E("atan2", np.arctan2, _atan2_vjp, lowerings("np.arctan2({0}, {1})"), costly=True)

hypot = ufunc_binding(np.hypot, hypot_p)
logaddexp = ufunc_binding(np.logaddexp, logaddexp_p)
logaddexp2 = ufunc_binding(np.logaddexp2, logaddexp2_p)
arctan2 = ufunc_binding(np.arctan2, atan2_p)


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
