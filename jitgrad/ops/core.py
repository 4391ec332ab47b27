"""Shared machinery of jitgrad's ops: operand avals, numpy's dtype promotion, broadcasting, casts, axes."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, UnsupportedError
from ..ir import Aval
from ..tracing import Tracer, bind, builder_aval, where_text


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
    if not weak and cdt.kind in "iu":
        xs = tuple(fitting_python_int(x, cdt) for x in xs)
    args = [broadcast_to(convert(x, cdt, weak), shape) for x in xs]
    return bind(prim, *args)


def fitting_python_int(x: ArrayLike, dtype: np.dtype) -> ArrayLike:
    """NEP 50: a Python int meeting an array of integer `dtype` must fit it, or numpy raises OverflowError.
    A constant is checked now; a Python int argument by a step at every call."""
    a = aval_of(x)
    if not a.weak or a.dtype.kind not in "iu" or a.dtype == dtype:
        return x
    if isinstance(x, Tracer):
        return bind(P.check_int_range_p, x, dtype=dtype)
    info = np.iinfo(dtype)
    if not info.min <= int(x) <= info.max:
        raise OverflowError(f"Python integer {int(x)} out of bounds for {dtype}{where_text()}")
    return x


def check_computable(op: str, dtype: np.dtype, xs: Sequence[ArrayLike]) -> None:
    if dtype.kind not in "biuf" or dtype == np.float16:
        raise UnsupportedError(f"{op}: dtype {dtype} (from operands {[str(aval_of(x)) for x in xs]}) is not "
                               f"supported{where_text()}")


def compare(prim: P.Primitive, numpy_fn: Any, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Comparisons: operands promoted to their common type, result bool. A Python int compares exactly with
    an integer array it does not fit (as numpy's do): both are then compared as int64."""
    common, weak = result_type(np.add, x, y)
    if not weak and common.kind in "iu" and common.itemsize < 8 and any(
            aval_of(v).weak and aval_of(v).dtype.kind in "iu" for v in (x, y)):
        common = np.dtype(np.int64)
    shape = broadcast_shapes(prim.name, x, y)
    return bind(prim, *[broadcast_to(convert(v, common, weak), shape) for v in (x, y)])


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
