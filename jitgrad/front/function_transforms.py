"""A custom `jg.Function` under forward mode and vmap, with torch's protocol.

Forward mode: a Function with a `jvp(ctx, *tangents)` static method gets its JVP from it. `jvp_graph`
(`jitgrad.front.forward`) derives every JVP as the VJP of the pullback at cotangent zero; for the equations of such a
Function it swaps in a primitive whose pullback is the transpose of the user's jvp (the VJP, in the tangents, of
the traced jvp, which is linear in them), so the derived JVP is the user's jvp exactly, and swaps it back
afterwards, so that reverse mode keeps the user's backward. Without `jvp`, the JVP is the transpose of the
user's backward (exact when backward is linear in its cotangents, as a backward is).

vmap: the batching rule of a Function's equation. With a `vmap(info, in_dims, *args)` static method it calls
it (the user's code, which usually calls `apply` again on the batch, so the backward is the user's). With
`generate_vmap_rule = True` (and for a Function nested in another transformation's graph, which is the same
thing) it records one `batched_call` equation: the forward subgraph batched, whose pullback is the Function's
pullback (the user's backward) batched, so `grad(vmap(f))` runs the user's backward on the batch; gradients of
unbatched inputs are summed over the batch. A Function with neither is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from jitgrad.tracing import lax as L
from jitgrad.passes.autodiff import inline_graph, joint_vjp_graph, zeros
from jitgrad.front.batching import Batch, batch_inline
from jitgrad.errors import FunctionError, UnsupportedError
from jitgrad.front.function import (Function, FunctionCall, FunctionPrimitive, _backward_ctx, _output_avals,
                                    _vjp_through_forward, custom_function_p)
from jitgrad.front.function_checks import defined_at, is_array
from jitgrad.ir.graph import Aval, Eqn, Graph, Var
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.traced import trace_to_graph
from jitgrad.tracing.tracer import builder_aval, current_builder
from jitgrad.tracing.trees import flatten_output


def _overrides(cls: type, method: str) -> bool:
    """Does the Function subclass define `method` (not inherited from `jg.Function`)?"""
    return any(method in vars(k) for k in cls.__mro__ if k is not Function)


# ---------------------------------------------------------------------- forward mode: Function.jvp

def _jvp_ctx(call: FunctionCall, saved: Sequence[Any]) -> Any:
    """The ctx jvp gets: forward's attributes; saved_tensors are what forward gave `ctx.save_for_forward`, or
    `save_for_backward` where it did not call it."""
    ctx = _backward_ctx(call, saved)
    if call.forward_slots is not None:
        ctx._jg_saved = tuple(None if k is None else saved[k] for k in call.forward_slots)
    return ctx


def _user_tangents(call: FunctionCall, returned: Any, outs: Sequence[Any]) -> list[Any]:
    """One tangent per output of forward, checked like backward's gradients (None: zeros)."""
    name, where = call.function.__name__, defined_at(call.function.jvp)
    found = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    if len(found) != call.n_outputs:
        raise FunctionError(f"{name}.jvp returned {len(found)} tangent(s), but forward has {call.n_outputs} "
                            f"output(s); return one tangent per output (None for none){where}")
    tangents = []
    for k, (t, o) in enumerate(zip(found, outs)):
        want = builder_aval(o)
        if t is None or not want.is_float:
            tangents.append(zeros(want))
            continue
        if not is_array(t) or builder_aval(t).shape != want.shape:
            got = builder_aval(t).shape if is_array(t) else type(t).__name__
            raise FunctionError(f"{name}.jvp: tangent {k} is {got}, but output {k} has shape {want.shape}{where}")
        tangents.append(L.convert(t, want.dtype, want.weak) if builder_aval(t).dtype != want.dtype else t)
    return tangents


class _UserJvpPrimitive(FunctionPrimitive):
    """A Function's equation while `jvp_graph` differentiates it: its pullback is the transpose of `fn.jvp`."""

    def pullback(self, cotangents: Sequence[Any | None], inputs: Sequence[Any], outputs: Sequence[Any], e: Eqn,
                 zeros: Any) -> Sequence[Any]:
        call: FunctionCall = e.params["_call"]
        n, n_body = call.n_outputs, len(call.body.inputs)
        ctx = _jvp_ctx(call, outputs[n:])
        slots = [(k, s) for k, s in enumerate(call.input_slots) if s is not None and builder_aval(inputs[s]).is_float]

        def user_jvp(*ts: Any) -> list[Any]:
            tangents: list[Any] = [None] * len(call.input_slots)
            for (k, _), t in zip(slots, ts):
                tangents[k] = t
            return _user_tangents(call, call.function.jvp(ctx, *tangents), outputs[:n])

        traced = trace_to_graph(user_jvp, [builder_aval(inputs[s]) for _, s in slots], parent=current_builder(),
                                reads_from=call.function.jvp)
        transpose = joint_vjp_graph(traced.graph, range(len(slots)))
        cts = [zeros(builder_aval(o)) if g is None else g for g, o in zip(cotangents[:n], outputs[:n])]
        found = inline_graph(transpose, [zeros(builder_aval(inputs[s])) for _, s in slots] + traced.outer + cts)
        in_cts: list[Any] = [None] * len(inputs)
        for (_, s), g in zip(slots, found[n:]):
            in_cts[s] = g
        for s, g in _vjp_through_forward(call, inputs[:n_body], cotangents[n:]):
            in_cts[s] = g if in_cts[s] is None else L.add(in_cts[s], g)
        return in_cts


custom_jvp_p = declare(_UserJvpPrimitive("custom_function_jvp", Kind.CALL, _output_avals, custom_function_p.impl,
                                         custom_function_p.vjp))


def swap_user_jvps(graph: Graph, to_user: bool) -> Graph:
    """`graph` with the equations of Functions that have a `jvp` on `custom_jvp_p` (to_user) or back, those
    inside a generated vmap rule's `batched_call` included (its pullback replays the per-example equation)."""
    source, target = (custom_function_p, custom_jvp_p) if to_user else (custom_jvp_p, custom_function_p)

    def swapped(e: Eqn) -> Eqn | None:
        if e.prim is source and _overrides(e.params["fn"], "jvp"):
            return Eqn(target, e.inputs, e.params, e.outs, e.source, e.label)
        if e.prim is batched_call_p:
            inner = swapped(e.params["_batched"].inner)
            if inner is not None:
                params = dict(e.params, _batched=replace(e.params["_batched"], inner=inner))
                return Eqn(e.prim, e.inputs, params, e.outs, e.source, e.label)
        return None

    found = [swapped(e) for e in graph.eqns]
    if all(f is None for f in found):
        return graph
    eqns = [e if f is None else f for e, f in zip(graph.eqns, found)]
    return Graph(graph.inputs, eqns, graph.outputs, graph.input_names)


# ---------------------------------------------------------------------- vmap: Function.vmap, generate_vmap_rule

@dataclass(frozen=True)
class VmapInfo:
    """torch's `info` of a `vmap` static method: the batch size, and vmap's randomness option (jitgrad has one)."""

    batch_size: int
    randomness: str = "error"


@dataclass(frozen=True, eq=False)
class BatchedCall:
    """One CALL equation batched: the equation as recorded per example, its inputs' and outputs' batch axes."""

    inner: Eqn
    dims: tuple[int | None, ...]
    out_dims: tuple[int | None, ...]
    size: int
    body: Graph  # the inner equation's subgraph, batched

    def __repr__(self) -> str:
        return f"BatchedCall({self.inner.label}, dims={self.dims}, size={self.size})"


class _BatchedPrimitive(Primitive):
    """A CALL equation (a Function's, or a batched one) mapped over a batch: its subgraph batched, and a pullback
    that is the per-example equation's pullback (the user's backward) batched."""

    def subgraph(self, e: Eqn) -> Graph:
        return e.params["_batched"].body

    def label_of(self, e: Eqn) -> str:
        return e.params["_batched"].inner.prim.label_of(e.params["_batched"].inner)

    def cse_key(self, e: Eqn) -> None:
        return None

    def pullback(self, cotangents: Sequence[Any | None], inputs: Sequence[Any], outputs: Sequence[Any], e: Eqn,
                 zeros: Any) -> Sequence[Any]:
        b: BatchedCall = e.params["_batched"]
        inner = b.inner
        given = [k for k, g in enumerate(cotangents) if g is not None]
        pattern: dict[str, list[bool]] = {}

        def per_example(*values: Any) -> list[Any]:
            cts: list[Any] = [None] * len(inner.outs)
            for k, v in zip(given, values):
                cts[k] = v
            ins, outs = values[len(given):len(given) + len(inner.inputs)], values[len(given) + len(inner.inputs):]
            found = inner.prim.pullback(cts, list(ins), list(outs), inner, zeros)
            pattern["none"] = [g is None for g in found]
            return [zeros(v.aval) if g is None else g for g, v in zip(found, inner.inputs)]

        avals = [inner.outs[k].aval for k in given] + [_aval(a) for a in inner.inputs] + [o.aval for o in inner.outs]
        traced = trace_to_graph(per_example, avals, parent=current_builder(), reads_from=per_example)
        dims = [b.out_dims[k] for k in given] + list(b.dims) + list(b.out_dims)
        found = batch_inline(traced.graph, [cotangents[k] for k in given] + list(inputs) + list(outputs)
                             + traced.outer, dims + [None] * len(traced.outer), b.size)
        in_cts: list[Any] = []
        for (g, d), want, none in zip(found, b.dims, pattern["none"]):
            if none:
                in_cts.append(None)
            elif want is None:  # a value shared by every example: its gradient sums theirs
                in_cts.append(g if d is None else _sum_axis(g, d))
            else:
                in_cts.append(_move(g, d, want, b.size))
        return in_cts


def _aval(a: Any) -> Aval:
    return a.aval


def _sum_axis(g: Any, d: int) -> Any:
    shape = L.aval(g).shape
    return L.reshape(L.reduce_sum(g, [d]), shape[:d] + shape[d + 1:])


def _move(x: Any, d: int | None, to: int, size: int) -> Any:
    return Batch(size).move(x, d, to)


def _batched_avals(avals: Sequence[Aval], **params: Any) -> list[Aval]:
    return [o.aval for o in params["_batched"].body.outputs]


def _batched_evaluate(*arrays: Any, **params: Any) -> Any:
    outs = inline_graph(params["_batched"].body, list(arrays))
    return outs if len(outs) > 1 else outs[0]


def _no_vjp(*_: Any, **__: Any) -> None:
    raise AssertionError("batched_call's pullback is its own")


batched_call_p = declare(_BatchedPrimitive("batched_call", Kind.CALL, _batched_avals, _batched_evaluate, _no_vjp))


def _generated(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[int | None]) -> tuple[list[Any], list[Any]]:
    """The generated rule: one batched_call equation."""
    sub = e.prim.subgraph(e)
    out_dims: list[int | None] = []

    def batched(*xs: Any) -> list[Any]:
        found = batch_inline(sub, xs, dims, b.size)
        out_dims.extend(d for _, d in found)
        return [v for v, _ in found]

    avals = [builder_aval(a) for a in args]
    traced = trace_to_graph(batched, avals, parent=current_builder(), reads_from=batched)
    assert not traced.outer, "a batched subgraph reads nothing from outside"
    call = BatchedCall(e, tuple(dims), tuple(out_dims), b.size, traced.graph)
    outs = b.bind(batched_call_p, *args, label=e.label, fn=e.params.get("fn"), _batched=call)
    return (outs if isinstance(outs, list) else [outs]), out_dims


def _user_rule(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[int | None]) -> tuple[list[Any], list[Any]]:
    """The Function's own `vmap` static method gives its outputs; what it saved is the forward subgraph's,
    batched (read only where a gradient taken inside the vmap reads them)."""
    call: FunctionCall = e.params["_call"]
    fn, n = call.function, call.n_outputs
    values = [call.constants[k] if s is None else args[s] for k, s in enumerate(call.input_slots)]
    in_dims = tuple(None if s is None else dims[s] for s in call.input_slots)
    returned = fn.vmap(VmapInfo(b.size), in_dims, *values)
    if not (isinstance(returned, tuple) and len(returned) == 2):
        raise FunctionError(f"{fn.__name__}.vmap must return (outputs, out_dims), got {type(returned).__name__}"
                            f"{defined_at(fn.vmap)}")
    outs, tree = flatten_output(returned[0])
    out_dims = [returned[1]] * len(outs) if returned[1] is None or isinstance(returned[1], int) else \
        _flat_dims(returned[1])
    if len(outs) != n or len(out_dims) != n:
        raise FunctionError(f"{fn.__name__}.vmap returned {len(outs)} output(s) and {len(out_dims)} out_dims; "
                            f"forward has {n} output(s){defined_at(fn.vmap)}")
    saved = batch_inline(call.body, args[:len(call.body.inputs)], dims[:len(call.body.inputs)], b.size)[n:]
    return list(outs) + [v for v, _ in saved], [None if d is None else d % (L.aval(o).ndim) for d, o in
                                               zip(out_dims, outs)] + [d for _, d in saved]


def _flat_dims(dims: Any) -> list[int | None]:
    if isinstance(dims, (tuple, list)):
        return [d for x in dims for d in _flat_dims(x)]
    if isinstance(dims, dict):
        return [d for k in sorted(dims) for d in _flat_dims(dims[k])]
    return [dims]


def batch_function(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[int | None]) -> tuple[list[Any], list[Any]]:
    """The batching rule of a Function's equation (torch's protocol; see the module's docstring)."""
    call: FunctionCall = e.params["_call"]
    fn = call.function
    own, generate = _overrides(fn, "vmap"), bool(getattr(fn, "generate_vmap_rule", False))
    if own and generate:
        raise FunctionError(f"{fn.__name__} both sets generate_vmap_rule = True and defines a vmap static method; "
                            f"keep one, as torch requires{defined_at(fn.vmap)}")
    if own:
        return _user_rule(b, e, args, dims)
    if generate:
        return _generated(b, e, args, dims)
    raise UnsupportedError(
        f"jg.vmap: the custom Function {fn.__name__}{_site(e)} is applied to batched values but has no batching rule. "
        f"Add `generate_vmap_rule = True` to the class (its forward and backward are mapped over the batch, and "
        f"grad of the vmap still runs {fn.__name__}.backward), or a static method `vmap(info, in_dims, *args)` "
        f"returning (outputs, out_dims), as torch.autograd.Function has")


def _site(e: Eqn) -> str:
    return f" (recorded at {e.source})" if e.source is not None else ""


custom_function_p.batch = custom_jvp_p.batch = batch_function
batched_call_p.batch = _generated  # vmap of vmap: the batched equation batched again
