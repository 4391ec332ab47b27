"""Writes, out of place: jg.add_at and jg.put_along_axis (the add_at and put host primitives); and the refusals of
numpy's in-place writes (np.add.at, np.put_along_axis, x[...] = v), which name the spelling that returns a new array."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import export, implements
from jitgrad.errors import UnsupportedError
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, where_text
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, convert, result_type
from jitgrad.ops.shapes import ravel, reshape
from jitgrad.ops.indexing import getitem, take_along_axis


def _batch_flat_write(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """add_at and put write a flat array at flat positions: the batch is one flat array of B rows, each row's
    positions moved by its offset."""
    a, values, positions = (b.move(x, d, 0) for x, d in zip(args, dims))
    (rows, n), shape = aval_of(a).shape, aval_of(positions).shape
    offsets = (np.arange(rows) * n).astype(aval_of(positions).dtype).reshape(rows, 1)
    moved = L.add(positions, L.broadcast_to(offsets, shape))
    flat = [L.reshape(v, (aval_of(v).size,)) for v in (a, values, moved)]
    out = bind(e.prim, *flat)
    return [L.reshape(out, (rows, n))], [0]


def _add_at_impl(a: Any, values: Any, positions: Any) -> np.ndarray:
    """A copy of flat `a` with np.add.at(copy, positions, values): repeated positions add up in order."""
    out = np.array(a, copy=True)
    np.add.at(out, np.asarray(positions), values)
    return out


def _add_at_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    (g,), (_, values, positions) = cts, ins
    return [g, L.convert(L.gather(g, [positions]), values.dtype), None]


def _put_impl(a: Any, values: Any, positions: Any) -> np.ndarray:
    """A copy of flat `a` with `values` written at `positions` (numpy's assignment: the last write wins)."""
    out = np.array(a, copy=True)
    out[np.asarray(positions)] = values
    return out


def _put_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    """To `a` where nothing was written; to each value whose write was the one kept."""
    (g,), (a, values, positions) = cts, ins
    ids = np.arange(values.shape[0], dtype=np.int64)
    writer = bind(put_p, np.full(a.shape, -1, np.int64), ids, positions)
    kept = L.eq(L.gather(writer, [positions]), ids)
    return [L.select(L.eq(writer, -1), g, 0), L.select(kept, L.gather(g, [positions]), 0), None]


add_at_p = declare(Primitive("add_at", Kind.HOST, lambda avals: avals[0], _add_at_impl, _add_at_vjp,
                             backward_label="IndexAddBackward", batch=_batch_flat_write))
put_p = declare(Primitive("put", Kind.HOST, lambda avals: avals[0], _put_impl, _put_vjp,
                          backward_label="IndexPutBackward", batch=_batch_flat_write))


def _positions(shape: tuple[int, ...], read: Any) -> ArrayLike:
    """The flat positions `read` (an indexing function, constant or traced indices) picks from an array of `shape`."""
    return read(np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape))


def _write(prim: Primitive, a: ArrayLike, positions: ArrayLike, values: ArrayLike) -> ArrayLike:
    shape = aval_of(a).shape
    values = broadcast_to(values, aval_of(positions).shape)
    return reshape(bind(prim, ravel(a), ravel(values), ravel(positions)), shape)


@export
def add_at(a: ArrayLike, indices: Any, values: ArrayLike) -> ArrayLike:
    """numpy's in-place np.add.at(a, indices, values) as a new array: `values` added at a[indices], repeated
    indices adding up (numpy's order and casting). Write `a = jg.add_at(a, indices, values)`."""
    a = a if isinstance(a, Tracer) else np.asarray(a)
    dtype, _ = result_type(np.add, a, values)
    positions = _positions(aval_of(a).shape, lambda p: getitem(p, indices))
    return _write(add_at_p, a, positions, convert(values, dtype))


@export
def put_along_axis(arr: ArrayLike, indices: Any, values: ArrayLike, axis: Any) -> ArrayLike:
    """numpy's in-place np.put_along_axis as a new array: `values` written where take_along_axis(arr, indices,
    axis) reads (cast to arr's dtype; of repeated indices the last write wins, as numpy's)."""
    arr = arr if isinstance(arr, Tracer) else np.asarray(arr)
    positions = _positions(aval_of(arr).shape, lambda p: take_along_axis(p, indices, axis))
    return _write(put_p, arr, positions, convert(values, aval_of(arr).dtype))


@implements(np.add, ufunc_method="at", signature="(a, indices, b=None, /)", export=False)
def _add_at_in_place(a: Any, indices: Any, b: Any = None, /) -> None:
    """np.add.at writes into `a`: refused, with the out-of-place spelling."""
    raise UnsupportedError(f"numpy.add.at(a, indices, b) adds into `a` in place, and a traced array cannot change (nor "
                           f"can an array outside the trace take traced values): returning a new array instead would "
                           f"leave your `a` unchanged. Write a = jg.add_at(a, indices, b), which returns the new array"
                           f"{where_text()}")


@implements(np.put_along_axis, export=False)
def _put_along_axis_in_place(arr: Any, indices: Any, values: Any, axis: Any) -> None:
    """np.put_along_axis writes into `arr`: refused, with the out-of-place spelling."""
    raise UnsupportedError(f"numpy.put_along_axis(arr, indices, values, axis) writes into `arr` in place, and a traced "
                           f"array cannot change: returning a new array instead would leave your `arr` unchanged. "
                           f"Write arr = jg.put_along_axis(arr, indices, values, axis), which returns the new array"
                           f"{where_text()}")


def tracer_setitem(t: Tracer, key: Any, value: Any) -> None:
    raise UnsupportedError(f"traced arrays are immutable: x[...] = v cannot be traced (array of shape {t.shape}); "
                           f"build the result with np.where, np.concatenate or np.pad{where_text()}")
