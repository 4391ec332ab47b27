"""Ops whose output's shape depends on the values: jg.nonzero with a fixed size, compress and extract with a
constant condition, and the refusals of the rest (np.nonzero, np.unique...) with what to write instead."""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from jitgrad.tracing.dispatch import export, implements, register_method
from jitgrad.errors import ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, normalize_axes
from jitgrad.ops.shapes import ravel, static_int
from jitgrad.ops.indexing import getitem, take


def _nonzero_impl(x: Any, *, size: int, fill_value: tuple[int, ...]) -> np.ndarray:
    """Per axis (rows), the indices of the first `size` nonzero elements in C order, padded with its fill value."""
    found = np.nonzero(np.asarray(x))
    out = np.empty((len(found), size), np.int64)
    out[:] = np.asarray(fill_value, np.int64).reshape(-1, 1)
    for row, i in zip(out, found):
        row[:builtins.min(size, i.size)] = i[:size]
    return out


nonzero_p = declare(Primitive("nonzero", Kind.HOST,
                              lambda avals, *, size, fill_value: Aval((avals[0].ndim, size), np.dtype(np.int64)),
                              _nonzero_impl))


@export
def nonzero(a: ArrayLike, *, size: int, fill_value: Any = 0) -> tuple[ArrayLike, ...]:
    """np.nonzero with a fixed size (JAX's `size=`): per axis, the indices of the first `size` nonzero elements
    (C order), padded with `fill_value` (one int, or one per axis) when there are fewer."""
    a = a if isinstance(a, Tracer) else np.asarray(a)
    shape = aval_of(a).shape
    size = static_int("jg.nonzero", "size", size)
    fills = [static_int("jg.nonzero", "fill_value", f)
             for f in (fill_value if isinstance(fill_value, (tuple, list)) else [fill_value] * len(shape))]
    if not shape or size < 0 or len(fills) != len(shape):
        raise ShapeError(f"jg.nonzero: needs an array of 1 or more dimensions (got shape {shape}), size >= 0 (got "
                         f"{size}) and one fill_value or one per axis (got {fill_value!r}){where_text()}")
    found = bind(nonzero_p, a, size=size, fill_value=tuple(fills))
    return tuple(getitem(found, k) for k in range(len(shape)))


_HOW_MANY_NONZERO = "how many elements are nonzero"
_KEEP_SHAPE = "or np.where(a != 0, x, 0) to keep the shape"
_REFUSED = {
    np.nonzero: (_HOW_MANY_NONZERO, "write jg.nonzero(a, size=N, fill_value=0) for the first N indices (padded to N), "
                 + _KEEP_SHAPE),
    np.argwhere: (_HOW_MANY_NONZERO, "write np.stack(jg.nonzero(a, size=N), axis=-1) for the first N (padded to N), "
                  + _KEEP_SHAPE),
    np.flatnonzero: (_HOW_MANY_NONZERO, "write jg.nonzero(np.ravel(a), size=N)[0] for the first N (padded to N), "
                     + _KEEP_SHAPE),
}
_REFUSED.update({fn: ("how many distinct values there are",
                      "compute it outside the traced function and pass the result in as an argument")
                 for fn in (np.unique, np.unique_values, np.unique_counts, np.unique_inverse, np.unique_all)})
_SELECTED = ("how many elements the condition selects",
             ("write np.where(condition, arr, 0) to keep the shape, np.ravel(arr)[jg.nonzero(np.ravel(condition), "
              "size=N)[0]] for the first N, or a constant condition"))


def data_dependent(op: str, traced: Any, why: str, instead: str) -> UnsupportedError:
    """The refusal of an op whose output's shape depends on the values: why, and what to write instead."""
    return UnsupportedError(f"{op} of a traced {aval_of(traced)}: the output's shape depends on the values ({why}), "
                            f"which a trace does not know; {instead}{where_text()}")


def _refusal(fn: Any, why: str, instead: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> None:
        traced = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, Tracer))
        raise data_dependent(f"numpy.{fn.__name__}", traced, why, instead)
    refuse.__doc__ = f"numpy.{fn.__name__}: refused, its output's shape depends on the values."
    return refuse


for _fn, (_why, _instead) in _REFUSED.items():
    implements(_fn, signature="(*args, **kwargs)", export=False)(_refusal(_fn, _why, _instead))
register_method("nonzero", lambda self: _refusal(np.nonzero, *_REFUSED[np.nonzero])(self), "(self, /)")


def _constant_condition(op: str, condition: Any) -> np.ndarray:
    condition = constant_of(condition)
    if isinstance(condition, Tracer):
        raise data_dependent(op, condition, *_SELECTED)
    return np.asarray(condition)


@implements(np.compress)
def compress(condition: Any, a: ArrayLike, axis: Any = None) -> ArrayLike:
    """numpy.compress with a constant condition: np.take of the indices where it holds."""
    cond = _constant_condition("numpy.compress", condition)
    x, axis = (ravel(a), 0) if axis is None else (a, axis)
    shape = aval_of(x).shape
    (ax,) = normalize_axes("compress", shape, axis)
    picked = np.nonzero(cond)[0] if cond.ndim == 1 else None
    if picked is None or picked.size and picked[-1] >= shape[ax]:
        raise ShapeError(f"compress: condition of shape {cond.shape} must be 1-d and select within axis {axis} of "
                         f"shape {shape}{where_text()}")
    return take(x, picked, axis=ax)


def _method_compress(self: ArrayLike, /, condition: Any, axis: Any = None) -> ArrayLike:
    return compress(condition, self, axis)


register_method("compress", _method_compress, "(self, /, condition, axis=None, out=None)")


@implements(np.extract)
def extract(condition: Any, arr: ArrayLike) -> ArrayLike:
    """numpy.extract with a constant condition: the flattened array's elements where it is nonzero."""
    cond = _constant_condition("numpy.extract", condition)
    return take(ravel(arr), np.nonzero(np.ravel(cond))[0])
