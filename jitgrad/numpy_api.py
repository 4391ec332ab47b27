"""numpy's protocols for tracers: which ufuncs, array functions and ndarray methods trace, and to what.

Anything not listed raises `UnsupportedError` naming the numpy function and the user's line.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import ops
from .errors import UnsupportedAttributeError, UnsupportedError
from .tracing import Tracer, where_text


def _on_bools(name: str, logical: Callable[..., Any], x: Any, y: Any) -> Any:
    """Bitwise ops are their logical counterparts on bool arrays; on integers they are not supported."""
    avals = [ops.aval_of(v) for v in (x, y)]
    if any(a.dtype != np.bool_ for a in avals):
        raise UnsupportedError(f"numpy.{name} of {avals[0]} and {avals[1]}: bitwise ops are supported on bool arrays "
                               f"only{where_text()}")
    return logical(x, y)


UFUNCS: dict[np.ufunc, Callable[..., Any]] = {
    np.add: ops.add, np.subtract: ops.subtract, np.multiply: ops.multiply, np.true_divide: ops.divide,
    np.power: ops.power, np.float_power: lambda x, y: ops.power(ops.astype(x, np.float64), y),
    np.maximum: ops.maximum, np.minimum: ops.minimum, np.fmax: ops.fmax, np.fmin: ops.fmin,
    np.arctan2: ops.arctan2,
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
    np.logical_not: ops.logical_not, np.bitwise_and: lambda x, y: _on_bools("bitwise_and", ops.logical_and, x, y),
    np.bitwise_or: lambda x, y: _on_bools("bitwise_or", ops.logical_or, x, y),
    np.bitwise_xor: lambda x, y: _on_bools("bitwise_xor", ops.logical_xor, x, y),
    np.invert: lambda x: _on_bools("invert", lambda a, _: ops.logical_not(a), x, x),
    np.isnan: ops.isnan, np.isfinite: ops.isfinite, np.matmul: ops.matmul,
}

REDUCING_UFUNCS: dict[np.ufunc, Callable[..., Any]] = {
    np.add: ops.sum, np.multiply: ops.prod, np.maximum: ops.max, np.minimum: ops.min,
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


def _arg_extremum(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(a: Any, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        if out is not None:
            raise UnsupportedError(f"{fn.__name__}(..., out=...) is not supported{where_text()}")
        return fn(a, axis=axis, keepdims=keepdims)

    return call


def _like(name: str, fill: Any) -> Callable[..., Any]:
    def call(a: Any, dtype: Any = None, order: str = "K", subok: bool = True, shape: Any = None, **kw: Any) -> Any:
        _no_extra(name, kw)
        return ops.full_like(a, fill, dtype, shape)

    return call


def _full_like(a: Any, fill_value: Any, dtype: Any = None, order: str = "K", subok: bool = True, shape: Any = None,
               **kw: Any) -> Any:
    _no_extra("full_like", kw)
    return ops.full_like(a, fill_value, dtype, shape)


def _norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    return ops.norm(x, ord, axis, keepdims)


def _round(a: Any, decimals: int = 0, out: Any = None) -> Any:
    if out is not None:
        raise UnsupportedError(f"numpy.round(..., out=...) is not supported{where_text()}")
    return ops.round(a, decimals)


def _einsum(*operands: Any, out: Any = None, optimize: Any = False, **kw: Any) -> Any:
    if out is not None:
        raise UnsupportedError(f"numpy.einsum(..., out=...) is not supported{where_text()}")
    _no_extra("einsum", kw)
    return ops.einsum(*operands)


def _concatenate(arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None, casting: str = "same_kind") -> Any:
    if out is not None:
        raise UnsupportedError(f"numpy.concatenate(..., out=...) is not supported{where_text()}")
    return ops.concatenate(arrays, axis, dtype)


def _stack(arrays: Any, axis: int = 0, out: Any = None, **kw: Any) -> Any:
    if out is not None:
        raise UnsupportedError(f"numpy.stack(..., out=...) is not supported{where_text()}")
    _no_extra("stack", kw)
    return ops.stack(arrays, axis)


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
    np.prod: _reduction(ops.prod), np.argmax: _arg_extremum(ops.argmax), np.argmin: _arg_extremum(ops.argmin),
    np.linalg.norm: _norm, np.round: _round, np.around: _round,
    np.moveaxis: ops.moveaxis, np.concatenate: _concatenate, np.stack: _stack,
    np.hstack: lambda tup, **kw: ops.hstack(tup), np.vstack: lambda tup, **kw: ops.vstack(tup),
    np.split: ops.split, np.array_split: ops.array_split,
    np.flip: ops.flip, np.fliplr: lambda m: ops.flip(m, 1), np.flipud: lambda m: ops.flip(m, 0),
    np.pad: ops.pad, np.tile: ops.tile, np.repeat: ops.repeat,
    np.take: lambda a, indices, axis=None, out=None, mode="raise": ops.take(a, indices, axis),
    np.take_along_axis: ops.take_along_axis,
    np.einsum: _einsum, np.tensordot: ops.tensordot, np.inner: ops.inner,
    np.zeros_like: _like("zeros_like", 0), np.ones_like: _like("ones_like", 1),
    np.empty_like: _like("empty_like", 0), np.full_like: _full_like,
    np.shape: lambda a: ops.aval_of(a).shape, np.ndim: lambda a: ops.aval_of(a).ndim,
    np.size: lambda a, axis=None: ops.aval_of(a).size if axis is None else ops.aval_of(a).shape[axis],
}


def handle_function(func: Any, args: tuple, kwargs: dict) -> Any:
    impl = FUNCTIONS.get(func)
    if impl is None:
        shapes = ", ".join(str(a.aval) for a in _tracers(args))
        raise UnsupportedError(f"numpy.{getattr(func, '__name__', func)} is not supported by jitgrad's tracer "
                               f"(called on traced {shapes}){where_text()}")
    return impl(*args, **kwargs)


def _tracers(args: Any) -> list[Tracer]:
    """The tracers among (possibly nested lists/tuples of) arguments."""
    if isinstance(args, Tracer):
        return [args]
    if isinstance(args, (list, tuple)):
        return [t for a in args for t in _tracers(a)]
    return []


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
    "prod": lambda t: lambda axis=None, dtype=None, keepdims=False: ops.prod(t, axis, dtype, keepdims),
    "argmax": lambda t: lambda axis=None, keepdims=False: ops.argmax(t, axis, keepdims),
    "argmin": lambda t: lambda axis=None, keepdims=False: ops.argmin(t, axis, keepdims),
    "take": lambda t: lambda indices, axis=None: ops.take(t, indices, axis),
    "repeat": lambda t: lambda repeats, axis=None: ops.repeat(t, repeats, axis),
    "round": lambda t: lambda decimals=0: ops.round(t, decimals),
}


def tracer_method(t: Tracer, name: str) -> Any:
    """Attribute lookup for ndarray-style methods on a tracer (`t.sum(axis=0)`, `t.T`, ...)."""
    factory = METHODS.get(name)
    if factory is None:
        if name.startswith("__"):
            raise AttributeError(name)
        in_place = (" ndarray's in-place methods (sort, fill, resize, put, partition, itemset, setflags) cannot "
                    "be traced because traced arrays are immutable: use the numpy function that returns a new array "
                    "(np.sort(x), np.full_like(x, v), ...)." if hasattr(np.ndarray, name) else "")
        raise UnsupportedAttributeError(
            f"traced {t.aval} arrays have no attribute {name!r}.{in_place} jitgrad supports the ndarray methods "
            f"{', '.join(sorted(METHODS))}; see docs/ops.md{where_text()}")
    return factory(t)
