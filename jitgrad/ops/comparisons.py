"""Elementwise comparisons, logic and selection: < <= > >= == !=, the logical ops and bitwise ones on bools,
isnan, isfinite, maximum, minimum, `where` and what is written with it (clip, fmax, fmin, heaviside, nan_to_num).

Also the two that pass values on: `stop_gradient` (no gradient flows back) and `astype` (cast)."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements, register_method
from jitgrad.errors import ShapeError, UnsupportedError
from jitgrad.ir.graph import Atom, Aval, Eqn
from jitgrad.ir.primitive import Kind, Primitive, batch_elementwise, declare, lowerings, stop_gradient_p
from jitgrad.tracing.tracer import Tracer, bind, where_text
from jitgrad.ops.core import (ArrayLike, _math, aval_of, bool_aval, broadcast_shapes, broadcast_to, check_computable,
                              compare, convert, elementwise_primitive, result_type, ufunc_binding)

E = elementwise_primitive


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


# ---------------------------------------------------------------------- isnan, isfinite

isnan_p = E("isnan", np.isnan, None, _math("isnan"), rule=bool_aval)
isfinite_p = E("isfinite", np.isfinite, None, _math("isfinite"), rule=bool_aval)


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


# ---------------------------------------------------------------------- maximum, minimum

def _extremum_vjp(wins: str) -> Any:
    """The gradient goes to the operand that wins, half of it to each on ties; where either is NaN (the result
    is NaN) both get it; a losing operand gets +0 whatever the cotangent's sign: torch.maximum/minimum's rule."""
    def vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
        x_loses, y_loses = (L.lt(x, y), L.gt(x, y)) if wins == "max" else (L.gt(x, y), L.lt(x, y))
        won = L.select(L.eq(x, y), L.mul(g, 0.5), g)
        return L.select(x_loses, 0, won), L.select(y_loses, 0, won)
    return vjp


# Ties return the second operand, as numpy's do (maximum(-0.0, 0.0) is 0.0); NaN in either operand propagates.
maximum_p = E("maximum", np.maximum, _extremum_vjp("max"), lowerings("({0} if ({0} > {1} or {0} != {0}) else {1})"))
minimum_p = E("minimum", np.minimum, _extremum_vjp("min"), lowerings("({0} if ({0} < {1} or {0} != {0}) else {1})"))

maximum = ufunc_binding(np.maximum, maximum_p)
minimum = ufunc_binding(np.minimum, minimum_p)


# ---------------------------------------------------------------------- where, and what is written with it

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


# ---------------------------------------------------------------------- stop_gradient, casts

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
