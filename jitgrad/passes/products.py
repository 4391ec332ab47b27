"""Matrix products batched across an unrolled loop, so OpenBLAS gets fewer, larger products: near its peak
instead of paying per call for packing and dispatch.

- Products of one shared matrix whose other operands do not depend on each other's results (`batch_products`)
  become one product of those operands concatenated (by rows for `x_t @ W`, by columns for `W @ x_t`), whose
  slices are the members' results: an RNN's `x_t @ W_x` at each step, a block's `x @ W_q`, `x @ W_k`, `x @ W_v`.
  A product whose operand depends on another's result (`h_t @ W_h`) keeps its place.
- Runs of products summed by one chain of adds (`sum_products`: a weight's gradient over a loop's steps,
  `sum_t L_t @ R_t`) become one product of the L_t side by side and the R_t stacked, added to the sum where the
  run's last term was. An LSTM's two weight gradients then share the stacked dz_t, and where the result fits
  they are stacked in turn.

A batch holds at most MAX_BATCHED_BYTES of concatenated operand and of result (longer ones are cut), since its
values live until its last member's operands exist. Consecutive steps of one input stacked by rows are a view of
it, not a copy. The medium LSTM (bench/models.py) runs 45 products a step instead of 99, and its step takes
26.6-27.2 ms instead of 33.3-33.8 (one process, both programs interleaved), at a lower simulated peak.

Only 2-D products of one dtype are batched. Each row (column) of a batched product is the same BLAS routine over
the same inner dimension as the member's own product, so its values agree to rounding (bit for bit on this
machine's OpenBLAS); a run's sum is associated differently, as a BLAS blocking its inner dimension differently
would. The bits depend on the graph only, never on the load. The equations are then ordered again (a stable
topological order), so each slice's readers follow the one product.
"""
from __future__ import annotations

import heapq
from typing import Sequence

from jitgrad.ir.graph import Atom, Aval, Eqn, Graph, Var
from jitgrad.ops.arithmetic import add_p
from jitgrad.ops.core import reshape_p, transpose_p
from jitgrad.ops.linalg import matmul_p
from jitgrad.ops.regions import concatenate_p, slice_p
from jitgrad.passes import simplify

MIN_BATCHED = 2  # products in one batch
WIDE = 3  # products in a batch made before sums of products are looked for
MAX_BATCHED_BYTES = 1 << 20  # largest concatenated operand, or result, of a batch: the values it holds live until
# its last member's operands exist (or its last slice is read), so a batch is short: 4 steps of the medium LSTM


def batch(graph: Graph) -> Graph:
    """Batches of at least WIDE products sharing a matrix first (a loop's `x_t @ W_x`: better a few larger
    products than each summed with `h_t @ W_h` as one), then sums of products over a loop's steps
    (`sum_products`: a weight's gradient), then those sums' products that share their stacked operand."""
    graph = batch_products(graph, WIDE)
    graph, summed = sum_products(graph)
    return batch_products(graph, MIN_BATCHED, summed)


def batch_products(graph: Graph, least: int = MIN_BATCHED, only: set[Var] | None = None) -> Graph:
    """`graph` with each batch of at least `least` independent 2-D products sharing one matrix (on either side)
    computed as one; where `only` is given, of the products writing those values. `graph` itself where no batch
    qualifies, or where the batches together would make a cycle (each is checked alone: a member reading another
    batch's result, whose member reads this batch's, is not looked for)."""
    position = {id(e): k for k, e in enumerate(graph.eqns)}
    done: set[int] = set()
    batches: list[tuple[list[Eqn], int]] = []
    for side in (1, 0):  # the shared matrix on the right (x_t @ W), then on the left (W @ x_t)
        for group in _groups(graph, side, done, only):
            span = graph.eqns[position[id(group[0])]:position[id(group[-1])] + 1]
            for members in _batches(span, group, side):
                if len(members) >= least:
                    batches.append((members, side))
                    done.update(id(e) for e in members)
    if not batches:
        return graph
    replaced = {id(e): [] for members, _ in batches for e in members}
    producer = graph.producers()
    for members, side in batches:
        replaced[id(members[0])] = _batched(members, side, producer)
    eqns = [n for e in graph.eqns for n in replaced.get(id(e), [e])]
    ordered = _stable_topological(eqns)
    if ordered is None:
        return graph
    return Graph(list(graph.inputs), ordered, list(graph.outputs), list(graph.input_names))


def _groups(graph: Graph, side: int, done: set[int], only: set[Var] | None) -> list[list[Eqn]]:
    """Candidate groups: 2-D products (not yet batched) by their shared operand on `side` and dtype, in program
    order. The other operands may differ in the axis they are stacked along (x_t^T and h_t^T in an LSTM's
    weight gradients, stacked by rows)."""
    groups: dict[tuple, list[Eqn]] = {}
    for e in graph.eqns:
        if e.prim is not matmul_p or id(e) in done or not isinstance(e.inputs[side], Var):
            continue
        a, b = e.inputs
        if a.aval.ndim != 2 or b.aval.ndim != 2 or a.aval.dtype != b.aval.dtype or (only is not None
                                                                                      and e.out not in only):
            continue
        groups.setdefault((e.inputs[side], a.aval.dtype), []).append(e)
    return [g for g in groups.values() if len(g) >= MIN_BATCHED]


def _batches(span: Sequence[Eqn], group: list[Eqn], side: int) -> list[list[Eqn]]:
    """`group` cut, in program order, into batches whose members read no result of their own batch, each within
    MAX_BATCHED_BYTES of concatenated operand and of result; `span` is the graph's equations from the group's
    first product to its last (nothing before the first can read a member's result)."""
    members = {id(e) for e in group}
    after: dict[Var, int] = {}  # the last batch (1, 2, ...) whose result a value depends on
    batches: list[list[Eqn]] = []
    operand_bytes = result_bytes = 0
    for e in span:
        depends = max((after.get(a, 0) for a in e.inputs if isinstance(a, Var)), default=0)
        if id(e) in members:
            varying = e.inputs[1 - side]
            if (not batches or depends == len(batches) or operand_bytes + varying.aval.nbytes > MAX_BATCHED_BYTES
                    or result_bytes + e.out.aval.nbytes > MAX_BATCHED_BYTES):
                batches.append([])
                operand_bytes = result_bytes = 0
            batches[-1].append(e)
            operand_bytes += varying.aval.nbytes
            result_bytes += e.out.aval.nbytes
            depends = len(batches)
        if depends:
            for o in e.outs:
                after[o] = depends
    return batches


def _batched(members: list[Eqn], side: int, producer: dict[Var, Eqn]) -> list[Eqn]:
    """What replaces `members` (products sharing their operand on `side`): one concatenation, one product and a
    slice of it for each member's result (defining the member's own output var)."""
    shared, first = members[0].inputs[side], members[0]
    axis = 0 if side == 1 else 1  # rows of x_t @ W, columns of W @ x_t
    varying = [e.inputs[1 - side] for e in members]
    extents = [e.out.aval.shape[axis] for e in members]

    def along(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
        return (n, shape[1]) if axis == 0 else (shape[0], n)

    new, stacked = _stack(varying, axis, producer, first)
    product = Var(Aval(along(first.out.aval.shape, sum(extents)), first.out.aval.dtype))
    new.append(Eqn(matmul_p, (stacked, shared) if side == 1 else (shared, stacked), {}, (product,), first.source,
                   first.label))
    offset = 0
    for e, n in zip(members, extents):
        new.append(Eqn(slice_p, (product,), {"starts": along((0, 0), offset), "steps": (1, 1),
                                             "shape": e.out.aval.shape}, e.outs, e.source, e.label))
        offset += n
    return new


def _stack(operands: Sequence[Atom], axis: int, producer: dict[Var, Eqn], site: Eqn) -> tuple[list[Eqn], Var]:
    """The 2-D `operands` concatenated along `axis`: equations and their result. Consecutive steps of one array
    (`xs[t]` for t = a..b, each a reshape of a slice of its leading axis) stacked by rows are that array's slice
    reshaped, a view: no copy, and no copy kernel reading one region per step."""
    shape = list(operands[0].aval.shape)
    shape[axis] = sum(a.aval.shape[axis] for a in operands)
    out = Var(Aval(tuple(shape), operands[0].aval.dtype))
    steps = _consecutive_steps(operands, producer) if axis == 0 else None
    if steps is not None:
        src, first = steps
        region = Var(Aval((len(operands),) + src.aval.shape[1:], src.aval.dtype))
        return [Eqn(slice_p, (src,), {"starts": (first,) + (0,) * (src.aval.ndim - 1), "steps": (1,) * src.aval.ndim,
                                      "shape": region.aval.shape}, (region,), site.source, site.label),
                Eqn(reshape_p, (region,), {"shape": out.aval.shape}, (out,), site.source, site.label)], out
    return [Eqn(concatenate_p, tuple(operands), {"axis": axis}, (out,), site.source, site.label)], out


def _consecutive_steps(operands: Sequence[Atom], producer: dict[Var, Eqn]) -> tuple[Var, int] | None:
    """(src, a) where `operands` are src[a], src[a + 1], ... (`_leading_step`), else None."""
    steps = [_leading_step(a, producer) for a in operands]
    if not all(steps) or len({src for src, _ in steps}) != 1:
        return None
    src, first = steps[0]
    return (src, first) if [t for _, t in steps] == list(range(first, first + len(steps))) else None


def _leading_step(a: Atom, producer: dict[Var, Eqn]) -> tuple[Var, int] | None:
    """(src, t) where `a` is `src[t]`, a whole step of a 3-D array's leading axis (a slice of it reshaped to 2-D)."""
    view = producer.get(a) if isinstance(a, Var) else None
    cut = producer.get(view.inputs[0]) if view is not None and view.prim is reshape_p and isinstance(
        view.inputs[0], Var) else None
    if cut is None or cut.prim is not slice_p or not isinstance(cut.inputs[0], Var):
        return None
    src, p = cut.inputs[0], cut.params
    whole = (src.aval.ndim == 3 and p["shape"] == (1,) + src.aval.shape[1:] and set(p["steps"]) == {1}
             and not any(p["starts"][1:]))
    return (src, p["starts"][0]) if whole else None


def _stable_topological(eqns: Sequence[Eqn]) -> list[Eqn] | None:
    """`eqns` in an order where each follows its inputs' producers, otherwise as close to the given order
    as that allows (of the equations ready, the earliest given goes first); None if they make a cycle."""
    producer = {o: k for k, e in enumerate(eqns) for o in e.outs}
    waiting = [0] * len(eqns)
    readers: list[list[int]] = [[] for _ in eqns]
    for k, e in enumerate(eqns):
        for p in {producer[a] for a in e.inputs if isinstance(a, Var) and a in producer}:
            waiting[k] += 1
            readers[p].append(k)
    ready = [k for k, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        k = heapq.heappop(ready)
        ordered.append(eqns[k])
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    return ordered if len(ordered) == len(eqns) else None


def sum_products(graph: Graph) -> tuple[Graph, set[Var]]:
    """`graph` with runs of products summed by one chain of adds (a weight's gradient over an unrolled loop's
    steps, `sum_t L_t @ R_t`) computed as one product each: `concatenate(L_t, axis=1) @ concatenate(R_t, axis=0)`,
    at most MAX_BATCHED_BYTES of each concatenated operand. The run's product sits where its last term was, and
    the sum adds it there, so terms are still added as they come. The association of the sum changes (as a BLAS
    blocking its inner dimension differently would); the bits are fixed by the graph. Also the values the runs'
    products write."""
    uses: dict[Var, int] = {}
    for e in graph.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                uses[a] = uses.get(a, 0) + 1
    for a in graph.outputs:
        if isinstance(a, Var):
            uses[a] = uses.get(a, 0) + 2  # never a chain's inner value
    producer = graph.producers()
    position = {id(e): k for k, e in enumerate(graph.eqns)}
    inner: set[int] = set()  # adds of a chain other than its last
    replaced: dict[int, list[Eqn]] = {}
    summed: set[Var] = set()
    for root in reversed(graph.eqns):
        if root.prim is not add_p or id(root) in inner:
            continue
        adds, terms = _chain(root, producer, uses)
        inner.update(id(a) for a in adds if a is not root)
        runs = _runs([t for t in terms if _summable(t, root, producer, uses)], producer, position)
        if runs:
            _rewrite_chain(root, adds, terms, runs, producer, replaced)
    summed.update(e.out for new in replaced.values() for e in new if e.prim is matmul_p)
    if not replaced:
        return graph, summed
    eqns = [n for e in graph.eqns for n in replaced.get(id(e), [e])]
    rewritten = Graph(list(graph.inputs), eqns, list(graph.outputs), list(graph.input_names))
    return simplify.dce(simplify.cse(rewritten)), summed  # cse: two sums over one R_t (weight gradients) share its stack


def _chain(root: Eqn, producer: dict[Var, Eqn], uses: dict[Var, int]) -> tuple[list[Eqn], list[Atom]]:
    """The adds of one aval summed into `root` (through values only the next add reads) and their terms, in order."""
    adds, terms, stack = [], [], [root]
    while stack:
        e = stack.pop()
        adds.append(e)
        for a in reversed(e.inputs):
            p = producer.get(a) if isinstance(a, Var) else None
            if p is not None and p.prim is add_p and uses[a] == 1 and a.aval == root.out.aval \
                    and all(x.aval == root.out.aval for x in p.inputs):
                stack.append(p)
            else:
                terms.append(a)
    return adds, terms


def _summable(term: Atom, root: Eqn, producer: dict[Var, Eqn], uses: dict[Var, int]) -> bool:
    """A 2-D product of one dtype, of the sum's aval, that only the chain reads."""
    p = producer.get(term) if isinstance(term, Var) else None
    return (p is not None and p.prim is matmul_p and uses[term] == 1 and term.aval == root.out.aval
            and all(a.aval.ndim == 2 and a.aval.dtype == term.aval.dtype for a in p.inputs))


def _runs(terms: list[Atom], producer: dict[Var, Eqn], position: dict[int, int]) -> list[list[Eqn]]:
    """The summable terms' products in program order, cut into runs of at least two within MAX_BATCHED_BYTES."""
    runs: list[list[Eqn]] = [[]]
    left_bytes = right_bytes = 0  # the current run's concatenated operands
    for e in sorted((producer[t] for t in terms), key=lambda e: position[id(e)]):
        left, right = (a.aval.nbytes for a in e.inputs)
        if runs[-1] and max(left_bytes + left, right_bytes + right) > MAX_BATCHED_BYTES:
            runs.append([])
            left_bytes = right_bytes = 0
        runs[-1].append(e)
        left_bytes += left
        right_bytes += right
    return [r for r in runs if len(r) >= 2]


def _rewrite_chain(root: Eqn, adds: list[Eqn], terms: list[Atom], runs: list[list[Eqn]],
                   producer: dict[Var, Eqn], replaced: dict[int, list[Eqn]]) -> None:
    """Record in `replaced` the equations that take the place of `adds` and the runs' products: each run's
    product, added to the running sum where its last term was; the other terms added where `root` was."""
    aval, source, label = root.out.aval, root.source, root.label
    in_runs = {e.out for run in runs for e in run}
    total: Var | None = None
    for run in runs:
        product = Var(aval)
        new = _run_product(run, product, producer)
        if total is not None:
            summed = Var(aval)
            new.append(Eqn(add_p, (total, product), {}, (summed,), source, label))
            product = summed
        total = product
        for e in run[:-1]:
            replaced[id(e)] = []
        replaced[id(run[-1])] = new
    rest = [t for t in terms if t not in in_runs]
    chain: list[Eqn] = []
    for k, t in enumerate(rest):
        out = root.out if k == len(rest) - 1 else Var(aval)
        chain.append(Eqn(add_p, (total, t), {}, (out,), source, label))
        total = out
    if not rest:  # the runs were every term: the last run's sum is the root's value
        last = replaced[id(runs[-1][-1])][-1]
        replaced[id(runs[-1][-1])][-1] = Eqn(last.prim, last.inputs, last.params, (root.out,), last.source, last.label)
    for a in adds:
        replaced[id(a)] = []
    replaced[id(root)] = chain


def _run_product(run: list[Eqn], out: Var, producer: dict[Var, Eqn]) -> list[Eqn]:
    """`sum_k L_k @ R_k` over `run` (in program order) as one product into `out`: the L_k side by side, the R_k
    stacked, both in the reverse order (x_0 .. x_3 where a backward computed the terms of steps 3 .. 0, so that
    consecutive steps of an input are a view of it); where every L_k is a transposed matrix u_k^T, the u_k are
    stacked and the stack transposed (rows copied, not columns). Two sums over the same R_k stack them alike."""
    site, run = run[-1], run[::-1]  # a backward runs the loop's steps backwards: stacked in the forward's order
    views = [producer.get(e.inputs[0]) if isinstance(e.inputs[0], Var) else None for e in run]
    new, right = _stack([e.inputs[1] for e in run], 0, producer, site)
    if all(v is not None and v.prim is transpose_p and v.params["perm"] == (1, 0) for v in views):
        stacking, stacked = _stack([v.inputs[0] for v in views], 0, producer, site)
        left = Var(Aval(stacked.aval.shape[::-1], stacked.aval.dtype))
        new += [*stacking, Eqn(transpose_p, (stacked,), {"perm": (1, 0)}, (left,), site.source, site.label)]
    else:
        stacking, left = _stack([e.inputs[0] for e in run], 1, producer, site)
        new += stacking
    new.append(Eqn(matmul_p, (left, right), {}, (out,), site.source, site.label))
    return new
