"""Custom differentiable functions with PyTorch's protocol: subclass `jg.Function`, write static
`forward(ctx, *args)` and `backward(ctx, *grad_outputs)`, call `Fn.apply(*args)`.

Inside a trace, `apply` traces `forward` into a closed subgraph and records ONE equation of the
`custom_function` primitive, whose outputs are the forward outputs followed by the arrays saved
with `ctx.save_for_backward`. Its VJP traces the user's `backward` on those saved values, so the
backward is IR too: fused, optimised and differentiable again. Before fusion, `passes.inline_custom`
replaces the equation by its subgraph, so the forward ops fuse with their neighbours. Outside a
trace, `apply` simply runs `forward` on the numpy arrays.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import captures
from jitgrad.tracing import lax as L
from jitgrad.passes.autodiff import inline_graph, joint_vjp_graph, zeros
from jitgrad.errors import FunctionError, TraceError
from jitgrad.front.function_checks import checked_gradients, is_array
from jitgrad.ir.graph import Aval, Eqn, Graph, Var, iter_vars
from jitgrad.ir.primitive import Kind, Primitive, declare, stop_gradient_p
from jitgrad.tracing.traced import trace_to_graph
from jitgrad.tracing.tracer import Builder, CapturedTracer, Tracer, bind, builder_aval, current_builder, where_text
from jitgrad.tracing.trees import flatten_output, unflatten_output

_INTERNAL = ("_jg_function", "_jg_saved", "_jg_saved_forward", "_jg_non_differentiable", "_jg_materialize",
             "needs_input_grad")


class FunctionCtx:
    """The `ctx` of `forward` and `backward`: saved arrays, `needs_input_grad`, and any attribute
    forward sets on it (flags, shapes, Python numbers), all of which backward sees again."""

    def __init__(self, function: type, needs_input_grad: tuple[bool, ...]):
        self._jg_function = function
        self._jg_saved: tuple[Any, ...] = ()
        self._jg_saved_forward: tuple[Any, ...] | None = None
        self._jg_non_differentiable: list[Any] = []
        self._jg_materialize = True
        self.needs_input_grad = needs_input_grad

    def mark_non_differentiable(self, *outputs: Any) -> None:
        """As torch's: these outputs of forward carry no gradient (what is computed from them does not
        reach the inputs through them), and backward receives zeros for them (None without
        materialized gradients)."""
        self._jg_non_differentiable.extend(outputs)

    def set_materialize_grads(self, value: bool) -> None:
        """As torch's: with False, backward receives None, not zeros, for outputs that got no gradient."""
        self._jg_materialize = bool(value)

    def mark_dirty(self, *inputs: Any) -> None:
        """Refused: traced arrays are immutable, so forward cannot modify its inputs in place."""
        name = self._jg_function.__name__
        raise FunctionError(f"{name}.forward: ctx.mark_dirty is not supported; jitgrad's arrays are immutable "
                            f"inside a trace, so forward cannot modify an input in place: compute and return a "
                            f"new array instead, and drop the mark_dirty call{where_text()}")

    def save_for_backward(self, *values: Any, _method: str = "save_for_backward") -> None:
        """Keep arrays (inputs, outputs or intermediates of forward; None allowed) for backward."""
        for i, v in enumerate(values):
            if v is not None and not is_array(v):
                name = self._jg_function.__name__
                raise FunctionError(
                    f"{name}.forward: ctx.{_method} got a {type(v).__name__} as value {i}; only arrays "
                    f"(and None) can be saved. Keep other values as ctx attributes, e.g. ctx.value = value"
                    f"{where_text()}")
        self._jg_saved = values

    def save_for_forward(self, *values: Any) -> None:
        """As torch's: keep arrays for `jvp`, where `ctx.saved_tensors` gives them (else the backward's)."""
        kept = self._jg_saved
        self.save_for_backward(*values, _method="save_for_forward")
        self._jg_saved_forward, self._jg_saved = self._jg_saved, kept

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        """The values given to `save_for_backward`, in order (traced arrays inside backward)."""
        return self._jg_saved

    saved_variables = saved_tensors  # PyTorch's old name for the same thing

    def attributes(self) -> dict[str, Any]:
        """What the user stored on ctx besides the saved arrays."""
        return {k: v for k, v in vars(self).items() if k not in _INTERNAL}


@dataclass(frozen=True, eq=False)
class FunctionCall:
    """One `Fn.apply` recorded in a trace: the forward subgraph and what backward needs besides the
    saved arrays (which are the equation's trailing outputs)."""

    function: type
    body: Graph  # (array arguments..., captured outer values...) -> (outputs..., saved arrays...)
    n_outputs: int
    input_slots: tuple[int | None, ...]  # per forward argument: its position among the equation's inputs
    input_names: tuple[str, ...]
    n_given: int  # arguments the caller passed; later ones took forward's defaults
    needs_input_grad: tuple[bool, ...]
    saved_slots: tuple[int | None, ...]  # per saved value: its position among the saved arrays (None: None)
    attributes: dict[str, Any]
    non_differentiable: frozenset[int] = frozenset()  # outputs marked by ctx.mark_non_differentiable
    materialize_grads: bool = True
    # Arrays from outside the arguments that backward reads (the equation's inputs after the body's):
    # per array, the path keys that led to it and the array the trace saw (`captures.substituted_as_traced`).
    backward_paths: tuple[tuple[tuple, ...], ...] = ()
    backward_arrays: tuple[np.ndarray, ...] = ()
    forward_slots: tuple[int | None, ...] | None = None  # as saved_slots, for ctx.save_for_forward (None: not called)
    constants: tuple[Any, ...] = ()  # per forward argument: what was given where it is not an array, else None

    def __repr__(self) -> str:
        return f"FunctionCall({self.function.__name__})"


class FunctionPrimitive(Primitive):
    """The primitive of every `jg.Function` application: a CALL holding the traced forward, whose pullback
    runs the user's backward (getting None, not zeros, where an output has no cotangent)."""

    def subgraph(self, e: Eqn) -> Graph:
        """The forward subgraph that computes `e.outs` from `e.inputs` (what inlining substitutes)."""
        return e.params["_call"].body

    def pullback(self, cotangents: Sequence[Any | None], inputs: Sequence[Any], outputs: Sequence[Any], e: Eqn,
                 zeros: Any) -> Sequence[Any]:
        return _function_vjp(cotangents, inputs, outputs, **e.params)

    def label_of(self, e: Eqn) -> str:
        return f"{e.params['fn'].__name__}Backward"

    def cse_key(self, e: Eqn) -> None:
        return None  # two applications are two calls of the user's code


def _output_avals(avals: Sequence[Aval], *, fn: type, _call: FunctionCall) -> list[Aval]:
    return [o.aval for o in _call.body.outputs]


def _evaluate(*arrays: Any, fn: type, _call: FunctionCall) -> Any:
    """Numpy reference: the forward subgraph run on arrays (no trace is active here); like every
    primitive's impl, one output comes back bare, several as a list."""
    outs = inline_graph(_call.body, list(arrays))
    return outs if len(outs) > 1 else outs[0]


def _function_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, fn: type, _call: FunctionCall
                  ) -> list[Any]:
    """Cotangents of the equation's inputs: the user's backward on the saved arrays, plus, where the
    saved arrays themselves get cotangents (second derivatives), the VJP of the forward subgraph."""
    call = _call
    n = call.n_outputs
    grad_outputs = [zeros(o.aval) if (g is None or k in call.non_differentiable) and call.materialize_grads
                    else None if k in call.non_differentiable else g
                    for k, (g, o) in enumerate(zip(cts[:n], outs[:n]))]
    n_body = len(call.body.inputs)
    read = ins[n_body:]
    by_path = {key: v for keys, v in zip(call.backward_paths, read) for key in keys}
    with captures.substituted_as_traced(fn.backward, by_path, {id(a): v for a, v in zip(call.backward_arrays, read)}):
        returned = fn.backward(_backward_ctx(call, outs[n:]), *grad_outputs)
    grads = checked_gradients(call, returned, ins[:n_body])
    in_cts: list[Any] = [None] * len(ins)
    for slot, g in zip(call.input_slots, grads):
        if slot is not None and g is not None:
            in_cts[slot] = g
    for slot, g in _vjp_through_forward(call, ins[:n_body], cts[n:]):
        in_cts[slot] = g if in_cts[slot] is None else L.add(in_cts[slot], g)
    return in_cts


def _backward_ctx(call: FunctionCall, saved: Sequence[Any]) -> FunctionCtx:
    """The ctx backward gets: forward's attributes and its saved arrays (`saved`: the non-None ones)."""
    ctx = FunctionCtx(call.function, call.needs_input_grad)
    vars(ctx).update(call.attributes)
    ctx._jg_saved = tuple(None if k is None else saved[k] for k in call.saved_slots)
    return ctx


def _cotangent_patterns(call: FunctionCall) -> list[tuple[bool, ...]]:
    """Which outputs get a gradient in the calls of backward to foresee: all of them when gradients are
    materialized (zeros stand in), else every non-empty subset for up to four outputs (all of them beyond)."""
    n = call.n_outputs
    if call.materialize_grads or n > 4:
        return [(True,) * n]
    return [tuple(bool(m >> k & 1) for k in range(n)) for m in range(1, 1 << n)]


def _backward_reads(call: FunctionCall, builder: Builder) -> list[CapturedTracer]:
    """The arrays from outside the arguments that the user's backward reads, found by tracing it once per
    cotangent pattern on stand-ins while the forward's trace (and its captures) is open. They become inputs
    of the equation, so backward, run again when the plan is differentiated, reads them at every call."""
    if builder.capture_root() is None:  # a trace that captures nothing (an autodiff replay): nothing to find
        return []
    n, avals = call.n_outputs, [o.aval for o in call.body.outputs]
    found: dict[int, CapturedTracer] = {}
    for pattern in _cotangent_patterns(call):
        def probe(*values: Any, pattern: tuple[bool, ...] = pattern) -> list[Any]:
            grads = [g if present else None for g, present in zip(values[:n], pattern)]
            call.function.backward(_backward_ctx(call, values[n:]), *grads)
            return []
        try:
            traced = trace_to_graph(probe, avals, parent=builder, reads_from=call.function.backward)
        except Exception:  # noqa: BLE001  backward fails the same way when differentiated, which reports it
            continue
        found.update((id(t), t) for t in traced.outer if type(t) is CapturedTracer)
    return list(found.values())


custom_function_p = declare(FunctionPrimitive("custom_function", Kind.CALL, _output_avals, _evaluate, _function_vjp))


def _inputs_reaching(graph: Graph) -> set[Var]:
    """Vars the graph's outputs depend on through differentiable equations."""
    needed = set(iter_vars(graph.outputs))
    for e in reversed(graph.eqns):
        if e.prim.vjp is not None and any(o in needed for o in e.outs):
            needed.update(iter_vars(e.inputs))
    return needed


def _vjp_through_forward(call: FunctionCall, ins: Sequence[Any], saved_cts: Sequence[Any]) -> list[tuple[int, Any]]:
    """(input slot, cotangent) pairs from differentiating the forward ops that computed the saved arrays."""
    wanted = [j for j, g in enumerate(saved_cts) if g is not None]
    if not wanted:
        return []
    body = call.body
    saved = Graph(body.inputs, body.eqns, [body.outputs[call.n_outputs + j] for j in wanted], body.input_names)
    reaching = _inputs_reaching(saved)
    wrt = [i for i, v in enumerate(body.inputs) if v.aval.is_float and v in reaching]
    if not wrt:
        return []
    results = inline_graph(joint_vjp_graph(saved, wrt), list(ins) + [saved_cts[j] for j in wanted])
    return list(zip(wrt, results[len(wanted):]))


@dataclass
class _Arguments:
    """`apply`'s arguments bound to forward's signature, flattened: positional ones, then keywords."""

    values: list[Any]
    names: list[str]
    n_positional: int
    keywords: list[str]
    n_given: int

    def call(self, forward: Callable[..., Any], ctx: FunctionCtx, values: Sequence[Any]) -> Any:
        kwargs = dict(zip(self.keywords, values[self.n_positional:]))
        return forward(ctx, *values[:self.n_positional], **kwargs)


def _bind_arguments(cls: type, args: tuple, kwargs: dict) -> _Arguments:
    signature = inspect.signature(cls.forward)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        params = list(signature.parameters.values())[1:]
        raise FunctionError(f"{cls.__name__}.apply: {exc}; {cls.__name__}.forward takes "
                            f"(ctx, {', '.join(str(p) for p in params)}){where_text()}") from None
    bound.apply_defaults()
    positional = list(bound.args[1:])
    names = []
    for p in list(signature.parameters.values())[1:]:
        if p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}[{i}]" for i in range(len(bound.arguments[p.name]))]
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    keywords = list(bound.kwargs)
    names = names[:len(positional)] + keywords
    given = [len(args)] + [names.index(k) + 1 for k in kwargs]
    return _Arguments(positional + [bound.kwargs[k] for k in keywords], names, len(positional), keywords,
                      max(given))


def _check_protocol(cls: type) -> None:
    for method in ("forward", "backward"):
        if not isinstance(inspect.getattr_static(cls, method, None), staticmethod):
            raise FunctionError(f"{cls.__name__}.{method} must be defined as a @staticmethod "
                                f"(jg.Function subclasses are never instantiated: call {cls.__name__}.apply)")


class Function:
    """Base class of custom differentiable functions, as `torch.autograd.Function`.

        class Exp(jg.Function):
            @staticmethod
            def forward(ctx, x):
                y = np.exp(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, grad_out):
                y, = ctx.saved_tensors
                return grad_out * y

    `backward` returns one gradient per argument given to `apply` (None where there is none); it is
    written with numpy/jitgrad ops, traced and fused like any other code, and may be differentiated again.
    """

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run forward on the arguments: recorded as one differentiable node inside a trace,
        evaluated directly on numpy arrays outside one."""
        _check_protocol(cls)
        arguments = _bind_arguments(cls, args, kwargs)
        needs = tuple(is_array(v) and builder_aval(v).is_float for v in arguments.values)
        builder = current_builder() or next((v.builder for v in arguments.values if isinstance(v, Tracer)), None)
        ctx = FunctionCtx(cls, needs)
        if builder is None:
            result = arguments.call(cls.forward, ctx, arguments.values)
            _forward_outputs(cls, result)
            return result
        return _record(cls, arguments, ctx, builder)


def _forward_outputs(cls: type, result: Any) -> tuple[list[Any], Any]:
    """Flatten what forward returned (an array or a tuple/list/dict of arrays)."""
    try:
        return flatten_output(result)
    except TraceError as exc:
        raise FunctionError(f"{cls.__name__}.forward: {exc}") from None


def _record(cls: type, arguments: _Arguments, ctx: FunctionCtx, builder: Builder) -> Any:
    """Trace forward in a child builder and record one custom_function equation in `builder`'s trace."""
    name = cls.__name__
    values = arguments.values
    array_positions = [k for k, v in enumerate(values) if is_array(v)]
    structure: dict[str, Any] = {}

    def traced_forward(*arrays: Any) -> list[Any]:
        full = list(values)
        for k, a in zip(array_positions, arrays):
            full[k] = a
        leaves, tree = _forward_outputs(cls, arguments.call(cls.forward, ctx, full))
        for key, v in ctx.attributes().items():
            if isinstance(v, Tracer) or (isinstance(v, (tuple, list)) and any(isinstance(x, Tracer) for x in v)):
                raise FunctionError(f"{name}.forward stored a traced array as ctx.{key}; save arrays with "
                                    f"ctx.save_for_backward(...) and read them from ctx.saved_tensors")
        marked = {id(v) for v in ctx._jg_non_differentiable}
        structure.update(tree=tree, n_outputs=len(leaves),
                         non_differentiable=frozenset(k for k, v in enumerate(leaves) if id(v) in marked))
        return leaves + [v for v in ctx.saved_tensors + (ctx._jg_saved_forward or ()) if v is not None]

    traced = trace_to_graph(traced_forward, [builder_aval(values[k]) for k in array_positions],
                            [arguments.names[k] for k in array_positions], parent=builder, reads_from=cls.forward)
    body, captured = traced.graph, traced.outer
    saved_slots, count = [], 0
    for v in ctx.saved_tensors + (ctx._jg_saved_forward or ()):
        saved_slots.append(None if v is None else count)
        count += v is not None
    saved_slots, forward_slots = saved_slots[:len(ctx.saved_tensors)], saved_slots[len(ctx.saved_tensors):]
    call = FunctionCall(cls, body, structure["n_outputs"],
                        tuple(array_positions.index(k) if k in array_positions else None for k in range(len(values))),
                        tuple(arguments.names), arguments.n_given, ctx.needs_input_grad, tuple(saved_slots),
                        ctx.attributes(), structure["non_differentiable"], ctx._jg_materialize,
                        forward_slots=None if ctx._jg_saved_forward is None else tuple(forward_slots),
                        constants=tuple(None if k in array_positions else v for k, v in enumerate(values)))
    reads = _backward_reads(call, builder)
    if reads:
        call = replace(call, backward_paths=tuple(tuple(p.key for p in t.capture.paths) for t in reads),
                       backward_arrays=tuple(t.array for t in reads))
    outs = bind(custom_function_p, *[values[k] for k in array_positions], *captured, *reads, label=name, fn=cls,
                _call=call)
    results = [bind(stop_gradient_p, o) if k in call.non_differentiable else o
               for k, o in enumerate(outs[:call.n_outputs])]
    return unflatten_output(structure["tree"], results)
