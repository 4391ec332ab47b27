"""Graph-to-graph optimisations run before fusion: DCE, CSE, constant folding, algebraic simplification.

Every pass keeps the graph's numbers bit-for-bit: no rewrite changes rounding (x*1 -> x is
exact, x*0 -> 0 is not done since it is wrong for inf and nan).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .ir import Atom, Eqn, Graph, Literal, Var, iter_vars, substitute
from .primitive import Kind, PRIMITIVES, stop_gradient_p

FOLD_LIMIT = 64  # largest constant (elements) folding may create; broadcasts of scalars stay broadcasts


def dce(graph: Graph) -> Graph:
    """Drop equations none of whose outputs reach the graph's outputs."""
    live = set(iter_vars(graph.outputs))
    kept = []
    for e in reversed(graph.eqns):
        if any(o in live for o in e.outs):
            kept.append(e)
            live.update(iter_vars(e.inputs))
    return Graph(list(graph.inputs), kept[::-1], list(graph.outputs), list(graph.input_names))


def remap_inputs(e: Eqn, mapping: dict[Var, Atom]) -> Eqn:
    """`e` with its input vars replaced through `mapping` (one level)."""
    return Eqn(e.prim, tuple(mapping.get(a, a) if isinstance(a, Var) else a for a in e.inputs), e.params, e.outs,
               e.source, e.label)


def _atom_key(a: Atom) -> Any:
    return a.key() if isinstance(a, Literal) else ("var", a.id)


def cse(graph: Graph) -> Graph:
    """Merge equations that apply the same primitive to the same atoms with the same params. A kept
    equation that several VJPs recorded names them all ("MulBackward/TanhBackward"); one the user's
    code recorded keeps no label."""
    seen: dict[Any, Eqn] = {}
    mapping: dict[Var, Atom] = {}
    kept = []
    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        params_key = e.prim.cse_key(e)
        if params_key is None:
            kept.append(e)
            continue
        key = (e.prim.name, tuple(_atom_key(a) for a in e.inputs), params_key)
        prev = seen.get(key)
        if prev is not None:
            mapping.update(zip(e.outs, prev.outs))
            if prev.label and e.label and e.label not in prev.label.split("/"):
                prev.label = f"{prev.label}/{e.label}"
            continue
        seen[key] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def scalar_constant(a: Atom, producers: dict[Var, Eqn]) -> Any | None:
    """The value of `a` if it is one number everywhere: a scalar literal, possibly moved by views."""
    while isinstance(a, Var):
        e = producers.get(a)
        if e is None or e.prim.kind is not Kind.VIEW:
            return None
        a = e.inputs[0]
    return a.scalar() if a.value.size == 1 else None


def fold_constants(graph: Graph) -> Graph:
    """Evaluate at compile time equations whose inputs are all literals (when the result is small),
    and elementwise equations whose inputs are each one number everywhere (the result is then a
    broadcast of one computed number)."""
    mapping: dict[Var, Atom] = {}
    producers: dict[Var, Eqn] = {}
    kept = []
    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        ins = e.inputs
        small = all(o.aval.size <= (1 if e.prim.kind is Kind.VIEW else FOLD_LIMIT) for o in e.outs)
        if e.prim.foldable and small and ins and all(isinstance(a, Literal) for a in ins):
            with np.errstate(all="ignore"):
                value = e.prim.impl(*[a.value for a in ins], **e.params)
            mapping[e.out] = Literal(np.asarray(value).astype(e.out.aval.dtype), e.out.aval)
            continue
        uniform = [scalar_constant(a, producers) for a in ins] if e.prim.kind is Kind.ELEMENTWISE else []
        if ins and uniform and all(u is not None for u in uniform) and e.out.aval.size > 1:
            with np.errstate(all="ignore"):
                value = e.prim.impl(*[np.asarray(u, a.aval.dtype) for u, a in zip(uniform, ins)], **e.params)
            scalar = Literal(np.asarray(value).astype(e.out.aval.dtype), e.out.aval.with_shape(()))
            e = Eqn(PRIMITIVES["broadcast_to"], (scalar,), {"shape": e.out.aval.shape}, e.outs, e.source, e.label)
        for o in e.outs:
            producers[o] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def simplify(graph: Graph) -> Graph:
    """Each primitive's own exact rewrites (x * 1, -(-x), views of views, casts to the same dtype...)."""
    producers: dict[Var, Eqn] = {}
    mapping: dict[Var, Atom] = {}
    kept = []

    def scalar_of(a: Atom) -> Any:
        return scalar_constant(a, producers)

    def producer_of(a: Atom) -> Eqn | None:
        return producers.get(a) if isinstance(a, Var) else None

    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        rewritten = e.prim.simplify(e, scalar_of, producer_of) if e.prim.simplify is not None else None
        if isinstance(rewritten, Eqn):
            e = rewritten
        elif rewritten is not None:
            mapping[e.outs[0]] = rewritten
            continue
        for o in e.outs:
            producers[o] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def strip_stop_gradient(graph: Graph) -> Graph:
    """After differentiation stop_gradient is the identity."""
    mapping = {e.out: e.inputs[0] for e in graph.eqns if e.prim is stop_gradient_p}
    eqns = [e for e in graph.eqns if e.prim is not stop_gradient_p]
    return substitute(Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), mapping)


def inline_custom(graph: Graph) -> Graph:
    """Replace each equation holding a subgraph (a `jg.Function` application) by it, with fresh
    vars, so its ops fuse with their neighbours. Inlined ops keep the Function's name as their label."""
    if not any(e.prim.kind is Kind.CALL for e in graph.eqns):
        return graph
    mapping: dict[Var, Atom] = {}
    eqns: list[Eqn] = []

    def emit(e: Eqn) -> None:
        ins = tuple(mapping.get(a, a) if isinstance(a, Var) else a for a in e.inputs)
        body = e.prim.subgraph(e)
        if body is None:
            eqns.append(Eqn(e.prim, ins, e.params, e.outs, e.source, e.label))
            return
        local: dict[Var, Atom] = dict(zip(body.inputs, ins))
        for inner in body.eqns:
            outs = tuple(Var(o.aval) for o in inner.outs)
            inner_ins = tuple(local.get(a, a) if isinstance(a, Var) else a for a in inner.inputs)
            local.update(zip(inner.outs, outs))
            emit(Eqn(inner.prim, inner_ins, inner.params, outs, inner.source, inner.label or e.label))
        for o, r in zip(e.outs, body.outputs):
            r = local.get(r, r) if isinstance(r, Var) else r
            mapping[o] = mapping.get(r, r) if isinstance(r, Var) else r

    for e in graph.eqns:
        emit(e)
    return substitute(Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), mapping)


def optimize(graph: Graph, max_rounds: int = 8) -> Graph:
    """Run the passes to a fixed point (bounded)."""
    graph = strip_stop_gradient(inline_custom(graph))
    for _ in range(max_rounds):
        before = len(graph.eqns)
        graph = dce(cse(simplify(fold_constants(graph))))
        if len(graph.eqns) == before:
            break
    return graph
