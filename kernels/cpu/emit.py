"""The pieces every CPU loop nest is written with (`jitgrad.kernels.cpu.codegen` and `columns`): the source
writer with unsigned index copies, loads and computes, stores, accumulation, and which reductions are
blocked, order-dependent or rescanned for the sign of zero."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jitgrad.passes.loops import Branch, Compute, Load, LoopKernel, Reduction, Stage, Store
from jitgrad.ir.primitive import entry_axis
from jitgrad.kernels.cpu import carry
from jitgrad.kernels.common import (Writer, accumulator_dtype, case_tests, case_values, emit_branch, expression,
                                    identity_literal, index_text, numba_type)

CHUNKS = 64  # parallel chunks of a full reduction
BLOCK = 256  # terms a float sum adds in its own dtype (`block_sum`: 64 or 32 lanes) before folding into float64
LANES = {np.dtype(np.float32): 64, np.dtype(np.float64): 32}  # block_sum's lanes (jitgrad.kernels.cpu.reductions)
SHORT_ROW = 8  # an unswitched copy's innermost loop shorter than this (a vector of float32) is written with its length


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


class LoopWriter(Writer):
    def loop(self, depth: int, axis: int, bounds: str, loop: str = "range") -> int:
        """Open `for i<axis> in loop(bounds)` with its unsigned index copy; the depth inside."""
        self.line(depth, f"for i{axis} in {loop}({bounds}):")
        self.line(depth + 1, f"u{axis} = np.uint64(i{axis})")
        return depth + 1


@dataclass
class Alias:
    """`dst = src`: a region read's value where `emit_unswitched` has already chosen the case."""

    dst: str
    src: str


def emit_body(w: LoopWriter, k: LoopKernel, depth: int,
              body: list[Load | Compute | Branch | Alias | carry.ScratchLoad]) -> None:
    for st in body:
        if isinstance(st, Alias):
            w.line(depth, f"{st.dst} = {st.src}")
        elif isinstance(st, Load):
            w.line(depth, f"{st.dst} = a{st.input}[{index_text(st.index, k.inputs[st.input].aval.ndim, 'u')}]")
        elif isinstance(st, carry.ScratchLoad):
            w.line(depth, f"{st.dst} = {st.array}[{row_index(k)}]")
        elif isinstance(st, Branch):
            emit_branch(w, depth, st, lambda d, sub: emit_body(w, k, d, sub))
        else:
            w.line(depth, f"{st.dst} = {expression(st, 'cpu')}")


def emit_stores(w: LoopWriter, k: LoopKernel, depth: int, stores: list[Store]) -> None:
    for s in stores:
        w.line(depth, f"o{s.output}[{index_text(s.index, k.outputs[s.output].aval.ndim, 'u')}] = {s.src}")


def emit_accumulate(w: LoopWriter, depth: int, r: Reduction, acc: str, value: str, exact: bool = False) -> None:
    """`acc` combined with `value`: the vectorisable combiner, or (`exact`, and for integers) the
    primitive's template, numpy's sequential rule."""
    typ = numba_type(accumulator_dtype(r))
    vector = r.prim.reduction.vector_combine if r.dtype.kind == "f" else None
    combine = r.prim.reduction.combine if exact or vector is None else vector.template
    w.line(depth, f"{acc} = {combine.format(acc, f'{typ}({value})')}")


def body_slice(body: list, name: str) -> list:
    """The statements of `body` that computing `name` needs, in order."""
    needed, kept = {name}, []
    for st in reversed(body):
        if st.dst in needed:
            kept.append(st)
            if isinstance(st, Compute):
                needed.update(st.args)
    return kept[::-1]


def emit_zero_rescan(w: LoopWriter, k: LoopKernel, depth: int, stage: Stage) -> None:
    """A float max/min that came out zero is recomputed with numpy's sequential rule (ties take the
    later element), so -0.0 and +0.0 come out as numpy's; other results are order-independent. Reads and
    writes each accumulator as `<acc>_`."""
    for r in stage.reductions:
        if not rescans_zero(r):
            continue
        w.line(depth, f"if {r.acc}_ == 0:")
        w.line(depth + 1, f"{r.acc}_ = {identity_literal(r)}")
        inner = depth + 1
        for a in k.reduce_axes:
            inner = w.loop(inner, a, f"n{a}")
        emit_body(w, k, inner, body_slice(stage.body, r.src))
        emit_accumulate(w, inner, r, f"{r.acc}_", r.src, exact=True)


def emit_last_zero(w: LoopWriter, depth: int, r: Reduction, keep: str) -> None:
    """`keep` = the term if it equals zero, else as it was. Where a float max/min comes out zero every term is
    at most (at least) zero and no NaN, so numpy's sequential rule (a tie takes the later term) returns the
    last zero term, sign included: what `emit_zero_rescan` recomputes, here as a select LLVM vectorises."""
    typ = numba_type(accumulator_dtype(r))
    w.line(depth, f"{keep} = {typ}({r.src}) if {r.src} == 0 else {keep}")


def _one_branch(body: list) -> int | None:
    """Where the only region read of `body` (not counting those inside its cases) is; None if it has none or several."""
    found = [n for n, st in enumerate(body) if isinstance(st, Branch)]
    return found[0] if len(found) == 1 else None


def _case_bodies(body: list, n: int) -> list[list]:
    """`body` once per case of its region read at `n`: the case's statements and its value in place of the read."""
    branch, before, after = body[n], body[:n], body[n + 1:]
    return [before + sub + [Alias(branch.dst, value)] + after for sub, value in case_values(branch)]


def unswitched_loops(body: list, axis: int) -> int:
    """How many copies of the loop over `axis` `emit_unswitched` writes for `body` (1: no region read); 0 where
    it cannot: two region reads side by side (a sum of padded slices), or a bound on `axis` itself."""
    n = _one_branch(body)
    if n is None:
        return 0 if any(isinstance(st, Branch) for st in body) else 1
    if any(entry_axis(entry) == axis for bounds, _, _ in body[n].cases for entry, _, _ in bounds):
        return 0
    counts = [unswitched_loops(case, axis) for case in _case_bodies(body, n)]
    return 0 if 0 in counts else sum(counts)


def short_length(k: LoopKernel, axis: int) -> str | None:
    """The length of `axis` as a literal where it is shorter than SHORT_ROW, else None. An unswitched copy of 3
    channels per row (an RGB image's im2col) spent more on each row's loop set-up, sized at run time, than on
    its three copies; with the length in the source LLVM unrolls it (0.9 -> 0.45 ms for the medium conv net's).
    The length is then part of the source text: each such length compiles its own kernel."""
    length = int(k.domain[axis])
    return str(length) if length < SHORT_ROW else None


def emit_unswitched(w: LoopWriter, k: LoopKernel, depth: int, body: list, stores: list[Store], axis: int,
                    pending: tuple[int, ...] = ()) -> None:
    """The innermost loop (over `axis`) inside each case of the body's region read, nested ones too, rather than
    the cases tested at every point: an im2col's nine shifted reads are nine contiguous copies of a row of
    channels. Only where `unswitched_loops` is positive; the same statements per point, so the same values. The
    loops over `pending` axes open only where a case test needs their variable (else at the innermost loop), so a
    test on an outer axis (which of the nine shifts) runs once per row of the axes under it, not per point."""
    n = _one_branch(body)
    if n is None:
        for a in pending:
            depth = w.loop(depth, a, f"n{a}")
        inner = w.loop(depth, axis, short_length(k, axis) or f"n{axis}")
        emit_body(w, k, inner, body)
        emit_stores(w, k, inner, stores)
        return
    tested = {entry_axis(entry) for bounds, _, _ in body[n].cases for entry, _, _ in bounds}
    for a in [a for a in pending if a in tested]:
        depth = w.loop(depth, a, f"n{a}")
    pending = tuple(a for a in pending if a not in tested)
    for test, case in zip(case_tests(body[n]), _case_bodies(body, n)):
        w.line(depth, test)
        emit_unswitched(w, k, depth + 1, case, stores, axis, pending)
