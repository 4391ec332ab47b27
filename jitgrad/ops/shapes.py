"""Shape ops: the numpy bindings that move, join and split axes (reshape in C and Fortran order, transpose,
diagonal, concatenate with dtype and casting, split, tile...). The region primitives (slice, pad, concatenate)
are in `regions`; numpy's np.pad and the array-building functions are in `building`."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing.dispatch import implements, register_method, register_property
from jitgrad.errors import ShapeError, TraceError, UnsupportedError
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, convert, normalize_axes, reshape_p, transpose_p
from jitgrad.ops.regions import concatenate_p, slice_region

def static_int(op: str, name: str, value: Any) -> int:
    """An int argument that shapes the trace (an offset, a count, a shift): a traced value is refused."""
    value = constant_of(value)
    if isinstance(value, Tracer):
        raise UnsupportedError(f"{op}: {name} must be a Python int known while tracing, not a traced value (it "
                               f"decides the output's shape){where_text()}")
    if not isinstance(value, (int, np.integer)):
        raise TraceError(f"{op}: {name} must be an int, got {value!r}{where_text()}")
    return int(value)


# ---------------------------------------------------------------------- reshape and friends

def _c_reshape(x: ArrayLike, shape: Any) -> ArrayLike:
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
    return bind(reshape_p, x, shape=tuple(int(d) for d in shape))


def _orders(op: str, order: str, allowed: str = "CF") -> str:
    """numpy's index orders: C (last axis fastest) and F (first axis fastest). "A" and "K" depend on the
    memory layout of the array, which a trace does not follow: refused."""
    if order is None:
        order = "C"
    if order not in allowed:
        raise UnsupportedError(f"{op}(..., order={order!r}) is not supported: jitgrad reads and writes in C or F "
                               f"(Fortran) index order, not by memory layout ('A', 'K'){where_text()}")
    return order


def _reversed_axes(x: ArrayLike) -> ArrayLike:
    return transpose(x) if aval_of(x).ndim > 1 else x


@implements(np.reshape)
def reshape(a: ArrayLike, /, shape: Any, order: str = "C", *, copy: Any = None) -> ArrayLike:
    """numpy.reshape in C or F index order (F: the transpose of the C reshape of the transpose); `copy`
    changes no value."""
    if _orders("reshape", order) == "F":
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        return _reversed_axes(_c_reshape(_reversed_axes(a), shape[::-1]))
    return _c_reshape(a, shape)


def _method_reshape(self: ArrayLike, /, *shape: Any, order: str = "C", copy: Any = None) -> ArrayLike:
    """ndarray.reshape(*shape) or (shape)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return reshape(self, shape, order)


register_method("reshape", _method_reshape, "(self, /, *shape, order='C', copy=None)")


@implements(np.ravel)
def ravel(a: ArrayLike, order: str = "C") -> ArrayLike:
    """numpy.ravel in C or F order."""
    return reshape(a, (-1,), _orders("ravel", order))


register_method("ravel", ravel, "(self, /, order='C')")
register_method("flatten", ravel, "(self, /, order='C')")


@implements(np.transpose)
def transpose(a: ArrayLike, axes: Any = None) -> ArrayLike:
    shape = aval_of(a).shape
    nd = len(shape)
    if axes is None:
        perm = tuple(reversed(range(nd)))
    elif len(axes) != nd:
        raise ShapeError(f"transpose: axes {tuple(axes)} don't match an array of shape {shape}{where_text()}")
    else:
        perm = tuple(normalize_axes("transpose", shape, ax)[0] for ax in axes)
    if sorted(perm) != list(range(nd)):
        raise ShapeError(f"transpose: axes {tuple(axes)} are not a permutation of the {nd} axes of shape {shape}"
                         f"{where_text()}")
    if perm == tuple(range(nd)):
        return a
    return bind(transpose_p, a, perm=perm)


def _method_transpose(self: ArrayLike, /, *axes: Any) -> ArrayLike:
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return transpose(self, axes or None)


register_method("transpose", _method_transpose, "(self, /, *axes)")
register_property("T", lambda t: transpose(t))


@implements(np.swapaxes, method="swapaxes")
def swapaxes(a: ArrayLike, axis1: int, axis2: int) -> ArrayLike:
    shape = aval_of(a).shape
    perm = list(range(len(shape)))
    i, j = normalize_axes("swapaxes", shape, axis1)[0], normalize_axes("swapaxes", shape, axis2)[0]
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def swap_last(x: ArrayLike) -> ArrayLike:
    return swapaxes(x, -1, -2)


register_property("mT", swap_last)


@implements(np.expand_dims)
def expand_dims(a: ArrayLike, axis: Any) -> ArrayLike:
    shape = list(aval_of(a).shape)
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out_ndim = len(shape) + len(items)
    for ax in normalize_axes("expand_dims", (1,) * out_ndim, axis):
        shape.insert(ax, 1)
    return reshape(a, tuple(shape))


@implements(np.squeeze, method="squeeze")
def squeeze(a: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(a).shape
    axes = tuple(i for i, d in enumerate(shape) if d == 1) if axis is None else normalize_axes("squeeze", shape, axis)
    if any(shape[i] != 1 for i in axes):
        raise ShapeError(f"squeeze: cannot select an axis to squeeze out which has size not equal to one "
                         f"(shape {shape}, axis {axis}){where_text()}")
    return reshape(a, tuple(d for i, d in enumerate(shape) if i not in axes))


@implements(np.moveaxis)
def moveaxis(a: ArrayLike, source: Any, destination: Any) -> ArrayLike:
    """numpy.moveaxis: move axes to new positions, the others keeping their order."""
    shape = aval_of(a).shape
    src = [normalize_axes("moveaxis", shape, s)[0] for s in (source if isinstance(source, (tuple, list)) else [source])]
    dst = [normalize_axes("moveaxis", shape, d)[0]
           for d in (destination if isinstance(destination, (tuple, list)) else [destination])]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must be the same number of "
                         f"distinct axes (array of shape {shape}){where_text()}")
    order = [k for k in range(len(shape)) if k not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(a, order)


@implements(np.flip)
def flip(m: ArrayLike, axis: Any = None) -> ArrayLike:
    shape = aval_of(m).shape
    axes = normalize_axes("flip", shape, axis)
    return slice_region(m, [shape[k] - 1 if k in axes and shape[k] else 0 for k in range(len(shape))],
                        [-1 if k in axes else 1 for k in range(len(shape))], shape)


@implements(np.fliplr)
def fliplr(m: ArrayLike) -> ArrayLike:
    return flip(m, 1)


@implements(np.flipud)
def flipud(m: ArrayLike) -> ArrayLike:
    return flip(m, 0)


@implements(np.diagonal, method="diagonal")
def diagonal(a: ArrayLike, offset: int = 0, axis1: int = 0, axis2: int = 1) -> ArrayLike:
    """numpy.diagonal: axis1 and axis2 removed, their diagonal appended last; a strided slice of the two axes
    flattened, so its gradient is a pad (no scatter)."""
    shape = aval_of(a).shape
    if len(shape) < 2:
        raise ShapeError(f"diagonal: an array of shape {shape} has fewer than 2 dimensions{where_text()}")
    i, j = (normalize_axes("diagonal", shape, ax)[0] for ax in (axis1, axis2))
    if i == j:
        raise ShapeError(f"diagonal: axis1 and axis2 cannot be the same (axes {axis1}, {axis2} of shape {shape})"
                         f"{where_text()}")
    k = static_int("diagonal", "offset", offset)
    rest = [shape[d] for d in range(len(shape)) if d not in (i, j)]
    n1, n2 = shape[i], shape[j]
    length = builtins.max(0, builtins.min(n1, n2 - k) if k >= 0 else builtins.min(n1 + k, n2))
    flat = reshape(transpose(a, [d for d in range(len(shape)) if d not in (i, j)] + [i, j]), rest + [n1 * n2])
    start = (k if k >= 0 else -k * n2) if length else 0
    return slice_region(flat, [0] * len(rest) + [start], [1] * len(rest) + [n2 + 1], rest + [length])


# ---------------------------------------------------------------------- joining and splitting

def _joined_dtype(op: str, arrays: Sequence[ArrayLike], dtype: Any, casting: str) -> np.dtype:
    """The dtype numpy joins arrays in: `dtype` if given (each input cast to it under `casting`), else
    the arrays' common dtype."""
    if dtype is None:
        return np.result_type(*[aval_of(x).dtype for x in arrays])
    target = np.dtype(dtype)
    for x in arrays:
        if not np.can_cast(aval_of(x).dtype, target, casting=casting):
            raise TraceError(f"{op}: Cannot cast array data from {aval_of(x).dtype!r} to {target!r} according to the "
                             f"rule {casting!r}{where_text()}")
    return target


@implements(np.concatenate)
def concatenate(arrays: Sequence[ArrayLike], /, axis: Any = 0, *, dtype: Any = None, casting: str = "same_kind"
                ) -> ArrayLike:
    """numpy.concatenate (axis=None joins the flattened arrays), with numpy's `dtype` and `casting`."""
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
    target = _joined_dtype("concatenate", arrays, dtype, casting)
    arrays = [convert(x, target) for x in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return bind(concatenate_p, *arrays, axis=ax)


@implements(np.stack)
def stack(arrays: Sequence[ArrayLike], axis: int = 0, *, dtype: Any = None, casting: str = "same_kind"
          ) -> ArrayLike:
    arrays = list(arrays)
    shapes = [aval_of(x).shape for x in arrays]
    if not arrays or any(sh != shapes[0] for sh in shapes):
        raise ShapeError(f"stack: all input arrays must have the same shape, got {shapes}{where_text()}")
    (ax,) = normalize_axes("stack", (1,) * (len(shapes[0]) + 1), axis)
    return concatenate([expand_dims(x, ax) for x in arrays], axis=ax, dtype=dtype, casting=casting)


@implements(np.hstack)
def hstack(tup: Sequence[ArrayLike], *, dtype: Any = None, casting: str = "same_kind") -> ArrayLike:
    arrays = [reshape(x, (1,)) if aval_of(x).ndim == 0 else x for x in tup]
    return concatenate(arrays, axis=0 if arrays and aval_of(arrays[0]).ndim == 1 else 1, dtype=dtype, casting=casting)


@implements(np.vstack)
def vstack(tup: Sequence[ArrayLike], *, dtype: Any = None, casting: str = "same_kind") -> ArrayLike:
    return concatenate([reshape(x, (1, -1)) if aval_of(x).ndim < 2 else x for x in tup], axis=0, dtype=dtype,
                       casting=casting)


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


@implements(np.split)
def split(ary: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("split", ary, indices_or_sections, axis, equal=True)


@implements(np.array_split)
def array_split(ary: ArrayLike, indices_or_sections: Any, axis: int = 0) -> list[ArrayLike]:
    return _split("array_split", ary, indices_or_sections, axis, equal=False)


@implements(np.tile)
def tile(A: ArrayLike, reps: Any) -> ArrayLike:
    """numpy.tile as a broadcast of interleaved unit axes, then a reshape merging each pair."""
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    if any(not isinstance(r, (int, np.integer)) or r < 0 for r in reps):
        raise ShapeError(f"tile: reps must be non-negative ints, got {reps!r}{where_text()}")
    shape = aval_of(A).shape
    nd = builtins.max(len(shape), len(reps))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    interleaved = reshape(A, [v for d in shape for v in (1, d)])
    spread = broadcast_to(interleaved, [v for r, d in zip(reps, shape) for v in (r, d)])
    return reshape(spread, [r * d for r, d in zip(reps, shape)])
