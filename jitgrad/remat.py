"""Recomputing cheap values instead of keeping them: a value one kernel writes only for later kernels
to read back (a forward value the backward reads: GELU's tanh, softmax's exp, LayerNorm's centred
input) is recomputed inside those kernels from arrays they can read anyway (matmul outputs, inputs,
reductions already written), so it is neither written nor kept alive between the two.

`fusion.schedule` asks `recompute_plan` for the rewrite after a first grouping, groups the rewritten
graph again and keeps whichever program holds less memory at its peak (`peak_bytes`) without running
more kernels. A recomputed value is computed by the same primitives from the same inputs as the
original; on the CPU, whose kernels are strict IEEE (no contraction outside vecmath's own polynomials),
it has the original's bits. CUDA's compiler may contract a multiply and an add into one FMA in one
kernel and not in another, so there a recomputed value may differ from the forward's in the last bit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Atom, Eqn, Graph, Literal, Var
from .loops import HostStep, LoopKernel, Program, is_transparent
from .primitive import Kind

MAX_RECOMPUTED_EQNS = 16  # elementwise equations one recomputed value may take
MAX_COSTLY = 2  # of which transcendental (exp, tanh...): more and recomputing costs more than reading


@dataclass
class Rewrite:
    """The graph with recomputing copies, and the copies' outputs (which fusion must not merge into
    any group but their readers')."""

    graph: Graph
    recomputed: set[Var]


def recompute_plan(graph: Graph, program: Program) -> Rewrite | None:
    """Copies of the elementwise equations behind each value that kernels write only for other kernels,
    placed before each reading kernel's first use of it; None when no value qualifies."""
    producers = {o: e for e in graph.eqns for o in e.outs}
    views = {o: e for o, e in producers.items() if is_transparent(e) and len(e.inputs) == 1}  # not concatenates
    written: dict[Var, int] = {}
    read_by_host = {a for a in graph.outputs if isinstance(a, Var)}
    kernel_of_eqn: dict[int, int] = {}
    available = set(graph.inputs)
    for k, step in enumerate(program.steps):
        if isinstance(step, HostStep):
            read_by_host.update(a for a in step.eqn.inputs if isinstance(a, Var))
            available.update(step.eqn.outs)
            continue
        written.update((v, k) for v in step.outputs)
        available.update(step.outputs)
        kernel_of_eqn.update((id(e), k) for e in step.eqns)

    def base(a: Atom) -> Atom:
        while isinstance(a, Var) and a in views:
            a = views[a].inputs[0]
        return a

    def readable(a: Atom, v: Var) -> bool:
        """Can a kernel recomputing `v` read `a`: a constant, an array already in memory, or a reduction's
        result (some kernel computes it; written for the copy if not yet, at most a quarter of v's size)?"""
        if isinstance(a, Literal) or a in available:
            return True
        e = producers.get(a)
        return e is not None and e.prim.kind is Kind.REDUCE and 4 * a.aval.size <= v.aval.size

    cones: dict[Var, list[Eqn] | None] = {}

    def cone(v: Var) -> list[Eqn] | None:
        """The elementwise equations (and views between them) computing `v` from arrays its readers can
        read, in graph order, if few enough."""
        if v in cones:
            return cones[v]
        found: dict[int, Eqn] = {}
        stack = [v]
        while stack and len(found) <= 2 * MAX_RECOMPUTED_EQNS:
            x = stack.pop()
            e = producers.get(x)
            if e is None or not (e.prim.kind is Kind.ELEMENTWISE or x in views):
                if not readable(x, v):
                    return cones.setdefault(v, None)
                continue
            if x in views and readable(base(x), v):
                continue  # a view of an array in memory: read through as it is
            if id(e) not in found:
                found[id(e)] = e
                stack.extend(a for a in e.inputs if isinstance(a, Var))
        eqns = list(found.values())
        computing = [e for e in eqns if e.prim.kind is Kind.ELEMENTWISE]
        ok = not stack and computing and len(computing) <= MAX_RECOMPUTED_EQNS \
            and sum(e.prim.costly for e in computing) <= MAX_COSTLY
        cones[v] = order(eqns) if ok else None
        return cones[v]

    position = {id(e): i for i, e in enumerate(graph.eqns)}

    def order(eqns: list[Eqn]) -> list[Eqn]:
        return sorted(eqns, key=lambda e: position[id(e)])

    candidates = {v for v in written if v not in read_by_host and producers[v].prim.kind is Kind.ELEMENTWISE
                  and cone(v) is not None}
    if not candidates:
        return None
    eqns: list[Eqn] = []
    recomputed: set[Var] = set()
    copies: dict[tuple[int, Var], Atom] = {}

    def copy_of(a: Atom, k: int) -> Atom:
        """`a` as kernel k recomputes it (candidates and views of them), else `a` itself."""
        if not isinstance(a, Var):
            return a
        key = (k, a)
        if key in copies:
            return copies[key]
        if a in candidates:
            for e in cone(a):  # the part of the cone this kernel has not recomputed already
                if (k, e.out) in copies:
                    continue
                out = Var(e.out.aval)
                ins = tuple(copies.get((k, x), x) if isinstance(x, Var) else x for x in e.inputs)
                eqns.append(Eqn(e.prim, ins, e.params, (out,), e.source, e.label))
                copies[(k, e.out)] = out
                recomputed.add(out)
            return copies[key]
        elif a in views and base(a) in candidates:
            e = views[a]
            found = Var(a.aval)
            eqns.append(Eqn(e.prim, (copy_of(e.inputs[0], k),) + e.inputs[1:], e.params, (found,), e.source,
                            e.label))
            recomputed.add(found)
        else:
            found = a
        copies[key] = found
        return found

    for e in graph.eqns:
        k = kernel_of_eqn.get(id(e))
        if k is not None and any(isinstance(a, Var) and written.get(base(a), k) != k for a in e.inputs):
            e = Eqn(e.prim, tuple(copy_of(a, k) for a in e.inputs), e.params, e.outs, e.source, e.label)
        eqns.append(e)
    if not recomputed:
        return None
    return Rewrite(Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), recomputed)


def peak_bytes(program: Program) -> int:
    """The most bytes of intermediate arrays alive at once when the steps run in order (each written by
    its step, freed after its last reader; views and the graph's inputs and outputs not counted)."""
    keep = set(program.graph.inputs) | {a for a in program.graph.outputs if isinstance(a, Var)}

    def reads(step: LoopKernel | HostStep) -> list[Var]:
        atoms = step.inputs if isinstance(step, LoopKernel) else step.eqn.inputs
        return [a for a in atoms if isinstance(a, Var)]

    def writes(step: LoopKernel | HostStep) -> list[Var]:
        if isinstance(step, LoopKernel):
            return list(step.outputs)
        return [] if step.eqn.prim.kind is Kind.VIEW else list(step.eqn.outs)

    last = {v: k for k, s in enumerate(program.steps) for v in reads(s)}
    counted: set[Var] = set()
    live = peak = 0
    for k, step in enumerate(program.steps):
        new = [v for v in writes(step) if v not in keep]
        counted.update(new)
        live += sum(v.aval.nbytes for v in new)
        peak = max(peak, live)
        live -= sum(v.aval.nbytes for v in set(reads(step)) if last[v] == k and v in counted)
    return peak
