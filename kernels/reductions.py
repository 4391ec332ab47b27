"""Scalar helpers the generated kernels call, compiled with their own floating-point flags.

`add_reassoc` carries LLVM's `reassoc` flag on its one addition: once LLVM inlines it into a
kernel's loop, the loop vectoriser may reorder that sum (and only that sum) into SIMD lanes,
while every other operation of the kernel keeps strict IEEE semantics.
"""
from numba import njit


@njit(fastmath={"reassoc"}, error_model="numpy")
def add_reassoc(acc, value):  # type: ignore[no-untyped-def]
    return acc + value
