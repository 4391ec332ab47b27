"""Shape ops: reshape, transpose and friends, slicing regions, padding, concatenation, splitting, tiling."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from .. import primitives as P
from ..errors import ShapeError, UnsupportedError
from ..tracing import Tracer, bind, constant_of, where_text
from .core import ArrayLike, aval_of, broadcast_to, convert, normalize_axes


def reshape(x: ArrayLike, shape: Any) -> ArrayLike:
    a = aval_of(x)
    shape = constant_of(shape)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(constant_of(d) for d in shape)
    if any(isinstance(d, Tracer) for d in shape):
        raise UnsupportedError(f"reshape: sizes must be Python ints, not traced values{where_text()}")
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension, got {shape}{where_text()}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or a.size % known:
            raise ShapeError(f"reshape: cannot reshape array of shape {a.shape} into {shape}{where_text()}")
        shape = tuple(a.size // known if d == -1 else int(d) for d in shape)
    if int(np.prod(shape, dtype=np.int64)) != a.size:
        raise ShapeError(f"reshape: cannot reshape array of size {a.size} (shape {a.shape}) into shape "
                         f"{shape}{where_text()}")
    if shape == a.shape:
        return x
    return bind(P.reshape_p, x, shape=tuple(int(d) for d in shape))


def transpose(x: ArrayLike, axes: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    nd = len(shape)
    if axes is None:
        perm = tuple(reversed(range(nd)))
    elif len(axes) != nd:
        raise ShapeError(f"transpose: axes {tuple(axes)} don't match an array of shape {shape}{where_text()}")
    else:
        perm = tuple(normalize_axes("transpose", shape, a)[0] for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ShapeError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape {shape}"
                         f"{where_text()}")
    if perm == tuple(range(nd)):
        return x
    return bind(P.transpose_p, x, perm=perm)


def swapaxes(x: ArrayLike, a: int, b: int) -> ArrayLike:
    nd = aval_of(x).ndim
    perm = list(range(nd))
    a, b = normalize_axes("swapaxes", aval_of(x).shape, a)[0], normalize_axes("swapaxes", aval_of(x).shape, b)[0]
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def swap_last(x: ArrayLike) -> ArrayLike:
    return swapaxes(x, -1, -2)


def expand_dims(x: ArrayLike, axis: Any) -> ArrayLike:
    shape = list(aval_of(x).shape)
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out_ndim = len(shape) + len(items)
    for a in normalize_axes("expand_dims", (1,) * out_ndim, axis):
        shape.insert(a, 1)
    return reshape(x, tuple(shape))


def squeeze(x: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    axes = tuple(i for i, d in enumerate(shape) if d == 1) if axis is None else normalize_axes("squeeze", shape, axis)
    if any(shape[i] != 1 for i in axes):
        raise ShapeError(f"squeeze: cannot select an axis to squeeze out which has size not equal to one "
                         f"(shape {shape}, axis {axis}){where_text()}")
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


def ravel(x: ArrayLike) -> ArrayLike:
    return reshape(x, (-1,))


def moveaxis(x: ArrayLike, source: Any, destination: Any) -> ArrayLike:
    """numpy.moveaxis: move axes to new positions, the others keeping their order."""
    shape = aval_of(x).shape
    src = [normalize_axes("moveaxis", shape, a)[0] for a in (source if isinstance(source, (tuple, list)) else [source])]
    dst = [normalize_axes("moveaxis", shape, a)[0]
           for a in (destination if isinstance(destination, (tuple, list)) else [destination])]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must be the same number of "
                         f"distinct axes (array of shape {shape}){where_text()}")
    order = [a for a in range(len(shape)) if a not in src]
    for d, a in sorted(zip(dst, src)):
        order.insert(d, a)
    return transpose(x, order)


def slice_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> ArrayLike:
    """The elements `starts[k] + steps[k] * i` (i < shape[k]) of each axis; a strided slice."""
    starts, steps, shape = tuple(int(v) for v in starts), tuple(int(v) for v in steps), tuple(int(v) for v in shape)
    if shape == aval_of(x).shape and all(v == 0 for v in starts) and all(v == 1 for v in steps):
        return x
    return bind(P.slice_p, x, starts=starts, steps=steps, shape=shape)


def pad_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int], value: Any
               ) -> ArrayLike:
    """An array of `shape` filled with `value`, holding `x` at the region `slice_region` would read."""
    starts, steps, shape = tuple(int(v) for v in starts), tuple(int(v) for v in steps), tuple(int(v) for v in shape)
    if shape == aval_of(x).shape and all(v == 0 for v in starts) and all(v == 1 for v in steps):
        return x
    return bind(P.pad_p, x, starts=starts, steps=steps, shape=shape, value=value)


def flip(x: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(x).shape
    axes = normalize_axes("flip", shape, axis)
    return slice_region(x, [shape[k] - 1 if k in axes and shape[k] else 0 for k in range(len(shape))],
                        [-1 if k in axes else 1 for k in range(len(shape))], shape)


def pad(x: ArrayLike, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> ArrayLike:
    """numpy.pad with mode='constant' and one scalar constant (not traced)."""
    a = aval_of(x)
    if mode != "constant":
        raise UnsupportedError(f"pad: mode={mode!r} is not supported (only 'constant'){where_text()}")
    constant_values, pad_width = constant_of(constant_values), constant_of(pad_width)
    if isinstance(constant_values, Tracer) or np.ndim(constant_values) != 0:
        raise UnsupportedError(f"pad: constant_values must be one constant number, got {constant_values!r}"
                               f"{where_text()}")
    if isinstance(pad_width, Tracer):
        raise UnsupportedError(f"pad: pad_width must be Python ints, not traced values{where_text()}")
    try:
        widths = np.broadcast_to(np.asarray(pad_width), (a.ndim, 2))
    except ValueError:
        raise ShapeError(f"pad: pad_width {pad_width!r} does not fit an array of shape {a.shape}{where_text()}") \
            from None
    if widths.dtype.kind not in "iu" or (widths < 0).any():
        raise ShapeError(f"pad: pad_width {pad_width!r} must be non-negative ints{where_text()}")
    shape = tuple(int(d + lo + hi) for d, (lo, hi) in zip(a.shape, widths))
    fill = np.asarray(constant_values).astype(a.dtype).item()
    return pad_region(x, [int(lo) for lo, _ in widths], [1] * a.ndim, shape, fill)


def concatenate(arrays: Sequence[ArrayLike], axis: Any = 0, dtype: Any = None) -> ArrayLike:
    """numpy.concatenate (axis=None joins the flattened arrays)."""
    arrays = list(arrays)
    if not arrays:
        raise ShapeError(f"concatenate: need at least one array to concatenate{where_text()}")
    if axis is None:
        arrays, axis = [ravel(x) for x in arrays], 0
    shapes = [aval_of(x).shape for x in arrays]
    if any(len(sh) == 0 for sh in shapes):
        raise ShapeError(f"concatenate: zero-dimensional arrays cannot be concatenated (shapes {shapes})"
                         f"{where_text()}")
    (ax,) = normalize_axes("concatenate", shapes[0], axis)
    if any(len(sh) != len(shapes[0]) or sh[:ax] + sh[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:]
           for sh in shapes):
        raise ShapeError(f"concatenate: shapes {shapes} must match except along axis {axis}{where_text()}")
    target = np.dtype(dtype) if dtype is not None else np.result_type(*[aval_of(x).dtype for x in arrays])
    arrays = [convert(x, target) for x in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return bind(P.concatenate_p, *arrays, axis=ax)


def stack(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    arrays = list(arrays)
    shapes = [aval_of(x).shape for x in arrays]
    if not arrays or any(sh != shapes[0] for sh in shapes):
        raise ShapeError(f"stack: all input arrays must have the same shape, got {shapes}{where_text()}")
    return concatenate([expand_dims(x, axis) for x in arrays], axis=axis)


def hstack(arrays: Sequence[ArrayLike]) -> ArrayLike:
    arrays = [reshape(x, (1,)) if aval_of(x).ndim == 0 else x for x in arrays]
    return concatenate(arrays, axis=0 if arrays and aval_of(arrays[0]).ndim == 1 else 1)


def vstack(arrays: Sequence[ArrayLike]) -> ArrayLike:
    return concatenate([reshape(x, (1, -1)) if aval_of(x).ndim < 2 else x for x in arrays], axis=0)


def _split(op: str, x: ArrayLike, indices_or_sections: Any, axis: int, equal: bool) -> list[ArrayLike]:
    shape = aval_of(x).shape
    (ax,) = normalize_axes(op, shape, axis)
    n = shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or equal and n % sections:
            raise ShapeError(f"{op}: cannot split axis {axis} of length {n} (shape {shape}) into {sections} equal "
                             f"sections{where_text()}")
        sizes = [n // sections + (1 if k < n % sections else 0) for k in range(sections)]
        bounds = [int(b) for b in np.cumsum([0] + sizes)]
    else:
        bounds = [0] + [int(np.clip(b if b >= 0 else b + n, 0, n)) for b in indices_or_sections] + [n]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        size = builtins.max(hi - lo, 0)
        parts.append(slice_region(x, [lo if k == ax else 0 for k in range(len(shape))], [1] * len(shape),
                                  [size if k == ax else d for k, d in enumerate(shape)]))
    return parts


def split(x: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("split", x, indices_or_sections, axis, equal=True)


def array_split(x: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("array_split", x, indices_or_sections, axis, equal=False)


def tile(x: ArrayLike, reps: Any) -> ArrayLike:
    """numpy.tile as a broadcast of interleaved unit axes, then a reshape merging each pair."""
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    if any(not isinstance(r, (int, np.integer)) or r < 0 for r in reps):
        raise ShapeError(f"tile: reps must be non-negative ints, got {reps!r}{where_text()}")
    shape = aval_of(x).shape
    nd = builtins.max(len(shape), len(reps))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    interleaved = reshape(x, [v for d in shape for v in (1, d)])
    spread = broadcast_to(interleaved, [v for r, d in zip(reps, shape) for v in (r, d)])
    return reshape(spread, [r * d for r, d in zip(reps, shape)])
