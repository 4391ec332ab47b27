"""Recomputing cheap values instead of keeping them: a value one kernel writes only for later kernels
to read back (a forward value the backward reads: GELU's tanh, softmax's exp, LayerNorm's centred
input) is recomputed inside those kernels from arrays they can read anyway (matmul outputs, inputs,
reductions already written), so it is neither written nor kept alive between the two.

`fusion.schedule` asks `recompute_plan` for the rewrite after a first grouping, groups the rewritten
graph again and keeps whichever program holds less memory at its peak (`peak_bytes`) without running
more kernels. A recomputed value is computed by the same primitives from the same inputs as the
original; on the CPU, whose kernels are strict IEEE (no contraction outside vecmath's own polynomials),
it has the original's bits. A device backend's compiler may contract a multiply and an add into one FMA
in one kernel and not in another, so there a recomputed value may differ from the forward's in the last
bit (its folder of kernels/ says so).

`recopy` does the same for copy kernels: a large array a copy kernel writes (an im2col's patches) that a late
host step reads again (the weight gradient's product) is copied again right before that step from its sources
(the images, a pooled layer) instead of being kept through the forward and the backward, where that lowers the
peak (`peak_bytes`, which keeps an array alive while a host view of it is read). A copy moves the same elements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from jitgrad.ir.graph import Atom, Eqn, Graph, Literal, Var
from jitgrad.passes.loops import HostStep, LoopKernel, Program, is_transparent
from jitgrad.ir.primitive import Kind

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
    its step, freed after the last step reading it or a host view of it; the graph's inputs and outputs not
    counted)."""
    keep = set(program.graph.inputs) | {a for a in program.graph.outputs if isinstance(a, Var)}

    def reads(step: LoopKernel | HostStep) -> list[Var]:
        atoms = step.inputs if isinstance(step, LoopKernel) else step.eqn.inputs
        return [a for a in atoms if isinstance(a, Var)]

    def writes(step: LoopKernel | HostStep) -> list[Var]:
        if isinstance(step, LoopKernel):
            return list(step.outputs)
        return [] if step.eqn.prim.kind is Kind.VIEW else list(step.eqn.outs)

    roots: dict[Var, set[Var]] = {}  # a host view's output -> the written arrays it may be memory of
    last: dict[Var, int] = {}
    for k, s in enumerate(program.steps):
        for v in reads(s):
            for r in roots.get(v, {v}):
                last[r] = k
        if isinstance(s, HostStep) and s.eqn.prim.kind is Kind.VIEW:
            under = set().union(*(roots.get(v, {v}) for v in reads(s)))
            roots.update((o, under) for o in s.eqn.outs)
    frees: dict[int, list[Var]] = {}
    for v, k in last.items():
        frees.setdefault(k, []).append(v)
    counted: set[Var] = set()
    live = peak = 0
    for k, step in enumerate(program.steps):
        new = [v for v in writes(step) if v not in keep]
        counted.update(new)
        live += sum(v.aval.nbytes for v in new)
        peak = max(peak, live)
        live -= sum(v.aval.nbytes for v in frees.get(k, ()) if v in counted)
    return peak


RECOPY_MIN_BYTES = 1 << 20  # smaller copies (an im2col's patches) are kept between their readers


def recopy(program: Program, regroup: Callable[[Graph], Program]) -> Program:
    """Copy kernels (an im2col's patches, nine shifted views of the padded input stacked) whose array a late host
    step reads again (the weight gradient's product, in the backward) are run again right before that reader,
    from the same sources, where those are in memory then anyway (the images; a pooled layer the backward reads),
    instead of keeping the array alive in between; each such rewrite (largest array first) is grouped again by
    `regroup` and kept where it lowers the program's `peak_bytes`. A copy moves the same elements: the same bits."""
    tried: set[Var] = set()
    sunk: set[Var] = set()  # the copies kept so far, placed again after each regrouping
    while True:
        found = _late_copy(program, tried)
        if found is None:
            return program
        graph, copied = found
        candidate = _sunk(regroup(graph), sunk | copied)
        if peak_bytes(candidate) < peak_bytes(program):
            program, sunk = candidate, sunk | copied


def _late_copy(program: Program, tried: set[Var]) -> tuple[Graph, set[Var]] | None:
    """The graph with the view cone of each late reader of the largest untried copy kernel's array recorded
    again before that reader (and the new vars), or None when no copy kernel qualifies."""
    graph = program.graph
    outputs = {a for a in graph.outputs if isinstance(a, Var)}
    copies = sorted((v for s in program.steps if isinstance(s, LoopKernel) and not s.eqns for v in s.outputs
                     if v not in tried and v.aval.nbytes >= RECOPY_MIN_BYTES and v not in outputs),
                    key=lambda v: -v.aval.nbytes)
    if not copies:
        return None
    producers = {o: e for e in graph.eqns for o in e.outs}
    views = {o: e for o, e in producers.items() if e.prim.kind is Kind.VIEW or e.prim.select_map is not None}
    step_of = {o: k for k, s in enumerate(program.steps)
               for o in (s.outputs if isinstance(s, LoopKernel) else s.eqn.outs)}
    last_read: dict[Var, int] = {}
    for k, s in enumerate(program.steps):
        for a in (s.inputs if isinstance(s, LoopKernel) else s.eqn.inputs):
            if isinstance(a, Var):
                last_read[a] = k
    reads: dict[Var, list[Eqn]] = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                reads.setdefault(a, []).append(e)
    for v in copies:
        tried.add(v)
        readers, stack, seen, plain = [], [v], set(), True
        while stack and plain:  # the host steps reading v through views (a kernel reading it: not a candidate)
            for e in reads.get(stack.pop(), ()):
                if id(e) in seen:
                    continue
                seen.add(id(e))
                if e.prim.kind is Kind.VIEW and e.prim.select_map is None and e.outs[0] not in outputs:
                    stack.extend(e.outs)
                elif e.prim.kind is not Kind.VIEW and e.prim.kind not in (Kind.ELEMENTWISE, Kind.REDUCE):
                    readers.append(e)
                else:
                    plain = False
        if not plain or len(readers) < 2 or not all(len(e.outs) == 1 and e.out in step_of for e in readers):
            continue
        readers.sort(key=lambda e: step_of[e.out])
        late = [e for e in readers[1:] if step_of[e.out] > step_of[readers[0].out] + 1]
        cone = _view_cone(v, views)
        sources = {a for e in cone for a in e.inputs if isinstance(a, Var) and a not in views}
        if late and all(a in graph.inputs or last_read.get(a, -1) >= step_of[late[0].out] for a in sources):
            return _with_copies(graph, v, late, views)
    return None


def _view_cone(v: Var, views: dict[Var, Eqn]) -> list[Eqn]:
    """The view and region-read equations making `v` from the arrays under them."""
    found: dict[int, Eqn] = {}
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, Var) and x in views and id(views[x]) not in found:
            found[id(views[x])] = views[x]
            stack.extend(views[x].inputs)
    return list(found.values())


def _with_copies(graph: Graph, v: Var, late: list[Eqn], views: dict[Var, Eqn]) -> tuple[Graph, set[Var]]:
    """Before the first late reader, its operands that are views of `v` recorded again down to v's sources (the
    later ones read the same copy)."""
    position = {id(e): i for i, e in enumerate(graph.eqns)}
    late_ids = {id(e) for e in late}
    eqns: list[Eqn] = []
    copied: set[Var] = set()
    fresh: dict[Var, Var] = {}  # one copy, made before the first late reader, for all of them
    for e in graph.eqns:
        if id(e) in late_ids:
            cones = [cone for a in e.inputs for cone in [_view_cone(a, views)] if any(v in c.outs for c in cone)]
            for c in sorted({id(c): c for cone in cones for c in cone}.values(), key=lambda c: position[id(c)]):
                if c.outs[0] in fresh:
                    continue
                outs = tuple(Var(o.aval) for o in c.outs)
                ins = tuple(fresh.get(a, a) if isinstance(a, Var) else a for a in c.inputs)
                eqns.append(Eqn(c.prim, ins, c.params, outs, c.source, c.label))
                fresh.update(zip(c.outs, outs))
                copied.update(outs)
            e = Eqn(e.prim, tuple(fresh.get(a, a) if isinstance(a, Var) else a for a in e.inputs), e.params, e.outs,
                    e.source, e.label)
        eqns.append(e)
    return Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names)), copied


def _sunk(program: Program, copied: set[Var]) -> Program:
    """`program` with the steps writing `copied` vars (the copy kernel run again, its host views) moved to right
    before the first step reading them (a step with no input but the graph's would otherwise run first)."""
    def outs(s: LoopKernel | HostStep) -> Sequence[Var]:
        return s.outputs if isinstance(s, LoopKernel) else s.eqn.outs

    def ins(s: LoopKernel | HostStep) -> Sequence[Atom]:
        return s.inputs if isinstance(s, LoopKernel) else s.eqn.inputs

    steps = list(program.steps)
    for k in range(len(steps) - 1, -1, -1):
        s = steps[k]
        if not any(o in copied for o in outs(s)):
            continue
        made = set(outs(s))
        first = next((j for j in range(k + 1, len(steps)) if any(a in made for a in ins(steps[j]))), None)
        if first is not None:
            steps.insert(first - 1, steps.pop(k))
    return Program(program.graph, steps, program.fusion_work)
