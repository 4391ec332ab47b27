"""Constants shaped like a traced array: zeros_like, ones_like, empty_like, full_like."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.tracing.dispatch import implements
from jitgrad.tracing.tracer import Tracer
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, check_computable, convert


@implements(np.full_like)
def full_like(a: ArrayLike, fill_value: Any, dtype: Any = None, order: str = "K", shape: Any = None) -> ArrayLike:
    """An array of a's shape and dtype (or the given ones) holding `fill_value`, a constant of the graph
    unless the fill value itself is traced. `order` changes no value."""
    av = aval_of(a)
    dtype = np.dtype(dtype) if dtype is not None else av.dtype
    check_computable("full_like", dtype, [a])
    shape = av.shape if shape is None else ((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
    fill = convert(fill_value, dtype) if isinstance(fill_value, Tracer) else np.asarray(fill_value).astype(dtype)
    return broadcast_to(fill, shape)


@implements(np.zeros_like)
def zeros_like(a: ArrayLike, dtype: Any = None, order: str = "K", shape: Any = None) -> ArrayLike:
    return full_like(a, 0, dtype, order, shape)


@implements(np.ones_like)
def ones_like(a: ArrayLike, dtype: Any = None, order: str = "K", shape: Any = None) -> ArrayLike:
    return full_like(a, 1, dtype, order, shape)


@implements(np.empty_like, export=False)
def empty_like(prototype: ArrayLike, /, dtype: Any = None, order: str = "K", shape: Any = None) -> ArrayLike:
    """numpy.empty_like: its values are unspecified; jitgrad's are zeros."""
    return full_like(prototype, 0, dtype, order, shape)


@implements(np.shape, export=False)
def shape(a: ArrayLike) -> tuple[int, ...]:
    return aval_of(a).shape


@implements(np.ndim, export=False)
def ndim(a: ArrayLike) -> int:
    return aval_of(a).ndim


@implements(np.size, export=False)
def size(a: ArrayLike, axis: Any = None) -> int:
    return aval_of(a).size if axis is None else aval_of(a).shape[axis]
