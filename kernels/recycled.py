"""Small outputs of a settled call, recycled by its generated code (`Executable.steady_source`).

A settled call allocates every kernel output afresh; at a few hundred nanoseconds each, for a call of a few
microseconds, that is a large share of it. An output of at most RING_BYTES gets a ring of two arrays in the
generated function: a call takes the older one when reference counts show that only the ring holds it, else the
newer one on the same test, else a new array, which becomes the newer one. Two, because `loss, grads =
f.value_and_grad(...)` in a loop still holds the last call's results while the next call runs. The test is the
buffer pool's (`jitgrad.kernels.buffers`): an array the user kept, or any view of it, is never overwritten. With
pooling off (`JITGRAD_BUFFER_POOL_MB=0`, or an interpreter whose counts cannot tell) every output is allocated.
"""
from __future__ import annotations

import sys
from typing import Any

from jitgrad.kernels import buffers
from jitgrad.kernels.pool_limit import pool_limit_bytes

RING_BYTES = 4096  # larger outputs are allocated afresh: their kernels take long enough that allocation is noise
SOLE_OWNER = buffers.SOLE_OWNER  # the ring's list, the generated function's local name, getrefcount's argument


def enabled() -> bool:
    """Do settled calls recycle their small outputs in this process (`buffers.POOLING` and a pool limit above 0)?"""
    return buffers.POOLING and pool_limit_bytes() > 0


def take_lines(var: str, allocate: str, ring: str, index: int) -> list[str]:
    """Generated lines binding `var` to a free array of the ring `ring` (a list, two places per output from
    2 * index), or to the new array of the expression `allocate`. Older place first: with the last call's results
    held, it is the one free. The array taken becomes the newer one."""
    older, newer = f"{ring}[{2 * index + 1}]", f"{ring}[{2 * index}]"
    swap = f"{older} = {newer}; {newer} = {var}"
    return [f"{var} = {older}",
            f"if refcount({var}) == {SOLE_OWNER}: {swap}",
            "else:",
            f"    {var} = {newer}",
            f"    if refcount({var}) != {SOLE_OWNER}: {var} = {allocate}; {swap}"]


def names() -> dict[str, Any]:
    """What `take_lines` reads besides the ring: the reference count."""
    return {"refcount": sys.getrefcount}
