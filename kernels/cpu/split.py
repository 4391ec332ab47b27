"""Index-set splitting: an innermost loop whose region reads bound that loop's own axis (the gradient of an
LSTM's four gates, concatenated along the last axis) is written once per segment between the bounds, each copy
holding only the case its segment reads, rather than testing every case at every point. LLVM if-converts such
tests into the vector loop, which then computes every case at every point: an LSTM gate gradient's exp ran for
all four gates, and its kernel took 18 us where the split one takes 6 us (same bits: the same statements per
point).

The bounds' order is read from their values when the source is written (a `Param`'s value), so the order is
part of the source text: a kernel whose bounds lie in another order is written as other text, another
compiled kernel. Equal values may come in either order; the segment between them is empty.

Region reads side by side that bound outer axes only (a convolution's input gradient, nine padded slices summed)
get one more copy of the innermost loop, for the block of those axes' longest segments (the image's interior),
with every case resolved (`main_block`); the points outside it test their cases as before. Testing nine cases per
point kept the loop scalar and branchy (the medium conv net's input gradient 0.85 -> 0.5 ms); a copy per segment
of each axis (36) took seven times as long to compile.
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
    found = _points(body, (axis,))
    return None if found is None else found[axis]


def main_block(body: list, axes: tuple[int, ...], extents: tuple[int, ...]) -> tuple[str, list] | None:
    """The block of the longest segment of each axis of `axes` that the region reads of `body` bound (lengths from
    the points' values and the axes' `extents` when the source is written): the test that a point lies in it, on
    the signed loop variables, and `body` with every region read resolved there. None where there is none: no
    region read, one that bounds an axis outside `axes` or a moved position, or no case holding in the block."""
    found = _points(body, axes)
    if found is None:
        return None
    ranks = {axis: {p: n for n, p in enumerate(points)} for axis, points in found.items()}
    segments, tests = {}, []
    for axis, points in found.items():
        edges = [0, *map(int_value, points), extents[axes.index(axis)]]
        segment = max(range(len(points) + 1), key=lambda n: edges[n + 1] - edges[n])
        segments[axis] = segment
        if segment > 0:
            tests.append(f"{int_text(points[segment - 1])} <= i{axis}")
        if segment < len(points):
            tests.append(f"i{axis} < {int_text(points[segment])}")
    resolved = _resolved(body, ranks, segments)
    return None if resolved is None or not tests else (" and ".join(tests), resolved)


def _points(body: list, axes: tuple[int, ...]) -> dict[int, list[int | Param]] | None:
    branches = [st for st in statements(body) if isinstance(st, Branch)]
    if not branches:
        return None
    points: dict[int, set[int | Param]] = {}
    for branch in branches:
        for bounds, _, _ in branch.cases:
            for entry, lo, hi in bounds:
                if isinstance(entry, Offset) or entry not in axes:
                    return None
                points.setdefault(entry, set()).update((lo, hi))
    ordered = {axis: sorted(found, key=_order) for axis, found in points.items()}
    return ordered if all(len(p) < MAX_SEGMENTS for p in ordered.values()) else None


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
    for segment, lo, hi in _segments(points, start, stop):
        resolved = _resolved(body, {axis: {p: n for n, p in enumerate(points)}}, {axis: segment})
        if resolved is not None:
            emit_point(w.loop(depth, axis, f"{lo}, {hi}"), resolved)


def _segments(points: list[int | Param], start: str, stop: str) -> list[tuple[int, str, str]]:
    """Each segment between `points` as (its number, its first and its end position as text), leaving out one
    that ends at or below 0 (as `common.bounds_text` drops such a lower bound, a parameter's sign is part of the
    source)."""
    found = []
    for segment in range(len(points) + 1):
        if segment < len(points) and int_value(points[segment]) <= 0:
            continue
        lo = start if segment == 0 else f"max({start}, {int_text(points[segment - 1])})"
        hi = stop if segment == len(points) else f"min({stop}, {int_text(points[segment])})"
        found.append((segment, lo, hi))
    return found


def _resolved(body: list, ranks: dict[int, dict], segments: dict[int, int]) -> list | None:
    """`body` with each region read (nested ones too) replaced by the statements of the case that holds on the
    chosen segments (`segments[axis]`: the segment between points `segment - 1` and `segment` of that axis;
    `ranks[axis]`: a point's position), and its value; None where no case holds (the segments hold no point)."""
    out = []
    for st in body:
        if not isinstance(st, Branch):
            out.append(st)
            continue
        holds = [all(ranks[axis][lo] < segments[axis] <= ranks[axis][hi] for axis, lo, hi in bounds)
                 for bounds, _, _ in st.cases]
        holds += [True] if st.otherwise is not None else []
        if True not in holds:
            return None
        statements, value = case_values(st)[holds.index(True)]
        sub = _resolved(statements, ranks, segments)
        if sub is None:
            return None
        out += sub + [Alias(st.dst, value)]
    return out
