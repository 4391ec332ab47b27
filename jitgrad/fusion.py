"""Fusion: partition an optimised graph into kernels and host steps, and describe each kernel as a
backend-neutral loop nest (`LoopKernel`) that `jitgrad.kernels` lowers to numba (CPU) or CUDA.

A kernel iterates over one domain D (a shape). Axes of D split into kept axes (outer loops) and
reduced axes R (inner loops). Inside, elementwise values are computed per point, views only move
indices (a broadcast reads index 0 along stretched axes, a transpose permutes), and reductions
accumulate over R. A value that needs a reduction's result is computed in a later pass over R
("stage"), so softmax-like chains (max -> exp/sum -> divide) become one kernel with three passes.
Only values used outside the kernel are written to memory.

Grouping is greedy: each fusible equation joins its producers' groups when the merged group still
lowers to a valid loop nest and no other step sits between them; then sibling groups over the same
domain that share inputs merge (one pass computes a loss and its gradients together).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import primitives as P
from .ir import Atom, Eqn, Graph, Literal, Var

Index = tuple  # per array axis: a domain axis number (the loop variable) or None (index 0)


class NotFusible(Exception):
    """A candidate group cannot be written as one loop nest."""


@dataclass
class Load:
    dst: str
    input: int  # position in LoopKernel.inputs
    index: Index


@dataclass
class Compute:
    dst: str
    prim: P.Primitive
    args: list[str]
    params: dict[str, Any]
    dtype: np.dtype
    value: tuple = ()  # (var id, index): equal in two passes when both compute the same value


@dataclass
class Reduction:
    acc: str
    prim: P.Primitive
    src: str
    dtype: np.dtype


@dataclass
class Store:
    output: int  # position in LoopKernel.outputs
    index: Index
    src: str


@dataclass
class Stage:
    """One pass over the reduced axes (or, with no reduced axes, the loop body)."""

    body: list[Load | Compute] = field(default_factory=list)
    reductions: list[Reduction] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)


@dataclass
class LoopKernel:
    """A fused group as a loop nest over `domain`; what every backend lowers."""

    domain: tuple[int, ...]
    reduce_axes: tuple[int, ...]
    inputs: list[Atom]  # materialised arrays read (Vars produced elsewhere, or array literals)
    scalars: list[Literal]  # scalar constants, passed as typed arguments
    outputs: list[Var]
    stages: list[Stage]
    epilogue: list[Load | Compute]  # per kept point, after all stages
    epilogue_stores: list[Store]
    eqns: list[Eqn]

    @property
    def kept_axes(self) -> tuple[int, ...]:
        return tuple(a for a in range(len(self.domain)) if a not in self.reduce_axes)


@dataclass
class HostStep:
    """An equation executed on whole arrays by its numpy reference (BLAS matmul, a copying reshape, a view)."""

    eqn: Eqn


@dataclass
class Program:
    """The executable form of a graph: kernels and host steps in order."""

    graph: Graph
    steps: list[LoopKernel | HostStep]

    @property
    def kernels(self) -> list[LoopKernel]:
        return [s for s in self.steps if isinstance(s, LoopKernel)]


def _canonical_index(shape: Sequence[int], domain_axes: Sequence[int | None]) -> Index:
    return tuple(None if d == 1 else a for d, a in zip(shape, domain_axes))


def view_index(e: Eqn, index: Index) -> Index:
    """Index into a view's input given the index into its output; NotFusible for reshapes that regroup."""
    src = e.inputs[0].aval.shape
    out = e.outs[0].aval.shape
    if e.prim is P.broadcast_to_p:
        lead = len(out) - len(src)
        return tuple(None if s == 1 else index[j + lead] for j, s in enumerate(src))
    if e.prim is P.transpose_p:
        result: list[int | None] = [None] * len(src)
        for j, p in enumerate(e.params["perm"]):
            result[p] = index[j]
        return tuple(result)
    if e.prim is P.reshape_p:
        if [d for d in src if d != 1] != [d for d in out if d != 1]:
            raise NotFusible("reshape regroups axes")
        live = iter([a for d, a in zip(out, index) if d != 1])
        return tuple(None if d == 1 else next(live) for d in src)
    raise NotFusible(e.prim.name)


class _LoopBuilder:
    """Builds a LoopKernel from a group of equations by walking from the group's outputs."""

    def __init__(self, eqns: list[Eqn], outputs: list[Var], views: dict[Var, Eqn]):
        self.eqns = eqns
        self.producer = {o: e for e in eqns for o in e.outs}
        self.views = views
        self.domain, self.reduce_axes = self._domain()
        n = len(self.domain)
        self.kept = tuple(a for a in range(n) if a not in self.reduce_axes)
        self.full_index = _canonical_index(self.domain, range(n))
        self.inputs: list[Atom] = []
        self.scalars: list[Literal] = []
        self.outputs = outputs
        self.stages: list[Stage] = []
        self.epilogue: list[Load | Compute] = []
        self.epilogue_stores: list[Store] = []
        self.memo: dict[tuple, str] = {}
        self.depths: dict[Var, int] = {}
        self.acc_names: dict[Var, str] = {}
        self.counter = 0

    def _domain(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        reduces = [e for e in self.eqns if e.prim.kind == "reduce"]
        if reduces:
            shapes = {e.inputs[0].aval.shape for e in reduces}
            axes = {e.params["axes"] for e in reduces}
            if len(shapes) != 1 or len(axes) != 1:
                raise NotFusible("reductions over different domains")
            return shapes.pop(), axes.pop()
        sizes = [(o.aval.size, o.aval.shape) for e in self.eqns if e.prim.kind == "elementwise" for o in e.outs]
        if not sizes:
            raise NotFusible("no computation")
        return max(sizes)[1], ()

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def depth(self, a: Atom) -> int:
        if not isinstance(a, Var) or (a not in self.producer and a not in self.views):
            return 0
        if a not in self.depths:
            e = self.producer.get(a) or self.views[a]
            d = max((self.depth(x) for x in e.inputs), default=0)
            self.depths[a] = d + 1 if e.prim.kind == "reduce" else d
        return self.depths[a]

    def stage(self, s: int) -> Stage:
        while len(self.stages) <= s:
            self.stages.append(Stage())
        return self.stages[s]

    def store_index(self, v: Var) -> tuple[Index, int | None]:
        """Where output `v` is written: over the full domain (a stage) or per kept point (epilogue)."""
        shape = v.aval.shape
        if shape == self.domain:
            return self.full_index, self.depth(v)
        kept_dims = [(a, self.domain[a]) for a in self.kept if self.domain[a] != 1]
        if [d for d in shape if d != 1] != [d for _, d in kept_dims]:
            raise NotFusible(f"output of shape {shape} fits neither the domain nor its kept axes")
        live = iter(a for a, _ in kept_dims)
        return tuple(None if d == 1 else next(live) for d in shape), None

    def value(self, a: Atom, index: Index, body: list, stage: int | None) -> str:
        """Name of a local holding `a` at `index`, emitting code into `body` (stage None: epilogue)."""
        index = tuple(None if d == 1 else i for d, i in zip(a.aval.shape, index))
        if isinstance(a, Literal) and a.is_scalar:
            if a not in self.scalars:
                self.scalars.append(a)
            return f"c{self.scalars.index(a)}"
        key = (id(body), a.id if isinstance(a, Var) else id(a), index)
        if key in self.memo:
            return self.memo[key]
        e = (self.producer.get(a) or self.views.get(a)) if isinstance(a, Var) else None
        if e is None:
            if stage is None and any(i in self.reduce_axes for i in index if i is not None):
                raise NotFusible("a per-row value reads along a reduced axis")
            if not any(x is a for x in self.inputs):
                self.inputs.append(a)
            name = self.fresh("v")
            body.append(Load(name, next(k for k, x in enumerate(self.inputs) if x is a), index))
        elif e.prim.kind == "view":
            name = self.value(e.inputs[0], view_index(e, index), body, stage)
        elif e.prim.kind == "reduce":
            name = self.accumulator(e, index)
        elif e.prim.kind == "elementwise":
            args = [self.value(x, index, body, stage) for x in e.inputs]
            name = self.fresh("t")
            body.append(Compute(name, e.prim, args, e.params, a.aval.dtype, (a.id, index)))
        else:
            raise NotFusible(e.prim.name)
        self.memo[key] = name
        return name

    def accumulator(self, e: Eqn, index: Index) -> str:
        canonical = _canonical_index(e.out.aval.shape, range(len(self.domain)))
        if index != canonical:
            raise NotFusible("a reduction's result is read at another position than its own row")
        if e.out not in self.acc_names:
            s = self.depth(e.inputs[0])
            st = self.stage(s)
            src = self.value(e.inputs[0], self.full_index, st.body, s)
            acc = self.fresh("acc")
            st.reductions.append(Reduction(acc, e.prim, src, e.out.aval.dtype))
            self.acc_names[e.out] = acc
        return self.acc_names[e.out]

    def build(self) -> LoopKernel:
        for k, v in enumerate(self.outputs):
            index, s = self.store_index(v)
            if s is None:
                src = self.value(v, index, self.epilogue, None)
                self.epilogue_stores.append(Store(k, index, src))
            else:
                st = self.stage(s)
                st.stores.append(Store(k, index, self.value(v, index, st.body, s)))
        if not self.stages:
            self.stages.append(Stage())
        return LoopKernel(self.domain, self.reduce_axes, self.inputs, self.scalars, self.outputs, self.stages,
                          self.epilogue, self.epilogue_stores, self.eqns)


def lower_group(eqns: list[Eqn], outputs: list[Var], views: dict[Var, Eqn]) -> LoopKernel:
    """The loop nest computing `outputs` from the group `eqns`, reading through transparent `views`;
    raises NotFusible if there is none."""
    return _LoopBuilder(eqns, outputs, views).build()


def is_transparent(e: Eqn) -> bool:
    """Views that only move indices are read through by kernels instead of being executed."""
    if e.prim.kind != "view":
        return False
    if e.prim is P.reshape_p:
        src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
        return [d for d in src if d != 1] == [d for d in out if d != 1]
    return True


class _Grouping:
    """Union of computing equations into groups, keeping merged groups valid loop nests and acyclic."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.eqns = graph.eqns
        self.views = {e.out: e for e in self.eqns if is_transparent(e)}
        self.computing = [i for i, e in enumerate(self.eqns) if e.prim.kind in ("elementwise", "reduce")]
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
        """Is `v` a chain of (transparent) reshapes of another value?"""
        if v not in self.views:
            return False
        while v in self.views:
            if self.views[v].prim is not P.reshape_p:
                return False
            v = self.views[v].inputs[0]
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
    host = [e for e in graph.eqns if e.prim.kind not in ("elementwise", "reduce") and e.out not in grouping.views]
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
