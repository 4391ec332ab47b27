"""Indexing reads: the gather and scatter-add primitives (scatter-add is gather's gradient), numpy's basic and
advanced `x[key]`, take (all modes), take_along_axis, repeat, one_hot, and iteration over a traced array."""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements
from jitgrad.errors import ArgumentError, ShapeError, TraceError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, normalize_axes
from jitgrad.ops.arithmetic import remainder
from jitgrad.ops.comparisons import astype, equal, maximum, minimum
from jitgrad.ops.regions import slice_region
from jitgrad.ops.shapes import expand_dims, ravel, reshape, transpose


def _gather_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    x, *indices = avals
    return x.with_shape(indices[0].shape + x.shape[len(indices):])


def _gather_impl(x: Any, *indices: Any) -> np.ndarray:
    """x[i0, i1, ...]: integer arrays (of one shape) indexing the leading axes of x."""
    return np.asarray(x)[tuple(np.asarray(i) for i in indices)]


def _gather_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    x, *indices = ins
    if _picks_one_per_row(x, indices):
        return [_one_hot_rows(cts[0], indices[1], x)] + [None] * len(indices)
    return [L.scatter_add(cts[0], indices, x.shape)] + [None] * len(indices)


def _picks_one_per_row(x: Any, indices: Sequence[Any]) -> bool:
    """Is this gather x[np.arange(rows), cols] on a matrix, the cross-entropy pattern?"""
    if len(x.shape) != 2 or len(indices) != 2 or not isinstance(indices[0], np.ndarray):
        return False
    rows = indices[0]
    return rows.shape == (x.shape[0],) and np.array_equal(rows, np.arange(x.shape[0]))


def _one_hot_rows(g: Any, cols: Any, x: Any) -> Any:
    """The gradient of x[arange(rows), cols] as where(cols[:, None] == arange(n), g[:, None], 0): elementwise,
    so it fuses with the rest of the backward instead of scattering into a fresh array."""
    rows, n = x.shape
    cols = L.convert(cols, np.int64)
    wrapped = L.select(L.lt(cols, 0), L.add(cols, n), cols)  # numpy's negative indices count from the end
    column = L.broadcast_to(L.reshape(wrapped, (rows, 1)), (rows, n))
    hit = L.eq(column, L.broadcast_to(np.arange(n, dtype=np.int64).reshape(1, n), (rows, n)))
    return L.select(hit, L.broadcast_to(L.reshape(g, (rows, 1)), (rows, n)), 0)


def _scatter_add_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(shape)


def _scatter_add_impl(g: Any, *indices: Any, shape: tuple[int, ...]) -> np.ndarray:
    """zeros(shape) with g added at [i0, i1, ...]; repeated indices accumulate, in index order (np.add.at's
    bits). Where the indices pick rows (trailing axes not indexed: an embedding's gradient), add.at runs on the
    flat output with one flat position per element: numpy's fast path for a 1-D target, 4x faster than index
    arrays into leading axes (1024 rows of 64 into (94, 64): 0.15 against 0.56 ms); each output element still
    gets its addends in the same order, starting from 0."""
    g = np.asarray(g)
    lead = tuple(np.asarray(i) for i in indices)
    rest = shape[len(lead):]
    if not rest:
        out = np.zeros(shape, g.dtype)
        np.add.at(out, lead, g)
        return out
    lead = tuple(np.broadcast_arrays(*lead))
    rows = np.zeros(lead[0].shape, np.intp)
    for axis, (index, size) in enumerate(zip(lead, shape)):
        if index.size and (index.min() < -size or index.max() >= size):
            bad = index[(index < -size) | (index >= size)].flat[0]
            raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {size}")
        index = index.astype(np.intp, copy=False)  # unsigned indices too (uint64 + int64 would be float)
        rows = rows * size + np.where(index < 0, index + size, index)
    trailing = math.prod(rest)
    positions = rows.reshape(-1, 1) * trailing + np.arange(trailing, dtype=np.intp)
    out = np.zeros(math.prod(shape), g.dtype)
    np.add.at(out, positions.reshape(-1), np.broadcast_to(g, rows.shape + rest).reshape(-1))
    return out.reshape(shape)


def _scatter_add_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, shape: tuple[int, ...]
                     ) -> list[Any]:
    _, *indices = ins
    return [L.gather(cts[0], indices)] + [None] * len(indices)


def _batch_indices(b: Any, indices: Sequence[Any], dims: Sequence[Any], lead: bool) -> list[Any]:
    """The index arrays batched at 0 (broadcast where not batched), after, with `lead`, an index reading the
    batch axis of the indexed array at each batch position."""
    found = [b.move(i, d, 0) for i, d in zip(indices, dims)]
    if not lead:
        return found
    shape = aval_of(found[0]).shape
    iota = np.arange(b.size, dtype=np.int64).reshape((b.size,) + (1,) * (len(shape) - 1))
    return [L.broadcast_to(iota, shape)] + found


def _batch_gather(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    (x, *indices), (dx, *di) = args, dims
    x = x if dx is None else b.move(x, dx, 0)
    return [L.gather(x, _batch_indices(b, indices, di, dx is not None))], [0]


def _batch_scatter_add(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    (g, *indices), (dg, *di) = args, dims
    found = _batch_indices(b, indices, di, True)
    return [L.scatter_add(b.move(g, dg, 0), found, (b.size,) + e.params["shape"])], [0]


gather_p = L.gather_p = declare(Primitive("gather", Kind.HOST, _gather_rule, _gather_impl, _gather_vjp,
                                        backward_label="IndexBackward", batch=_batch_gather))
scatter_add_p = L.scatter_add_p = declare(Primitive(
    "scatter_add", Kind.HOST, _scatter_add_rule, _scatter_add_impl, _scatter_add_vjp,
    backward_label="IndexPutBackward", batch=_batch_scatter_add))


@implements(np.repeat, method="repeat")
def repeat(a: ArrayLike, repeats: Any, axis: Any = None) -> ArrayLike:
    """numpy.repeat with constant repeats (one count, or one per element along the axis)."""
    x = a
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    (ax,) = normalize_axes("repeat", shape, axis)
    repeats = constant_of(repeats)
    if isinstance(repeats, Tracer):
        raise UnsupportedError(f"repeat: traced repeats give a data-dependent shape; pass constant counts"
                               f"{where_text()}")
    counts = np.asarray(repeats)
    if counts.dtype.kind not in "iu" or (counts < 0).any() or counts.ndim > 1 or \
            counts.ndim == 1 and counts.shape[0] not in (1, shape[ax]):
        raise ShapeError(f"repeat: repeats {repeats!r} must be non-negative ints, one or one per element of axis "
                         f"{axis} (shape {shape}){where_text()}")
    if counts.size == 1:
        r = int(counts.reshape(-1)[0])
        spread = broadcast_to(expand_dims(x, ax + 1), shape[:ax + 1] + (r,) + shape[ax + 1:])
        return reshape(spread, shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])
    return take(x, np.repeat(np.arange(shape[ax]), counts), axis=ax)


def gather(x: ArrayLike, indices: Sequence[ArrayLike]) -> ArrayLike:
    """x[i0, i1, ...] for integer arrays of one shape indexing the leading axes (a host step)."""
    return bind(gather_p, x, *indices)


def _index_array(k: Any, shape: tuple[int, ...]) -> Any:
    """An integer index array (traced, or a constant as int64); anything else is a mistake we name."""
    if isinstance(k, Tracer) and k.dtype == np.bool_:
        k = constant_of(k)  # a mask read from outside the arguments shapes the trace: a guarded constant
    if isinstance(k, Tracer):
        if k.dtype == np.bool_:
            raise UnsupportedError(f"indexing an array of shape {shape} with a traced boolean mask: the result's "
                                   f"shape depends on the mask's values (how many are True), which a trace does not "
                                   f"know. Write np.where(mask, x, 0) to keep the shape, x[jg.nonzero(mask, size=N)] "
                                   f"for the first N selected elements (padded with index 0), or use a constant mask"
                                   f"{where_text()}")
        if k.dtype.kind not in "iu":
            raise TraceError(f"indexing an array of shape {shape}: arrays used as indices must be of integer (or "
                             f"boolean) type, got {k.aval}{where_text()}")
        return k
    arr = np.asarray(k)
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iub":
        raise TraceError(f"indexing an array of shape {shape}: only integers, slices, None, ..., and integer or "
                         f"boolean arrays are valid indices, got {k!r}{where_text()}")
    return arr if arr.dtype == np.bool_ else arr.astype(np.int64)


def _index_entries(shape: tuple[int, ...], key: Any) -> list[tuple[str, Any]]:
    """The key as one entry per indexed axis or new axis: ("slice", s), ("int", i), ("array", a), ("new", None)."""
    items = key if isinstance(key, tuple) else (key,)
    parsed: list[tuple[str, Any]] = []
    for k in items:
        if k is None:
            parsed.append(("new", None))
        elif k is Ellipsis:
            parsed.append(("ellipsis", None))
        elif isinstance(k, slice):
            parsed.append(("slice", k))
        elif isinstance(k, (bool, np.bool_)) or isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype == np.bool_:
            raise UnsupportedError(f"indexing with a scalar boolean is not supported (array of shape {shape})"
                                   f"{where_text()}")
        elif isinstance(k, (int, np.integer)):
            parsed.append(("int", int(k)))
        else:
            arr = _index_array(k, shape)
            parsed.append(("mask" if isinstance(arr, np.ndarray) and arr.dtype == np.bool_ else "array", arr))
    if [kind for kind, _ in parsed].count("ellipsis") > 1:
        raise ShapeError(f"an index can only have a single ellipsis ('...'), got {key!r}{where_text()}")
    used = builtins.sum(v.ndim if kind == "mask" else 1 for kind, v in parsed if kind not in ("new", "ellipsis"))
    if used > len(shape):
        raise ShapeError(f"too many indices for array: array of shape {shape} is {len(shape)}-dimensional, but "
                         f"{used} were indexed{where_text()}")
    fill = [("slice", slice(None))] * (len(shape) - used)
    at = next((i for i, (kind, _) in enumerate(parsed) if kind == "ellipsis"), len(parsed))
    parsed = parsed[:at] + fill + parsed[at + 1:]
    entries: list[tuple[str, Any]] = []
    axis = 0
    for kind, v in parsed:
        if kind == "mask":
            if v.shape != shape[axis:axis + v.ndim]:
                raise ShapeError(f"boolean index of shape {v.shape} does not match the indexed axes "
                                 f"{shape[axis:axis + v.ndim]} of an array of shape {shape}{where_text()}")
            entries += [("array", i.astype(np.int64)) for i in np.nonzero(v)]
        else:
            entries.append((kind, v))
        axis += 0 if kind == "new" else v.ndim if kind == "mask" else 1
    return entries


def getitem(x: ArrayLike, key: Any) -> ArrayLike:
    """x[key] with numpy semantics: basic slicing (steps, negative indices, None, ...) is a strided slice
    and reshape; integer-array and constant boolean-mask indexing is a gather whose gradient scatter-adds."""
    shape = aval_of(x).shape
    entries = _index_entries(shape, key)
    advanced = any(kind == "array" for kind, _ in entries)
    if advanced:
        entries = [("array", np.asarray(v, np.int64)) if kind == "int" else (kind, v) for kind, v in entries]
    picks: list[tuple[int, int, int]] = []  # per indexed axis: (start, step, length) of the basic slice
    axes: list[int | None] = []  # per entry: the array axis it indexes (None for a new axis)
    for kind, v in entries:
        if kind == "new":
            axes.append(None)
            continue
        axes.append(len(picks))
        picks.append(_basic_pick(kind, v, len(picks), shape))
    starts, steps, lengths = ([p[j] for p in picks] for j in range(3))
    y = slice_region(x, starts, steps, lengths)
    if not advanced:
        out = [1 if ax is None else lengths[ax] for (kind, _), ax in zip(entries, axes) if kind != "int"]
        return reshape(y, out)
    return _advanced_index(y, entries, axes, lengths)


def _basic_pick(kind: str, v: Any, axis: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(start, step, length) a slice, an int or an index array (the whole axis) selects from `axis`."""
    n = shape[axis]
    if kind == "slice":
        v = slice(*(constant_of(b) for b in (v.start, v.stop, v.step)))
        if builtins.any(isinstance(b, Tracer) for b in (v.start, v.stop, v.step)):
            raise UnsupportedError(f"slice bounds must be Python ints, not traced values (array of shape {shape})"
                                   f"{where_text()}")
        if v.step == 0:
            raise ShapeError(f"slice step cannot be zero (array of shape {shape}){where_text()}")
        start, stop, step = v.indices(n)
        length = len(range(start, stop, step))
        return (start if length else 0), step, length
    bad = None
    if kind == "int" and not -n <= v < n:
        bad = v
    elif isinstance(v, np.ndarray) and v.size and not ((-n <= v) & (v < n)).all():
        bad = v[(v < -n) | (v >= n)][0]
    if bad is not None:
        raise ShapeError(f"index {bad} is out of bounds for axis {axis} with size {n} (array of shape {shape})"
                         f"{where_text()}")
    return (v % n, 1, 1) if kind == "int" else (0, 1, n)


def _advanced_index(y: ArrayLike, entries: list[tuple[str, Any]], axes: list[int | None],
                    lengths: list[int]) -> ArrayLike:
    """Gather along the array-indexed axes of `y`; the index dimensions go where the first index array was
    when the index arrays are adjacent in the key, else first (numpy's rule)."""
    positions = [k for k, (kind, _) in enumerate(entries) if kind == "array"]
    arrays = [entries[k][1] for k in positions]
    try:
        batch = tuple(np.broadcast_shapes(*[aval_of(a).shape for a in arrays]))
    except ValueError:
        raise ShapeError(f"shape mismatch: indexing arrays could not be broadcast together with shapes "
                         f"{' '.join(str(aval_of(a).shape) for a in arrays)}{where_text()}") from None
    indexed = [axes[k] for k in positions]
    rest = [ax for (kind, _), ax in zip(entries, axes) if kind == "slice"]
    moved = transpose(y, indexed + rest)
    taken = gather(moved, [broadcast_to(a, batch) for a in arrays])
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    before = builtins.sum(1 for kind, _ in entries[:positions[0]] if kind == "slice") if adjacent else 0
    nb = len(batch)
    order = [nb + k for k in range(before)] + list(range(nb)) + [nb + k for k in range(before, len(rest))]
    taken = transpose(taken, order)
    out: list[int] = [] if adjacent else list(batch)
    for k, ((kind, _), ax) in enumerate(zip(entries, axes)):
        if kind == "new":
            out.append(1)
        elif kind == "slice":
            out.append(lengths[ax])
        elif adjacent and k == positions[0]:
            out.extend(batch)
    return reshape(taken, out)


@implements(np.take, method="take")
def take(a: ArrayLike, indices: Any, axis: Any = None, mode: str = "raise") -> ArrayLike:
    """numpy.take: the index dimensions replace `axis` (the flattened array when axis is None). mode "raise"
    refuses out-of-range indices (a constant at trace time, a traced one when the gather runs); "wrap" counts
    them modulo the length; "clip" moves them to the nearest end."""
    x = a
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    (ax,) = normalize_axes("take", shape, axis)
    idx = _take_index("take", indices, shape)
    if mode not in ("raise", "wrap", "clip"):
        raise ArgumentError(f"take: clipmode must be one of 'clip', 'raise', or 'wrap', got {mode!r}{where_text()}")
    n = shape[ax]
    if n == 0 and aval_of(idx).size:
        raise ShapeError(f"take: cannot do a non-empty take from an empty axis (axis {axis} of shape {shape})"
                         f"{where_text()}")
    if mode == "wrap":
        idx = np.mod(idx, n) if isinstance(idx, np.ndarray) else remainder(idx, n)
    elif mode == "clip":
        idx = np.clip(idx, 0, n - 1) if isinstance(idx, np.ndarray) else minimum(maximum(idx, 0), n - 1)
    return getitem(x, (slice(None),) * ax + (idx,))


def _take_index(op: str, indices: Any, shape: tuple[int, ...]) -> Any:
    idx = _index_array(indices, shape)
    if isinstance(idx, np.ndarray) and idx.dtype == np.bool_:
        raise TraceError(f"{op}: indices must be integers, got a boolean array (array of shape {shape})"
                         f"{where_text()}")
    return idx


@implements(np.take_along_axis)
def take_along_axis(arr: ArrayLike, indices: Any, axis: Any = -1) -> ArrayLike:
    """numpy.take_along_axis: `indices` (same ndim as x) picks along `axis`, broadcasting the other axes."""
    x = arr
    if axis is None:
        x, axis = ravel(x), 0
    shape = aval_of(x).shape
    idx = _take_index("take_along_axis", indices, shape)
    if aval_of(idx).ndim != len(shape):
        raise ShapeError(f"take_along_axis: indices of shape {aval_of(idx).shape} must have as many dimensions as "
                         f"the array of shape {shape}{where_text()}")
    (ax,) = normalize_axes("take_along_axis", shape, axis)
    key = tuple(idx if k == ax else np.arange(d).reshape([-1 if j == k else 1 for j in range(len(shape))])
                for k, d in enumerate(shape))
    return getitem(x, key)


@export
def one_hot(indices: ArrayLike, n: int, dtype: Any = np.float64) -> ArrayLike:
    """Rows of the n x n identity picked by integer `indices` (an index outside [0, n) gives a zero row,
    as jax.nn.one_hot): `np.eye(n)[y]` written as a comparison, which fuses and needs no gather."""
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ShapeError(f"one_hot: n must be a non-negative int, got {n!r}{where_text()}")
    if aval_of(indices).dtype.kind not in "iu":
        raise TraceError(f"one_hot: indices must be integers, got {aval_of(indices)}{where_text()}")
    hit = equal(expand_dims(indices, -1), np.arange(int(n)))
    return astype(hit, dtype)


def tracer_iter(t: Tracer) -> Any:
    """`for row in traced`: the rows, as numpy iterates an array."""
    if t.ndim == 0:
        raise TraceError(f"iteration over a 0-d traced array{where_text()}")
    return (getitem(t, k) for k in range(t.shape[0]))
