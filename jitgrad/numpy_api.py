"""numpy's protocols for tracers: which ufuncs, array functions and ndarray methods trace, and to what.

Anything not listed raises `UnsupportedError` naming the numpy function and the user's line.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import ops
from .errors import UnsupportedError
from .tracing import Tracer, where_text

UFUNCS: dict[np.ufunc, Callable[..., Any]] = {
    np.add: ops.add, np.subtract: ops.subtract, np.multiply: ops.multiply, np.true_divide: ops.divide,
    np.power: ops.power, np.float_power: ops.power, np.maximum: ops.maximum, np.minimum: ops.minimum,
    np.fmax: ops.maximum, np.fmin: ops.minimum, np.arctan2: ops.arctan2,
    np.negative: ops.negative, np.positive: lambda x: x, np.absolute: ops.absolute, np.fabs: ops.absolute,
    np.sign: ops.sign, np.exp: ops.exp, np.expm1: ops.expm1, np.log: ops.log, np.log1p: ops.log1p,
    np.log2: lambda x: ops.divide(ops.log(x), float(np.log(2.0))),
    np.log10: lambda x: ops.divide(ops.log(x), float(np.log(10.0))),
    np.exp2: lambda x: ops.exp(ops.multiply(x, float(np.log(2.0)))),
    np.sin: ops.sin, np.cos: ops.cos, np.tan: ops.tan, np.tanh: ops.tanh, np.sinh: ops.sinh,
    np.cosh: ops.cosh, np.arcsin: ops.arcsin, np.arccos: ops.arccos, np.arctan: ops.arctan,
    np.arcsinh: ops.arcsinh, np.arctanh: ops.arctanh, np.sqrt: ops.sqrt, np.square: ops.square,
    np.reciprocal: ops.reciprocal, np.floor: ops.floor, np.ceil: ops.ceil, np.rint: ops.rint,
    np.less: ops.less, np.less_equal: ops.less_equal, np.greater: ops.greater,
    np.greater_equal: ops.greater_equal, np.equal: ops.equal, np.not_equal: ops.not_equal,
    np.logical_and: ops.logical_and, np.logical_or: ops.logical_or, np.logical_xor: ops.logical_xor,
    np.logical_not: ops.logical_not, np.bitwise_and: ops.logical_and, np.bitwise_or: ops.logical_or,
    np.isnan: ops.isnan, np.isfinite: ops.isfinite, np.matmul: ops.matmul,
}

REDUCING_UFUNCS: dict[np.ufunc, Callable[..., Any]] = {
    np.add: ops.sum, np.maximum: ops.max, np.minimum: ops.min,
}


def handle_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    if kwargs.get("out") is not None:
        raise UnsupportedError(f"numpy.{ufunc.__name__}(..., out=...): traced arrays are immutable; "
                               f"use the returned value{where_text()}")
    extra = {k: v for k, v in kwargs.items() if k not in ("out",) and v is not None}
    if method == "__call__":
        fn = UFUNCS.get(ufunc)
        if fn is None or extra:
            raise UnsupportedError(f"numpy.{ufunc.__name__}{' with ' + str(sorted(extra)) if extra else ''} is "
                                   f"not supported by jitgrad's tracer{where_text()}")
        return fn(*inputs)
    if method == "reduce" and ufunc in REDUCING_UFUNCS:
        return REDUCING_UFUNCS[ufunc](inputs[0], axis=kwargs.get("axis", 0),
                                      keepdims=kwargs.get("keepdims", False))
    raise UnsupportedError(f"numpy.{ufunc.__name__}.{method} is not supported by jitgrad's tracer{where_text()}")


def _reduction(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        if out is not None:
            raise UnsupportedError(f"{fn.__name__}(..., out=...) is not supported{where_text()}")
        _no_extra(fn.__name__, kw)
        if dtype is not None:
            return fn(a, axis=axis, dtype=dtype, keepdims=keepdims)
        return fn(a, axis=axis, keepdims=keepdims)

    return call


def _extremum(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        if out is not None:
            raise UnsupportedError(f"{fn.__name__}(..., out=...) is not supported{where_text()}")
        _no_extra(fn.__name__, kw)
        return fn(a, axis=axis, keepdims=keepdims)

    return call


def _no_extra(name: str, kw: dict) -> None:
    given = {k: v for k, v in kw.items() if v is not None and k != "where" or (k == "where" and v is not True)}
    if given:
        raise UnsupportedError(f"numpy.{name}: argument(s) {sorted(given)} are not supported{where_text()}")


def _where(cond: Any, x: Any = None, y: Any = None) -> Any:
    if x is None or y is None:
        raise UnsupportedError(f"numpy.where with one argument (indices of nonzero elements) has a data-dependent "
                               f"shape and cannot be traced; use np.where(cond, a, b){where_text()}")
    return ops.where(cond, x, y)


def _var(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0, keepdims: bool = False,
         **kw: Any) -> Any:
    _no_extra("var", kw)
    return ops.var(a, axis=axis, ddof=ddof, keepdims=keepdims)


def _std(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0, keepdims: bool = False,
         **kw: Any) -> Any:
    _no_extra("std", kw)
    return ops.std(a, axis=axis, ddof=ddof, keepdims=keepdims)


FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    np.sum: _reduction(ops.sum), np.mean: _reduction(ops.mean),
    np.max: _extremum(ops.max), np.amax: _extremum(ops.max), np.min: _extremum(ops.min), np.amin: _extremum(ops.min),
    np.var: _var, np.std: _std,
    np.where: _where, np.clip: lambda a, a_min=None, a_max=None, **kw: ops.clip(a, a_min, a_max),
    np.reshape: lambda a, shape=None, **kw: ops.reshape(a, kw.get("newshape", shape)),
    np.transpose: lambda a, axes=None: ops.transpose(a, axes),
    np.swapaxes: ops.swapaxes, np.expand_dims: ops.expand_dims,
    np.squeeze: lambda a, axis=None: ops.squeeze(a, axis), np.ravel: lambda a, order="C": ops.ravel(a),
    np.broadcast_to: lambda a, shape, subok=False: ops.broadcast_to(a, shape if isinstance(shape, tuple)
                                                                    else (shape,)),
    np.dot: ops.dot, np.outer: ops.outer, np.square: ops.square,
}


def handle_function(func: Any, args: tuple, kwargs: dict) -> Any:
    impl = FUNCTIONS.get(func)
    if impl is None:
        raise UnsupportedError(f"numpy.{getattr(func, '__name__', func)} is not supported by jitgrad's tracer"
                               f"{where_text()}")
    return impl(*args, **kwargs)


def _method_reshape(t: Tracer) -> Callable[..., Any]:
    def reshape(*shape: Any, order: str = "C") -> Any:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.reshape(t, shape)

    return reshape


def _method_transpose(t: Tracer) -> Callable[..., Any]:
    def transpose(*axes: Any) -> Any:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(t, axes or None)

    return transpose


METHODS: dict[str, Callable[[Tracer], Any]] = {
    "T": lambda t: ops.transpose(t),
    "mT": lambda t: ops.swap_last(t),
    "sum": lambda t: lambda axis=None, dtype=None, keepdims=False: ops.sum(t, axis, dtype, keepdims),
    "mean": lambda t: lambda axis=None, dtype=None, keepdims=False: ops.mean(t, axis, dtype, keepdims),
    "max": lambda t: lambda axis=None, keepdims=False: ops.max(t, axis, keepdims),
    "min": lambda t: lambda axis=None, keepdims=False: ops.min(t, axis, keepdims),
    "var": lambda t: lambda axis=None, ddof=0, keepdims=False: ops.var(t, axis, ddof, keepdims),
    "std": lambda t: lambda axis=None, ddof=0, keepdims=False: ops.std(t, axis, ddof, keepdims),
    "reshape": _method_reshape, "transpose": _method_transpose,
    "astype": lambda t: lambda dtype, copy=True: ops.astype(t, dtype),
    "swapaxes": lambda t: lambda a, b: ops.swapaxes(t, a, b),
    "squeeze": lambda t: lambda axis=None: ops.squeeze(t, axis),
    "ravel": lambda t: lambda: ops.ravel(t), "flatten": lambda t: lambda: ops.ravel(t),
    "clip": lambda t: lambda lo=None, hi=None: ops.clip(t, lo, hi),
    "dot": lambda t: lambda other: ops.dot(t, other),
}


def tracer_method(t: Tracer, name: str) -> Any:
    """Attribute lookup for ndarray-style methods on a tracer (`t.sum(axis=0)`, `t.T`, ...)."""
    factory = METHODS.get(name)
    if factory is None:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"traced arrays have no attribute {name!r} (jitgrad supports ndarray methods "
                             f"{', '.join(sorted(METHODS))}){where_text()}")
    return factory(t)
