"""Constants shaped like a traced array: zeros_like, ones_like, full_like."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..tracing import Tracer
from .core import ArrayLike, aval_of, broadcast_to, check_computable, convert


def full_like(x: ArrayLike, fill_value: Any, dtype: Any = None, shape: Any = None) -> ArrayLike:
    """An array of x's shape and dtype (or the given ones) holding `fill_value`, a constant of the graph
    unless the fill value itself is traced."""
    a = aval_of(x)
    dtype = np.dtype(dtype) if dtype is not None else a.dtype
    check_computable("full_like", dtype, [x])
    shape = a.shape if shape is None else ((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
    fill = convert(fill_value, dtype) if isinstance(fill_value, Tracer) else np.asarray(fill_value).astype(dtype)
    return broadcast_to(fill, shape)


def zeros_like(x: ArrayLike, dtype: Any = None, shape: Any = None) -> ArrayLike:
    return full_like(x, 0, dtype, shape)


def ones_like(x: ArrayLike, dtype: Any = None, shape: Any = None) -> ArrayLike:
    return full_like(x, 1, dtype, shape)
