"""Loop nests: the backend-neutral form of a fused kernel (`LoopKernel`); `lower_group` writes a group as one.

A kernel iterates over one domain D (a shape). Axes of D split into kept axes (outer loops) and
reduced axes R (inner loops). Inside, elementwise values are computed per point, views only move
indices (a broadcast reads index 0 along stretched axes, a transpose permutes), and reductions
accumulate over R. A value that needs a reduction's result is computed in a later pass over R
("stage"), so softmax-like chains (max -> exp/sum -> divide) become one kernel with three passes.
Only values used outside the kernel are written to memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from jitgrad.ir.graph import Atom, Aval, Eqn, Graph, Literal, Var
from jitgrad.ir.primitive import Kind, Offset, Param, Primitive, entry_axis

Index = tuple  # per array axis: a domain axis number (the loop variable), None (index 0) or an `Offset`


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
    prim: Primitive
    args: list[str]
    params: dict[str, Any]
    dtype: np.dtype
    value: tuple = ()  # (var id, index): equal in two passes when both compute the same value


@dataclass
class Branch:
    """`dst` = the value of the first case whose bounds all hold, computed by that case's own statements; the
    `otherwise` scalar where none holds (None: the cases cover every point, and a last case without bounds
    is the rest). A bound (entry, lo, hi) holds where lo <= the entry's position < hi. Region reads: a pad
    reads its input inside the region and its fill value outside, a concatenate reads the operand whose
    range holds the position. A case's statements read only the loop variables, scalars and accumulators."""

    dst: str
    cases: list[tuple[tuple, list, str]]  # (bounds, statements, the name holding the case's value)
    otherwise: str | None


def statements(body: list) -> list:
    """Every statement of `body`, those inside branches included."""
    found = []
    for st in body:
        found.append(st)
        if isinstance(st, Branch):
            for _, sub, _ in st.cases:
                found.extend(statements(sub))
    return found


@dataclass
class Reduction:
    acc: str
    prim: Primitive
    src: str
    dtype: np.dtype
    counts: bool = False  # its terms are bools cast to floats: a float sum of them is exact in any order


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
    index_params: tuple[int, ...] = ()  # the values of its `Param`s, by number: int64 arguments after the scalars
    lowered: dict[str, str] = field(default_factory=dict, compare=False, repr=False)  # backend -> source, kept on disk

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
    fusion_work: int = 0  # steps the grouping visited and merges it tried (a measure of its cost)

    @property
    def kernels(self) -> list[LoopKernel]:
        return [s for s in self.steps if isinstance(s, LoopKernel)]


def _canonical_index(shape: Sequence[int], domain_axes: Sequence[int | None]) -> Index:
    return tuple(None if d == 1 else a for d, a in zip(shape, domain_axes))


def view_index(e: Eqn, index: Index) -> Index:
    """Index into a view's input given the index into its output; NotFusible for views that regroup axes."""
    found = e.prim.index_map(e, index) if e.prim.index_map is not None else None
    if found is None:
        raise NotFusible(f"{e.prim.name} is not a pure move of indices here")
    return found


class _LoopBuilder:
    """Builds a LoopKernel from a group of equations by walking from the group's outputs (with `domain`
    given and no equations: a copy kernel writing views of arrays)."""

    def __init__(self, eqns: list[Eqn], outputs: list[Var], views: dict[Var, Eqn],
                 domain: tuple[int, ...] | None = None):
        self.eqns = eqns
        self.producer = {o: e for e in eqns for o in e.outs}
        self.views = views
        self.domain, self.reduce_axes = self._domain() if domain is None else (domain, ())
        self.fills: dict[tuple, Literal] = {}
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
        reduces = [e for e in self.eqns if e.prim.kind is Kind.REDUCE]
        if reduces:
            shapes = {e.inputs[0].aval.shape for e in reduces}
            axes = {e.params["axes"] for e in reduces}
            if len(shapes) != 1 or len(axes) != 1:
                raise NotFusible("reductions over different domains")
            return shapes.pop(), axes.pop()
        sizes = [(o.aval.size, o.aval.shape) for e in self.eqns if e.prim.kind is Kind.ELEMENTWISE for o in e.outs]
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
            self.depths[a] = d + 1 if e.prim.kind is Kind.REDUCE else d
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
            if stage is None and any(entry_axis(i) in self.reduce_axes for i in index if i is not None):
                raise NotFusible("a per-row value reads along a reduced axis")
            if not any(x is a for x in self.inputs):
                self.inputs.append(a)
            name = self.fresh("v")
            body.append(Load(name, next(k for k, x in enumerate(self.inputs) if x is a), index))
        elif e.prim.select_map is not None:
            name = self.selected(e, index, body, stage)
        elif e.prim.kind is Kind.VIEW:
            name = self.value(e.inputs[0], view_index(e, index), body, stage)
        elif e.prim.kind is Kind.REDUCE:
            name = self.accumulator(e, index)
        elif e.prim.kind is Kind.ELEMENTWISE:
            args = [self.value(x, index, body, stage) for x in e.inputs]
            name = self.fresh("t")
            body.append(Compute(name, e.prim, args, e.params, a.aval.dtype, (a.id, index)))
        else:
            raise NotFusible(e.prim.name)
        self.memo[key] = name
        return name

    def selected(self, e: Eqn, index: Index, body: list, stage: int | None) -> str:
        """A region read (`Primitive.select_map`): the operand whose bounds hold at `index`, else the fill.
        Bounds on fixed positions are decided here; a read that is one case everywhere is a plain one."""
        found = e.prim.select_map(e, index)
        if found is None:
            raise NotFusible(f"{e.prim.name} is not read through here")
        cases, fill = found
        live = []
        for bounds, k, inner in cases:
            dynamic = _dynamic_bounds(bounds)
            if dynamic is None:
                continue
            live.append((dynamic, k, inner))
            if not dynamic:
                fill = None  # this case holds wherever the earlier ones do not
                break
        if live and fill is None:
            live[-1] = ((),) + live[-1][1:]  # the cases cover every point: the last one is the rest
        if live and not live[0][0]:
            return self.value(e.inputs[live[0][1]], live[0][2], body, stage)
        otherwise = None if fill is None else self.value(self.fill(fill, e.out.aval.dtype), (), body, stage)
        if not live:
            return otherwise
        branches = []
        for bounds, k, inner in live:
            sub: list = []
            branches.append((bounds, sub, self.value(e.inputs[k], inner, sub, stage)))
        name = self.fresh("t")
        body.append(Branch(name, branches, otherwise))
        return name

    def fill(self, value: Any, dtype: np.dtype) -> Literal:
        """The scalar constant a region read gives outside its operands (one per value and dtype)."""
        key = (np.dtype(dtype).str, repr(value))
        if key not in self.fills:
            self.fills[key] = Literal(np.asarray(value, dtype), Aval((), np.dtype(dtype)))
        return self.fills[key]

    def accumulator(self, e: Eqn, index: Index) -> str:
        canonical = _canonical_index(e.out.aval.shape, range(len(self.domain)))
        if index != canonical:
            raise NotFusible("a reduction's result is read at another position than its own row")
        if e.out not in self.acc_names:
            s = self.depth(e.inputs[0])
            st = self.stage(s)
            src = self.value(e.inputs[0], self.full_index, st.body, s)
            acc = self.fresh("acc")
            st.reductions.append(Reduction(acc, e.prim, src, e.out.aval.dtype, self.casts_bool(e.inputs[0])))
            self.acc_names[e.out] = acc
        return self.acc_names[e.out]

    def casts_bool(self, a: Atom) -> bool:
        """Is `a` (through views) a bool array cast to another dtype, so that its elements are 0 or 1?"""
        e = self.producer.get(a) or self.views.get(a) if isinstance(a, Var) else None
        while e is not None and e.prim.kind is Kind.VIEW:
            a = e.inputs[0]
            e = self.producer.get(a) or self.views.get(a) if isinstance(a, Var) else None
        return e is not None and e.prim.converts and e.inputs[0].aval.dtype == np.bool_

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
        params = _Params()
        for body, stores in [(s.body, s.stores) for s in self.stages] + [(self.epilogue, self.epilogue_stores)]:
            params.body(body)
            params.stores(stores)
        return LoopKernel(self.domain, self.reduce_axes, self.inputs, self.scalars, self.outputs, self.stages,
                          self.epilogue, self.epilogue_stores, self.eqns, tuple(params.values))


class _Params:
    """Replaces the shape-dependent integers of a kernel's statements (Offset starts, region-read bounds) by
    `Param`s, in place, numbered in the order met: one per distinct value of each kind (a start, a fixed
    position, a bound), since every kernel argument costs compile time (an im2col repeats its pad's edges in
    nine cases). Where quantities of one kind happen to be equal for one shape and not for another (an edge
    of 6 and six channels), the two shapes compile their own kernels; no shape reads another's values."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.found: dict[tuple[str, int], Param] = {}

    def param(self, kind: str, value: int) -> Param:
        if (kind, value) not in self.found:
            self.found[(kind, value)] = Param(len(self.values), value)
            self.values.append(value)
        return self.found[(kind, value)]

    def entry(self, entry: int | Offset | None) -> int | Offset | None:
        if isinstance(entry, Offset) and isinstance(entry.start, int) and entry.start != 0:
            return Offset(entry.axis, self.param("start" if entry.axis is not None else "fixed", entry.start),
                          entry.step)
        return entry

    def index(self, index: Index) -> Index:
        return tuple(self.entry(e) for e in index)

    def stores(self, stores: list[Store]) -> None:
        for st in stores:
            st.index = self.index(st.index)

    def body(self, body: list) -> None:
        for st in body:
            if isinstance(st, Load):
                st.index = self.index(st.index)
            elif isinstance(st, Branch):
                cases = []
                for bounds, sub, value in st.cases:
                    self.body(sub)
                    cases.append((tuple((self.entry(e), self.param("bound", lo), self.param("bound", hi))
                                        for e, lo, hi in bounds),
                                  sub, value))
                st.cases = cases


def lower_group(eqns: list[Eqn], outputs: list[Var], views: dict[Var, Eqn]) -> LoopKernel:
    """The loop nest computing `outputs` from the group `eqns`, reading through transparent `views`;
    raises NotFusible if there is none."""
    return _LoopBuilder(eqns, outputs, views).build()


def view_kernel(v: Var, views: dict[Var, Eqn]) -> LoopKernel:
    """A kernel writing `v` (contiguous) by reading through the transparent `views` that make it."""
    return _LoopBuilder([], [v], views, v.aval.shape).build()


def _dynamic_bounds(bounds: tuple) -> tuple | None:
    """The bounds that depend on a loop variable; None if a bound on a fixed position fails."""
    dynamic = []
    for entry, lo, hi in bounds:
        if entry_axis(entry) is None:
            position = entry.start if isinstance(entry, Offset) else 0
            if not lo <= position < hi:
                return None
        else:
            dynamic.append((entry, lo, hi))
    return tuple(dynamic)


def is_transparent(e: Eqn) -> bool:
    """Views that only move indices, and region reads (pads, concatenates) kernels can select from, are
    read through by kernels instead of being executed."""
    identity = tuple(range(e.outs[0].aval.ndim)) if e.outs else ()
    if e.prim.select_map is not None:
        return e.prim.select_map(e, identity) is not None
    if e.prim.kind is not Kind.VIEW or e.prim.index_map is None:
        return False
    return e.prim.index_map(e, identity) is not None
