"""Values a later pass of a row kernel reuses instead of recomputing them.

A multi-pass kernel (softmax: max, then exp/sum, then exp/divide) evaluates, in each pass, every
value that pass needs; a value such as `exp(x - max)` is then computed twice per element. For a
kernel with kept axes (one row per kept point), a costly value an earlier pass already computed
is written to a per-row scratch array there and read back in the later pass. Cheap values
(arithmetic, compares, selects) are recomputed: that costs less than the memory traffic.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from jitgrad.passes.loops import Compute, Load, LoopKernel, Stage


@dataclass
class ScratchLoad:
    """`dst` = the carried value at this point of the row, read from scratch array `array`."""

    dst: str
    array: str


@dataclass
class Carry:
    """A value computed as `src` in pass `stage`, kept in scratch `array` (one row) for later passes."""

    array: str
    dtype: np.dtype
    stage: int
    src: str


def is_costly(c: Compute) -> bool:
    """Transcendental functions and powers: worth keeping rather than computing again (each primitive says)."""
    return c.prim.costly


def plan(k: LoopKernel) -> tuple[list[Stage], list[Carry]]:
    """The kernel's passes with recomputed costly values replaced by scratch loads, and the carries."""
    if not k.kept_axes or len(k.stages) < 2:
        return k.stages, []
    computed: dict[tuple, tuple[int, Compute]] = {}  # value -> (pass, statement) that computed it first
    carries: dict[tuple, Carry] = {}
    stages = []
    for s, stage in enumerate(k.stages):
        defs = {st.dst: st for st in stage.body}
        costly: dict[str, bool] = {}

        def subtree_costly(name: str) -> bool:
            st = defs.get(name)
            if not isinstance(st, Compute):
                return False
            if name not in costly:
                costly[name] = is_costly(st) or any(subtree_costly(a) for a in st.args)
            return costly[name]

        needed: set[str] = set()
        loads: dict[str, str] = {}
        stack = [r.src for r in stage.reductions] + [st.src for st in stage.stores]
        while stack:
            name = stack.pop()
            st = defs.get(name)
            if st is None or name in needed:
                continue
            needed.add(name)
            if isinstance(st, Compute) and st.value in computed and subtree_costly(name):
                first_stage, first = computed[st.value]
                carry = carries.setdefault(st.value, Carry(f"s{len(carries)}", st.dtype, first_stage, first.dst))
                loads[name] = carry.array
            elif isinstance(st, Compute):
                stack.extend(st.args)
        body: list[Load | Compute | ScratchLoad] = [
            ScratchLoad(st.dst, loads[st.dst]) if st.dst in loads else st for st in stage.body if st.dst in needed]
        for st in body:
            if isinstance(st, Compute):
                computed.setdefault(st.value, (s, st))
        stages.append(replace(stage, body=body))
    return stages, list(carries.values())
