"""CPU lowering: a fused `LoopKernel` becomes Python source compiled by numba.

The source has a parallel variant (`prange` over the outermost kept axis, or over chunks of the
first reduced axis for full reductions) and a serial one for small domains. Lengths are runtime
arguments, so one compiled kernel serves every length of the same rank, dtypes and layout.
Scalar constants are typed arguments too (numba would type a bare `1.0` as float64 and promote
float32 math); two or more come as one array per dtype (`scalar_groups`). No fast-math: numbers match numpy's.

What lets LLVM vectorise the loops: arrays are indexed with unsigned copies of the loop variables
(numba wraps negative signed indices with a select, which turns contiguous loads into gathers);
float sums store blocks of `BLOCK` terms that `block_sum` adds in vector lanes in one fixed
order, and fold each block into a float64 total in order (a float64 accumulator would halve the
vector width of a float32 loop; a reassociated one would make the bits depend on the kernel and
the variant). Full reductions split into the same chunks in both variants (the serial one walks
them in a plain loop), so the serial and parallel kernels give the same bits; float max/min
reductions use LLVM's NaN-propagating `maximum`/`minimum`, and a row whose extremum is zero is
rescanned with numpy's sequential rule so that the sign of the zero matches numpy's. Values a
later pass would recompute are carried through per-row scratch (`jitgrad.kernels.cpu.carry`). A sum
over outer axes with the last axes kept (a bias gradient) is a column kernel: rows walked in order,
contiguous columns vectorised, each column's terms in the row kernel's lanes and order, so the
same bits without a strided walk per output element; reductions exact in any order over middle axes
with the last axis kept (a max-pool) are lane kernels, channels innermost (`jitgrad.kernels.cpu.columns`).
An elementwise kernel whose one region read chooses by outer positions only tests its cases once per row, the
innermost loop written inside each case (`emit.emit_unswitched`: LLVM does not unswitch these loops); region
reads that choose by the innermost position split that loop into segments (`split`), in elementwise and
column kernels, and several side by side that choose by outer positions (but the parallel one) get a copy of the
innermost loop for the block of those axes' longest segments, every case resolved there (`split.main_block`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.passes.loops import Compute, LoopKernel, Reduction, Stage, statements
from jitgrad.kernels.cpu import carry, reductions
from jitgrad.kernels.common import (accumulator_dtype, argument_names, identity_literal, numba_type,
                                    scalar_values)
from jitgrad.kernels.cpu.columns import emit_columns, emit_lanes, is_column_kernel, is_lane_kernel
from jitgrad.kernels.cpu.emit import (BLOCK, CHUNKS, LoopWriter, emit_accumulate, emit_body, emit_stores,
                                      emit_unswitched, emit_zero_rescan, is_blocked, order_dependent, row_index,
                                      unswitched_loops)
from jitgrad.kernels.cpu.split import emit_split_loop, main_block, split_points

__all__ = ["BLOCK", "PARALLEL_MIN_SIZE", "generate", "is_blocked", "is_column_kernel", "is_lane_kernel",
           "kernel_arguments", "module_source", "scalar_arguments"]

PARALLEL_MIN_SIZE = 1 << 15  # smaller domains always run the serial variant; larger ones time both
MAX_UNSWITCHED_LOOPS = 32  # copies of the innermost loop an elementwise kernel's region read may be split into

PACKED_FROM = 2  # scalar arguments from which a kernel takes them as one array per dtype (`scalar_groups`)
HEADER = "import math\n\nimport numpy as np\nfrom numba import prange\n"
BLOCK_SUM = f"{reductions.__name__}.block_sum"


def helper_imports(k: LoopKernel) -> list[str]:
    """`from module import name` lines for the helpers the kernel's expressions and reductions call."""
    wanted: set[str] = set()
    for stage in k.stages:
        for st in statements(stage.body):
            if isinstance(st, Compute):
                wanted.update(st.prim.lowering["cpu"].imports)
        for r in stage.reductions:
            vector = r.prim.reduction.vector_combine
            if vector is not None and r.dtype.kind == "f":
                wanted.update(vector.imports)
            if is_blocked(r):
                wanted.add(BLOCK_SUM)
    wanted.update(name for st in statements(k.epilogue) if isinstance(st, Compute)
                  for name in st.prim.lowering["cpu"].imports)
    by_module: dict[str, list[str]] = {}
    for dotted in sorted(wanted):
        module, _, name = dotted.rpartition(".")
        by_module.setdefault(module, []).append(name)
    return [f"from {m} import {', '.join(names)}" for m, names in sorted(by_module.items())]


def _emit_pass(w: LoopWriter, k: LoopKernel, depth: int, stage: Stage, loops: list[tuple[int, str, str]],
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
    emit_body(w, k, inner, stage.body)
    for r in stage.reductions:
        if r.acc in carried:
            continue
        if r in blocked:
            w.line(inner, f"{r.acc}_s[np.uint64(i{loops[-1][0]} - b{loops[-1][0]})] = {numba_type(r.dtype)}({r.src})")
        else:
            emit_accumulate(w, inner, r, f"{r.acc}_", r.src)
    emit_stores(w, k, inner, stage.stores)
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


def _emit_stage_rows(w: LoopWriter, k: LoopKernel, depth: int, stage: Stage, carries: list[carry.Carry]) -> None:
    """A stage for one kept point: accumulators, loops over the reduced axes, final casts."""
    for r in stage.reductions:
        w.line(depth, f"{r.acc}_ = {identity_literal(r)}")
    _emit_pass(w, k, depth, stage, [(a, "0", f"n{a}") for a in k.reduce_axes], carries)
    emit_zero_rescan(w, k, depth, stage)
    for r in stage.reductions:
        w.line(depth, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def _emit_rows_of_one_array(w: LoopWriter, depth: int, arrays: list[tuple[str, str]], length: str) -> None:
    """Arrays of `length` elements named `arrays` (name, numba dtype): one allocation per dtype, each array a row
    of it (an allocation costs about 50 ns, a few of them a large share of a small kernel's call)."""
    by_dtype: dict[str, list[str]] = {}
    for name, dtype in arrays:
        by_dtype.setdefault(dtype, []).append(name)
    for dtype, names in by_dtype.items():
        if len(names) == 1:
            w.line(depth, f"{names[0]} = np.empty({length}, {dtype})")
            continue
        w.line(depth, f"{names[0]}_rows = np.empty(({len(names)}, {length}), {dtype})")
        for row, name in enumerate(names):
            w.line(depth, f"{name} = {names[0]}_rows[{row}]")


def _emit_block_scratch(w: LoopWriter, depth: int, stages: list[Stage], carries: list[carry.Carry]) -> None:
    """Per-chunk scratch of the blocked sums that do not read their terms from a carried value."""
    _emit_rows_of_one_array(w, depth, [(f"{r.acc}_s", numba_type(r.dtype)) for s, stage in enumerate(stages)
                                       for r in stage.reductions
                                       if is_blocked(r) and not any(_sums_carried(r, c) for c in carries
                                                                    if c.stage == s)], str(BLOCK))


def _emit_stage_chunked(w: LoopWriter, k: LoopKernel, stage: Stage, parallel: bool) -> None:
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
    _emit_rows_of_one_array(w, 1, [(f"{r.acc}_p", numba_type(accumulator_dtype(r))) for r in stage.reductions], "nc")
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
        emit_accumulate(w, 2, r, f"{r.acc}_", f"{r.acc}_p[ch]")
    emit_zero_rescan(w, k, 1, stage)
    for r in stage.reductions:
        w.line(1, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def _emit_rows(w: LoopWriter, k: LoopKernel, parallel: bool) -> None:
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
    elementwise = not k.reduce_axes and not carries and len(stages) == 1 and not k.epilogue and not k.epilogue_stores
    if elementwise and len(kept) > 1:  # region reads: tested once per row, or the last axis split into segments
        stage, last = stages[0], kept[-1]

        def point(at: int, statements: list) -> None:
            emit_body(w, k, at, statements)
            emit_stores(w, k, at, stage.stores)

        points = split_points(stage.body, last)
        if points is not None:
            for a in kept[1:-1]:
                depth = w.loop(depth, a, f"n{a}")
            emit_split_loop(w, depth, last, "0", f"n{last}", stage.body, points, point)
            return
        if 1 < unswitched_loops(stage.body, last) <= MAX_UNSWITCHED_LOOPS:
            emit_unswitched(w, k, depth, stage.body, stage.stores, last, tuple(kept[1:-1]))
            return
        block = main_block(stage.body, tuple(kept[1:-1]), tuple(k.domain[a] for a in kept[1:-1]))
        if block is not None:
            for a in kept[1:-1]:
                depth = w.loop(depth, a, f"n{a}")
            test, resolved = block
            for line, statements in ((f"if {test}:", resolved), ("else:", stage.body)):
                w.line(depth, line)
                point(w.loop(depth + 1, last, f"n{last}"), statements)
            return
    for a in kept[1:]:
        depth = w.loop(depth, a, f"n{a}")
    for s, stage in enumerate(stages):
        _emit_stage_rows(w, k, depth, stage, [c for c in carries if c.stage == s])
    emit_body(w, k, depth, k.epilogue)
    emit_stores(w, k, depth, k.epilogue_stores)


def generate(k: LoopKernel, name: str, parallel: bool = True) -> str:
    """numba-ready source of a function `name` computing kernel `k` (outputs are preallocated args)."""
    w = LoopWriter()
    groups = scalar_groups(k)
    if groups is None:
        w.line(0, f"def {name}({', '.join(argument_names(k))}):")
    else:
        lengths, inputs, outputs = len(k.domain), len(k.inputs), len(k.outputs)
        names = argument_names(k)
        packed = [f"cs{g}" for g in range(len(groups))]
        w.line(0, f"def {name}({', '.join(names[:lengths + inputs] + packed + names[len(names) - outputs:])}):")
        for g, (_, members) in enumerate(groups):
            for j, (member, _) in enumerate(members):
                w.line(1, f"{member} = cs{g}[{j}]")
    if is_column_kernel(k):
        emit_columns(w, k, parallel)
    elif is_lane_kernel(k):
        emit_lanes(w, k, parallel)
    elif k.kept_axes:
        _emit_rows(w, k, parallel)
    elif k.reduce_axes:
        for stage in k.stages:
            _emit_stage_chunked(w, k, stage, parallel)
        emit_body(w, k, 1, k.epilogue)
        emit_stores(w, k, 1, k.epilogue_stores)
    else:
        for stage in k.stages:
            _emit_stage_rows(w, k, 1, stage, [])
        emit_body(w, k, 1, k.epilogue)
        emit_stores(w, k, 1, k.epilogue_stores)
    w.line(1, "return 0")
    return "\n".join(w.lines) + "\n"


def module_source(k: LoopKernel) -> str:
    """A module defining the kernel twice, `parallel_kernel` and `serial_kernel`, so numba caches each, and
    `quick_kernel`, the serial one under the name of its quick machine code (`quick_codegen`)."""
    header = HEADER + "".join(line + "\n" for line in helper_imports(k))
    return (header + "\n\n" + generate(k, "parallel_kernel") + "\n\n" + generate(k, "serial_kernel", parallel=False)
            + "\n\n\nquick_kernel = serial_kernel\n")


def scalar_groups(k: LoopKernel) -> list[tuple[np.dtype, list[tuple[str, Any]]]] | None:
    """A kernel's scalar constants and index parameters (int64), by dtype in first-seen order, each as its name in
    the source and its value; None for fewer than PACKED_FROM of them, passed one by one. Each group is one array
    argument (`scalar_arguments`): numba's dispatcher types each argument of every call, about 70 ns a scalar,
    and an array of them costs as much as one."""
    values = scalar_values(k)
    if len(values) < PACKED_FROM:
        return None
    groups: dict[np.dtype, list[tuple[str, Any]]] = {}
    for name, value in values:
        groups.setdefault(value.dtype, []).append((name, value))
    return list(groups.items())


def scalar_arguments(k: LoopKernel) -> list[Any]:
    """The typed scalar constants of a kernel, then its index parameters (int64): numpy scalars, so numba keeps
    float32 float32, or from PACKED_FROM of them on, one array per dtype (`scalar_groups`)."""
    groups = scalar_groups(k)
    if groups is None:
        return [value for _, value in scalar_values(k)]
    return [np.array([value for _, value in members], dtype) for dtype, members in groups]


def kernel_arguments(k: LoopKernel, arrays: list[np.ndarray], outputs: list[np.ndarray], scalars: list[Any]
                     ) -> list[Any]:
    """The call's arguments: lengths, inputs (0-d made 1-d), typed scalar constants and index parameters
    (`scalar_arguments`), outputs."""
    ins = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    outs = [o.reshape(1) if o.ndim == 0 else o for o in outputs]
    return [*k.domain, *ins, *scalars, *outs]
