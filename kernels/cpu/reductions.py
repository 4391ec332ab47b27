"""Helpers the generated kernels call to combine reductions in vectorisable form.

`maximum_propagating`/`minimum_propagating` are LLVM's `llvm.maximum`/`llvm.minimum`: NaN in
either operand gives NaN (numpy's rule) and -0.0 orders below +0.0. LLVM vectorises reductions
over them, which it cannot do for a compare-and-select that tests for NaN.

`block_sum` sums a block of float32 or float64 values in a fixed order, fast and reproducible.
"""
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _float_intrinsic(name: str) -> Any:
    """A numba intrinsic calling the LLVM intrinsic `name` on two floats of the same type."""
    def typer(typingctx: Any, a: Any, b: Any) -> Any:
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            t = args[0].type
            return builder.call(builder.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t, t])), args)
        return a(a, b), codegen
    typer.__name__ = name.replace("llvm.", "") + "_propagating"
    return intrinsic(typer)


maximum_propagating = _float_intrinsic("llvm.maximum")
minimum_propagating = _float_intrinsic("llvm.minimum")


LANES = {types.float32: 64, types.float64: 32}  # independent lane sums: eight 256-bit adds in flight


@intrinsic
def _lane_sums(typingctx: Any, buf: Any, m: Any) -> Any:
    """Sum of the float `buf[:m]`: lane k adds elements k, k + LANES, ... in order (one
    <LANES x float> add per step; the last, partial step reads the remaining elements into a zeroed
    vector, so nothing past `buf[m - 1]` is touched), then lanes combine as a balanced tree of
    halves: lane k adds lane k + LANES/2, then k + LANES/4, ... (vertical adds of whole registers)."""
    if not (isinstance(buf, types.Array) and buf.dtype in LANES and buf.ndim == 1 and buf.layout == "C"
            and isinstance(m, types.Integer)):
        return None
    lane_count = LANES[buf.dtype]
    element = ir.FloatType() if buf.dtype == types.float32 else ir.DoubleType()
    alignment = buf.dtype.bitwidth // 8  # what the array guarantees, not the vector's width

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        vector = ir.VectorType(element, lane_count)
        zeros = ir.Constant(vector, [0.0] * lane_count)
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        count = args[1]
        lanes = ir.Constant(count.type, lane_count)
        steps = builder.udiv(count, lanes)
        acc = cgutils.alloca_once_value(builder, zeros)
        with cgutils.for_range(builder, steps) as loop:
            start = builder.gep(data, [builder.mul(loop.index, lanes)])
            terms = builder.load(builder.bitcast(start, vector.as_pointer()), align=alignment)
            builder.store(builder.fadd(builder.load(acc), terms), acc)
        done = builder.mul(steps, lanes)
        rest = builder.sub(count, done)
        partial = cgutils.alloca_once(builder, vector)
        with builder.if_then(builder.icmp_unsigned(">", rest, ir.Constant(count.type, 0))):
            builder.store(zeros, partial)
            elements = builder.bitcast(partial, data.type)
            with cgutils.for_range(builder, rest) as tail:
                builder.store(builder.load(builder.gep(data, [builder.add(done, tail.index)])),
                              builder.gep(elements, [tail.index]))
            builder.store(builder.fadd(builder.load(acc), builder.load(partial)), acc)
        total = builder.load(acc)
        width = lane_count
        while width > 1:
            width //= 2
            halves = [ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(first, first + width)))
                      for first in (0, width)]
            total = builder.fadd(builder.shuffle_vector(total, total, halves[0]),
                                 builder.shuffle_vector(total, total, halves[1]))
        return builder.extract_element(total, ir.Constant(ir.IntType(32), 0))
    return buf.dtype(buf, m), codegen


@njit(error_model="numpy")
def block_sum(buf, m):  # type: ignore[no-untyped-def]
    """Sum of the float `buf[:m]` in one fixed order: LANES interleaved lane sums (a missing
    term counts as +0.0, which changes no lane), combined pairwise. Strict IEEE arithmetic
    (explicit vector adds, nothing reordered), so every kernel summing the same values gets the
    same bits; each lane adds few terms, so the error is that of a pairwise sum."""
    return _lane_sums(buf, np.int64(m))
