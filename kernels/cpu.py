"""CPU lowering: a fused `LoopKernel` becomes Python source compiled by numba.

The source has a parallel variant (`prange` over the outermost kept axis, or over chunks of the
first reduced axis for full reductions) and a serial one for small domains. Lengths are runtime
arguments, so one compiled kernel serves every length of the same rank, dtypes and layout.
Scalar constants are typed arguments too (numba would type a bare `1.0` as float64 and promote
float32 math). No fast-math: numbers match numpy's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitgrad.fusion import Compute, Load, LoopKernel, Reduction, Stage, Store

PARALLEL_MIN_SIZE = 1 << 15  # smaller domains always run the serial variant; larger ones time both
CHUNKS = 64  # parallel chunks of a full reduction

HEADER = "import math\n\nimport numpy as np\nfrom numba import prange\nfrom jitgrad.kernels.reductions import add_reassoc\nfrom jitgrad.kernels.vecmath import vexp, vexpm1, vlog, vlog1p, vsigmoid, vtanh\n"


def numba_type(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def accumulator_dtype(r: Reduction) -> np.dtype:
    """Sums of float32 accumulate in float64 (then round once), like numpy's pairwise sum is accurate."""
    if r.prim.name == "reduce_sum" and r.dtype.kind == "f":
        return np.dtype(np.float64)
    return r.dtype


def identity_literal(r: Reduction) -> str:
    dtype = accumulator_dtype(r)
    if r.prim.name == "reduce_sum":
        return f"{numba_type(dtype)}(0)"
    if r.prim.name == "reduce_prod":
        return f"{numba_type(dtype)}(1)"
    big = "np.inf" if dtype.kind == "f" else str(np.iinfo(dtype).max if dtype.kind in "iu" else 1)
    small = "-np.inf" if dtype.kind == "f" else str(np.iinfo(dtype).min if dtype.kind in "iu" else 0)
    return f"{numba_type(dtype)}({small if r.prim.name == 'reduce_max' else big})"


def expression(c: Compute) -> str:
    """The scalar expression of one elementwise op, cast to its IR dtype where numba's rules differ."""
    expr = c.prim.cpu.format(*c.args, cast=numba_type(c.dtype))
    if c.prim.name == "convert" and c.dtype == np.bool_:
        return f"({c.args[0]} != 0)"
    if c.dtype.kind in "iu" and c.prim.name != "convert":
        return f"{numba_type(c.dtype)}({expr})"
    return expr


def index_text(index: tuple, rank: int) -> str:
    if rank == 0:
        return "0"
    return ", ".join(f"i{a}" if a is not None else "0" for a in index)


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)


def _emit_body(w: _Writer, k: LoopKernel, depth: int, body: list[Load | Compute]) -> None:
    for st in body:
        if isinstance(st, Load):
            w.line(depth, f"{st.dst} = a{st.input}[{index_text(st.index, k.inputs[st.input].aval.ndim)}]")
        else:
            w.line(depth, f"{st.dst} = {expression(st)}")


def _emit_stores(w: _Writer, k: LoopKernel, depth: int, stores: list[Store]) -> None:
    for s in stores:
        w.line(depth, f"o{s.output}[{index_text(s.index, k.outputs[s.output].aval.ndim)}] = {s.src}")


def _emit_accumulate(w: _Writer, depth: int, r: Reduction, acc: str, value: str) -> None:
    """Sums go through `add_reassoc` so the loop vectorises; max/min use the primitive's template."""
    typ = numba_type(accumulator_dtype(r))
    combine = "add_reassoc({0}, {1})" if r.prim.name == "reduce_sum" else r.prim.cpu
    w.line(depth, f"{acc} = {combine.format(acc, f'{typ}({value})')}")


def _emit_pass(w: _Writer, k: LoopKernel, depth: int, stage: Stage, loops: list[str]) -> None:
    """One pass over the reduced axes: `loops` open the nest, then loads, math, accumulation, stores."""
    for loop in loops:
        w.line(depth, loop)
        depth += 1
    _emit_body(w, k, depth, stage.body)
    for r in stage.reductions:
        _emit_accumulate(w, depth, r, f"{r.acc}_", r.src)
    _emit_stores(w, k, depth, stage.stores)
    if not loops and not stage.body and not stage.stores:
        w.line(depth, "pass")


def _emit_stage_rows(w: _Writer, k: LoopKernel, depth: int, stage: Stage) -> None:
    """A stage for one kept point: accumulators, loops over the reduced axes, final casts."""
    for r in stage.reductions:
        w.line(depth, f"{r.acc}_ = {identity_literal(r)}")
    _emit_pass(w, k, depth, stage, [f"for i{a} in range(n{a}):" for a in k.reduce_axes])
    for r in stage.reductions:
        w.line(depth, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def _emit_stage_chunked(w: _Writer, k: LoopKernel, stage: Stage, parallel: bool) -> None:
    """A stage of a full reduction: parallel chunks of the first reduced axis, then a serial combine.
    The serial variant uses one chunk: LLVM vectorises that plain loop far better than a chunk nest."""
    first, rest = k.reduce_axes[0], k.reduce_axes[1:]
    w.line(1, f"nc = max(1, min(n{first}, {CHUNKS}))" if parallel else "nc = 1")
    for r in stage.reductions:
        w.line(1, f"{r.acc}_p = np.empty(nc, {numba_type(accumulator_dtype(r))})")
    w.line(1, "for ch in prange(nc):")
    for r in stage.reductions:
        w.line(2, f"{r.acc}_ = {identity_literal(r)}")
    loops = [f"for i{first} in range(ch * n{first} // nc, (ch + 1) * n{first} // nc):"]
    _emit_pass(w, k, 2, stage, loops + [f"for i{a} in range(n{a}):" for a in rest])
    for r in stage.reductions:
        w.line(2, f"{r.acc}_p[ch] = {r.acc}_")
    for r in stage.reductions:
        w.line(1, f"{r.acc}_ = {identity_literal(r)}")
        w.line(1, "for ch in range(nc):")
        _emit_accumulate(w, 2, r, f"{r.acc}_", f"{r.acc}_p[ch]")
        w.line(1, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")


def argument_names(k: LoopKernel) -> list[str]:
    return ([f"n{a}" for a in range(len(k.domain))] + [f"a{i}" for i in range(len(k.inputs))]
            + [f"c{i}" for i in range(len(k.scalars))] + [f"o{i}" for i in range(len(k.outputs))])


def generate(k: LoopKernel, name: str, parallel: bool = True) -> str:
    """numba-ready source of a function `name` computing kernel `k` (outputs are preallocated args)."""
    w = _Writer()
    w.line(0, f"def {name}({', '.join(argument_names(k))}):")
    kept = k.kept_axes
    if kept:
        w.line(1, f"for i{kept[0]} in prange(n{kept[0]}):")
        depth = 2
        for a in kept[1:]:
            w.line(depth, f"for i{a} in range(n{a}):")
            depth += 1
        for stage in k.stages:
            _emit_stage_rows(w, k, depth, stage)
        _emit_body(w, k, depth, k.epilogue)
        _emit_stores(w, k, depth, k.epilogue_stores)
    elif k.reduce_axes:
        for stage in k.stages:
            _emit_stage_chunked(w, k, stage, parallel)
        _emit_body(w, k, 1, k.epilogue)
        _emit_stores(w, k, 1, k.epilogue_stores)
    else:
        for stage in k.stages:
            _emit_stage_rows(w, k, 1, stage)
        _emit_body(w, k, 1, k.epilogue)
        _emit_stores(w, k, 1, k.epilogue_stores)
    w.line(1, "return 0")
    return "\n".join(w.lines) + "\n"


def module_source(k: LoopKernel) -> str:
    """A module defining the kernel twice, `parallel_kernel` and `serial_kernel`, so numba caches each."""
    return HEADER + "\n\n" + generate(k, "parallel_kernel") + "\n\n" + generate(k, "serial_kernel", parallel=False)


def scalar_arguments(k: LoopKernel) -> list[Any]:
    """The typed scalar constants of a kernel (numpy scalars, so numba keeps float32 float32)."""
    return [s.value.reshape(())[()] for s in k.scalars]


def kernel_arguments(k: LoopKernel, arrays: list[np.ndarray], outputs: list[np.ndarray], scalars: list[Any]
                     ) -> list[Any]:
    """The call's arguments: lengths, inputs (0-d made 1-d), typed scalar constants, outputs."""
    ins = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    outs = [o.reshape(1) if o.ndim == 0 else o for o in outputs]
    return [*k.domain, *ins, *scalars, *outs]
