"""Reverse-mode differentiation of IR graphs into IR graphs.

`joint_vjp_graph` replays a graph and appends, in reverse order, each equation's VJP rule: the
result is one graph taking (primals, output cotangents) to (outputs, gradients), written in the
same primitive set, so it can be optimised, fused, or differentiated again.
`split_forward_backward` cuts such a joint graph into a forward part that also returns the
residuals the backward needs, and a backward part that takes (residuals, cotangents).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.ir.graph import Atom, Aval, Eqn, Graph, Literal, SourceInfo, Var, iter_vars, substitute
from jitgrad.ir.primitive import Kind
from jitgrad.tracing.tracer import Builder, bind, building, current_builder


def replay(graph: Graph, env: dict[Var, Any]) -> None:
    """Re-record `graph`'s equations into the active builder; `env` maps its vars to new values."""
    def read(a: Atom) -> Any:
        return a.value if isinstance(a, Literal) else env[a]

    builder = current_builder()
    for e in graph.eqns:
        ins = [read(a) for a in e.inputs]
        with recorded_at(builder, e.source):
            outs = e.prim.replay(ins, e, bind)
        for v, o in zip(e.outs, outs):
            env[v] = o


@contextmanager
def recorded_at(builder: Builder | None, source: SourceInfo | None) -> Iterator[None]:
    """Equations recorded in this block point at `source`: replayed and VJP ops keep the user's line."""
    if builder is None or source is None:
        yield
        return
    previous, builder.source = builder.source, source
    try:
        yield
    finally:
        builder.source = previous


def differentiable_vars(graph: Graph, wrt: Sequence[int]) -> set[Var]:
    """Vars whose value depends, through differentiable primitives, on the inputs in `wrt`."""
    live = {graph.inputs[i] for i in wrt if graph.inputs[i].aval.is_float}
    for e in graph.eqns:
        if e.prim.vjp is None:
            continue
        if any(isinstance(a, Var) and a in live for a in e.inputs):
            live.update(o for o in e.outs if o.aval.is_float)
    return live


def zeros(aval: Aval) -> Any:
    return L.broadcast_to(np.zeros((), aval.dtype), aval.shape)


def joint_vjp_graph(graph: Graph, wrt: Sequence[int], differentiated: int | None = None) -> Graph:
    """Graph (primals..., cotangents per output...) -> (outputs..., gradient per `wrt` input...). With
    `differentiated`, only the first that many outputs take cotangents; the others (a loss's auxiliary
    values) are computed alongside and carry no gradient."""
    builder = Builder(parent=None)
    with building(builder):
        env: dict[Var, Any] = {v: builder.new_input(v.aval, n) for v, n in zip(graph.inputs, graph.input_names)}
        n_cts = len(graph.outputs) if differentiated is None else differentiated
        cts_in = [builder.new_input(o.aval, f"d_out{i}") for i, o in enumerate(graph.outputs[:n_cts])]
        replay(graph, env)
        live = differentiable_vars(graph, wrt)
        ct: dict[Var, Any] = {}

        def accumulate(v: Var, g: Any) -> None:
            if g is None or v not in live:
                return
            g = L.convert(g, v.aval.dtype, v.aval.weak)
            ct[v] = g if v not in ct else L.add(ct[v], g)

        for out, g in zip(graph.outputs, cts_in):
            if isinstance(out, Var):
                accumulate(out, g)
        for e in reversed(graph.eqns):
            if e.prim.vjp is None or not any(o in ct for o in e.outs):
                continue
            if not any(isinstance(a, Var) and a in live for a in e.inputs):
                continue
            out_cts = [ct.get(o) for o in e.outs]  # None: no cotangent (the primitive decides what zero means)
            ins = [a.value if isinstance(a, Literal) else env[a] for a in e.inputs]
            outs = [env[o] for o in e.outs]
            previous = builder.label
            builder.label = e.prim.label_of(e)
            try:
                with recorded_at(builder, e.source):
                    in_cts = e.prim.pullback(out_cts, ins, outs, e, zeros)
            finally:
                builder.label = previous
            for a, g in zip(e.inputs, in_cts):
                if isinstance(a, Var):
                    accumulate(a, g)
        grads = []
        for i in wrt:
            v = graph.inputs[i]
            grads.append(ct[v] if v in ct else zeros(v.aval))
        outputs = [env[o] if isinstance(o, Var) else o.value for o in graph.outputs]
        return builder.graph(outputs + grads)[0]


@dataclass
class SplitGraphs:
    """A joint graph cut in two: forward returns outputs then residuals; backward takes residuals then cotangents."""

    forward: Graph
    backward: Graph
    n_outputs: int


def split_forward_backward(joint: Graph, n_primals: int, n_outputs: int) -> SplitGraphs:
    """Partition a joint graph: the forward computes only what the outputs need; the backward
    recomputes whatever else it needs from the residuals (primal inputs and forward values). Views
    (broadcasts, transposes, reshapes) are redone in the backward, so it saves their sources: a (4, 1)
    mean is saved, not its (4, 8) broadcast."""
    primals, cts = joint.inputs[:n_primals], joint.inputs[n_primals:]
    outs, grads = joint.outputs[:n_outputs], joint.outputs[n_outputs:]
    producers = joint.producers()
    needed: set[Var] = set()
    stack = [a for a in iter_vars(outs)]
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        e = producers.get(v)
        if e is not None:
            stack.extend(iter_vars(e.inputs))
    fwd_eqns = [e for e in joint.eqns if any(o in needed for o in e.outs)]
    recompute = [e for e in fwd_eqns if e.prim.kind is Kind.VIEW]
    fwd_defined = set(primals) | {o for e in fwd_eqns for o in e.outs if e not in recompute}
    bwd_eqns = [e for e in joint.eqns if not any(o in needed for o in e.outs) or e in recompute]
    residuals: list[Var] = []
    seen: set[Var] = set()
    for a in [a for e in bwd_eqns for a in e.inputs] + list(grads):
        if isinstance(a, Var) and a in fwd_defined and a not in seen:
            seen.add(a)
            residuals.append(a)
    forward = Graph(list(primals), fwd_eqns, list(outs) + residuals, joint.input_names[:n_primals])
    res_inputs = [Var(r.aval) for r in residuals]
    mapping: dict[Var, Atom] = dict(zip(residuals, res_inputs))

    def sub(a: Atom) -> Atom:
        return mapping.get(a, a) if isinstance(a, Var) else a

    bwd = [Eqn(e.prim, tuple(sub(a) for a in e.inputs), e.params, e.outs, e.source, e.label) for e in bwd_eqns]
    backward = Graph(res_inputs + list(cts), bwd, [sub(g) for g in grads],
                     [f"res{i}" for i in range(len(residuals))] + joint.input_names[n_primals:])
    return SplitGraphs(forward, backward, n_outputs)


def with_unit_cotangent(joint: Graph, n_primals: int) -> Graph:
    """Fix the (single, scalar) output cotangent of a joint graph to 1: the graph of value-and-grad."""
    (ct,) = joint.inputs[n_primals:]
    one = Literal(np.ones(ct.aval.shape, ct.aval.dtype), ct.aval)
    g = substitute(joint, {ct: one})
    g.inputs = g.inputs[:n_primals]
    g.input_names = g.input_names[:n_primals]
    return g


def inline_graph(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """Record a closed graph's equations into the active builder on `args`; returns its outputs."""
    env: dict[Var, Any] = dict(zip(graph.inputs, args))
    replay(graph, env)
    return [env[o] if isinstance(o, Var) else o.value for o in graph.outputs]
