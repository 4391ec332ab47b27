"""Graph-to-graph optimisations run before fusion: DCE, CSE, constant folding, algebraic simplification.

Every pass keeps the graph's numbers bit-for-bit: no rewrite changes rounding (x*1 -> x is
exact, x*0 -> 0 is not done since it is wrong for inf and nan).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.ir.graph import Atom, Eqn, Graph, Literal, Var, iter_vars, substitute
from jitgrad.ir.primitive import Kind, stop_gradient_p
from jitgrad.ops.core import broadcast_to_p, reshape_p

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
            e = Eqn(broadcast_to_p, (scalar,), {"shape": e.out.aval.shape}, e.outs, e.source, e.label)
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


MAX_SUNK_EQNS = 16  # elementwise equations `sink_reshapes` may record again per reshape
MAX_SUNK_COSTLY = 2  # of which transcendental: more, and computing them twice costs more than the pass saved


def _regroups(e: Eqn) -> bool:
    """Is `e` a reshape that regroups axes (a (N, C) array viewed as (B, H/2, 2, W/2, 2, C)), which kernels
    cannot read through and so splits fusion groups?"""
    if e.prim is not reshape_p:
        return False
    src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
    return [d for d in src if d != 1] != [d for d in out if d != 1]


def sink_reshapes(graph: Graph) -> Graph:
    """A regrouping reshape of an elementwise result becomes the elementwise ops recorded again on reshaped
    operands (arrays reshaped, broadcasts of trailing axes broadcast to the new shape), so that they fuse with
    what reads the reshape: a conv's bias and ReLU, computed on the (N, C) product, join the 2x2 max-pool that
    reads them as (B, H/2, 2, W/2, 2, C), and the ReLU's output is neither written nor kept for the backward.
    The same primitives on the same elements give the same bits. Only where a kernel op reads the reshape and
    the reshaped value has no other reader; at most MAX_SUNK_EQNS equations (of which MAX_SUNK_COSTLY costly)
    per reshape, as the ops under it that other equations read (the pre-activation the ReLU's gradient reads)
    stay for them and are computed twice."""
    if not any(_regroups(e) for e in graph.eqns):
        return graph
    producers = {o: e for e in graph.eqns for o in e.outs}
    readers: dict[Var, list[Eqn]] = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                readers.setdefault(a, []).append(e)
    eqns: list[Eqn] = []
    mapping: dict[Var, Atom] = {}
    for e in graph.eqns:
        e = remap_inputs(e, mapping)
        x = e.inputs[0] if e.inputs else None
        source = producers.get(x) if isinstance(x, Var) else None
        fuses = any(r.prim.kind in (Kind.ELEMENTWISE, Kind.REDUCE) for r in readers.get(e.outs[0], ()))
        if _regroups(e) and fuses and source is not None and source.prim.kind is Kind.ELEMENTWISE \
                and len(readers[x]) == 1 and x not in graph.outputs:
            made: list[Eqn] = []
            found = _reshaped(x, e.outs[0].aval.shape, producers, made, {})
            if found is not None and sum(m.prim.kind is Kind.ELEMENTWISE for m in made) <= MAX_SUNK_EQNS \
                    and sum(m.prim.costly for m in made) <= MAX_SUNK_COSTLY:
                eqns.extend(made)
                mapping[e.outs[0]] = found
                continue
        eqns.append(e)
    if not mapping:
        return graph
    return substitute(Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), mapping)


def _reshaped(a: Atom, shape: tuple[int, ...], producers: dict[Var, Eqn], made: list[Eqn],
              memo: dict[Var, Atom | None]) -> Atom | None:
    """`a` (an operand of an elementwise op whose result is reshaped to `shape`) in that shape, appending the
    equations that make it to `made`; None where a broadcast does not keep its axes under the reshape."""
    if isinstance(a, Literal):
        value = np.asarray(a.value)
        return Literal(value.reshape(shape), a.aval.with_shape(shape)) if value.shape == a.aval.shape else None
    if a in memo:
        return memo[a]
    memo[a] = None  # a cycle cannot happen in SSA; this only marks the walk
    e = producers.get(a)
    out = Var(a.aval.with_shape(shape))
    if e is not None and e.prim is broadcast_to_p:
        x = e.inputs[0]
        kept = tuple(x.aval.shape)
        while kept and kept[0] == 1:
            kept = kept[1:]
        n = len(kept)
        if x.aval.ndim > len(shape) or (n and (tuple(a.aval.shape[-n:]) != kept or tuple(shape[-n:]) != kept)):
            return None
        made.append(Eqn(e.prim, (x,), {"shape": tuple(shape)}, (out,), e.source, e.label))
    elif e is not None and (e.prim.kind is Kind.VIEW and e.prim is not reshape_p or e.prim.select_map):
        return None  # a strided view: reshaping it would copy it on the host
    elif e is not None and e.prim.kind is Kind.ELEMENTWISE and len(e.outs) == 1 and len(made) <= 2 * MAX_SUNK_EQNS:
        ins = []
        for x in e.inputs:
            r = _reshaped(x, shape, producers, made, memo)
            if r is None:
                return None
            ins.append(r)
        made.append(Eqn(e.prim, tuple(ins), e.params, (out,), e.source, e.label))
    else:
        made.append(Eqn(reshape_p, (a,), {"shape": tuple(shape)}, (out,), None, ""))
    memo[a] = out
    return out


def optimize(graph: Graph, max_rounds: int = 8) -> Graph:
    """Run the passes to a fixed point (bounded)."""
    graph = strip_stop_gradient(inline_custom(graph))
    for _ in range(max_rounds):
        before = len(graph.eqns)
        graph = dce(cse(sink_reshapes(simplify(fold_constants(graph)))))
        if len(graph.eqns) == before:
            break
    return graph
