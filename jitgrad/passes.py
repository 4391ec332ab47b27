"""Graph-to-graph optimisations run before fusion: DCE, CSE, constant folding, algebraic simplification.

Every pass keeps the graph's numbers bit-for-bit: no rewrite changes rounding (x*1 -> x is
exact, x*0 -> 0 is not done since it is wrong for inf and nan).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import primitives as P
from .ir import Atom, Eqn, Graph, Literal, Var, iter_vars, substitute

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


def _params_key(params: dict[str, Any]) -> Any:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def cse(graph: Graph) -> Graph:
    """Merge equations that apply the same primitive to the same atoms with the same params."""
    seen: dict[Any, Eqn] = {}
    mapping: dict[Var, Atom] = {}
    kept = []
    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        if e.prim.kind == "custom":
            kept.append(e)
            continue
        key = (e.prim.name, tuple(_atom_key(a) for a in e.inputs), _params_key(e.params))
        prev = seen.get(key)
        if prev is not None:
            mapping.update(zip(e.outs, prev.outs))
            continue
        seen[key] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def scalar_constant(a: Atom, producers: dict[Var, Eqn]) -> Any | None:
    """The value of `a` if it is one number everywhere: a scalar literal, possibly broadcast/reshaped."""
    while isinstance(a, Var):
        e = producers.get(a)
        if e is None or e.prim not in (P.broadcast_to_p, P.reshape_p):
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
        small = all(o.aval.size <= (1 if e.prim is P.broadcast_to_p else FOLD_LIMIT) for o in e.outs)
        if e.prim.kind != "custom" and small and ins and all(isinstance(a, Literal) for a in ins):
            with np.errstate(all="ignore"):
                value = e.prim.impl(*[a.value for a in ins], **e.params)
            mapping[e.out] = Literal(np.asarray(value).astype(e.out.aval.dtype), e.out.aval)
            continue
        uniform = [scalar_constant(a, producers) for a in ins] if e.prim.kind == "elementwise" else []
        if ins and uniform and all(u is not None for u in uniform) and e.out.aval.size > 1:
            with np.errstate(all="ignore"):
                value = e.prim.impl(*[np.asarray(u, a.aval.dtype) for u, a in zip(uniform, ins)], **e.params)
            scalar = Literal(np.asarray(value).astype(e.out.aval.dtype), e.out.aval.with_shape(()))
            e = Eqn(P.broadcast_to_p, (scalar,), {"shape": e.out.aval.shape}, e.outs, e.source, e.label)
        for o in e.outs:
            producers[o] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def _identity_rewrite(e: Eqn, producers: dict[Var, Eqn]) -> Atom | None:
    """An atom equal to `e`'s output, bit for bit, if one exists without computing."""
    out = e.outs[0] if len(e.outs) == 1 else None
    if out is None:
        return None

    def same(a: Atom) -> bool:
        return a.aval.shape == out.aval.shape and a.aval.dtype == out.aval.dtype

    name = e.prim.name
    if name in ("broadcast_to", "reshape", "convert", "transpose", "stop_gradient") and same(e.inputs[0]):
        if name != "transpose" or e.params["perm"] == tuple(range(len(e.params["perm"]))):
            return e.inputs[0]
    if name in ("mul", "div", "sub"):
        # x*1, 1*x, x/1 and x-(+0) are exact for every x, -0.0, inf and nan included (x+0 is not: -0+0 = +0).
        x, y = e.inputs
        cy, cx = scalar_constant(y, producers), scalar_constant(x, producers)
        unit = 0 if name == "sub" else 1
        if cy is not None and cy == unit and not np.signbit(cy) and same(x):
            return x
        if name == "mul" and cx is not None and cx == 1 and same(y):
            return y
    if e.prim.kind == "reduce" and same(e.inputs[0]):
        return e.inputs[0]
    if name == "neg":
        inner = producers.get(e.inputs[0]) if isinstance(e.inputs[0], Var) else None
        if inner is not None and inner.prim is P.neg_p:
            return inner.inputs[0]
    return None


def _compose_views(e: Eqn, producers: dict[Var, Eqn]) -> Eqn | None:
    """reshape(reshape(x)) and broadcast_to(broadcast_to(x)) collapse to one view."""
    src = e.inputs[0]
    inner = producers.get(src) if isinstance(src, Var) else None
    if inner is None or inner.prim is not e.prim or e.prim not in (P.reshape_p, P.broadcast_to_p):
        return None
    return Eqn(e.prim, (inner.inputs[0],), e.params, e.outs, e.source, e.label)


def simplify(graph: Graph) -> Graph:
    """Algebraic identities that are exact in IEEE arithmetic, and view composition."""
    producers: dict[Var, Eqn] = {}
    mapping: dict[Var, Atom] = {}
    kept = []
    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        replacement = _identity_rewrite(e, producers)
        if replacement is not None:
            mapping[e.outs[0]] = replacement
            continue
        e = _compose_views(e, producers) or e
        for o in e.outs:
            producers[o] = e
        kept.append(e)
    return substitute(Graph(list(graph.inputs), kept, list(graph.outputs), list(graph.input_names)), mapping)


def strip_stop_gradient(graph: Graph) -> Graph:
    """After differentiation stop_gradient is the identity."""
    mapping = {e.out: e.inputs[0] for e in graph.eqns if e.prim is P.stop_gradient_p}
    eqns = [e for e in graph.eqns if e.prim is not P.stop_gradient_p]
    return substitute(Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), mapping)


def inline_custom(graph: Graph) -> Graph:
    """Replace each custom equation (a `jg.Function` application) by its forward subgraph, with fresh
    vars, so its ops fuse with their neighbours. Inlined ops keep the Function's name as their label."""
    if not any(e.prim.kind == "custom" for e in graph.eqns):
        return graph
    mapping: dict[Var, Atom] = {}
    eqns: list[Eqn] = []

    def emit(e: Eqn) -> None:
        ins = tuple(mapping.get(a, a) if isinstance(a, Var) else a for a in e.inputs)
        if e.prim.kind != "custom":
            eqns.append(Eqn(e.prim, ins, e.params, e.outs, e.source, e.label))
            return
        body = e.prim.body(e)
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
