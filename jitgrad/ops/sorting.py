"""Sorting and selection: the host primitives sort, argsort and argpartition, and the numpy bindings
np.sort, np.argsort (.argsort), np.partition, np.argpartition (.argpartition), np.median, np.quantile
and np.percentile.

Each primitive runs numpy's own function on the host, so values and indices are numpy's: NaNs sort to
the end, ties in argsort come out in the order numpy's `kind` gives (stable for "stable"/"mergesort").
Gradients flow through the permutation as torch's do: sort's VJP scatters the cotangent back to where
each value came from (a stable argsort of the input); partition, median and quantile are gathers by
numpy's argpartition, whose gradient scatter-adds. Integer results (indices) carry no gradient.
np.partition is `x` gathered by numpy's np.argpartition: the elements at `kth` and the set on each side
are numpy's; the order within each side, which numpy leaves unspecified, is argpartition's."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, TraceError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, batch_along_axis, normalize_axes
from jitgrad.ops.arithmetic import add, multiply, subtract
from jitgrad.ops.comparisons import isnan, where
from jitgrad.ops.reductions import mean
from jitgrad.ops.regions import slice_region
from jitgrad.ops.shapes import ravel, reshape, transpose

# ---------------------------------------------------------------------- primitives


def _same_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    """Sorted values: the input's shape and dtype."""
    return Aval(avals[0].shape, avals[0].dtype, False)


def _index_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    """Indices: the input's shape, int64 (numpy's intp)."""
    return Aval(avals[0].shape, np.dtype(np.int64), False)


def _sort_impl(x: Any, *, axis: int, kind: str | None) -> np.ndarray:
    """numpy's sort, so values (signed zeros, NaNs last) are numpy's; C-contiguous for the kernels after it."""
    return np.ascontiguousarray(np.sort(np.asarray(x), axis=axis, kind=kind))


def _argsort_impl(x: Any, *, axis: int, kind: str | None) -> np.ndarray:
    """numpy's argsort, so ties come out as numpy's `kind` orders them."""
    return np.ascontiguousarray(np.argsort(np.asarray(x), axis=axis, kind=kind), dtype=np.int64)


def _argpartition_impl(x: Any, *, kth: tuple[int, ...], axis: int) -> np.ndarray:
    """numpy's argpartition (introselect), numpy's indices."""
    return np.ascontiguousarray(np.argpartition(np.asarray(x), kth, axis=axis), dtype=np.int64)


def along(indices: Any, axis: int) -> list[Any]:
    """The index arrays that read `indices` along `axis` and every other axis in place (take_along_axis)."""
    shape = L.aval(indices).shape
    return [indices if k == axis else L.broadcast_to(
        np.arange(d, dtype=np.int64).reshape([-1 if j == k else 1 for j in range(len(shape))]), shape)
        for k, d in enumerate(shape)]


def take_along(x: ArrayLike, indices: Any, axis: int) -> ArrayLike:
    """x read at `indices` along `axis` (a gather, whose gradient scatter-adds)."""
    return L.gather(x, along(indices, axis))


def _sort_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int, kind: str | None
              ) -> list[Any]:
    """Each sorted position's cotangent goes back to the element it came from (tied elements in stable order)."""
    (x,), (g,) = ins, cts
    order = bind(argsort_p, x, axis=axis, kind="stable")
    return [L.scatter_add(g, along(order, axis), L.aval(x).shape)]


sort_p = declare(Primitive("sort", Kind.HOST, _same_rule, _sort_impl, _sort_vjp, backward_label="SortBackward",
                           batch=batch_along_axis))
argsort_p = declare(Primitive("argsort", Kind.HOST, _index_rule, _argsort_impl, batch=batch_along_axis))
argpartition_p = declare(Primitive("argpartition", Kind.HOST, _index_rule, _argpartition_impl, batch=batch_along_axis))


# ---------------------------------------------------------------------- sort, argsort, partition

def _sort_axis(op: str, a: ArrayLike, axis: Any) -> tuple[ArrayLike, int]:
    """The axis sorted along: None sorts the flattened array, as numpy's."""
    if axis is None:
        return ravel(a), 0
    if not isinstance(constant_of(axis), (int, np.integer)):
        raise TraceError(f"{op}: axis must be None or one int, got {axis!r}{where_text()}")
    return a, normalize_axes(op, aval_of(a).shape, axis)[0]


def _sort_kind(op: str, kind: Any, stable: Any) -> str | None:
    """numpy's sort kind; `stable=True` is kind "stable". Validated by numpy itself, which knows its kinds."""
    if stable is not None:
        if kind is not None:
            raise TraceError(f"{op}: `kind` and `stable` can't be given at the same time; use only one of them"
                             f"{where_text()}")
        return "stable" if stable else None
    try:
        np.sort(np.zeros(1), kind=kind)
    except (ValueError, TypeError):
        raise UnsupportedError(f"{op}: kind={kind!r} is not a sort kind; use 'quicksort', 'mergesort', 'heapsort' or "
                               f"'stable'{where_text()}") from None
    return kind


@implements(np.sort)
def sort(a: ArrayLike, axis: Any = -1, kind: Any = None, *, stable: Any = None) -> ArrayLike:
    """numpy.sort: numpy's sorted values (NaNs last); the gradient goes back through the permutation."""
    x, ax = _sort_axis("sort", a, axis)
    kind = _sort_kind("sort", kind, stable)
    return x if aval_of(x).shape[ax] <= 1 else bind(sort_p, x, axis=ax, kind=kind)


@implements(np.argsort, method="argsort")
def argsort(a: ArrayLike, axis: Any = -1, kind: Any = None, *, stable: Any = None) -> ArrayLike:
    """numpy.argsort (int64, no gradient): numpy's indices for the given kind, ties in that kind's order."""
    x, ax = _sort_axis("argsort", a, axis)
    return bind(argsort_p, x, axis=ax, kind=_sort_kind("argsort", kind, stable))


def _kth(op: str, kth: Any, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Constant partition indices, each within the axis (negative ones count from its end)."""
    kth = constant_of(kth)
    if isinstance(kth, Tracer):
        raise UnsupportedError(f"{op}: kth must be constant ints, not traced values{where_text()}")
    ks = np.asarray(kth)
    if ks.dtype.kind not in "iu" or ks.ndim > 1:
        raise TraceError(f"{op}: kth must be an int or a sequence of ints, got {kth!r}{where_text()}")
    n = shape[axis]
    bad = [int(k) for k in ks.reshape(-1) if not -n <= k < n]
    if bad or not ks.size:
        raise ShapeError(f"{op}: kth={kth!r} is out of bounds for axis {axis} of length {n} (shape {shape})"
                         f"{where_text()}")
    return tuple(int(k) for k in ks.reshape(-1))


@implements(np.argpartition, method="argpartition")
def argpartition(a: ArrayLike, kth: Any, axis: Any = -1) -> ArrayLike:
    """numpy.argpartition (int64, no gradient): numpy's own indices."""
    x, ax = _sort_axis("argpartition", a, axis)
    return bind(argpartition_p, x, kth=_kth("argpartition", kth, aval_of(x).shape, ax), axis=ax)


@implements(np.partition)
def partition(a: ArrayLike, kth: Any, axis: Any = -1) -> ArrayLike:
    """numpy.partition as x gathered by numpy's argpartition: numpy's values at `kth`, and numpy's sets on each
    side, in argpartition's order (numpy leaves it unspecified); the gradient scatter-adds back."""
    x, ax = _sort_axis("partition", a, axis)
    return take_along(x, argpartition(x, kth, ax), ax)


# ---------------------------------------------------------------------- median and quantiles

def _reduced_last(op: str, a: ArrayLike, axis: Any) -> tuple[ArrayLike, tuple[int, ...]]:
    """`a` with the reduced axes moved last and merged into one (numpy's _ureduce), and those axes."""
    shape = aval_of(a).shape
    axes = normalize_axes(op, shape, axis)
    keep = [k for k in range(len(shape)) if k not in axes]
    merged = math.prod(shape[k] for k in axes)
    return reshape(transpose(a, keep + list(axes)), [shape[k] for k in keep] + [merged]), axes


def _kept(result: ArrayLike, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool, lead: tuple = ()
          ) -> ArrayLike:
    """keepdims: the reduced axes back as length 1 (after the `lead` axes of several quantiles)."""
    if not keepdims:
        return result
    return reshape(result, lead + tuple(1 if k in axes else d for k, d in enumerate(shape)))


def _select(x: ArrayLike, positions: Sequence[int]) -> ArrayLike:
    """x's order statistics at `positions` (non-negative) of its last axis, in that order, as a last axis: one
    argpartition and two gathers; the gradient scatter-adds to the elements read."""
    shape = aval_of(x).shape
    last = len(shape) - 1
    order = bind(argpartition_p, x, kth=tuple(sorted(set(positions))), axis=last)
    wanted = L.broadcast_to(np.asarray(positions, np.int64).reshape((1,) * last + (-1,)),
                            shape[:-1] + (len(positions),))
    return take_along(x, L.gather(order, along(wanted, last)), last)


def _part(x: ArrayLike, start: int, length: int) -> ArrayLike:
    """`length` elements of the last axis from `start`."""
    shape = aval_of(x).shape
    return slice_region(x, [0] * (len(shape) - 1) + [start], [1] * len(shape), shape[:-1] + (length,))


def _nan_where_nan(result: ArrayLike, largest: ArrayLike) -> ArrayLike:
    """NaN where the reduced axis holds one: NaNs sort last, so where its largest element is NaN."""
    return where(isnan(largest), largest, result)


@implements(np.median)
def median(a: ArrayLike, axis: Any = None, overwrite_input: Any = False, keepdims: Any = False) -> ArrayLike:
    """numpy.median: the middle element of the sorted axes, or numpy's mean of the middle two (ints give float64);
    NaN where they hold a NaN, nan for empty axes; the gradient goes to the middle element(s), half each for two.
    `overwrite_input` changes no value (jitgrad never writes to its inputs)."""
    shape = aval_of(a).shape
    x, axes = _reduced_last("median", a, axis)
    n = aval_of(x).shape[-1]
    if n == 0:
        return _kept(mean(x, axis=-1), shape, axes, keepdims)
    half = n // 2
    middle = [half - 1, half] if n % 2 == 0 else [half]
    floats = aval_of(x).dtype.kind == "f"
    picked = _select(x, middle + ([n - 1] if floats else []))
    result = mean(_part(picked, 0, len(middle)), axis=-1)
    if floats:
        result = _nan_where_nan(result, reshape(_part(picked, len(middle), 1), aval_of(result).shape))
    return _kept(result, shape, axes, keepdims)


def _boundaries(index: Any, condition: Callable[[Any, Any], Any]) -> np.ndarray:
    """numpy's discrete methods: the index below or above a virtual index, by `condition`, clipped at 0."""
    previous = np.floor(index)
    chosen = np.asarray(np.where(condition(index - previous, index), previous, previous + 1)).astype(np.intp)
    chosen[chosen < 0] = 0
    return chosen


def _continuous(alpha: float, beta: float) -> Callable[[int, Any], Any]:
    """numpy's _compute_virtual_index for the continuous Hyndman & Fan methods, in numpy's order of operations."""
    return lambda n, q: n * q + (alpha + q * (1 - alpha - beta)) - 1


def _gamma(gamma: Any, index: Any) -> Any:
    """The interpolation weight as it is: the fractional part of the virtual index."""
    return gamma


# numpy's methods (Hyndman & Fan and the classic ones): the virtual index into the sorted axis and the rule that
# fixes the interpolation weight (None: the index is an integer, read directly).
_METHODS: dict[str, tuple[Callable[[int, Any], Any], Callable[[Any, Any], Any] | None]] = {
    "inverted_cdf": (lambda n, q: _boundaries(n * q - 1, lambda g, i: g == 0), None),
    "averaged_inverted_cdf": (lambda n, q: n * q - 1, lambda g, i: np.where(g == 0, 0.5, 1.0)),
    "closest_observation": (lambda n, q: _boundaries(n * q - 1 - 0.5, lambda g, i: (g == 0) & (np.floor(i) % 2 == 1)),
                            None),
    "interpolated_inverted_cdf": (_continuous(0, 1), _gamma),
    "hazen": (_continuous(0.5, 0.5), _gamma),
    "weibull": (_continuous(0, 0), _gamma),
    "linear": (lambda n, q: (n - 1) * q, _gamma),
    "median_unbiased": (_continuous(1 / 3.0, 1 / 3.0), _gamma),
    "normal_unbiased": (_continuous(3 / 8.0, 3 / 8.0), _gamma),
    "lower": (lambda n, q: np.floor((n - 1) * q).astype(np.intp), None),
    "higher": (lambda n, q: np.ceil((n - 1) * q).astype(np.intp), None),
    "midpoint": (lambda n, q: 0.5 * (np.floor((n - 1) * q) + np.ceil((n - 1) * q)),
                 lambda g, i: np.where(i % 1 == 0, 0.0, 0.5)),
    "nearest": (lambda n, q: np.around((n - 1) * q).astype(np.intp), None),
}


def _neighbours(virtual: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's _get_indexes: the positions below and above each virtual index, both the last one past the end
    (and for NaN), both the first one before the start."""
    previous = np.array(np.floor(virtual), dtype=np.float64)
    following = np.array(previous + 1)
    for mask, value in ((virtual >= n - 1, -1), (virtual < 0, 0), (np.isnan(virtual), -1)):
        previous[mask], following[mask] = value, value
    return previous.astype(np.intp), following.astype(np.intp)


def _quantile_values(x: ArrayLike, positions: np.ndarray, floats: bool) -> tuple[list[ArrayLike], Any]:
    """The order statistics at each array of `positions` (shaped positions.shape + x's other axes) and, for
    floats, each row's largest element (for the NaN check)."""
    n, rest = aval_of(x).shape[-1], aval_of(x).shape[:-1]
    flat = [int(p) % n for group in positions for p in np.ravel(group)]
    picked = _select(x, flat + ([n - 1] if floats else []))
    lead, out = np.shape(positions[0]), []
    for k in range(len(positions)):
        part = reshape(_part(picked, k * math.prod(lead), math.prod(lead)), rest + lead)
        out.append(transpose(part, [len(rest) + j for j in range(len(lead))] + list(range(len(rest)))))
    largest = reshape(_part(picked, len(flat), 1), rest) if floats else None
    return out, largest


def _lerp(a: ArrayLike, b: ArrayLike, t: Any) -> ArrayLike:
    """numpy's _lerp: a + (b - a) * t, or b - (b - a) * (1 - t) where t >= 0.5 (t a constant)."""
    diff = subtract(b, a)
    low, high = np.asarray(t) < 0.5, np.asarray(t) >= 0.5
    below = add(a, multiply(diff, t)) if low.any() else None
    above = subtract(b, multiply(diff, 1 - t)) if high.any() else None
    if below is None or above is None:
        return below if above is None else above
    return where(np.broadcast_to(high, np.broadcast_shapes(high.shape, aval_of(below).shape)), above, below)


def _quantile(op: str, a: ArrayLike, q: np.ndarray, weak: bool, axis: Any, method: Any, keepdims: Any
              ) -> ArrayLike:
    """numpy's _quantile with the reduced axes last: virtual indexes from `method` (constants), the order
    statistics around them, numpy's interpolation between them, NaN where the axes hold a NaN."""
    if method not in _METHODS:
        raise UnsupportedError(f"{op}: method={method!r} is not a quantile method; use one of {', '.join(_METHODS)}"
                               f"{where_text()}")
    shape = aval_of(a).shape
    x, axes = _reduced_last(op, a, axis)
    n = aval_of(x).shape[-1]
    if n == 0:
        raise ShapeError(f"{op}: cannot take a quantile over an empty axis (axes {axes} of shape {shape})"
                         f"{where_text()}")
    index_of, fix_gamma = _METHODS[method]
    virtual = np.asanyarray(index_of(n, q))
    floats = aval_of(x).dtype.kind == "f"
    if fix_gamma is None or method == "linear" and virtual.dtype.kind in "iu":
        (result,), largest = _quantile_values(x, [virtual], floats)
    else:
        previous, following = _neighbours(virtual, n)
        gamma = np.asanyarray(fix_gamma(np.asanyarray(virtual - previous), virtual), dtype=virtual.dtype)
        gamma = float(gamma) if weak else gamma.reshape(virtual.shape + (1,) * (aval_of(x).ndim - 1))
        (low, high), largest = _quantile_values(x, [previous, following], floats)
        result = _lerp(low, high, gamma)
    if floats:
        result = _nan_where_nan(result, largest)
    return _kept(result, shape, axes, keepdims, virtual.shape)


def _constant_q(op: str, q: Any) -> Any:
    """q as a constant (an array from outside the arguments is one, checked at every call); traced q is refused."""
    q = constant_of(q)
    if isinstance(q, Tracer) or isinstance(q, (list, tuple)) and any(isinstance(v, Tracer) for v in q):
        raise UnsupportedError(f"{op}: q must be constant (numbers or a numpy array), not traced: it picks which "
                               f"sorted elements are read{where_text()}")
    return q


def _checked_q(op: str, fraction: np.ndarray, q: Any, top: int) -> np.ndarray:
    """q as a fraction of the axis, checked: a scalar or 1-d (numpy also takes 2-d), every value in [0, 1]."""
    if fraction.ndim > 2 or not (fraction.size == 0 or (fraction.min() >= 0 and fraction.max() <= 1)):
        raise ShapeError(f"{op}: q must be a scalar or 1-d with every value in [0, {top}], got {q!r}{where_text()}")
    return fraction


@implements(np.quantile)
def quantile(a: ArrayLike, q: Any, axis: Any = None, overwrite_input: Any = False, method: Any = "linear",
             keepdims: Any = False) -> ArrayLike:
    """numpy.quantile with every numpy method (constant q); the result is numpy's, bit for bit; the gradient goes
    to the two elements interpolated between, weighted as they are. `overwrite_input` changes no value."""
    q = _constant_q("quantile", q)
    weak = type(q) in (int, float)
    return _quantile("quantile", a, _checked_q("quantile", np.asanyarray(q), q, 1), weak, axis, method, keepdims)


@implements(np.percentile)
def percentile(a: ArrayLike, q: Any, axis: Any = None, overwrite_input: Any = False, method: Any = "linear",
               keepdims: Any = False) -> ArrayLike:
    """numpy.percentile: numpy.quantile of q / 100."""
    q = _constant_q("percentile", q)
    weak = type(q) in (int, float)
    fraction = np.asanyarray(np.true_divide(q, 100))
    return _quantile("percentile", a, _checked_q("percentile", fraction, q, 100), weak, axis, method, keepdims)
