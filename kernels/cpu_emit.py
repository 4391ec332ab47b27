"""The pieces every CPU loop nest is written with (`jitgrad.kernels.cpu` and `cpu_columns`): the source
writer with unsigned index copies, loads and computes, stores, accumulation, and which reductions are
blocked, order-dependent or rescanned for the sign of zero."""
from __future__ import annotations

import numpy as np

from jitgrad.loops import Branch, Compute, Load, LoopKernel, Reduction, Stage, Store
from jitgrad.kernels import carry
from jitgrad.kernels.common import (Writer, accumulator_dtype, emit_branch, expression, identity_literal, index_text,
                                    numba_type)

CHUNKS = 64  # parallel chunks of a full reduction
BLOCK = 256  # terms a float sum adds in its own dtype (`block_sum`: 64 or 32 lanes) before folding into float64
LANES = {np.dtype(np.float32): 64, np.dtype(np.float64): 32}  # block_sum's lanes (jitgrad.kernels.reductions)


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


def emit_body(w: LoopWriter, k: LoopKernel, depth: int, body: list[Load | Compute | Branch | carry.ScratchLoad]
              ) -> None:
    for st in body:
        if isinstance(st, Load):
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
