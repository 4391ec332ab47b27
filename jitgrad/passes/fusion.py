"""Fusion: partition an optimised graph into kernels (`jitgrad.passes.loops.LoopKernel`) and host steps.

Grouping is greedy: each fusible equation joins its producers' groups when the merged group still
lowers to a valid loop nest (`lower_group`) and no other step sits between them; then sibling groups
over the same domain that share inputs merge (one pass computes a loss and its gradients together).
Where kernels then read back values other kernels wrote only for them, the graph is grouped once more
with those values recomputed by their readers (`jitgrad.passes.remat`), and the program holding less memory
at its peak is kept.

The work stays near-linear in the graph: groups further apart than MERGE_WINDOW equations are not
merged, whether a merge would make a cycle is a depth-first search that never enters a step starting
after the target group ends (in the graph's order; extended past groups that span back), and siblings
are tried in order of position among the groups reading one input, each with the next one only.
`work` counts the steps those searches visit and the merges tried.
"""
from __future__ import annotations

from typing import Any, Sequence

from jitgrad.passes import products, remat, simplify
from jitgrad.ir.graph import Atom, Eqn, Graph, Var
from jitgrad.passes.loops import (Branch, HostStep, LoopKernel, NotFusible, Program, is_transparent, lower_group,
                                  statements, view_kernel)
from jitgrad.ir.primitive import Kind, entry_axis

MAX_INPUTS = 16  # arrays a fused kernel may read: longer chains (a gradient summed over 200 time steps) split
# into kernels of one shape, which share their compiled code, instead of one kernel per length
MIN_COPY_VIEWS = 4  # view equations (the region read included) a copy kernel must replace to be written
MAX_COPY_BYTES = 1 << 20  # and the largest array it writes when a region read chooses along its last axis: past
# this numpy's copies are as fast as a per-element choice between operands; with the choice on outer axes only
# (an im2col), the kernel copies whole rows (CPU: `kernels.cpu.codegen.MAX_UNSWITCHED_LOOPS`) at any size
MERGE_WINDOW = 256  # equations between two groups beyond which they are not merged: a forward value used far
# later in the backward stays in its own kernel, and the cycle check only searches that window
HELD_INPUTS, HELD_BYTES, HELD_SPREAD = 1, 1 << 16, 32  # a group reads at most one host result (a matmul's) of 64 KB
# or more that only it reads, where such results are computed more than 32 equations apart: a weight's gradient
# summed over time steps adds each step's term as it comes (the same adds, same order), not all at the end


class _PrefixMax:
    """Max over positions [0, end) of values set per position (a segment tree): where the groups starting
    before a position end, in O(log n) per update and query."""

    def __init__(self, n: int):
        self.size = 1
        while self.size < max(n, 1):
            self.size *= 2
        self.tree = [-1] * (2 * self.size)

    def set(self, i: int, value: int) -> None:
        i += self.size
        self.tree[i] = value
        while i > 1:
            i //= 2
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])

    def below(self, end: int) -> int:
        """The largest value at a position < end (-1 if none)."""
        lo, hi, best = self.size, self.size + min(end, self.size), -1
        while lo < hi:
            if lo & 1:
                best = max(best, self.tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, self.tree[hi])
            lo //= 2
            hi //= 2
        return best


class _Grouping:
    """Union of computing equations into groups, keeping merged groups valid loop nests and acyclic."""

    def __init__(self, graph: Graph, recomputed: frozenset[Var] = frozenset()):
        self.graph = graph
        self.eqns = graph.eqns
        self.recomputed = {i for i, e in enumerate(self.eqns) if e.outs and e.outs[0] in recomputed}
        self.views = {e.out: e for e in self.eqns if is_transparent(e)}
        self.computing = [i for i, e in enumerate(self.eqns) if e.prim.kind in (Kind.ELEMENTWISE, Kind.REDUCE)]
        self.group_of = {i: i for i in self.computing}
        self.members: dict[int, list[int]] = {i: [i] for i in self.computing}
        self.span: dict[int, tuple[int, int]] = {i: (i, i) for i in self.computing}  # first and last member
        self.ends = _PrefixMax(len(self.eqns))  # at each group's first member, its last one
        self.input_cache: dict[int, set[Any]] = {}
        self.reader_cache: dict[int, set[int]] = {}  # per group: the equations outside it reading its values
        self.work = 0
        self.producer_index = {o: i for i, e in enumerate(self.eqns) for o in e.outs if e.out not in self.views}
        self.readers: dict[Var, set[int]] = {}  # non-view equations reading a var, directly or through views
        self.escapes: set[Var] = set()  # vars reaching a graph output as they are, or through views
        self.squeezed: dict[Var, list[Var]] = {}  # var -> graph outputs that only drop/add length-1 axes of it
        outputs = {a for a in graph.outputs if isinstance(a, Var)}
        for i, e in enumerate(self.eqns):
            if e.out in self.views:
                continue
            for a in e.inputs:
                for x in self.sources(a):
                    if isinstance(x, Var):
                        self.readers.setdefault(x, set()).add(i)
        for v in outputs:
            if self.only_squeezes(v):
                self.squeezed.setdefault(self.sources(v)[0], []).append(v)
            else:
                self.escapes.update(self.sources(v))

    def only_squeezes(self, v: Var) -> bool:
        """Is `v` a chain of views of another value that only drop or add length-1 axes (same data order)?"""
        if v not in self.views:
            return False
        while v in self.views:
            e = self.views[v]
            if e.prim.select_map is not None:
                return False  # a region read (a concatenate with empty operands may keep the size)
            src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
            if e.inputs[0].aval.size != e.outs[0].aval.size or \
                    [d for d in src if d != 1] != [d for d in out if d != 1]:
                return False
            v = e.inputs[0]
        return True

    def sources(self, v: Atom) -> list[Atom]:
        """The values a chain of transparent views reads from (one, or a concatenate's operands)."""
        if not (isinstance(v, Var) and v in self.views):
            return [v]
        found: dict[int, Atom] = {}
        stack = [v]
        while stack:
            x = stack.pop()
            if isinstance(x, Var) and x in self.views:
                stack.extend(reversed(self.views[x].inputs))
            else:
                found.setdefault(id(x), x)
        return list(found.values())

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
        """The steps reading a value group `g` computes (groups >= 0, host equations as -1 - i)."""
        readers = self.reader_cache.get(g)
        if readers is None:
            inside = set(self.members[g])
            readers = self.reader_cache[g] = {r for i in self.members[g] for o in self.eqns[i].outs
                                              for r in self.readers.get(o, ()) if r not in inside}
        return {self.group_of.get(r, -1 - r) for r in readers}

    def step_successors(self, node: int) -> set[int]:
        """Successors of a group (>= 0) or of a host equation i (encoded as -1 - i)."""
        if node >= 0:
            return self.successors(node)
        e = self.eqns[-1 - node]
        found = set()
        for o in e.outs:
            found.update(self.group_of.get(r, -1 - r) for r in self.readers.get(o, ()))
        return found

    def first_member(self, node: int) -> int:
        """The earliest equation of a group (>= 0) or the host equation a node (-1 - i) stands for."""
        return self.span[node][0] if node >= 0 else -1 - node

    def search_bound(self, dst: int) -> int:
        """A position such that no step whose first equation is at or after it leads to group `dst`: dst's
        last equation, extended to the last equation of every group starting before the bound (a path into
        dst can come back from a later step only through a group that spans back), to a fixed point."""
        end = self.span[dst][1]
        while True:
            further = self.ends.below(end)
            if further <= end:
                return end
            end = further

    def reaches_indirectly(self, src: int, dst: int) -> bool:
        """Is there a path src -> X -> ... -> dst through some other step X? Steps starting at or after
        `search_bound(dst)` cannot lead to dst: not searched."""
        end = self.search_bound(dst)
        stack = [s for s in self.successors(src) if s != dst]
        seen: set[int] = set()
        while stack:
            g = stack.pop()
            if g == dst:
                return True
            if g not in seen and self.first_member(g) < end:
                seen.add(g)
                self.work += 1
                stack.extend(self.step_successors(g))
        return False

    def holds_apart(self, inside: set[int], inputs: set[Any]) -> bool:
        """Would a group of `inside` keep more than HELD_INPUTS large host results only it reads, computed far apart?"""
        at = [j for x in inputs for j in [self.producer_index.get(x)] if j is not None and j not in self.group_of
              and x.aval.nbytes >= HELD_BYTES and x not in self.escapes and self.readers.get(x, set()) <= inside]
        return len(at) > HELD_INPUTS and max(at) - min(at) > HELD_SPREAD

    def lower(self, members: Sequence[int]) -> LoopKernel:
        eqns = [self.eqns[i] for i in sorted(members)]
        try:
            return lower_group(eqns, self.outputs_of(members, store_squeezed=True), self.views)
        except NotFusible:
            return lower_group(eqns, self.outputs_of(members, store_squeezed=False), self.views)

    def try_merge(self, a: int, b: int) -> bool:
        self.work += 1
        if a == b or len(self._inputs(a) | self._inputs(b)) > MAX_INPUTS:
            return False
        (lo_a, hi_a), (lo_b, hi_b) = self.span[a], self.span[b]
        if max(lo_a, lo_b) - min(hi_a, hi_b) > MERGE_WINDOW:
            return False
        members = self.members[a] + self.members[b]
        if self.holds_apart(set(members), self._inputs(a) | self._inputs(b)):
            return False
        if self.reaches_indirectly(a, b) or self.reaches_indirectly(b, a):
            return False
        try:
            self.lower(members)
        except NotFusible:
            return False
        for i in self.members[b]:
            self.group_of[i] = a
        self.members[a] = members
        self.ends.set(self.span[a][0], -1)
        self.ends.set(self.span[b][0], -1)
        self.span[a] = (min(self.span[a][0], self.span[b][0]), max(self.span[a][1], self.span[b][1]))
        self.ends.set(self.span[a][0], self.span[a][1])
        del self.members[b], self.span[b]
        for cache in (self.input_cache, self.reader_cache):
            cache.pop(a, None)
            cache.pop(b, None)
        return True

    def run(self) -> None:
        for i in self.computing:
            for x in self.eqns[i].inputs:
                for src in self.sources(x):
                    j = self.producer_index.get(src) if isinstance(src, Var) else None
                    if j is not None and j in self.group_of and (i not in self.recomputed or j in self.recomputed):
                        self.try_merge(self.group_of[j], self.group_of[i])
        self.merge_siblings()

    def _inputs(self, g: int) -> set[Any]:
        """The values group `g` reads from outside itself (through views), cached until it merges."""
        found = self.input_cache.get(g)
        if found is None:
            inside = set(self.members[g])
            found = self.input_cache[g] = {x for i in self.members[g] for a in self.eqns[i].inputs
                                           for x in self.sources(a)
                                           if isinstance(x, Var) and self.producer_index.get(x) not in inside}
        return found

    def merge_siblings(self) -> None:
        """Merge groups that read a common input, each with the next group (by position) reading it."""
        changed = True
        while changed:
            changed = False
            readers: dict[Any, list[tuple[int, int]]] = {}
            for g in self.members:
                for v in self._inputs(g):
                    readers.setdefault(v, []).append((self.span[g][0], g))
            for positioned in readers.values():
                groups = [g for _, g in sorted(positioned)]
                for x, y in zip(groups, groups[1:]):
                    a, b = self.group_of[x], self.group_of[y]  # where earlier merges of this round put them
                    if a != b and self.try_merge(a, b):
                        changed = True


def schedule(graph: Graph) -> Program:
    """Batch `graph`'s products (`jitgrad.passes.products`), group it into kernels and host steps, ordered so each
    step follows its inputs' producers; then, where kernels read back values other kernels wrote only for them, the
    same with those values recomputed by their readers (`jitgrad.passes.remat`), if that lowers the peak memory
    without more kernels; then `remat.recopy`."""
    graph = products.batch(graph)
    program, recomputed = _grouped(graph, frozenset()), frozenset()
    rewrite = remat.recompute_plan(graph, program)
    if rewrite is not None:
        candidate = _grouped(simplify.dce(rewrite.graph), frozenset(rewrite.recomputed))
        candidate.fusion_work += program.fusion_work
        if len(candidate.kernels) <= len(program.kernels) and remat.peak_bytes(candidate) < remat.peak_bytes(program):
            program, recomputed = candidate, frozenset(rewrite.recomputed)
        else:
            program.fusion_work = candidate.fusion_work
    return remat.recopy(program, lambda g: _grouped(simplify.dce(g), recomputed))  # an im2col run again, not kept


def _grouped(graph: Graph, recomputed: frozenset[Var]) -> Program:
    """`graph` grouped into kernels and host steps; equations computing `recomputed` values join only
    their readers' groups (and each other's), never their producers'."""
    grouping = _Grouping(graph, recomputed)
    grouping.run()
    steps: list[LoopKernel | HostStep] = [grouping.lower(m) for m in grouping.members.values()]
    host = [e for e in graph.eqns if e.prim.kind not in (Kind.ELEMENTWISE, Kind.REDUCE) and e.out not in grouping.views]
    written = {o for k in steps for o in k.outputs}
    needed_views, copied = _views_needed_on_host(graph, grouping, host, written)
    steps += [view_kernel(v, grouping.views) for v in copied]
    steps += [HostStep(e) for e in graph.eqns if e in host or id(e) in needed_views]
    return Program(graph, _topological(steps), grouping.work)


def _view_count(v: Var, views: dict[Var, Eqn]) -> int:
    """How many view equations make `v` from the values under them."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, Var) and x in views and id(views[x]) not in seen:
            seen.add(id(views[x]))
            stack.extend(views[x].inputs)
    return len(seen)


def _views_needed_on_host(graph: Graph, grouping: _Grouping, host: list[Eqn], written: set[Var]
                          ) -> tuple[set[int], list[Var]]:
    """Transparent views whose results host steps or the graph's outputs use as arrays (and no kernel writes):
    the ids of those that run as host steps, and the region reads (pads, concatenates) a copy kernel writes
    instead, reading its operands through their views in place. A copy kernel is worth its compile where it
    replaces MIN_COPY_VIEWS host steps or more, for an array of at most MAX_COPY_BYTES or one whose region reads
    choose their operand by outer positions only: an im2col's nine slices of a padded input, stacked, are one
    pass over the input, where numpy runs a pad, nine slices, nine reshapes and a concatenate copying three
    floats at a time, each step a Python call (3-14x slower for 3-144 MiB im2cols); a concatenate of two
    arrays stays numpy's (as one of more than MAX_INPUTS arrays, or a large one along its last axis)."""
    views = grouping.views
    needed: set[int] = set()
    copied: list[Var] = []
    stack = [a for e in host for a in e.inputs] + list(graph.outputs)
    while stack:
        v = stack.pop()
        if not (isinstance(v, Var) and v in views and v not in written and id(views[v]) not in needed):
            continue
        needed.add(id(views[v]))
        if views[v].prim.select_map is not None and len(grouping.sources(v)) <= MAX_INPUTS \
                and _view_count(v, views) >= MIN_COPY_VIEWS \
                and (v.aval.nbytes <= MAX_COPY_BYTES or not _chooses_along_last_axis(view_kernel(v, views))):
            copied.append(v)
        else:
            stack.extend(views[v].inputs)
    copies = {id(views[v]) for v in copied}
    return needed - copies, copied


def _chooses_along_last_axis(k: LoopKernel) -> bool:
    """Does a region read of kernel `k` test a bound on the last axis of its domain (a concatenate or pad there)?"""
    last = len(k.domain) - 1
    body = [st for stage in k.stages for st in stage.body] + k.epilogue
    return any(entry_axis(entry) == last for st in statements(body) if isinstance(st, Branch)
               for bounds, _, _ in st.cases for entry, _, _ in bounds)


def _topological(steps: list[LoopKernel | HostStep]) -> list[LoopKernel | HostStep]:
    """Order steps so each runs after the steps producing its inputs (Kahn's algorithm: no recursion,
    whatever the depth of an unrolled loop)."""
    def produced(s: LoopKernel | HostStep) -> list[Var]:
        return list(s.outputs) if isinstance(s, LoopKernel) else list(s.eqn.outs)

    def needed(s: LoopKernel | HostStep) -> set[Var]:
        atoms = s.inputs if isinstance(s, LoopKernel) else s.eqn.inputs
        return {a for a in atoms if isinstance(a, Var)}

    made_by = {v: k for k, s in enumerate(steps) for v in produced(s)}
    waiting = [{made_by[v] for v in needed(s) if v in made_by} for s in steps]
    users: dict[int, list[int]] = {}
    for k, deps in enumerate(waiting):
        for d in deps:
            users.setdefault(d, []).append(k)
    ready = [k for k, deps in enumerate(waiting) if not deps]
    ready.reverse()
    order: list[int] = []
    while ready:
        k = ready.pop()
        order.append(k)
        for u in users.get(k, ()):
            waiting[u].discard(k)
            if not waiting[u]:
                ready.append(u)
    if len(order) != len(steps):
        raise RuntimeError("jitgrad internal error: fusion produced a cycle")
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
