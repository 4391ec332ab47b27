"""Array building: triangles and diagonals (tril, triu, diag, trace), rolls and rotations, the split, stack and
append variants, kron, cross, select, and linspace and logspace with traced endpoints. All are composites of
slices, pads, concatenation, views and where, so they fuse and differentiate with no rule of their own."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, TraceError
from jitgrad.tracing.tracer import Tracer, constant_of, where_text
from jitgrad.ops.core import (ArrayLike, aval_of, broadcast_shapes, broadcast_to, convert, normalize_axes, result_type)
from jitgrad.ops.arithmetic import add, divide, floor, multiply, negative, power, subtract
from jitgrad.ops.comparisons import astype, equal, greater, where
from jitgrad.ops.reductions import sum
from jitgrad.ops.regions import pad_region, slice_region
from jitgrad.ops.shapes import (concatenate, diagonal, expand_dims, flip, moveaxis, ravel, reshape, split, stack,
                                static_int, transpose)


def _array(x: Any) -> ArrayLike:
    """A traced value or a Python number (weak, NEP 50) as it is; anything else as a numpy array."""
    return x if isinstance(x, (Tracer, bool, int, float)) else np.asarray(x)


def _strong(x: Any) -> ArrayLike:
    """A traced value as it is, anything else as numpy's asarray makes it (a Python number strongly typed)."""
    return x if isinstance(x, Tracer) else np.asarray(x)


def _axis_slice(x: ArrayLike, axis: int, start: int, length: int, step: int = 1) -> ArrayLike:
    """`length` elements of `axis` from `start`, every `step` (the other axes whole)."""
    shape = aval_of(x).shape
    return slice_region(x, [start if k == axis else 0 for k in range(len(shape))],
                        [step if k == axis else 1 for k in range(len(shape))],
                        [length if k == axis else d for k, d in enumerate(shape)])


# ---------------------------------------------------------------------- triangles and diagonals

def _triangle(op: str, m: ArrayLike, k: Any, lower: bool) -> ArrayLike:
    m = _array(m)
    shape = aval_of(m).shape
    if not shape:
        raise ShapeError(f"{op}: a 0-d array has no triangle{where_text()}")
    rows, cols = shape[-2:] if len(shape) > 1 else (shape[0], shape[0])
    mask = np.tri(rows, cols, static_int(op, "k", k) - (0 if lower else 1), dtype=bool)
    zero = np.zeros(1, aval_of(m).dtype)
    return where(mask, m, zero) if lower else where(mask, zero, m)


@implements(np.tril)
def tril(m: ArrayLike, k: int = 0) -> ArrayLike:
    """numpy.tril: zeros above diagonal k of the last two axes (a 1-D array is its square's rows)."""
    return _triangle("tril", m, k, lower=True)


@implements(np.triu)
def triu(m: ArrayLike, k: int = 0) -> ArrayLike:
    """numpy.triu: zeros below diagonal k of the last two axes (a 1-D array is its square's rows)."""
    return _triangle("triu", m, k, lower=False)


@implements(np.diag)
def diag(v: ArrayLike, k: int = 0) -> ArrayLike:
    """numpy.diag: a 1-D array on diagonal k of a square of zeros (a mask, elementwise), or a 2-D array's
    diagonal k."""
    v = _array(v)
    shape = aval_of(v).shape
    k = static_int("diag", "k", k)
    if len(shape) == 2:
        return diagonal(v, k)
    if len(shape) != 1:
        raise ShapeError(f"diag: input must be 1- or 2-d, got shape {shape}{where_text()}")
    n = shape[0] + abs(k)
    line = pad_region(v, [0], [1], [n], 0)
    spread = reshape(line, (n, 1) if k >= 0 else (1, n))
    return where(np.eye(n, k=k, dtype=bool), spread, np.zeros(1, aval_of(v).dtype))


@implements(np.trace, method="trace", export=False)  # jg.trace is jitgrad's tracing decorator
def trace(a: ArrayLike, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None) -> ArrayLike:
    """numpy.trace: the sum of `diagonal(a, offset, axis1, axis2)` (in `dtype`, numpy's sum rules)."""
    return sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


# ---------------------------------------------------------------------- rolls and rotations

@implements(np.roll)
def roll(a: ArrayLike, shift: Any, axis: Any = None) -> ArrayLike:
    """numpy.roll: each axis rotated by its total shift (repeated axes add up), as two slices joined."""
    a = _array(a)
    shape = aval_of(a).shape
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), shape)
    shift = constant_of(shift)
    shifts = [static_int("roll", "shift", s) for s in (shift if isinstance(shift, (tuple, list, np.ndarray))
                                                       else [shift])]
    axes = [normalize_axes("roll", shape, ax)[0] for ax in (axis if isinstance(axis, (tuple, list)) else [axis])]
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    elif len(axes) == 1:
        axes = axes * len(shifts)
    elif len(shifts) != len(axes):
        raise ShapeError(f"roll: shift {shift!r} and axis {axis!r} do not broadcast together{where_text()}")
    total = dict.fromkeys(range(len(shape)), 0)
    for s, ax in zip(shifts, axes):
        total[ax] += s
    for ax, s in total.items():
        n = shape[ax]
        if n and s % n:
            s %= n
            a = concatenate([_axis_slice(a, ax, n - s, s), _axis_slice(a, ax, 0, n - s)], axis=ax)
    return a


@implements(np.rot90)
def rot90(m: ArrayLike, k: int = 1, axes: Any = (0, 1)) -> ArrayLike:
    """numpy.rot90: k quarter turns from axes[0] towards axes[1], as flips and a transpose."""
    m = _array(m)
    nd, axes = aval_of(m).ndim, tuple(axes)
    if len(axes) != 2:
        raise ShapeError(f"rot90: len(axes) must be 2, got axes={axes}{where_text()}")
    if axes[0] == axes[1] or abs(axes[0] - axes[1]) == nd:
        raise ShapeError(f"rot90: axes {axes} must be different (array of shape {aval_of(m).shape}){where_text()}")
    if not all(-nd <= ax < nd for ax in axes):
        raise ShapeError(f"rot90: axes={axes} out of range for an array of ndim={nd}{where_text()}")
    k = static_int("rot90", "k", k) % 4
    if k == 0:
        return m
    if k == 2:
        return flip(flip(m, axes[0]), axes[1])
    perm = list(range(nd))
    perm[axes[0]], perm[axes[1]] = perm[axes[1]], perm[axes[0]]
    return transpose(flip(m, axes[1]), perm) if k == 1 else flip(transpose(m, perm), axes[1])


@implements(np.rollaxis)
def rollaxis(a: ArrayLike, axis: int, start: int = 0) -> ArrayLike:
    """numpy.rollaxis: `axis` moved to just before position `start`."""
    shape = aval_of(a).shape
    n = len(shape)
    (ax,) = normalize_axes("rollaxis", shape, axis)
    given = static_int("rollaxis", "start", start)
    at = given + n if given < 0 else given
    if not 0 <= at < n + 1:
        raise ShapeError(f"rollaxis: 'start' arg requires {-n} <= start < {n + 1}, got {given} (shape {shape})"
                         f"{where_text()}")
    at -= 1 if ax < at else 0
    order = [d for d in range(n) if d != ax]
    order.insert(at, ax)
    return transpose(a, order)


# ---------------------------------------------------------------------- splitting, stacking, appending

def _split_along(op: str, ary: ArrayLike, indices_or_sections: Any, axis: int, min_ndim: int) -> list[ArrayLike]:
    shape = aval_of(ary).shape
    if len(shape) < min_ndim:
        raise ShapeError(f"{op} only works on arrays of {min_ndim} or more dimensions, got shape {shape}"
                         f"{where_text()}")
    return split(ary, indices_or_sections, axis)


@implements(np.hsplit)
def hsplit(ary: ArrayLike, indices_or_sections: Any) -> list[ArrayLike]:
    """numpy.hsplit: split along axis 1 (axis 0 of a 1-D array)."""
    return _split_along("hsplit", ary, indices_or_sections, 1 if aval_of(ary).ndim > 1 else 0, 1)


@implements(np.vsplit)
def vsplit(ary: ArrayLike, indices_or_sections: Any) -> list[ArrayLike]:
    """numpy.vsplit: split along axis 0 of an array of 2 or more dimensions."""
    return _split_along("vsplit", ary, indices_or_sections, 0, 2)


@implements(np.dsplit)
def dsplit(ary: ArrayLike, indices_or_sections: Any) -> list[ArrayLike]:
    """numpy.dsplit: split along axis 2 of an array of 3 or more dimensions."""
    return _split_along("dsplit", ary, indices_or_sections, 2, 3)


@implements(np.column_stack)
def column_stack(tup: Sequence[ArrayLike]) -> ArrayLike:
    """numpy.column_stack: 0-d and 1-D arrays as columns, joined along axis 1."""
    arrays = [_strong(x) for x in tup]
    return concatenate([reshape(x, (-1, 1)) if aval_of(x).ndim < 2 else x for x in arrays], axis=1)


@implements(np.append)
def append(arr: ArrayLike, values: Any, axis: Any = None) -> ArrayLike:
    """numpy.append: `values` joined after `arr` along `axis` (both flattened when axis is None)."""
    arr, values = _strong(arr), _strong(values)
    if axis is None:
        arr, values, axis = ravel(arr), ravel(values), 0
    return concatenate([arr, values], axis=axis)


def _at_least(arys: Sequence[ArrayLike], nd: int) -> Any:
    """Each array reshaped to `nd` dimensions as numpy's atleast_{nd}d; one array alone, several as a tuple."""
    out = []
    for x in arys:
        x = _strong(x)
        shape = aval_of(x).shape
        if len(shape) < nd:
            shape = {0: (1, 1, 1), 1: (1,) + shape + (1,), 2: shape + (1,)}[len(shape)] if nd == 3 else \
                (1,) * (nd - len(shape)) + shape
        out.append(reshape(x, shape))
    return out[0] if len(out) == 1 else tuple(out)


@implements(np.atleast_1d)
def atleast_1d(*arys: ArrayLike) -> Any:
    """numpy.atleast_1d: 0-d arrays as shape (1,)."""
    return _at_least(arys, 1)


@implements(np.atleast_2d)
def atleast_2d(*arys: ArrayLike) -> Any:
    """numpy.atleast_2d: 0-d as (1, 1), 1-D (n,) as (1, n)."""
    return _at_least(arys, 2)


@implements(np.atleast_3d)
def atleast_3d(*arys: ArrayLike) -> Any:
    """numpy.atleast_3d: 0-d as (1, 1, 1), 1-D (n,) as (1, n, 1), 2-D (m, n) as (m, n, 1)."""
    return _at_least(arys, 3)


# ---------------------------------------------------------------------- products and selection

@implements(np.kron)
def kron(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """numpy.kron: the block product, as a broadcast multiply of interleaved unit axes and a reshape."""
    a, b = _array(a), _array(b)
    sa, sb = aval_of(a).shape, aval_of(b).shape
    if len(sa) < len(sb):
        sa = (1,) * (len(sb) - len(sa)) + sa
    if not sa or not sb:
        return multiply(a, b)
    sb = (1,) * (len(sa) - len(sb)) + sb
    spread = multiply(reshape(a, [v for d in sa for v in (d, 1)]), reshape(b, [v for d in sb for v in (1, d)]))
    return reshape(spread, [x * y for x, y in zip(sa, sb)])


def _component(x: ArrayLike, k: int) -> ArrayLike:
    """x[..., k]."""
    shape = aval_of(x).shape
    return reshape(_axis_slice(x, len(shape) - 1, k, 1), shape[:-1])


@implements(np.cross)
def cross(a: ArrayLike, b: ArrayLike, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: Any = None
          ) -> ArrayLike:
    """numpy.cross of 3-vectors (or 2-vectors, whose third component is 0), broadcast, with numpy's formulas
    term by term; a pair of 2-vectors gives the z component alone."""
    a, b = _array(a), _array(b)
    if axis is not None:
        axisa = axisb = axisc = axis
    if aval_of(a).ndim < 1 or aval_of(b).ndim < 1:
        raise ShapeError(f"cross: at least one array has zero dimension (shapes {aval_of(a).shape}, "
                         f"{aval_of(b).shape}){where_text()}")
    dtype = np.promote_types(aval_of(a).dtype, aval_of(b).dtype)
    a, b = moveaxis(convert(a, dtype), axisa, -1), moveaxis(convert(b, dtype), axisb, -1)
    na, nb = aval_of(a).shape[-1], aval_of(b).shape[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ShapeError(f"cross: incompatible dimensions for cross product (dimension must be 2 or 3), got "
                         f"vectors of {na} and {nb}{where_text()}")
    a0, a1, a2 = [_component(a, k) for k in range(na)] + [None] * (3 - na)
    b0, b1, b2 = [_component(b, k) for k in range(nb)] + [None] * (3 - nb)
    z = subtract(multiply(a0, b1), multiply(a1, b0))
    if na == nb == 2:
        return z
    if na == 2:
        parts = [multiply(a1, b2), negative(multiply(a0, b2)), z]
    elif nb == 2:
        parts = [negative(multiply(a2, b1)), multiply(a2, b0), z]
    else:
        parts = [subtract(multiply(a1, b2), multiply(a2, b1)), subtract(multiply(a2, b0), multiply(a0, b2)), z]
    return moveaxis(stack(parts, axis=-1), -1, axisc)


def _common_dtype(values: Sequence[Any]) -> np.dtype:
    """numpy's result_type of arrays and Python numbers (NEP 50: a Python number, or a traced one, is weak)."""
    def stand_in(v: Any) -> Any:
        a = aval_of(v)
        return {"b": True, "i": 0, "u": 0, "f": 0.0}[a.dtype.kind] if a.weak else a.dtype
    return np.result_type(*[stand_in(v) for v in values])


@implements(np.select)
def select(condlist: Sequence[ArrayLike], choicelist: Sequence[ArrayLike], default: Any = 0) -> ArrayLike:
    """numpy.select: the choice of the first condition that holds, else `default`; a chain of where."""
    conds, choices = [_array(c) for c in condlist], [_array(c) for c in choicelist] + [_array(default)]
    if len(conds) != len(choices) - 1:
        raise ShapeError(f"select: list of cases must be same length as list of conditions ({len(conds)} "
                         f"conditions, {len(choices) - 1} choices){where_text()}")
    if not conds:
        raise ShapeError(f"select with an empty condition list is not possible{where_text()}")
    for i, c in enumerate(conds):
        if aval_of(c).dtype != np.bool_:
            raise TraceError(f"select: invalid entry {i} in condlist: should be boolean, got {aval_of(c)}"
                             f"{where_text()}")
    dtype = _common_dtype(choices)
    result = convert(choices[-1], dtype)
    for cond, choice in zip(conds[::-1], choices[-2::-1]):
        result = where(cond, convert(choice, dtype), result)
    return broadcast_to(result, broadcast_shapes("select", *conds, *choices))


# ---------------------------------------------------------------------- evenly spaced values

@implements(np.linspace)
def linspace(start: ArrayLike, stop: ArrayLike, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype: Any = None, axis: int = 0) -> Any:
    """numpy.linspace with traced or array endpoints, differentiable in them: numpy's arithmetic step by step,
    its branch for a step that underflows to zero chosen by where."""
    num = static_int("linspace", "num", num)
    if num < 0:
        raise ShapeError(f"linspace: Number of samples, {num}, must be non-negative{where_text()}")
    start, stop = _array(start), _array(stop)
    dt = result_type(np.add, start, stop)[0]
    dt = dt if dt.kind == "f" else np.dtype(np.float64)
    start, stop = convert(start, dt), convert(stop, dt)
    delta = subtract(stop, start)
    ramp = np.arange(num, dtype=dt).reshape((-1,) + (1,) * aval_of(delta).ndim)
    div = num - 1 if endpoint else num
    if div > 0:
        step = divide(delta, div)
        underflow = greater(sum(astype(equal(step, 0), np.int64)), 0)
        y = where(underflow, multiply(divide(ramp, div), delta), multiply(ramp, step))
    else:
        step, y = np.nan, multiply(ramp, delta)
    y = add(y, start)
    if endpoint and num > 1:
        y = where(np.arange(num).reshape(ramp.shape) == num - 1, stop, y)
    y = moveaxis(y, 0, axis) if axis != 0 else y
    if dtype is not None:
        y = astype(floor(y) if np.dtype(dtype).kind in "iu" else y, dtype)
    return (y, step) if retstep else y


@implements(np.logspace)
def logspace(start: ArrayLike, stop: ArrayLike, num: int = 50, endpoint: bool = True, base: Any = 10.0,
             dtype: Any = None, axis: int = 0) -> ArrayLike:
    """numpy.logspace: base ** linspace(start, stop); an array base broadcasts with the endpoints, as numpy's."""
    start, stop, base = _array(start), _array(stop), _array(base)
    if not isinstance(base, (float, int)) and aval_of(base).ndim:
        start, stop, base = _strong(start), _strong(stop), _strong(base)
        nd = len(broadcast_shapes("logspace", start, stop, base))
        start, stop, base = (reshape(v, (1,) * (nd - aval_of(v).ndim) + aval_of(v).shape) for v in (start, stop, base))
        base = expand_dims(base, axis)
    y = power(base, linspace(start, stop, num=num, endpoint=endpoint, axis=axis))
    return y if dtype is None else astype(y, dtype)
