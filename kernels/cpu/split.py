"""Index-set splitting: an innermost loop whose region reads bound that loop's own axis (the gradient of an
LSTM's four gates, concatenated along the last axis) is written once per segment between the bounds, each copy
holding only the case its segment reads, rather than testing every case at every point. LLVM if-converts such
tests into the vector loop, which then computes every case at every point: an LSTM gate gradient's exp ran for
all four gates, and its kernel took 18 us where the split one takes 6 us (same bits: the same statements per
point).

The bounds' order is read from their values when the source is written (a `Param`'s value), so the order is
part of the source text: a kernel whose bounds lie in another order is written as other text, another
compiled kernel. Equal values may come in either order; the segment between them is empty.
"""
from __future__ import annotations

from typing import Callable

from jitgrad.passes.loops import Branch, statements
from jitgrad.ir.primitive import Offset, Param
from jitgrad.kernels.common import case_values, int_text, int_value
from jitgrad.kernels.cpu.emit import Alias, LoopWriter

MAX_SEGMENTS = 9  # more segments: the copies of the loop cost more compile time than the tests cost time


def split_points(body: list, axis: int) -> list[int | Param] | None:
    """The distinct bounds the region reads of `body` set on `axis`, in increasing order of value; None where
    the loop is not split: no region read, or one that bounds another axis or a moved position, or more than
    MAX_SEGMENTS segments."""
    branches = [st for st in statements(body) if isinstance(st, Branch)]
    if not branches:
        return None
    points: set[int | Param] = set()
    for branch in branches:
        for bounds, _, _ in branch.cases:
            for entry, lo, hi in bounds:
                if isinstance(entry, Offset) or entry != axis:
                    return None
                points.update((lo, hi))
    ordered = sorted(points, key=_order)
    return ordered if len(ordered) < MAX_SEGMENTS else None


def _order(point: int | Param) -> tuple[int, int]:
    """Increasing value; among equal values a literal first, then parameters by number (any order is right)."""
    return (int_value(point), point.number + 1 if isinstance(point, Param) else 0)


def emit_split_loop(w: LoopWriter, depth: int, axis: int, start: str, stop: str, body: list,
                    points: list[int | Param], emit_point: Callable[[int, list], None]) -> None:
    """The loop over `axis` from `start` to `stop` once per segment between `points` (`split_points`), each
    holding `body` with every region read replaced by the case its segment reads, written by
    `emit_point(depth, statements)`. Segments with no point of the domain are left
    out: one that ends at or below 0 (as `common.bounds_text` drops such a lower bound, a parameter's sign is
    part of the source), and one no case of a region read without a fill value covers (its cases cover every
    point)."""
    rank = {p: n for n, p in enumerate(points)}
    for segment in range(len(points) + 1):
        if segment < len(points) and int_value(points[segment]) <= 0:
            continue
        resolved = _resolved(body, rank, segment)
        if resolved is None:
            continue
        lo = start if segment == 0 else f"max({start}, {int_text(points[segment - 1])})"
        hi = stop if segment == len(points) else f"min({stop}, {int_text(points[segment])})"
        emit_point(w.loop(depth, axis, f"{lo}, {hi}"), resolved)


def _resolved(body: list, rank: dict, segment: int) -> list | None:
    """`body` with each region read (nested ones too) replaced by the statements of the case that holds on the
    segment between points `segment - 1` and `segment` (`rank`: a point's position), and its value; None where
    no case holds (the segment holds no point)."""
    out = []
    for st in body:
        if not isinstance(st, Branch):
            out.append(st)
            continue
        holds = [all(rank[lo] < segment <= rank[hi] for _, lo, hi in bounds) for bounds, _, _ in st.cases]
        holds += [True] if st.otherwise is not None else []
        if True not in holds:
            return None
        statements, value = case_values(st)[holds.index(True)]
        sub = _resolved(statements, rank, segment)
        if sub is None:
            return None
        out += sub + [Alias(st.dst, value)]
    return out
