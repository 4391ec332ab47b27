"""Host values as a backend's adapter takes them (what every adapter shares): an argument as a numpy array of
its plan's dtype, and a cotangent checked and cast to its output's dtype."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.errors import InputError
from jitgrad.ir.graph import Aval


def as_array(x: Any, aval: Aval) -> np.ndarray:
    """Argument `x` as an array of its plan's dtype (a no-op for the common case)."""
    if type(x) is np.ndarray and x.dtype == aval.dtype:
        return x
    return np.asarray(x, dtype=aval.dtype)


def cotangent_array(g: Any, aval: Aval, fname: str, k: int) -> np.ndarray:
    """A cotangent as an array of its output's dtype; complex or non-numeric values are refused."""
    try:
        arr = np.asarray(g)
    except (TypeError, ValueError):
        arr = np.empty(0, object)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{fname}: cotangent {k} is a {type(g).__name__} of dtype {arr.dtype}; pass a real "
                         f"array of output {k}'s shape {aval.shape} ({aval.dtype})")
    return arr.astype(aval.dtype, copy=False)
