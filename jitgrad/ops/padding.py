"""np.pad in the modes that copy values, and sliding_window_view (the windows numpy code reads, from a padded
array, to write a convolution): composites of slices, pads and concatenation, with no rule of their own."""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, TraceError, UnsupportedError
from jitgrad.tracing.tracer import Tracer, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, normalize_axes
from jitgrad.ops.arithmetic import multiply, subtract
from jitgrad.ops.regions import pad_region, slice_region
from jitgrad.ops.shapes import concatenate, reshape, stack, static_int
from jitgrad.ops.building import _array, _axis_slice


# ---------------------------------------------------------------------- np.pad

_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")
_PAD_KWARGS = {"constant": {"constant_values"}, "reflect": {"reflect_type"}, "symmetric": {"reflect_type"}}


@implements(np.pad)
def pad(array: ArrayLike, pad_width: Any, mode: str = "constant", **kwargs: Any) -> ArrayLike:
    """numpy.pad in the modes that copy values: 'constant' (one constant number), 'edge', 'wrap', 'reflect' and
    'symmetric' (reflect_type 'even' or 'odd'); each axis in turn, with numpy's steps for pads wider than the
    array."""
    if not isinstance(mode, str) or mode not in _PAD_MODES:
        raise UnsupportedError(f"numpy.pad: mode={mode!r} is not supported; jitgrad pads in the modes "
                               f"{', '.join(_PAD_MODES)} (not 'linear_ramp', 'maximum', 'mean', 'median', 'minimum', "
                               f"'empty' or a function){where_text()}")
    unknown = set(kwargs) - _PAD_KWARGS.get(mode, set())
    if unknown:
        raise TraceError(f"numpy.pad: unsupported keyword arguments for mode {mode!r}: {sorted(unknown)}"
                         f"{where_text()}")
    array = _array(array)
    a = aval_of(array)
    widths = _pad_widths(a.shape, pad_width)
    if mode == "constant":
        return _pad_constant(array, widths, kwargs.get("constant_values", 0))
    odd = kwargs.get("reflect_type", "even")
    if odd not in ("even", "odd"):
        raise TraceError(f"numpy.pad: reflect_type must be 'even' or 'odd', got {odd!r}{where_text()}")
    for ax, (lo, hi) in enumerate(widths):
        if a.shape[ax] == 0 and (lo or hi):
            raise ShapeError(f"pad: can't extend empty axis {ax} (shape {a.shape}) using modes other than "
                             f"'constant'{where_text()}")
        if lo or hi:
            array = _pad_axis(mode, array, ax, lo, hi, odd == "odd")
    return array


def _pad_axis(mode: str, x: ArrayLike, ax: int, lo: int, hi: int, odd: bool) -> ArrayLike:
    """Axis `ax` of `x` padded by (lo, hi) in `mode`."""
    if mode == "edge":
        return _pad_edge(x, ax, lo, hi)
    if mode == "wrap":
        return _pad_wrap(x, ax, lo, hi)
    return _pad_reflect(x, ax, lo, hi, odd, include_edge=mode == "symmetric")


def _pad_widths(shape: tuple[int, ...], pad_width: Any) -> list[tuple[int, int]]:
    pad_width = constant_of(pad_width)
    if isinstance(pad_width, Tracer):
        raise UnsupportedError(f"pad: pad_width must be Python ints, not traced values{where_text()}")
    try:
        widths = np.broadcast_to(np.asarray(pad_width), (len(shape), 2))
    except ValueError:
        raise ShapeError(f"pad: pad_width {pad_width!r} does not fit an array of shape {shape}{where_text()}") \
            from None
    if widths.dtype.kind not in "iu" or (widths < 0).any():
        raise ShapeError(f"pad: pad_width {pad_width!r} must be non-negative ints{where_text()}")
    return [(int(lo), int(hi)) for lo, hi in widths]


def _pad_constant(array: ArrayLike, widths: list[tuple[int, int]], constant_values: Any) -> ArrayLike:
    """One constant number around the array (a pad region)."""
    a = aval_of(array)
    constant_values = constant_of(constant_values)
    if isinstance(constant_values, Tracer) or np.ndim(constant_values) != 0:
        raise UnsupportedError(f"pad: constant_values must be one constant number, got {constant_values!r}"
                               f"{where_text()}")
    shape = [d + lo + hi for d, (lo, hi) in zip(a.shape, widths)]
    fill = np.asarray(constant_values).astype(a.dtype).item()
    return pad_region(array, [lo for lo, _ in widths], [1] * a.ndim, shape, fill)


def _spread(x: ArrayLike, axis: int, n: int) -> ArrayLike:
    """A length-1 axis broadcast to length n."""
    shape = aval_of(x).shape
    return broadcast_to(x, shape[:axis] + (n,) + shape[axis + 1:])


def _pad_edge(x: ArrayLike, ax: int, lo: int, hi: int) -> ArrayLike:
    n = aval_of(x).shape[ax]
    return concatenate([_spread(_axis_slice(x, ax, 0, 1), ax, lo), x,
                        _spread(_axis_slice(x, ax, n - 1, 1), ax, hi)], axis=ax)


def _pad_reflect(x: ArrayLike, ax: int, lo: int, hi: int, odd: bool, include_edge: bool) -> ArrayLike:
    """numpy's reflection, chunk by chunk (a chunk at most the original length; 'odd' as 2 * edge - chunk); an
    axis of length 1 is padded with its edge, as numpy does."""
    n = aval_of(x).shape[ax]
    if n == 1:
        return _pad_edge(x, ax, lo, hi)
    edge = 1 if include_edge else 0
    while lo or hi:
        length = aval_of(x).shape[ax]
        period = length // n * n if include_edge else (length - 1) // (n - 1) * (n - 1)
        left, right = builtins.min(period, lo), builtins.min(period, hi)
        lchunk = _axis_slice(x, ax, left - edge, left, -1)
        rchunk = _axis_slice(x, ax, length - 2 + edge, right, -1)
        if odd:
            lchunk = subtract(multiply(2, _axis_slice(x, ax, 0, 1)), lchunk)
            rchunk = subtract(multiply(2, _axis_slice(x, ax, length - 1, 1)), rchunk)
        x = concatenate([lchunk, x, rchunk], axis=ax)
        lo, hi = lo - left, hi - right
    return x


def _pad_wrap(x: ArrayLike, ax: int, lo: int, hi: int) -> ArrayLike:
    """numpy's wrap, chunk by chunk (a chunk at most a whole number of periods of the original)."""
    n = aval_of(x).shape[ax]
    while lo or hi:
        length = aval_of(x).shape[ax]
        period = length // n * n
        left, right = builtins.min(period, lo), builtins.min(period, hi)
        x = concatenate([_axis_slice(x, ax, period - left, left), x, _axis_slice(x, ax, length - period, right)],
                        axis=ax)
        lo, hi = lo - left, hi - right
    return x


# ---------------------------------------------------------------------- sliding windows

@implements(np.lib.stride_tricks.sliding_window_view)
def sliding_window_view(x: ArrayLike, window_shape: Any, axis: Any = None) -> ArrayLike:
    """numpy's sliding_window_view (how numpy code writes convolutions): each window position is a strided
    slice, stacked on a last axis then split into `window_shape`; the gradient is one pad per position, summed
    (no scatter)."""
    x = _array(x)
    shape = aval_of(x).shape
    window = tuple(static_int("sliding_window_view", "window_shape", w)
                   for w in (window_shape if np.iterable(window_shape) else (window_shape,)))
    if any(w < 0 for w in window):
        raise ShapeError(f"sliding_window_view: window_shape {window} cannot contain negative values{where_text()}")
    if axis is None:
        axis = tuple(range(len(shape)))
    axes = [normalize_axes("sliding_window_view", shape, ax)[0]
            for ax in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    if len(window) != len(axes):
        raise ShapeError(f"sliding_window_view: window_shape {window} needs one axis per window dimension, got axis "
                         f"{axis!r} for an array of shape {shape}{where_text()}")
    trimmed = list(shape)
    for ax, w in zip(axes, window):
        if trimmed[ax] < w:
            raise ShapeError(f"sliding_window_view: window shape {window} cannot be larger than input array shape "
                             f"{shape}{where_text()}")
        trimmed[ax] -= w - 1
    views = []
    for offsets in np.ndindex(*window):
        starts = [0] * len(shape)
        for ax, o in zip(axes, offsets):
            starts[ax] += o
        views.append(slice_region(x, starts, [1] * len(shape), trimmed))
    if not views:  # a window of length 0: an empty result
        return reshape(slice_region(x, [0] * len(shape), [1] * len(shape), [0] * len(shape)), trimmed + list(window))
    return reshape(stack(views, axis=-1), trimmed + list(window))
