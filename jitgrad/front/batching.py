"""`vmap`: a function mapped over a batch axis of its arguments, as one program (JAX's semantics).

vmap is a transformation of the traced graph: the function is traced once on per-example avals (the batch
axis removed), then each equation is recorded again by its primitive's batching rule (`Primitive.batch`,
declared beside the primitive in `jitgrad.ops`), which gives an ordinary graph, batched, that fuses and
compiles like any other. Equations that read no batched value are recorded as they are. An op without a
rule is refused, naming it; nothing ever loops over the batch. On arrays the batched program is compiled
and cached per call signature (a `Traced`); inside a trace it is inlined, so vmap nests and composes with
`grad`, `value_and_grad`, `jvp` and `trace` either way round.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import optree

from jitgrad.tracing import lax as L
from jitgrad.tracing import trees
from jitgrad.front.api import Traced
from jitgrad.passes.autodiff import recorded_at
from jitgrad.errors import InputError, UnsupportedError
from jitgrad.ir.graph import Aval, Graph, Literal
from jitgrad.tracebacks import api_boundary
from jitgrad.tracing.tracer import bind, current_builder
from jitgrad.front.transforms import FlatArguments, function_name, is_tracing, trace_nested


class _Unbatched:
    """None in an in_axes/out_axes tree (a pytree node without leaves to optree): 'not batched'."""

    def __repr__(self) -> str:
        return "None"


_NONE = _Unbatched()


class Batch:
    """What a batching rule is given besides its equation: the batch size, `move` and `bind`."""

    def __init__(self, size: int):
        self.size = size
        self.bind = bind

    def move(self, x: Any, d: int | None, to: int) -> Any:
        """`x` with its batch axis `d` moved to position `to`; where `d` is None, one broadcast there."""
        shape = L.aval(x).shape
        if d is None:
            x = L.reshape(x, shape[:to] + (1,) + shape[to:])
            return L.broadcast_to(x, shape[:to] + (self.size,) + shape[to:])
        if d == to:
            return x
        perm = [k for k in range(len(shape)) if k != d]
        perm.insert(to, d)
        return L.transpose(x, perm)


def _site(e: Any) -> str:
    return f" (recorded at {e.source})" if e.source is not None else ""


def batch_inline(graph: Graph, args: Sequence[Any], dims: Sequence[int | None], size: int
                 ) -> tuple[list[Any], list[int | None]]:
    """Record `graph` batched into the active builder: `args` carry their batch axes (of length `size`) at
    `dims` (None: not batched). Returns the outputs and their batch axes (None: the same for every example)."""
    b, builder = Batch(size), current_builder()
    env: dict[Any, tuple[Any, int | None]] = dict(zip(graph.inputs, zip(args, dims)))
    for e in graph.eqns:
        found = [(a.value, None) if isinstance(a, Literal) else env[a] for a in e.inputs]
        values, in_dims = [v for v, _ in found], [d for _, d in found]
        with recorded_at(builder, e.source):
            if all(d is None for d in in_dims):
                outs, out_dims = e.prim.replay(values, e, bind), [None] * len(e.outs)
            elif e.prim.batch is None:
                raise UnsupportedError(_no_rule(e))
            else:
                outs, out_dims = e.prim.batch(b, e, values, in_dims)
        for v, o, d in zip(e.outs, outs, out_dims):
            want = v.aval.shape if d is None else v.aval.shape[:d] + (size,) + v.aval.shape[d:]
            assert L.aval(o).shape == want, f"the batching rule of {e.prim.name} gave {L.aval(o).shape}, not {want}"
            env[v] = (o, d)
    return [(o.value, None) if isinstance(o, Literal) else env[o] for o in graph.outputs]


def _no_rule(e: Any) -> str:
    return (f"jg.vmap: the op {e.prim.name!r}{_site(e)} has no batching rule, so it cannot be mapped over a batch "
            f"(vmap never loops over the batch); call it outside the vmap, or on the whole batch")


def _leaf_axes(axes: Any, tree: Any, what: str, name: str) -> list[Any]:
    """One axis (an int, or _NONE) per leaf of `tree`, from `axes`, a pytree prefix of it: an int or None stands
    for its whole subtree (in_axes: a prefix of the tuple of the arguments; out_axes: of the output)."""
    prefix = optree.tree_map(lambda a: _NONE if a is None else a, axes, none_is_leaf=True, namespace=trees.NAMESPACE)
    try:
        found = optree.broadcast_prefix(prefix, tree, namespace=trees.NAMESPACE)
    except ValueError as exc:
        shown = "the arguments" if what == "in_axes" else "the output"
        raise InputError(f"{name}: {what} = {axes!r} does not match the structure of {shown}; give an int, None, or "
                         f"a tree of them matching {shown} ({exc})") from None
    for a in found:
        if a is not _NONE and (not isinstance(a, int) or isinstance(a, bool)):
            raise InputError(f"{name}: {what} holds {a!r}; each entry is an int (an axis) or None")
    return found


def _axis(a: int, ndim: int, name: str, where: str) -> int:
    if not -ndim <= a < ndim:
        raise InputError(f"{name}: axis {a} is out of range for {where} of {ndim} dimension(s)")
    return a % ndim


def _batched(fn: Callable[..., Any], args: Sequence[Any], in_axes: Any, out_axes: Any, axis_size: int | None,
             name: str) -> Any:
    """fn mapped over `args`' batch axes, recorded into the active builder."""
    flat = FlatArguments.of(args, name)
    if not (in_axes is None or isinstance(in_axes, (int, tuple))):
        raise InputError(f"{name}: in_axes must be an int, None or a tuple with one entry per argument (each an "
                         f"int, None or a pytree of them), got {in_axes!r}")
    axes = _leaf_axes(in_axes, tuple(args), "in_axes", name)
    dims: list[int | None] = []
    sizes: dict[int, list[str]] = {}
    for k, (a, aval) in enumerate(zip(axes, flat.avals)):
        if a is _NONE:
            dims.append(None)
            continue
        d = _axis(a, aval.ndim, name, f"argument leaf {k} of shape {aval.shape}")
        dims.append(d)
        sizes.setdefault(aval.shape[d], []).append(f"leaf {k} (shape {aval.shape}, axis {a})")
    if axis_size is not None:
        sizes.setdefault(int(axis_size), []).append("axis_size")
    if len(sizes) > 1:
        raise InputError(f"{name}: the batched axes have different sizes: "
                         + "; ".join(f"{n} for {', '.join(w)}" for n, w in sizes.items()))
    if not sizes:
        raise InputError(f"{name}: no argument is batched (every in_axes is None); batch one, or pass axis_size")
    (size,) = sizes
    per_example = FlatArguments(flat.leaves, [a if d is None else Aval(a.shape[:d] + a.shape[d + 1:], a.dtype, a.weak)
                                              for a, d in zip(flat.avals, dims)], flat.structures)
    traced = trace_nested(fn, per_example)
    found = batch_inline(traced.graph, flat.leaves + traced.outer, dims + [None] * len(traced.outer), size)
    placed, outs, values = [], trees.unflatten_output(traced.tree, [0] * len(found)), iter(found)
    leaves, structure = trees.tree_flatten(outs)  # float0 outputs are leaves here (zeros: no value of the graph)
    for k, (leaf, a) in enumerate(zip(leaves, _leaf_axes(out_axes, outs, "out_axes", name))):
        if trees.is_float0(leaf):
            shape = leaf.shape if a is _NONE else _with_axis(leaf.shape, _axis(a, leaf.ndim + 1, name,
                                                                                f"output leaf {k}"), size)
            placed.append(np.zeros(shape, trees.float0))
            continue
        value, d = next(values)
        if a is _NONE:
            if d is not None:
                raise InputError(f"{name}: out_axes is None for output leaf {k}, but it depends on the batched "
                                 f"arguments; give it an axis")
            placed.append(value)
            continue
        ndim = L.aval(value).ndim + (d is None)
        placed.append(Batch(size).move(value, d, _axis(a, ndim, name, f"output leaf {k}")))
    return trees.tree_unflatten(structure, placed)


def _with_axis(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return shape[:axis] + (size,) + shape[axis:]


def vmap(fn: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0, axis_size: int | None = None
         ) -> Callable[..., Any]:
    """`fn` mapped over a batch axis: `in_axes` (an int, None, or a tuple with one entry per positional argument,
    each an int, None or a pytree prefix of that argument) says which axis of each argument is the batch axis
    (None: the argument is shared); `out_axes` (the same, per output) where the batch axis goes in each output.
    Negative axes count from the end. One program, traced once per call signature; no loop over the batch."""
    base = fn.fn if isinstance(fn, Traced) else fn
    name = f"jg.vmap of {function_name(base)}"

    def program(*args: Any) -> Any:
        return _batched(base, args, in_axes, out_axes, axis_size, name)

    program.__name__ = f"vmap_{function_name(base)}"
    compiled = Traced(program)

    @api_boundary
    def vmap_fn(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise InputError(f"{name}: pass the arguments by position (in_axes gives one axis per positional "
                             f"argument); got keywords {sorted(kwargs)}")
        if is_tracing(args):
            return _batched(base, args, in_axes, out_axes, axis_size, name)
        return compiled(*args)

    vmap_fn.__name__ = f"vmap_{function_name(base)}"
    return vmap_fn
