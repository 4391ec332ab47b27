"""numpy's matmul as the BLAS gemm calls it makes, so that blas_handoff can make the same calls for the parts of a
split product without the GIL: the same routine, transposition flags and leading dimensions, and for a stack of
matrices (a batched product) one call per matrix, as numpy's matmul loop makes them. `describe` applies numpy's
rule to one product; `SplitCalls` keeps, per layout of a split product's operands (shapes, strides, dtype), its
parts' calls as offsets from the operands' addresses, derived once and moved to each product's addresses (about 5
us a product, against 17 us for describing both parts anew).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # cblas enumerations
BLAS_MAX = (1 << 31) - 1  # numpy gives gemm no dimension or leading dimension above this
# a described call: the gemm's arguments, then the matrix stack as two levels of (count, byte steps of a, b, out)
DOUBLE, TRANS_A, TRANS_B, M, N, K, A, LDA, B, LDB, C, LDC = range(12)
COUNT0, STEP_A0, STEP_B0, STEP_C0, COUNT1, STEP_A1, STEP_B1, STEP_C1 = range(12, 20)
FIELDS = 20
Aliasing = tuple[int, int, int, int, int]  # a's address minus b's for the first matrix, then per level count, step gap
Parts = Callable[[np.ndarray, np.ndarray, np.ndarray], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]


def _operand(strides: tuple[int, ...], size: int, rows: int, cols: int) -> tuple[int, int] | None:
    """numpy's rule for a gemm operand: (transposition, leading dimension), or None where numpy does not call
    gemm (no unit stride, a leading stride not a whole number of items or below the other dimension)."""
    s0, s1 = strides
    if s1 == size and s0 % size == 0 and cols <= s0 // size <= BLAS_MAX:
        return NO_TRANS, s0 // size
    if s0 == size and s1 % size == 0 and rows <= s1 // size <= BLAS_MAX:
        return TRANS, s1 // size
    return None


def _stack(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[list[int]] | None:
    """The batch dimensions as at most two levels [count, step of a, of b, of out] (steps in bytes, 0 where an
    operand is broadcast), levels that step evenly merged; None for more levels or an output not of the broadcast
    batch shape."""
    batch = out.shape[:-2]
    try:
        if np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) != batch:
            return None
    except ValueError:
        return None
    levels: list[list[int]] = []
    for d, count in enumerate(batch):
        if count == 1:
            continue
        steps = []
        for x in (a, b, out):
            axis = d - len(batch) + x.ndim - 2
            steps.append(0 if axis < 0 or x.shape[axis] == 1 else x.strides[axis])
        if levels and all(outer == inner * count for outer, inner in zip(levels[-1][1:], steps)):
            levels[-1] = [levels[-1][0] * count, *steps]
        else:
            levels.append([count, *steps])
    if len(levels) > 2:
        return None
    return levels + [[1, 0, 0, 0]] * (2 - len(levels))


def _layout(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> tuple[list[int], Aliasing | None] | None:
    """The call at these arrays' addresses, and for a product numpy would give to syrk were a and b one array
    (a matrix times its own transpose) what tells whether they are; None where numpy would not call gemm."""
    if not (a.ndim >= 2 and b.ndim >= 2 and out.ndim >= 2 and a.dtype == b.dtype == out.dtype
            and a.dtype in (np.float32, np.float64)):
        return None
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k2 != k or out.shape[-2:] != (m, n) or min(m, n, k) < 2 or max(m, n, k) > BLAS_MAX:
        return None
    size = out.itemsize
    first, second = _operand(a.strides[-2:], size, m, k), _operand(b.strides[-2:], size, k, n)
    out_rows, out_items = out.strides[-2:]
    if first is None or second is None or out_items != size or out_rows % size or not n <= out_rows // size <= BLAS_MAX:
        return None
    stack = _stack(a, b, out)
    if stack is None:
        return None
    a_at, b_at = a.ctypes.data, b.ctypes.data
    call = [int(a.dtype == np.float64), first[0], second[0], m, n, k, a_at, first[1], b_at, second[1],
            out.ctypes.data, out_rows // size, *stack[0], *stack[1]]
    syrk = m == n and a.strides[-2] == b.strides[-1] and a.strides[-1] == b.strides[-2] and first[0] != second[0]
    aliasing = (a_at - b_at, stack[0][0], stack[0][1] - stack[0][2], stack[1][0], stack[1][1] - stack[1][2])
    return call, aliasing if syrk else None


def _aliased(gap: int, aliasing: Aliasing) -> bool:
    """Whether some matrix of the stack has a at b's address (`gap`: how far the operands' addresses differ beyond
    the aliasing's own first gap), where numpy calls syrk instead of gemm."""
    first, count0, gap0, count1, gap1 = aliasing
    for i in range(count0):
        rest = -(gap + first + i * gap0)  # what j * gap1 must be for matrix (i, j)
        if rest == 0 or gap1 != 0 and rest % gap1 == 0 and 0 <= rest // gap1 < count1:
            return True
    return False


def _aligned(*arrays: np.ndarray) -> bool:
    return all(x.flags.aligned for x in arrays)


def describe(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[int] | None:
    """The gemm calls numpy's matmul makes for `a @ b` into `out` (FIELDS ints), or None where numpy would do
    something else: other than float32/float64 of one dtype, a dimension below 2 (numpy's vector and scalar
    routines), a non-gemm layout, more than two levels of batch dimensions that do not merge, misaligned data, a
    matrix times its own transpose (syrk)."""
    found = _layout(a, b, out) if _aligned(a, b, out) else None
    if found is None or found[1] is not None and _aliased(0, found[1]):
        return None
    return found[0]


class SplitCalls:
    """The calls of a split product's parts per layout of its operands, as offsets from their addresses."""

    LIMIT = 4096  # layouts kept (then forgotten all at once): a program has a few dozen

    def __init__(self) -> None:
        self.layouts: dict[tuple, list[tuple[list[int], Aliasing | None]] | None] = {}

    def calls(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: Parts) -> list[list[int]] | None:
        """`describe` of each of `parts(a, b, out)`, or None where one is not described."""
        key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, a.dtype, b.dtype, out.dtype)
        template = self.layouts.get(key, False)
        if template is False:
            if len(self.layouts) >= self.LIMIT:
                self.layouts.clear()
            template = self.layouts[key] = self._template(a, b, out, parts)
        if template is None or not _aligned(a, b, out):  # aligned operands: aligned parts (steps are whole items)
            return None
        a_at, b_at, out_at = (x.ctypes.data for x in (a, b, out))
        found = []
        for offsets, aliasing in template:
            if aliasing is not None and _aliased(a_at - b_at, aliasing):
                return None
            call = offsets.copy()
            call[A] += a_at
            call[B] += b_at
            call[C] += out_at
            found.append(call)
        return found

    @staticmethod
    def _template(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: Parts
                  ) -> list[tuple[list[int], Aliasing | None]] | None:
        bases = [x.ctypes.data for x in (a, b, out)]
        found = []
        for part in parts(a, b, out):
            layout = _layout(*part)
            if layout is None:
                return None
            call, aliasing = layout
            call[A], call[B], call[C] = call[A] - bases[0], call[B] - bases[1], call[C] - bases[2]
            if aliasing is not None:  # relative to the operands' gap
                aliasing = (aliasing[0] - (bases[0] - bases[1]), *aliasing[1:])
            found.append((call, aliasing))
        return found
