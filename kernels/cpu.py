"""CPU lowering: a fused `LoopKernel` becomes Python source compiled by numba.

The source has a parallel variant (`prange` over the outermost kept axis, or over chunks of the
first reduced axis for full reductions) and a serial one for small domains. Lengths are runtime
arguments, so one compiled kernel serves every length of the same rank, dtypes and layout.
Scalar constants are typed arguments too (numba would type a bare `1.0` as float64 and promote
float32 math). No fast-math: numbers match numpy's.

What lets LLVM vectorise the loops: arrays are indexed with unsigned copies of the loop variables
(numba wraps negative signed indices with a select, which turns contiguous loads into gathers);
float sums store blocks of `BLOCK` terms that `block_sum` adds in vector lanes in one fixed
order, and fold each block into a float64 total in order (a float64 accumulator would halve the
vector width of a float32 loop; a reassociated one would make the bits depend on the kernel and
the variant). Full reductions split into the same chunks in both variants (the serial one walks
them in a plain loop), so the serial and parallel kernels give the same bits; float max/min
reductions use LLVM's NaN-propagating `maximum`/`minimum`, and a row whose extremum is zero is
rescanned with numpy's sequential rule so that the sign of the zero matches numpy's. Values a
later pass would recompute are carried through per-row scratch (`jitgrad.kernels.carry`). A sum
over outer axes with the last axes kept (a bias gradient) is a column kernel: rows walked in order,
contiguous columns vectorised, each column's terms in the row kernel's lanes and order, so the
same bits without a strided walk per output element.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.loops import Compute, Load, LoopKernel, Reduction, Stage, Store
from jitgrad.kernels import carry
from jitgrad.kernels.common import (Writer, accumulator_dtype, argument_names, expression, identity_literal,
                                    index_text, numba_type)

PARALLEL_MIN_SIZE = 1 << 15  # smaller domains always run the serial variant; larger ones time both
CHUNKS = 64  # parallel chunks of a full reduction
BLOCK = 256  # terms a float sum adds in its own dtype (`block_sum`: 64 or 32 lanes) before folding into float64
LANES = {np.dtype(np.float32): 64, np.dtype(np.float64): 32}  # block_sum's lanes (jitgrad.kernels.reductions)
COLUMN_TILE = 256  # columns a column kernel sums at once (its lane sums: 64 KiB)

HEADER = "import math\n\nimport numpy as np\nfrom numba import prange\n"
BLOCK_SUM = "jitgrad.kernels.reductions.block_sum"


def helper_imports(k: LoopKernel) -> list[str]:
    """`from module import name` lines for the helpers the kernel's expressions and reductions call."""
    wanted: set[str] = set()
    for stage in k.stages:
        for st in stage.body:
            if isinstance(st, Compute):
                wanted.update(st.prim.lowering["cpu"].imports)
        for r in stage.reductions:
            vector = r.prim.reduction.vector_combine
            if vector is not None and r.dtype.kind == "f":
                wanted.update(vector.imports)
            if is_blocked(r):
                wanted.add(BLOCK_SUM)
    wanted.update(name for st in k.epilogue if isinstance(st, Compute) for name in st.prim.lowering["cpu"].imports)
    by_module: dict[str, list[str]] = {}
    for dotted in sorted(wanted):
        module, _, name = dotted.rpartition(".")
        by_module.setdefault(module, []).append(name)
    return [f"from {m} import {', '.join(names)}" for m, names in sorted(by_module.items())]


def row_index(k: LoopKernel) -> str:
    """Index of the current point into a per-row scratch array (the reduced axes)."""
    return ", ".join(f"u{a}" for a in k.reduce_axes)


def is_blocked(r: Reduction) -> bool:
    """Float sums add per block in their dtype (full vector width, fixed order), then across blocks in float64.
    A count (a sum of bools cast to floats, as max's gradient counts ties) is exact in any order: its terms
    go straight into its int64 accumulator (`accumulator_dtype`), rounded once at the end."""
    return r.prim.reduction.blocked and r.dtype.kind == "f" and not r.counts


def order_dependent(r: Reduction) -> bool:
    """Does the result's rounding depend on the order the terms are combined in (float sums and products)?"""
    return r.prim.reduction.order_dependent and r.dtype.kind == "f" and not (r.counts and r.prim.reduction.blocked)


def rescans_zero(r: Reduction) -> bool:
    """A float max/min whose result is zero is recomputed in numpy's order, for numpy's sign of zero."""
    return r.prim.reduction.rescan_zero and r.dtype.kind == "f"


class _Writer(Writer):
    def loop(self, depth: int, axis: int, bounds: str, loop: str = "range") -> int:
        """Open `for i<axis> in loop(bounds)` with its unsigned index copy; the depth inside."""
        self.line(depth, f"for i{axis} in {loop}({bounds}):")
        self.line(depth + 1, f"u{axis} = np.uint64(i{axis})")
        return depth + 1


def _emit_body(w: _Writer, k: LoopKernel, depth: int, body: list[Load | Compute | carry.ScratchLoad]) -> None:
    for st in body:
        if isinstance(st, Load):
            w.line(depth, f"{st.dst} = a{st.input}[{index_text(st.index, k.inputs[st.input].aval.ndim, 'u')}]")
        elif isinstance(st, carry.ScratchLoad):
            w.line(depth, f"{st.dst} = {st.array}[{row_index(k)}]")
        else:
            w.line(depth, f"{st.dst} = {expression(st, 'cpu')}")


def _emit_stores(w: _Writer, k: LoopKernel, depth: int, stores: list[Store]) -> None:
    for s in stores:
        w.line(depth, f"o{s.output}[{index_text(s.index, k.outputs[s.output].aval.ndim, 'u')}] = {s.src}")


def _emit_accumulate(w: _Writer, depth: int, r: Reduction, acc: str, value: str, exact: bool = False) -> None:
    """`acc` combined with `value`: the vectorisable combiner, or (`exact`, and for integers) the
    primitive's template, numpy's sequential rule."""
    typ = numba_type(accumulator_dtype(r))
    vector = r.prim.reduction.vector_combine if r.dtype.kind == "f" else None
    combine = r.prim.reduction.combine if exact or vector is None else vector.template
    w.line(depth, f"{acc} = {combine.format(acc, f'{typ}({value})')}")


def _slice(body: list, name: str) -> list:
    """The statements of `body` that computing `name` needs, in order."""
    needed, kept = {name}, []
    for st in reversed(body):
        if st.dst in needed:
            kept.append(st)
            if isinstance(st, Compute):
                needed.update(st.args)
    return kept[::-1]


def _emit_pass(w: _Writer, k: LoopKernel, depth: int, stage: Stage, loops: list[tuple[int, str, str]],
               carries: list[carry.Carry]) -> None:
    """One pass over the reduced axes (`loops`: axis, start, stop, outermost first): loads, math,
    accumulation, stores, and the values later passes reuse. With float sums the innermost loop
    runs in blocks of BLOCK: each block's terms go to scratch `<acc>_s` (or are already in a carried
    value's scratch row), summed by `block_sum`."""
    blocked = [r for r in stage.reductions if is_blocked(r)] if loops else []
    carried = {r.acc: c for r in blocked for c in carries if _sums_carried(r, c)}
    for axis, start, stop in (loops[:-1] if blocked else loops):
        depth = w.loop(depth, axis, f"{start}, {stop}")
    inner = depth
    if blocked:
        axis, start, stop = loops[-1]
        w.line(depth, f"for b{axis} in range({start}, {stop}, {BLOCK}):")
        w.line(depth + 1, f"m{axis} = min(b{axis} + {BLOCK}, {stop}) - b{axis}")
        inner = w.loop(depth + 1, axis, f"b{axis}, b{axis} + m{axis}")
    _emit_body(w, k, inner, stage.body)
    for r in stage.reductions:
        if r.acc in carried:
            continue
        if r in blocked:
            w.line(inner, f"{r.acc}_s[np.uint64(i{loops[-1][0]} - b{loops[-1][0]})] = {numba_type(r.dtype)}({r.src})")
        else:
            _emit_accumulate(w, inner, r, f"{r.acc}_", r.src)
    _emit_stores(w, k, inner, stage.stores)
    for c in carries:
        w.line(inner, f"{c.array}[{row_index(k)}] = {c.src}")
    for r in blocked:
        axis = loops[-1][0]
        if r.acc in carried:
            row = "".join(f"u{a}, " for a, _, _ in loops[:-1])
            terms = f"{carried[r.acc].array}[{row}b{axis}:]"
        else:
            terms = f"{r.acc}_s"
        w.line(depth + 1, f"{r.acc}_ += np.float64(block_sum({terms}, m{axis}))")
    if not loops and not stage.body and not stage.stores:
        w.line(depth, "pass")


def _sums_carried(r: Reduction, c: carry.Carry) -> bool:
    """Does the blocked sum `r` add exactly the values carry `c` stores (so it can read them there)?"""
    return c.src == r.src and c.dtype == r.dtype


def _emit_zero_rescan(w: _Writer, k: LoopKernel, depth: int, stage: Stage) -> None:
    """A float max/min that came out zero is recomputed with numpy's sequential rule (ties take the
    later element), so -0.0 and +0.0 come out as numpy's; other results are order-independent."""
    for r in stage.reductions:
        if not rescans_zero(r):
            continue
        w.line(depth, f"if {r.acc}_ == 0:")
        w.line(depth + 1, f"{r.acc}_ = {identity_literal(r)}")
        inner = depth + 1
        for a in k.reduce_axes:
            inner = w.loop(inner, a, f"n{a}")
        _emit_body(w, k, inner, _slice(stage.body, r.src))
        _emit_accumulate(w, inner, r, f"{r.acc}_", r.src, exact=True)


def _emit_stage_rows(w: _Writer, k: LoopKernel, depth: int, stage: Stage, carries: list[carry.Carry]) -> None:
    """A stage for one kept point: accumulators, loops over the reduced axes, final casts."""
    for r in stage.reductions:
        w.line(depth, f"{r.acc}_ = {identity_literal(r)}")
    _emit_pass(w, k, depth, stage, [(a, "0", f"n{a}") for a in k.reduce_axes], carries)
    _emit_zero_rescan(w, k, depth, stage)
    for r in stage.reductions:
        w.line(depth, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def _emit_block_scratch(w: _Writer, depth: int, stages: list[Stage], carries: list[carry.Carry]) -> None:
    """Per-chunk scratch of the blocked sums that do not read their terms from a carried value."""
    for s, stage in enumerate(stages):
        for r in stage.reductions:
            if is_blocked(r) and not any(_sums_carried(r, c) for c in carries if c.stage == s):
                w.line(depth, f"{r.acc}_s = np.empty({BLOCK}, {numba_type(r.dtype)})")


def _emit_stage_chunked(w: _Writer, k: LoopKernel, stage: Stage, parallel: bool) -> None:
    """A stage of a full reduction: parallel chunks of the first reduced axis, then a serial combine.
    Float sums and products split into the same chunks in the serial variant (walked in order), so
    both variants associate them alike and give the same bits; other reductions are exact in any
    order and run serially as one chunk, which LLVM vectorises best. Chunks of a blocked axis start
    at multiples of BLOCK, so both variants sum the same blocks."""
    first, rest = k.reduce_axes[0], k.reduce_axes[1:]
    grain = BLOCK if not rest and any(is_blocked(r) for r in stage.reductions) else 1
    w.line(1, f"nb = (n{first} + {grain - 1}) // {grain}" if grain > 1 else f"nb = n{first}")
    chunked = parallel or any(order_dependent(r) for r in stage.reductions)
    w.line(1, f"nc = max(1, min(nb, {CHUNKS}))" if chunked else "nc = 1")
    for r in stage.reductions:
        w.line(1, f"{r.acc}_p = np.empty(nc, {numba_type(accumulator_dtype(r))})")
    w.line(1, "for ch in prange(nc):")
    _emit_block_scratch(w, 2, [stage], [])
    for r in stage.reductions:
        w.line(2, f"{r.acc}_ = {identity_literal(r)}")
    if grain > 1:
        w.line(2, f"lo = ch * nb // nc * {grain}")
        w.line(2, f"hi = min((ch + 1) * nb // nc * {grain}, n{first})")
    else:
        w.line(2, "lo = ch * nb // nc")
        w.line(2, "hi = (ch + 1) * nb // nc")
    _emit_pass(w, k, 2, stage, [(first, "lo", "hi")] + [(a, "0", f"n{a}") for a in rest], [])
    for r in stage.reductions:
        w.line(2, f"{r.acc}_p[ch] = {r.acc}_")
    for r in stage.reductions:
        w.line(1, f"{r.acc}_ = {identity_literal(r)}")
        w.line(1, "for ch in range(nc):")
        _emit_accumulate(w, 2, r, f"{r.acc}_", f"{r.acc}_p[ch]")
    _emit_zero_rescan(w, k, 1, stage)
    for r in stage.reductions:
        w.line(1, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def _emit_rows(w: _Writer, k: LoopKernel, parallel: bool) -> None:
    """Kernels with kept axes: a parallel loop over the first kept axis; when passes need scratch
    (block sums, carried values), over chunks of it, each chunk allocating its scratch once."""
    stages, carries = carry.plan(k)
    kept = k.kept_axes
    scratch = carries or any(is_blocked(r) for st in stages for r in st.reductions)
    if scratch and k.reduce_axes:
        w.line(1, f"nc = max(1, min(n{kept[0]}, {CHUNKS}))" if parallel else "nc = 1")
        w.line(1, "for ch in prange(nc):")
        _emit_block_scratch(w, 2, stages, carries)
        extents = ", ".join(f"n{a}" for a in k.reduce_axes)
        for c in carries:
            w.line(2, f"{c.array} = np.empty(({extents},), {numba_type(c.dtype)})")
        depth = w.loop(2, kept[0], f"ch * n{kept[0]} // nc, (ch + 1) * n{kept[0]} // nc")
    else:
        depth = w.loop(1, kept[0], f"n{kept[0]}", "prange")
    for a in kept[1:]:
        depth = w.loop(depth, a, f"n{a}")
    for s, stage in enumerate(stages):
        _emit_stage_rows(w, k, depth, stage, [c for c in carries if c.stage == s])
    _emit_body(w, k, depth, k.epilogue)
    _emit_stores(w, k, depth, k.epilogue_stores)


def is_column_kernel(k: LoopKernel) -> bool:
    """One pass of float sums over outer axes, kept axes inner (a bias gradient: sum over batch and time of
    a (B, T, D) array): rows of the reduced axes are walked in order, contiguous columns vectorised."""
    if not k.kept_axes or not k.reduce_axes or max(k.reduce_axes) > min(k.kept_axes) or len(k.stages) != 1:
        return False
    (stage,) = k.stages
    return bool(stage.reductions) and all(is_blocked(r) for r in stage.reductions) and not carry.plan(k)[1]


def _emit_columns(w: _Writer, k: LoopKernel, parallel: bool) -> None:
    """A column kernel: per tile of up to COLUMN_TILE columns of the last kept axis, every row of the
    reduced axes in order, adding each column's terms into `LANES` lane sums per block of BLOCK rows
    (lane j takes rows j, j + LANES, ...) that combine as `block_sum`'s balanced tree of halves: the same
    terms in the same order as a row kernel, so the same bits, with contiguous loads."""
    (stage,) = k.stages
    kept, reduced = k.kept_axes, k.reduce_axes
    first, last = kept[0], kept[-1]
    if len(kept) == 1:
        w.line(1, f"nc = max(1, min({CHUNKS}, n{first} // 64))" if parallel else "nc = 1")
    else:
        w.line(1, f"nc = max(1, min({CHUNKS}, n{first}))" if parallel else "nc = 1")
    w.line(1, "for ch in prange(nc):")
    for r in stage.reductions:
        lanes = LANES[np.dtype(r.dtype)]
        w.line(2, f"{r.acc}_l = np.empty(({lanes}, {COLUMN_TILE}), {numba_type(r.dtype)})")
        w.line(2, f"{r.acc}_t = np.empty({COLUMN_TILE}, np.float64)")
    lo, hi = f"ch * n{first} // nc", f"(ch + 1) * n{first} // nc"
    depth = 2
    if len(kept) > 1:
        depth = w.loop(depth, first, f"{lo}, {hi}")
        for a in kept[1:-1]:
            depth = w.loop(depth, a, f"n{a}")
        lo, hi = "0", f"n{last}"
    w.line(depth, f"hi{last} = {hi}")
    w.line(depth, f"for tl{last} in range({lo}, hi{last}, {COLUMN_TILE}):")
    w.line(depth + 1, f"wd{last} = min(tl{last} + {COLUMN_TILE}, hi{last}) - tl{last}")
    tile = depth + 1
    for r in stage.reductions:
        w.line(tile, f"{r.acc}_t[:wd{last}] = 0.0")
    inner = tile
    for a in reduced[:-1]:
        inner = w.loop(inner, a, f"n{a}")
    row = reduced[-1]
    w.line(inner, f"for b{row} in range(0, n{row}, {BLOCK}):")
    for r in stage.reductions:
        w.line(inner + 1, f"{r.acc}_l[:, :wd{last}] = 0.0")
    body = w.loop(inner + 1, row, f"b{row}, min(b{row} + {BLOCK}, n{row})")
    lane_of = {r.acc: LANES[np.dtype(r.dtype)] - 1 for r in stage.reductions}
    w.line(body, f"ln{row} = np.uint64(i{row} - b{row})")
    body = w.loop(body, last, f"tl{last}, tl{last} + wd{last}")
    _emit_body(w, k, body, stage.body)
    for r in stage.reductions:
        cell = f"{r.acc}_l[ln{row} & np.uint64({lane_of[r.acc]}), np.uint64(i{last} - tl{last})]"
        w.line(body, f"{cell} = {cell} + {numba_type(r.dtype)}({r.src})")
    _emit_stores(w, k, body, stage.stores)
    for r in stage.reductions:  # the tree of halves as one loop: a sixth of the code to compile, the same adds
        w.line(inner + 1, f"hw = {LANES[np.dtype(r.dtype)]}")
        w.line(inner + 1, "while hw > 1:")
        w.line(inner + 2, "hw //= 2")
        w.line(inner + 2, "for h in range(hw):")
        w.line(inner + 3, f"for j in range(wd{last}):")
        w.line(inner + 4, f"{r.acc}_l[h, j] = {r.acc}_l[h, j] + {r.acc}_l[h + hw, j]")
        w.line(inner + 1, f"for j in range(wd{last}):")
        w.line(inner + 2, f"{r.acc}_t[j] += np.float64({r.acc}_l[0, j])")
    per_column = w.loop(tile, last, f"tl{last}, tl{last} + wd{last}")
    for r in stage.reductions:
        w.line(per_column, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_t[i{last} - tl{last}])")
    _emit_body(w, k, per_column, k.epilogue)
    _emit_stores(w, k, per_column, k.epilogue_stores)


def generate(k: LoopKernel, name: str, parallel: bool = True) -> str:
    """numba-ready source of a function `name` computing kernel `k` (outputs are preallocated args)."""
    w = _Writer()
    w.line(0, f"def {name}({', '.join(argument_names(k))}):")
    if is_column_kernel(k):
        _emit_columns(w, k, parallel)
    elif k.kept_axes:
        _emit_rows(w, k, parallel)
    elif k.reduce_axes:
        for stage in k.stages:
            _emit_stage_chunked(w, k, stage, parallel)
        _emit_body(w, k, 1, k.epilogue)
        _emit_stores(w, k, 1, k.epilogue_stores)
    else:
        for stage in k.stages:
            _emit_stage_rows(w, k, 1, stage, [])
        _emit_body(w, k, 1, k.epilogue)
        _emit_stores(w, k, 1, k.epilogue_stores)
    w.line(1, "return 0")
    return "\n".join(w.lines) + "\n"


def module_source(k: LoopKernel) -> str:
    """A module defining the kernel twice, `parallel_kernel` and `serial_kernel`, so numba caches each."""
    header = HEADER + "".join(line + "\n" for line in helper_imports(k))
    return header + "\n\n" + generate(k, "parallel_kernel") + "\n\n" + generate(k, "serial_kernel", parallel=False)


def scalar_arguments(k: LoopKernel) -> list[Any]:
    """The typed scalar constants of a kernel (numpy scalars, so numba keeps float32 float32)."""
    return [s.value.reshape(())[()] for s in k.scalars]


def kernel_arguments(k: LoopKernel, arrays: list[np.ndarray], outputs: list[np.ndarray], scalars: list[Any]
                     ) -> list[Any]:
    """The call's arguments: lengths, inputs (0-d made 1-d), typed scalar constants, outputs."""
    ins = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    outs = [o.reshape(1) if o.ndim == 0 else o for o in outputs]
    return [*k.domain, *ins, *scalars, *outs]
