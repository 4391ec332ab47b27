"""Host views that many BLAS calls read, copied contiguous once per call. OpenBLAS packs a transposed operand
of a small product more slowly than a contiguous one (an LSTM's dz @ Wh.T, (32, 256) @ (256, 64): 20 us against
10 us), and a loop unrolled by tracing reads the same weight's transpose once per step: one copy (7 us there)
serves them all. The products give the same numbers either way (checked bit for bit on this machine's OpenBLAS);
only their time changes."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.ir.graph import Var
from jitgrad.passes.loops import HostStep, LoopKernel
from jitgrad.ir.primitive import Kind

MIN_READERS = 8  # fewer: the copy costs about what the readers save (at (1024, 512) @ (512, 512), more)
MAX_BYTES = 4 << 20  # larger products spend their time multiplying, not packing


def copied_views(steps: Sequence[LoopKernel | HostStep]) -> set[Var]:
    """Outputs of host views read by at least MIN_READERS host steps in operand positions their primitive reads
    faster contiguous (`Primitive.contiguous_operands`), of at most MAX_BYTES."""
    readers: Counter[Var] = Counter()
    for s in steps:
        if isinstance(s, HostStep):
            readers.update(s.eqn.inputs[p] for p in s.eqn.prim.contiguous_operands)
    return {o for s in steps if isinstance(s, HostStep) and s.eqn.prim.kind is Kind.VIEW for o in s.eqn.outs
            if readers[o] >= MIN_READERS and int(np.prod(o.aval.shape)) * o.aval.dtype.itemsize <= MAX_BYTES}


def contiguous(impl: Callable[..., Any], into: bool = False) -> Callable[..., Any]:
    """`impl` whose result is made C-contiguous (a copy where the view is strided); `into`: always copied into
    the `out=` array it is given (a pooled one)."""
    def copied(*args: Any, **params: Any) -> Any:
        return np.ascontiguousarray(impl(*args, **params))

    def copied_into(*args: Any, out: np.ndarray, **params: Any) -> Any:
        np.copyto(out, impl(*args, **params))
        return out
    return copied_into if into else copied
