"""No numpy argument is ever silently ignored: a sweep over the signature of every numpy function, ufunc
and ndarray method jitgrad implements. Each argument, given a value other than numpy's default, either
gives numpy's result (the same values and dtype) or raises UnsupportedError naming it; where numpy
itself refuses the value, jitgrad refuses it too. A new binding whose arguments this table cannot
exercise fails the sweep until a sample is added."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.tracing.dispatch import FUNCTIONS, METHOD_BINDINGS, NO_VALUE, UFUNCS, Binding

X = np.arange(1.0, 13.0).reshape(3, 4) / 4  # positive, away from 0: every ufunc is defined on it
BOOLS = X > 1.5
INDICES = np.array([2, 0, 1])
UNSPECIFIED_VALUES = {"numpy.empty_like"}  # numpy leaves its values unspecified: only shape and dtype compare

# How to call each numpy function with a traced `x` as its array (positional arguments, then keywords).
BASE: dict[Any, Callable[[Any], tuple[tuple, dict]]] = {
    np.reshape: lambda x: ((x, (4, 3)), {}), np.transpose: lambda x: ((x,), {}),
    np.swapaxes: lambda x: ((x, 0, 1), {}), np.expand_dims: lambda x: ((x, 0), {}),
    np.squeeze: lambda x: ((x[None],), {}), np.ravel: lambda x: ((x,), {}),
    np.broadcast_to: lambda x: ((x, (2, 3, 4)), {}), np.dot: lambda x: ((x, X.T), {}),
    np.outer: lambda x: ((x, X[0]), {}), np.moveaxis: lambda x: ((x, 0, 1), {}),
    np.concatenate: lambda x: (([x, x],), {}), np.stack: lambda x: (([x, x],), {}),
    np.hstack: lambda x: (([x, x],), {}), np.vstack: lambda x: (([x, x],), {}),
    np.split: lambda x: ((x, 2, 1), {}), np.array_split: lambda x: ((x, 3, 1), {}),
    np.tile: lambda x: ((x, 2), {}), np.repeat: lambda x: ((x, 2), {}),
    np.take: lambda x: ((x, INDICES), {}), np.take_along_axis: lambda x: ((x, np.zeros((3, 1), int), 1), {}),
    np.einsum: lambda x: (("ij->j", x), {}), np.tensordot: lambda x: ((x, X.T), {}),
    np.inner: lambda x: ((x, X), {}), np.full_like: lambda x: ((x, 2.0), {}),
    np.where: lambda x: ((BOOLS, x, 0.0), {}), np.pad: lambda x: ((x, 1), {}),
    np.clip: lambda x: ((x, 1.0, 2.0), {}), np.linalg.norm: lambda x: ((x,), {}),
    np.roll: lambda x: ((x, 1), {}), np.rollaxis: lambda x: ((x, 1), {}), np.hsplit: lambda x: ((x, 2), {}),
    np.vsplit: lambda x: ((x, 3), {}), np.dsplit: lambda x: ((x[:, :, None], 1), {}),
    np.append: lambda x: ((x, x), {}),
    np.kron: lambda x: ((x, X), {}), np.cross: lambda x: ((x[:, :3], X[:, 1:]), {}),
    np.select: lambda x: (([x > 1.5], [x]), {}), np.linspace: lambda x: ((x, x + 1), {}),
    np.logspace: lambda x: ((x, x + 1), {}), np.lib.stride_tricks.sliding_window_view: lambda x: ((x, (2, 2)), {}),
    np.put_along_axis: lambda x: ((x, np.zeros((3, 1), int), 0.0, 1), {}),
    np.compress: lambda x: ((np.array([True, False, True]), x), {}), np.extract: lambda x: ((BOOLS, x), {}),
    np.partition: lambda x: ((x, 1), {}), np.argpartition: lambda x: ((x, 1), {}),
    np.quantile: lambda x: ((x, 0.3), {}), np.percentile: lambda x: ((x, 30.0), {}),
    np.linalg.inv: lambda x: ((_spd(x),), {}), np.linalg.det: lambda x: ((_spd(x),), {}),
    np.linalg.slogdet: lambda x: ((_spd(x),), {}), np.linalg.cholesky: lambda x: ((_spd(x),), {}),
    np.linalg.eigh: lambda x: ((_spd(x),), {}), np.linalg.eigvalsh: lambda x: ((_spd(x),), {}),
    np.linalg.solve: lambda x: ((_spd(x), X[:, 0]), {}), np.linalg.lstsq: lambda x: ((x, X), {}),
    np.linalg.matrix_power: lambda x: ((_spd(x), 2), {}), np.linalg.multi_dot: lambda x: (([x, X.T],), {}),
    np.linalg.tensorsolve: lambda x: ((_spd(x), X[:, 0]), {}),
}


def _spd(x: Any) -> Any:
    """A symmetric positive-definite 3x3 matrix from X's first three columns."""
    return x[:, :3] @ x[:, :3].T + np.eye(3)


def _base(fn: Any) -> Callable[[Any], tuple[tuple, dict]]:
    return BASE.get(fn, lambda x: ((x,), {}))


def _sample(name: str, default: Any, binding: Binding) -> Any:
    """A value of argument `name` other than numpy's default."""
    samples: dict[str, list[Any]] = {
        "axis": [0, 1, -1], "keepdims": [True], "dtype": [np.float32], "initial": [10.0], "where": [BOOLS],
        "casting": ["unsafe", "no"], "order": ["F", "C"], "subok": [False, True], "signature": [("d", "d")],
        "ddof": [1], "correction": [1], "mean": [np.ones((1, 1))], "mode": ["clip", "edge"], "copy": [True, False],
        "decimals": [1], "ord": [1], "optimize": [True], "device": ["cpu"], "shape": [(2, 2)], "axes": [1],
        "out": ["OUT"], "a_min": [1.5], "a_max": [2.5], "min": [1.5], "max": [2.5], "kwargs": [{"casting": "no"}],
        "axis1": [1], "axis2": [0], "equal_nan": [True], "k": [2], "offset": [1], "start": [1], "axisa": [0],
        "axisb": [0], "axisc": [0], "num": [3], "endpoint": [False], "retstep": [True], "base": [2.0],
        "default": [1.0], "writeable": [True], "n": [2], "prepend": [0.5], "append": [np.ones((3, 1))],
        "to_end": [[1.0, 2.0]], "to_begin": [2.5], "edge_order": [2], "kind": ["stable"], "stable": [True],
        "kth": [[0, 2]], "overwrite_input": [True], "method": ["midpoint"], "weights": [np.ones((3, 4))],
        "nan": [1.0], "posinf": [1.0], "neginf": [-1.0], "upper": [True], "UPLO": ["U"], "full_matrices": [False],
        "compute_uv": [False], "hermitian": [True], "rcond": [0.1], "rtol": [0.1, None], "tol": [0.1], "p": [1],
        "ind": [1],
    }
    if name not in samples:
        raise AssertionError(f"{binding.name}: no sample for argument {name!r}; add one to _sample")
    for value in samples[name]:
        if not _same(value, default):
            return value
    raise AssertionError(f"{binding.name}: every sample of {name!r} is numpy's default")


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(np.all(a == b))
    except Exception:
        return False


def _operands(signature: inspect.Signature, args: tuple) -> set[str]:
    """The parameters the base call fills by position (the operands)."""
    names = []
    for p in signature.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return set(names) | {p.name}
        names.append(p.name)
    return set(names[:len(args)])


def _check(binding: Binding, call: Callable[[Any, dict], Any], signature: inspect.Signature, args: tuple) -> None:
    operands = _operands(signature, args)
    for p in signature.parameters.values():
        if p.name in operands or p.name == "self":
            continue
        value = _sample(p.name, p.default, binding)
        keywords = value if p.kind is p.VAR_KEYWORD else {p.name: value}
        try:
            expected = call(X, dict((k, _out_for(call, v)) for k, v in keywords.items()))
            numpy_error = None
        except Exception as exc:  # numpy refuses this value: jitgrad must refuse it too
            expected, numpy_error = None, exc
        try:
            got = jg.trace(lambda x: call(x, dict((k, _out_for(call, v)) for k, v in keywords.items())))(X)
        except jg.UnsupportedError as exc:
            assert list(keywords)[0] in str(exc), f"{binding.name}: refused without naming {list(keywords)[0]}: {exc}"
            continue
        except Exception as exc:
            assert numpy_error is not None, f"{binding.name}({p.name}={value!r}) raised {exc!r}; numpy did not"
            continue
        assert numpy_error is None, f"{binding.name}({p.name}={value!r}) gave a result; numpy raised {numpy_error!r}"
        for g, e in zip(_leaves(got), _leaves(expected)):
            assert np.asarray(g).dtype == np.asarray(e).dtype, f"{binding.name}({p.name}={value!r}): dtype"
            assert np.shape(g) == np.shape(e), f"{binding.name}({p.name}={value!r}): shape"
            if binding.name not in UNSPECIFIED_VALUES:
                np.testing.assert_allclose(g, e, rtol=1e-6, err_msg=f"{binding.name}({p.name}={value!r})")


def _out_for(call: Callable[[Any, dict], Any], value: Any) -> Any:
    """`out=` needs an array numpy can write the result into."""
    if not (isinstance(value, str) and value == "OUT"):
        return value
    return np.zeros_like(np.asarray(_leaves(call(X, {}))[0]))


def _leaves(x: Any) -> list[Any]:
    return [v for item in x for v in _leaves(item)] if isinstance(x, (list, tuple)) else [x]


@pytest.mark.parametrize("fn", list(FUNCTIONS), ids=lambda f: FUNCTIONS[f].name)
def test_every_argument_of_every_numpy_function(fn) -> None:
    binding = FUNCTIONS[fn]
    args, kwargs = _base(fn)(X)
    _check(binding, lambda x, extra: fn(*_base(fn)(x)[0], **_base(fn)(x)[1], **extra), binding.signature, args)


@pytest.mark.parametrize("key", list(UFUNCS), ids=lambda k: UFUNCS[k].name)
def test_every_argument_of_every_ufunc(key) -> None:
    ufunc, method = key
    binding = UFUNCS[key]
    bitwise = ufunc in (np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.invert)
    operands = (lambda x: x > 1.5) if bitwise else (lambda x: x)
    if method == "at":  # in place: refused whatever its arguments
        def call(x: Any, extra: dict) -> Any:
            return getattr(ufunc, method)(x, INDICES, 1.0, **extra)
        args: tuple = (X, INDICES, 1.0)
    elif method in ("reduce", "accumulate"):
        def call(x: Any, extra: dict) -> Any:
            return getattr(ufunc, method)(operands(x), **extra)
        args = (X,)
    else:
        def call(x: Any, extra: dict) -> Any:
            return ufunc(*[operands(x)] * ufunc.nin, **extra)
        args = (X,) * ufunc.nin
    _check(binding, call, binding.signature, args)


@pytest.mark.parametrize("name", sorted(METHOD_BINDINGS))
def test_every_argument_of_every_ndarray_method(name) -> None:
    binding = METHOD_BINDINGS[name]
    first_args = {"reshape": ((4, 3),), "astype": (np.float32,), "compress": (np.array([True, False, True]),)
                  }.get(name, ())

    def call(x: Any, extra: dict) -> Any:
        return getattr(x, name)(*first_args, **extra)

    _check(binding, call, binding.signature, ("self",) + first_args)


def test_the_reproducers_of_ignored_arguments() -> None:
    """What was silently ignored before: Fortran order, initial/where, dtype, min/max keywords, out."""
    a = X
    cases = [
        (lambda x: x.reshape(4, 3, order="F"), a.reshape(4, 3, order="F")),
        (lambda x: np.reshape(x, (4, 3), order="F"), np.reshape(a, (4, 3), order="F")),
        (lambda x: np.ravel(x, order="F"), np.ravel(a, order="F")),
        (lambda x: x.flatten("F"), a.flatten("F")),
        (lambda x: np.add.reduce(x, axis=0, initial=10.0), np.add.reduce(a, axis=0, initial=10.0)),
        (lambda x: np.maximum.reduce(x, axis=1, initial=2.0), np.maximum.reduce(a, axis=1, initial=2.0)),
        (lambda x: np.add.reduce(x, where=BOOLS), np.add.reduce(a, where=BOOLS)),
        (lambda x: np.var(x, dtype=np.float32), np.var(a, dtype=np.float32)),
        (lambda x: np.hstack([x, x], dtype=np.float32), np.hstack([a, a], dtype=np.float32)),
        (lambda x: np.clip(x, min=1.0), np.clip(a, min=1.0)),
        (lambda x: x.clip(min=1.0), a.clip(min=1.0)),
        (lambda x: np.mean(x, axis=1, where=BOOLS), np.mean(a, axis=1, where=BOOLS)),
    ]
    for fn, want in cases:
        got = jg.trace(fn)(a)
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for fn in (lambda x: np.clip(x, 0, 1, out=np.empty_like(a)), lambda x: np.var(x, out=np.empty(())),
               lambda x: np.concatenate([x, x], casting="no", dtype=np.float32)):
        with pytest.raises((jg.UnsupportedError, jg.TraceError)):
            jg.trace(fn)(a)
    assert NO_VALUE is np._NoValue
