"""CPU kernels whose last axis is kept and vectorised across it while the reduced axes before it are
walked row by row: the column kernel (float sums over outer axes, a bias gradient) and the lane kernel
(order-independent reductions over middle axes: a 2x2 max-pool of (B, H, 2, W, 2, C) and its tie count).
Both keep one accumulator per column of the last axis, so its loads are contiguous and LLVM vectorises
them, where a row kernel would walk the reduced axes with a stride for every output element."""
from __future__ import annotations

import numpy as np

from jitgrad.passes.loops import LoopKernel, Reduction
from jitgrad.kernels.cpu import carry
from jitgrad.kernels.common import accumulator_dtype, identity_literal, numba_type
from jitgrad.kernels.cpu.emit import (BLOCK, CHUNKS, LANES, LoopWriter, emit_accumulate, emit_body, emit_stores,
                                      emit_last_zero, is_blocked, order_dependent, rescans_zero)
from jitgrad.kernels.cpu.split import emit_split_loop, split_points

COLUMN_TILE = 256  # columns a column kernel sums at once (its lane sums: 64 KiB)


def is_column_kernel(k: LoopKernel) -> bool:
    """One pass of float sums over outer axes, kept axes inner (a bias gradient: sum over batch and time of
    a (B, T, D) array): rows of the reduced axes are walked in order, contiguous columns vectorised."""
    if not k.kept_axes or not k.reduce_axes or max(k.reduce_axes) > min(k.kept_axes) or len(k.stages) != 1:
        return False
    (stage,) = k.stages
    return bool(stage.reductions) and all(is_blocked(r) for r in stage.reductions) and not carry.plan(k)[1]


def emit_columns(w: LoopWriter, k: LoopKernel, parallel: bool) -> None:
    """A column kernel: per tile of up to COLUMN_TILE columns of the last kept axis, every row of the
    reduced axes in order, adding each column's terms into `LANES` lane sums per block of BLOCK rows
    (lane j takes rows j, j + LANES, ...) that combine as `block_sum`'s balanced tree of halves: the same
    terms in the same order as a row kernel, so the same bits, with contiguous loads. Region reads bounded on
    the columns' axis split the column loop into segments (`cpu_split`)."""
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
    by_lanes: dict[int, list[Reduction]] = {}
    for r in stage.reductions:
        by_lanes.setdefault(LANES[np.dtype(r.dtype)], []).append(r)
    _emit_columns_loop(w, tile, f"wd{last}", [f"{r.acc}_t[j] = 0.0" for r in stage.reductions])
    inner = tile
    for a in reduced[:-1]:
        inner = w.loop(inner, a, f"n{a}")
    row = reduced[-1]
    w.line(inner, f"for b{row} in range(0, n{row}, {BLOCK}):")
    for lanes, group in by_lanes.items():
        w.line(inner + 1, f"for h in range({lanes}):")
        _emit_columns_loop(w, inner + 2, f"wd{last}", [f"{r.acc}_l[h, j] = 0.0" for r in group])
    body = w.loop(inner + 1, row, f"b{row}, min(b{row} + {BLOCK}, n{row})")
    lane_of = {r.acc: LANES[np.dtype(r.dtype)] - 1 for r in stage.reductions}
    w.line(body, f"ln{row} = np.uint64(i{row} - b{row})")

    def point(at: int, statements: list) -> None:
        emit_body(w, k, at, statements)
        for r in stage.reductions:
            cell = f"{r.acc}_l[ln{row} & np.uint64({lane_of[r.acc]}), np.uint64(i{last} - tl{last})]"
            w.line(at, f"{cell} = {cell} + {numba_type(r.dtype)}({r.src})")
        emit_stores(w, k, at, stage.stores)

    points = split_points(stage.body, last)
    if points is None:
        point(w.loop(body, last, f"tl{last}, tl{last} + wd{last}"), stage.body)
    else:
        emit_split_loop(w, body, last, f"tl{last}", f"tl{last} + wd{last}", stage.body, points, point)
    for lanes, group in by_lanes.items():  # the tree of halves as one loop nest for every sum of these lanes
        w.line(inner + 1, f"hw = {lanes}")
        w.line(inner + 1, "while hw > 1:")
        w.line(inner + 2, "hw //= 2")
        w.line(inner + 2, "for h in range(hw):")
        _emit_columns_loop(w, inner + 3, f"wd{last}", [f"{r.acc}_l[h, j] = {r.acc}_l[h, j] + {r.acc}_l[h + hw, j]"
                                                        for r in group])
    _emit_columns_loop(w, inner + 1, f"wd{last}", [f"{r.acc}_t[j] += np.float64({r.acc}_l[0, j])"
                                                   for r in stage.reductions])
    per_column = w.loop(tile, last, f"tl{last}, tl{last} + wd{last}")
    for r in stage.reductions:
        w.line(per_column, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_t[i{last} - tl{last}])")
    emit_body(w, k, per_column, k.epilogue)
    emit_stores(w, k, per_column, k.epilogue_stores)


def _emit_columns_loop(w: LoopWriter, depth: int, width: str, statements: list[str]) -> None:
    """One `for j in range(width)` loop holding every accumulator's statement: each loop nest LLVM
    vectorises costs compile time (vector body, remainder, alias checks), so accumulators share them;
    explicit loops rather than slice assignments, which numba types and lowers as generic array code."""
    w.line(depth, f"for j in range({width}):")
    for statement in statements:
        w.line(depth + 1, statement)


def is_lane_kernel(k: LoopKernel) -> bool:
    """Reductions exact in any order (float max/min, counts, integer sums) over axes before a kept last
    axis, under another kept axis (a 2x2 max-pool of (B, H, 2, W, 2, C) and its tie count); no float sum
    (those keep their row order: column kernel or row kernel) and nothing carried between passes."""
    kept, last = k.kept_axes, len(k.domain) - 1
    if not k.reduce_axes or len(kept) < 2 or kept[-1] != last:
        return False
    reductions = [r for stage in k.stages for r in stage.reductions]
    return bool(reductions) and not any(is_blocked(r) or order_dependent(r) for r in reductions) \
        and not carry.plan(k)[1]


def emit_lanes(w: LoopWriter, k: LoopKernel, parallel: bool) -> None:
    """A lane kernel: per point of the kept axes but the last, one accumulator per column of the last
    axis; each pass walks the reduced axes in order with the columns innermost (contiguous, vectorised).
    A float max/min also keeps, per column, the last term equal to zero (`emit_last_zero`), which is what
    numpy's sequential rule returns when the result is zero: a ReLU's pooled zeros need no rescan. The
    same terms combine exactly, so the same bits as a row kernel."""
    kept, reduced = k.kept_axes, k.reduce_axes
    outer, last = kept[:-1], kept[-1]
    depth = w.loop(1, outer[0], f"n{outer[0]}", "prange" if parallel else "range")
    for stage in k.stages:
        for r in stage.reductions:
            w.line(depth, f"{r.acc}_v = np.empty(n{last}, {numba_type(accumulator_dtype(r))})")
            w.line(depth, f"{r.acc}_f = np.empty(n{last}, {numba_type(r.dtype)})")
            if rescans_zero(r):
                w.line(depth, f"{r.acc}_z = np.empty(n{last}, {numba_type(accumulator_dtype(r))})")
    for a in outer[1:]:
        depth = w.loop(depth, a, f"n{a}")
    done: list[Reduction] = []

    def finished(at: int) -> None:
        for r in done:
            w.line(at, f"{r.acc} = {r.acc}_f[u{last}]")

    for stage in k.stages:
        column = w.loop(depth, last, f"n{last}")
        for r in stage.reductions:
            w.line(column, f"{r.acc}_v[u{last}] = {identity_literal(r)}")
        inner = depth
        for a in reduced:
            inner = w.loop(inner, a, f"n{a}")
        body = w.loop(inner, last, f"n{last}")
        finished(body)
        emit_body(w, k, body, stage.body)
        for r in stage.reductions:
            emit_accumulate(w, body, r, f"{r.acc}_v[u{last}]", r.src)
            if rescans_zero(r):
                emit_last_zero(w, body, r, f"{r.acc}_z[u{last}]")
        emit_stores(w, k, body, stage.stores)
        column = w.loop(depth, last, f"n{last}")
        for r in stage.reductions:
            w.line(column, f"{r.acc}_ = {r.acc}_v[u{last}]")
            if rescans_zero(r):
                w.line(column, f"{r.acc}_ = {r.acc}_z[u{last}] if {r.acc}_ == 0 else {r.acc}_")
        for r in stage.reductions:
            w.line(column, f"{r.acc}_f[u{last}] = {numba_type(r.dtype)}({r.acc}_)")
        done.extend(stage.reductions)
    column = w.loop(depth, last, f"n{last}")
    finished(column)
    emit_body(w, k, column, k.epilogue)
    emit_stores(w, k, column, k.epilogue_stores)
