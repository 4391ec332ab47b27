"""Fusion: partition an optimised graph into kernels (`jitgrad.loops.LoopKernel`) and host steps.

Grouping is greedy: each fusible equation joins its producers' groups when the merged group still
lowers to a valid loop nest (`lower_group`) and no other step sits between them; then sibling groups
over the same domain that share inputs merge (one pass computes a loss and its gradients together).
"""
from __future__ import annotations

from typing import Any, Sequence

from .ir import Atom, Eqn, Graph, Var
from .loops import HostStep, LoopKernel, NotFusible, Program, is_transparent, lower_group
from .primitive import Kind

class _Grouping:
    """Union of computing equations into groups, keeping merged groups valid loop nests and acyclic."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.eqns = graph.eqns
        self.views = {e.out: e for e in self.eqns if is_transparent(e)}
        self.computing = [i for i, e in enumerate(self.eqns) if e.prim.kind in (Kind.ELEMENTWISE, Kind.REDUCE)]
        self.group_of = {i: i for i in self.computing}
        self.members: dict[int, list[int]] = {i: [i] for i in self.computing}
        self.producer_index = {o: i for i, e in enumerate(self.eqns) for o in e.outs if e.out not in self.views}
        self.readers: dict[Var, set[int]] = {}  # non-view equations reading a var, directly or through views
        self.escapes: set[Var] = set()  # vars reaching a graph output as they are, or through views
        self.squeezed: dict[Var, list[Var]] = {}  # var -> graph outputs that only drop/add length-1 axes of it
        outputs = {a for a in graph.outputs if isinstance(a, Var)}
        for i, e in enumerate(self.eqns):
            if e.out in self.views:
                continue
            for a in e.inputs:
                if isinstance(a, Var):
                    self.readers.setdefault(self.source(a), set()).add(i)
        for v in outputs:
            if self.only_squeezes(v):
                self.squeezed.setdefault(self.source(v), []).append(v)
            else:
                self.escapes.add(self.source(v))

    def only_squeezes(self, v: Var) -> bool:
        """Is `v` a chain of views of another value that only drop or add length-1 axes (same data order)?"""
        if v not in self.views:
            return False
        while v in self.views:
            e = self.views[v]
            src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
            if e.inputs[0].aval.size != e.outs[0].aval.size or \
                    [d for d in src if d != 1] != [d for d in out if d != 1]:
                return False
            v = e.inputs[0]
        return True

    def source(self, v: Atom) -> Atom:
        """The value a chain of transparent views reads from."""
        while isinstance(v, Var) and v in self.views:
            v = self.views[v].inputs[0]
        return v

    def outputs_of(self, members: Sequence[int], store_squeezed: bool) -> list[Var]:
        """What a group writes: values read outside it or returned. With `store_squeezed`, a value returned
        only as a reshape of itself (a loss of shape () from a (1,) reduction) is written in that shape."""
        inside = set(members)
        found = []
        for i in sorted(members):
            for o in self.eqns[i].outs:
                squeezed = self.squeezed.get(o, [])
                if o in self.escapes or any(r not in inside for r in self.readers.get(o, ())) \
                        or (squeezed and not store_squeezed):
                    found.append(o)
                if store_squeezed:
                    found.extend(squeezed)
        return found

    def successors(self, g: int) -> set[int]:
        found = set()
        for i in self.members[g]:
            for o in self.eqns[i].outs:
                found.update(self.group_of.get(r, -1 - r) for r in self.readers.get(o, ()))
        found.discard(g)
        return found

    def step_successors(self, node: int) -> set[int]:
        """Successors of a group (>= 0) or of a host equation i (encoded as -1 - i)."""
        if node >= 0:
            return self.successors(node)
        e = self.eqns[-1 - node]
        found = set()
        for o in e.outs:
            found.update(self.group_of.get(r, -1 - r) for r in self.readers.get(o, ()))
        return found

    def reaches_indirectly(self, src: int, dst: int) -> bool:
        """Is there a path src -> X -> ... -> dst through some other step X?"""
        stack = [s for s in self.successors(src) if s != dst]
        seen: set[int] = set()
        while stack:
            g = stack.pop()
            if g == dst:
                return True
            if g not in seen:
                seen.add(g)
                stack.extend(self.step_successors(g))
        return False

    def lower(self, members: Sequence[int]) -> LoopKernel:
        eqns = [self.eqns[i] for i in sorted(members)]
        try:
            return lower_group(eqns, self.outputs_of(members, store_squeezed=True), self.views)
        except NotFusible:
            return lower_group(eqns, self.outputs_of(members, store_squeezed=False), self.views)

    def try_merge(self, a: int, b: int) -> bool:
        if a == b or self.reaches_indirectly(a, b) or self.reaches_indirectly(b, a):
            return False
        members = self.members[a] + self.members[b]
        try:
            self.lower(members)
        except NotFusible:
            return False
        for i in self.members[b]:
            self.group_of[i] = a
        self.members[a] = members
        del self.members[b]
        return True

    def run(self) -> None:
        for i in self.computing:
            for x in self.eqns[i].inputs:
                j = self.producer_index.get(self.source(x)) if isinstance(x, Var) else None
                if j is not None and j in self.group_of:
                    self.try_merge(self.group_of[j], self.group_of[i])
        self.merge_siblings()

    def _inputs(self, g: int) -> set[Any]:
        inside = set(self.members[g])
        return {self.source(a) for i in self.members[g] for a in self.eqns[i].inputs
                if isinstance(a, Var) and self.producer_index.get(self.source(a)) not in inside}

    def merge_siblings(self) -> None:
        changed = True
        while changed:
            changed = False
            for x in list(self.members):
                for y in list(self.members):
                    if x < y and x in self.members and y in self.members and self._inputs(x) & self._inputs(y):
                        changed |= self.try_merge(x, y)


def schedule(graph: Graph) -> Program:
    """Group `graph` into kernels and host steps, ordered so each step follows its inputs' producers."""
    grouping = _Grouping(graph)
    grouping.run()
    steps: list[LoopKernel | HostStep] = [grouping.lower(m) for m in grouping.members.values()]
    host = [e for e in graph.eqns if e.prim.kind not in (Kind.ELEMENTWISE, Kind.REDUCE) and e.out not in grouping.views]
    written = {o for k in steps for o in k.outputs}
    needed_views = _views_needed_on_host(graph, grouping.views, host, written)
    steps += [HostStep(e) for e in graph.eqns if e in host or id(e) in needed_views]
    return Program(graph, _topological(steps))


def _views_needed_on_host(graph: Graph, views: dict[Var, Eqn], host: list[Eqn], written: set[Var]) -> set[int]:
    """Transparent views whose results host steps or the graph's outputs use as arrays (and no kernel writes)."""
    needed: set[int] = set()
    stack = [a for e in host for a in e.inputs] + list(graph.outputs)
    while stack:
        v = stack.pop()
        if isinstance(v, Var) and v in views and v not in written and id(views[v]) not in needed:
            needed.add(id(views[v]))
            stack.append(views[v].inputs[0])
    return needed


def _topological(steps: list[LoopKernel | HostStep]) -> list[LoopKernel | HostStep]:
    """Order steps so each runs after the steps producing its inputs."""
    def produced(s: LoopKernel | HostStep) -> list[Var]:
        return list(s.outputs) if isinstance(s, LoopKernel) else list(s.eqn.outs)

    def needed(s: LoopKernel | HostStep) -> list[Var]:
        atoms = s.inputs if isinstance(s, LoopKernel) else s.eqn.inputs
        return [a for a in atoms if isinstance(a, Var)]

    made_by = {v: k for k, s in enumerate(steps) for v in produced(s)}
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(k: int) -> None:
        if state.get(k) == 2:
            return
        if state.get(k) == 1:
            raise RuntimeError("jitgrad internal error: fusion produced a cycle")
        state[k] = 1
        for v in needed(steps[k]):
            if v in made_by:
                visit(made_by[v])
        state[k] = 2
        order.append(k)

    for k in range(len(steps)):
        visit(k)
    return [steps[k] for k in order]


def describe(program: Program) -> str:
    """Fusion groups as text: each kernel's domain, passes, inputs, outputs and member equations."""
    lines = []
    for n, s in enumerate(program.steps):
        if isinstance(s, HostStep):
            lines.append(f"step {n}: host {s.eqn.prim.name} -> {s.eqn.outs[0].aval}")
            continue
        red = f", reduce axes {s.reduce_axes}" if s.reduce_axes else ""
        lines.append(f"step {n}: kernel over {s.domain}{red}, {len(s.stages)} pass(es), "
                     f"{len(s.eqns)} ops: {' '.join(e.prim.name for e in s.eqns)}")
        lines.append(f"    reads {[str(a.aval) for a in s.inputs]}, writes {[str(o.aval) for o in s.outputs]}")
    return "\n".join(lines) if lines else "(no steps: outputs are inputs or constants)"
