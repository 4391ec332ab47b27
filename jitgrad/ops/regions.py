"""The primitives that select regions of arrays: slice (a view kernels read through at offsets), pad and
concatenate (host steps where arrays are needed, region reads inside kernels: `Primitive.select_map`), and
their IR-level binders `slice_region` and `pad_region`."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare, shifted
from jitgrad.ops.core import ArrayLike, batch_along_axis, batch_rebound


def region(starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> tuple[slice, ...]:
    """Python slices selecting `shape[k]` elements from `starts[k]` every `steps[k]` (steps may be negative)."""
    out = []
    for start, step, n in zip(starts, steps, shape):
        if n == 0:
            out.append(slice(0, 0))
            continue
        stop = start + step * (n - 1) + (1 if step > 0 else -1)
        out.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(out)


def _region_rule(avals: Sequence[Aval], *, shape: tuple[int, ...], **_: Any) -> Aval:
    return avals[0].with_shape(shape)


def _slice_impl(x: Any, *, starts: tuple[int, ...], steps: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """A view: host steps (concatenate, matmul) read it as it is; kernels read through it (`_slice_index`)."""
    return np.asarray(x)[region(starts, steps, shape)]


def _slice_index(e: Any, index: tuple) -> tuple:
    """A slice reads its input at `starts[k] + steps[k] * i` along each axis."""
    return tuple(shifted(i, start, step) for i, start, step in zip(index, e.params["starts"], e.params["steps"]))


def _pad_impl(x: Any, *, starts: tuple[int, ...], steps: tuple[int, ...], shape: tuple[int, ...], value: Any
              ) -> np.ndarray:
    x = np.asarray(x)
    out = np.full(shape, value, x.dtype)
    out[region(starts, steps, x.shape)] = x
    return out


def _batch_region(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """A slice or pad of the batch axis (at 0) whole: its start 0, step 1, length the batch size."""
    p = e.params
    params = dict(p, starts=(0,) + p["starts"], steps=(1,) + p["steps"], shape=(b.size,) + p["shape"])
    return batch_rebound(b, e, [b.move(args[0], dims[0], 0)], params)


slice_p = L.slice_p = declare(Primitive(
    "slice", Kind.VIEW, _region_rule, _slice_impl,
    lambda cts, ins, outs, *, starts, steps, shape: [L.pad_region(cts[0], starts, steps, ins[0].shape, 0)],
    index_map=_slice_index, backward_label="SliceBackward", batch=_batch_region))
def _pad_select(e: Any, index: tuple) -> tuple[list, Any] | None:
    """A kernel reads a pad's input inside the region (moved back by `starts`, reversed where a step is -1),
    its fill value outside; pads with interior steps (the gradient of a strided slice) stay host steps."""
    starts, steps = e.params["starts"], e.params["steps"]
    if any(abs(t) != 1 for t in steps):
        return None
    shape, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
    spans = [(s, s + n) if t == 1 else (s - n + 1, s + 1) for s, t, n in zip(starts, steps, shape)]
    bounds = tuple((i, lo, hi) for i, (lo, hi), m in zip(index, spans, out) if (lo, hi) != (0, m))
    inner = tuple(shifted(i, -s, 1) if t == 1 else shifted(i, s, -1) for i, s, t in zip(index, starts, steps))
    return [(bounds, 0, inner)], e.params["value"]


pad_p = L.pad_p = declare(Primitive(
    "pad", Kind.HOST, _region_rule, _pad_impl,
    lambda cts, ins, outs, *, starts, steps, shape, value: [L.slice_region(cts[0], starts, steps, ins[0].shape)],
    select_map=_pad_select, backward_label="PadBackward", batch=_batch_region))


def _concatenate_rule(avals: Sequence[Aval], *, axis: int) -> Aval:
    first = avals[0]
    shape = list(first.shape)
    shape[axis] = builtins.sum(a.shape[axis] for a in avals)
    return Aval(tuple(shape), first.dtype, all(a.weak for a in avals))


def _concatenate_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int) -> list[Any]:
    (g,) = cts
    grads, offset = [], 0
    for x in ins:
        starts = tuple(offset if k == axis else 0 for k in range(x.ndim))
        grads.append(L.slice_region(g, starts, (1,) * x.ndim, x.shape))
        offset += x.shape[axis]
    return grads


def _concatenate_select(e: Any, index: tuple) -> tuple[list, Any]:
    """A kernel reads the operand whose range along `axis` holds the position, moved back by its offset (where
    every operand is empty, so is the result: no case, and a fill value no point reads)."""
    axis, cases, offset = e.params["axis"], [], 0
    for k, x in enumerate(e.inputs):
        n = x.aval.shape[axis]
        if n:
            inner = index[:axis] + (shifted(index[axis], -offset, 1),) + index[axis + 1:]
            cases.append((((index[axis], offset, offset + n),), k, inner))
        offset += n
    return cases, None if cases else 0


concatenate_p = declare(Primitive("concatenate", Kind.HOST, _concatenate_rule,
                                  lambda *xs, axis: np.concatenate(xs, axis=axis), _concatenate_vjp,
                                  select_map=_concatenate_select, backward_label="CatBackward",
                                  batch=batch_along_axis))


def slice_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> ArrayLike:
    """The elements `starts[k] + steps[k] * i` (i < shape[k]) of each axis; a strided slice."""
    return L.slice_region(x, starts, steps, shape)


def pad_region(x: ArrayLike, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int], value: Any
               ) -> ArrayLike:
    """An array of `shape` filled with `value`, holding `x` at the region `slice_region` would read."""
    return L.pad_region(x, starts, steps, shape, value)
