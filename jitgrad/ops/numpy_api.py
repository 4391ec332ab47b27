"""numpy's protocols for traced arrays: `__array_ufunc__`, `__array_function__`, ndarray methods and
attributes, operators and indexing, all answered from the registry the ops fill (`jitgrad.tracing.dispatch`).

Anything not registered raises `UnsupportedError` naming the numpy function, the traced shapes and the
user's line. Importing this module installs the protocols on `Tracer`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jitgrad.tracing.dispatch import FUNCTIONS, METHODS, UFUNCS, numpy_name
from jitgrad.errors import UnsupportedAttributeError, UnsupportedError
from jitgrad.ops.indexing import getitem, tracer_iter
from jitgrad.ops.writes import tracer_setitem
from jitgrad.tracing.tracer import Tracer, where_text


def _traced_shapes(args: Any) -> str:
    return ", ".join(str(t.aval) for t in _tracers(args))


def _tracers(args: Any) -> list[Tracer]:
    """The tracers among (possibly nested lists/tuples of) arguments."""
    if isinstance(args, Tracer):
        return [args]
    if isinstance(args, (list, tuple)):
        return [t for a in args for t in _tracers(a)]
    return []


# What to write instead of a numpy (or SciPy) function the tracer does not take, where one expression does it:
# the one record of it, which the unsupported-op error and `python -m jitgrad ops NAME` read. Keyed by the
# numpy name without "numpy." ("ptp", "linalg.vector_norm") or, for a ufunc (SciPy's too), its __name__.
EQUIVALENTS = {
    "ptp": "x.max(axis) - x.min(axis)",
    "average": "np.sum(x * w, axis) / np.sum(w, axis) for weights w (np.mean(x, axis) without)",
    "nansum": "np.sum(np.where(np.isnan(x), 0, x), axis)",
    "nanmean": "np.sum(np.where(np.isnan(x), 0, x), axis) / np.sum(~np.isnan(x), axis)",
    "nanmax": "np.max(np.where(np.isnan(x), -np.inf, x), axis)",
    "nanmin": "np.min(np.where(np.isnan(x), np.inf, x), axis)",
    "count_nonzero": "np.sum(x != 0, axis)",
    "any": "np.sum(x != 0, axis) > 0",
    "all": "np.sum(x == 0, axis) == 0",
    "isinf": "np.abs(x) == np.inf",
    "isposinf": "x == np.inf",
    "isneginf": "x == -np.inf",
    "isclose": "np.abs(a - b) <= atol + rtol * np.abs(b) (numpy's defaults: rtol=1e-05, atol=1e-08)",
    "trunc": "np.where(x < 0, np.ceil(x), np.floor(x))",
    "fix": "np.where(x < 0, np.ceil(x), np.floor(x))",
    "copy": "x itself (traced arrays are immutable: a copy is never needed)",
    "cumulative_sum": "np.cumsum(x, axis)",
    "cumulative_prod": "np.cumprod(x, axis)",
    "trapezoid": "np.sum((y[..., 1:] + y[..., :-1]) / 2 * np.diff(x), axis=-1)",
    "vdot": "np.sum(a * b) (real arrays)",
    "vecdot": "np.sum(a * b, axis=-1)",
    "cov": "(x - x.mean(axis=1, keepdims=True)) @ (x - x.mean(axis=1, keepdims=True)).T / (x.shape[1] - 1), "
           "one variable per row of a 2-d x",
    "linalg.vector_norm": "np.linalg.norm(x, ord, axis)",
    "linalg.matrix_norm": "np.linalg.norm(x, ord, axis=(-2, -1))",
    "linalg.vecdot": "np.sum(a * b, axis=-1)",
    "linalg.matmul": "a @ b",
    "linalg.outer": "np.outer(a, b)",
    "linalg.cross": "np.cross(a, b)",
    "linalg.trace": "np.trace(x, axis1=-2, axis2=-1)",
    "linalg.diagonal": "np.diagonal(x, axis1=-2, axis2=-1)",
    "expit": "jg.sigmoid(x)",
    "log_expit": "-jg.softplus(-x)",
    "erf": "jg.erf(x)",
    "logsumexp": "jg.logsumexp(x, axis)",
    "softmax": "jg.softmax(x, axis)",
    "log_softmax": "jg.log_softmax(x, axis)",
    "bincount": "jg.add_at(np.zeros(n), x, weights) (the counts of x's values, weighted, over a fixed length n)",
    "searchsorted": "np.sum(a < v[..., None], axis=-1) for a sorted 1-d a (side='left'; <= for side='right')",
    "digitize": "np.sum(bins <= x[..., None], axis=-1) for increasing bins",
    "put": "np.where(mask, values, x) or jg.put_along_axis(x, indices, values, axis), which return a new array",
    "place": "np.where(mask, values, x), which returns a new array",
    "copyto": "np.where(mask, src, dst), which returns a new array",
}


def unsupported(name: str, key: str, args: Any) -> UnsupportedError:
    """The error for a numpy function or ufunc without a binding: what it was called on and what to do instead
    (a jg or numpy expression where one exists, `python -m jitgrad ops`, computing it outside the traced
    function)."""
    instead = EQUIVALENTS.get(key)
    return UnsupportedError(f"{name} is not supported by jitgrad's tracer (called on traced {_traced_shapes(args)})."
                            f"{f' Write {instead} instead: it traces.' if instead else ''} `python -m jitgrad ops` "
                            f"lists what is supported (`python -m jitgrad ops {key or name}` says this); otherwise "
                            f"compute this value outside the traced function and pass it in as an argument"
                            f"{where_text()}")


def handle_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    binding = UFUNCS.get((ufunc, method))
    if binding is None:
        owner = "numpy." if getattr(np, ufunc.__name__, None) is ufunc else "the ufunc "  # SciPy's are ufuncs too
        name = f"{owner}{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        raise unsupported(name, ufunc.__name__ if method == "__call__" else name, inputs)
    return binding(*inputs, **kwargs)


def handle_function(func: Any, args: tuple, kwargs: dict) -> Any:
    binding = FUNCTIONS.get(func)
    if binding is None:
        name = numpy_name(func) if hasattr(func, "__name__") else f"numpy.{func}"
        raise unsupported(name, name.removeprefix("numpy.") if hasattr(func, "__name__") else "", args)
    return binding(*args, **kwargs)


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
            f"{', '.join(sorted(METHODS))}; `python -m jitgrad ops {name}` says more{where_text()}")
    return factory(t)


def _binary(uf: np.ufunc, reflected: bool) -> Callable[[Tracer, Any], Any]:
    def op(self: Tracer, other: Any) -> Any:
        args = (other, self) if reflected else (self, other)
        return handle_ufunc(uf, "__call__", args, {})

    op.__name__ = uf.__name__
    return op


def _install() -> None:
    """Give `Tracer` numpy's protocols, operators and indexing, as ndarray has them."""
    Tracer.__array_ufunc__ = lambda self, ufunc, method, *inputs, **kwargs: handle_ufunc(ufunc, method, inputs,
                                                                                             kwargs)
    Tracer.__array_function__ = lambda self, func, types, args, kwargs: handle_function(func, args, kwargs)
    Tracer.__getattr__ = tracer_method
    binary = {
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
        "floordiv": np.floor_divide, "mod": np.remainder, "divmod": np.divmod, "pow": np.power, "matmul": np.matmul,
        "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    }
    for name, uf in binary.items():
        setattr(Tracer, f"__{name}__", _binary(uf, reflected=False))
        setattr(Tracer, f"__r{name}__", _binary(uf, reflected=True))
    for name, uf in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                     "eq": np.equal, "ne": np.not_equal}.items():
        setattr(Tracer, f"__{name}__", _binary(uf, reflected=False))
    Tracer.__neg__ = lambda self: handle_ufunc(np.negative, "__call__", (self,), {})
    Tracer.__pos__ = lambda self: self
    Tracer.__abs__ = lambda self: handle_ufunc(np.absolute, "__call__", (self,), {})
    Tracer.__invert__ = lambda self: handle_ufunc(np.invert, "__call__", (self,), {})
    Tracer.__getitem__ = getitem
    Tracer.__iter__ = tracer_iter
    Tracer.__setitem__ = tracer_setitem


_install()
