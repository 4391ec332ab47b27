"""CUDA lowering: a fused `LoopKernel` becomes Python source for numba's CUDA target.

Three kernel families, chosen from the loop nest and its lengths (`family`):
- ``elementwise`` (no reduced axes): one grid-stride loop over the flattened domain; each point's
  indices come from the flat index by division, so broadcasts are index arithmetic.
- ``rows`` (reductions with kept points): each block owns one kept point at a time (grid-stride over
  rows); its threads stride over the reduced points and combine with a block reduction per stage.
- ``full`` (reductions over everything): per stage a ``partial_s`` kernel where every block reduces
  its share into one partial per block, then a one-block ``finish_s`` kernel reducing the partials
  (a second pass, deterministic, unlike atomics); later stages read earlier results from 1-element
  buffers, and the last ``finish`` runs the epilogue.

The block reduction uses warp shuffles (`cuda.shfl_down_sync`) for 32/64-bit accumulators on a GPU
and a shared-memory tree otherwise; the simulator has no shuffles, so ``target="simulator"`` always
uses the tree. Scalar functions go through `math` (libdevice) on the GPU and numpy in the
simulator (the templates of `lowerings`, where a primitive's record template does not serve).
Lengths and scalar constants are arguments, as on the CPU: one source serves every length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jitgrad.passes.loops import Branch, Compute, Load, LoopKernel, Reduction, Stage, Store

from jitgrad.kernels.common import (Writer, accumulator_dtype, combine, emit_branch, expression, identity_literal, index_text,
                     numba_type)
from jitgrad.kernels.common import argument_names as kernel_arguments
from jitgrad.kernels.cuda import lowerings

THREADS = 256  # most threads in a block; shared buffers have this length
WARP = 32
MAX_BLOCKS = 4096  # grid-stride loops cover larger domains with this many blocks
MAX_PARTIALS = 1024  # blocks of a full reduction's first pass (one partial each)
TILE = 16  # matmul tile edge: TILE x TILE threads per block
TARGETS = ("gpu", "simulator")

HEADER = "import math\n\nimport numpy as np\nfrom numba import cuda\n"
GPU_HEADER = HEADER + "from numba.cuda import libdevice\n"

SHUFFLE_DTYPES = {np.dtype(t) for t in (np.int32, np.int64, np.float32, np.float64)}


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"unknown CUDA target {target!r}; expected one of {TARGETS}")


BACKENDS = {"gpu": lowerings.GPU, "simulator": lowerings.SIMULATOR}  # the lowerings each target reads
# (`lowerings`): libdevice's math on a GPU; numpy's scalar functions in the simulator, which runs plain Python


def scalar_expression(c: Compute, target: str) -> str:
    """The scalar expression of one elementwise op on `target`, cast to its IR dtype."""
    return expression(c, BACKENDS[target])


def family(k: LoopKernel) -> str:
    """``elementwise``, ``rows`` or ``full`` (see the module docstring)."""
    if not k.reduce_axes:
        return "elementwise"
    return "full" if all(k.domain[a] == 1 for a in k.kept_axes) else "rows"


def reductions(k: LoopKernel) -> list[Reduction]:
    return [r for st in k.stages for r in st.reductions]


def argument_names(k: LoopKernel) -> list[str]:
    """Lengths, inputs, scalars, outputs; a full reduction adds per reduction a partials and a result buffer."""
    names = kernel_arguments(k)
    if family(k) == "full":
        for r in reductions(k):
            names += [f"p_{r.acc}", f"r_{r.acc}"]
    return names


@dataclass
class _Emitter:
    """Writes one kernel function; `target` picks scalar math and the block-reduction style."""

    k: LoopKernel
    target: str
    w: Writer

    def body(self, depth: int, body: list[Load | Compute | Branch]) -> None:
        for st in body:
            if isinstance(st, Load):
                rank = self.k.inputs[st.input].aval.ndim
                self.w.line(depth, f"{st.dst} = a{st.input}[{index_text(st.index, rank)}]")
            elif isinstance(st, Branch):
                emit_branch(self.w, depth, st, self.body)
            else:
                self.w.line(depth, f"{st.dst} = {scalar_expression(st, self.target)}")

    def stores(self, depth: int, stores: list[Store]) -> None:
        for s in stores:
            rank = self.k.outputs[s.output].aval.ndim
            self.w.line(depth, f"o{s.output}[{index_text(s.index, rank)}] = {s.src}")

    def unravel(self, depth: int, flat: str, axes: tuple[int, ...]) -> None:
        """Loop indices i<a> for `axes` (row-major) from the flat index `flat`."""
        if not axes:
            return
        self.w.line(depth, f"q = {flat}")
        for a in reversed(axes[1:]):
            self.w.line(depth, f"i{a} = q % n{a}")
            self.w.line(depth, f"q = q // n{a}")
        self.w.line(depth, f"i{axes[0]} = q")

    def product(self, axes: tuple[int, ...]) -> str:
        return " * ".join(f"n{a}" for a in axes) or "1"

    def combine(self, r: Reduction, acc: str, value: str) -> str:
        return combine(r, acc, value)

    def prologue(self, shared: list[Reduction]) -> None:
        for r in shared:
            self.w.line(1, f"sh_{r.acc} = cuda.shared.array({THREADS}, {numba_type(accumulator_dtype(r))})")
        self.w.line(1, "tid = cuda.threadIdx.x")
        self.w.line(1, "nt = cuda.blockDim.x")
        if self.target == "gpu" and any(accumulator_dtype(r) in SHUFFLE_DTYPES for r in shared):
            self.w.line(1, f"lane = tid % {WARP}")
            self.w.line(1, f"warp = tid // {WARP}")

    def block_reduce(self, depth: int, r: Reduction) -> None:
        """Combine every thread's `<acc>_` into all threads' `<acc>_` (a barrier ends it)."""
        acc, sh, d = f"{r.acc}_", f"sh_{r.acc}", depth
        if self.target == "gpu" and accumulator_dtype(r) in SHUFFLE_DTYPES:
            self._warp_reduce(d, r, acc)
            self.w.line(d, "if lane == 0:")
            self.w.line(d + 1, f"{sh}[warp] = {acc}")
            self.w.line(d, "cuda.syncthreads()")
            self.w.line(d, "if warp == 0:")
            self.w.line(d + 1, f"{acc} = {sh}[lane] if lane < nt // {WARP} else {identity_literal(r)}")
            self._warp_reduce(d + 1, r, acc)
            self.w.line(d + 1, "if lane == 0:")
            self.w.line(d + 2, f"{sh}[0] = {acc}")
        else:
            self.w.line(d, f"{sh}[tid] = {acc}")
            self.w.line(d, "cuda.syncthreads()")
            self.w.line(d, "half = nt // 2")
            self.w.line(d, "while half > 0:")
            self.w.line(d + 1, "if tid < half:")
            self.w.line(d + 2, f"{sh}[tid] = {self.combine(r, f'{sh}[tid]', f'{sh}[tid + half]')}")
            self.w.line(d + 1, "cuda.syncthreads()")
            self.w.line(d + 1, "half = half // 2")
        self.w.line(d, "cuda.syncthreads()")
        self.w.line(d, f"{acc} = {sh}[0]")
        self.w.line(d, "cuda.syncthreads()")

    def _warp_reduce(self, d: int, r: Reduction, acc: str) -> None:
        self.w.line(d, f"offset = {WARP // 2}")
        self.w.line(d, "while offset > 0:")
        self.w.line(d + 1, f"other = cuda.shfl_down_sync(0xFFFFFFFF, {acc}, offset)")  # every lane shuffles
        self.w.line(d + 1, f"{acc} = {self.combine(r, acc, 'other')}")
        self.w.line(d + 1, "offset = offset // 2")

    def stage_loop(self, depth: int, stage: Stage, start: str, step: str, total: str) -> None:
        """Accumulate this thread's share of the reduced points from `start` by `step`."""
        for r in stage.reductions:
            self.w.line(depth, f"{r.acc}_ = {identity_literal(r)}")
        self.w.line(depth, f"p = {start}")
        self.w.line(depth, f"while p < {total}:")
        self.unravel(depth + 1, "p", self.k.reduce_axes)
        self.body(depth + 1, stage.body)
        for r in stage.reductions:
            self.w.line(depth + 1, f"{r.acc}_ = {self.combine(r, f'{r.acc}_', r.src)}")
        self.stores(depth + 1, stage.stores)
        self.w.line(depth + 1, f"p += {step}")


def _signature_line(k: LoopKernel, name: str) -> str:
    return f"def {name}({', '.join(argument_names(k))}):"


def _elementwise(k: LoopKernel, target: str) -> list[str]:
    e = _Emitter(k, target, Writer())
    e.w.line(0, _signature_line(k, "kernel"))
    e.w.line(1, f"total = {e.product(tuple(range(len(k.domain))))}")
    e.w.line(1, "p = cuda.grid(1)")
    e.w.line(1, "step = cuda.gridsize(1)")
    e.w.line(1, "while p < total:")
    e.unravel(2, "p", tuple(range(len(k.domain))))
    for stage in k.stages:
        e.body(2, stage.body)
        e.stores(2, stage.stores)
    e.body(2, k.epilogue)
    e.stores(2, k.epilogue_stores)
    e.w.line(2, "p += step")
    return e.w.lines


def _rows(k: LoopKernel, target: str) -> list[str]:
    e = _Emitter(k, target, Writer())
    e.w.line(0, _signature_line(k, "kernel"))
    e.prologue(reductions(k))
    e.w.line(1, f"rows = {e.product(k.kept_axes)}")
    e.w.line(1, f"red = {e.product(k.reduce_axes)}")
    e.w.line(1, "row = cuda.blockIdx.x")
    e.w.line(1, "while row < rows:")
    e.unravel(2, "row", k.kept_axes)
    for stage in k.stages:
        e.stage_loop(2, stage, "tid", "nt", "red")
        for r in stage.reductions:
            e.block_reduce(2, r)
            e.w.line(2, f"{r.acc} = {numba_type(r.dtype)}({r.acc}_)")
    if k.epilogue or k.epilogue_stores:
        e.w.line(2, "if tid == 0:")
        e.body(3, k.epilogue)
        e.stores(3, k.epilogue_stores)
    e.w.line(2, "row += cuda.gridDim.x")
    return e.w.lines


def _earlier_results(e: _Emitter, stages: list[Stage], depth: int) -> None:
    for st in stages:
        for r in st.reductions:
            e.w.line(depth, f"{r.acc} = r_{r.acc}[0]")


def _partial(k: LoopKernel, target: str, s: int) -> list[str]:
    stage = k.stages[s]
    e = _Emitter(k, target, Writer())
    e.w.line(0, _signature_line(k, f"partial_{s}"))
    e.prologue(stage.reductions)
    _earlier_results(e, k.stages[:s], 1)
    e.stage_loop(1, stage, "cuda.blockIdx.x * nt + tid", "cuda.gridDim.x * nt", e.product(k.reduce_axes))
    for r in stage.reductions:
        e.block_reduce(1, r)
        e.w.line(1, "if tid == 0:")
        e.w.line(2, f"p_{r.acc}[cuda.blockIdx.x] = {r.acc}_")
    return e.w.lines


def _finish(k: LoopKernel, target: str, s: int) -> list[str]:
    stage = k.stages[s]
    e = _Emitter(k, target, Writer())
    e.w.line(0, _signature_line(k, f"finish_{s}"))
    e.prologue(stage.reductions)
    for r in stage.reductions:
        e.w.line(1, f"{r.acc}_ = {identity_literal(r)}")
        e.w.line(1, "p = tid")
        e.w.line(1, f"while p < p_{r.acc}.shape[0]:")
        e.w.line(2, f"{r.acc}_ = {r.prim.reduction.combine.format(f'{r.acc}_', f'p_{r.acc}[p]')}")
        e.w.line(2, "p += nt")
        e.block_reduce(1, r)
    e.w.line(1, "if tid == 0:")
    for r in stage.reductions:
        e.w.line(2, f"r_{r.acc}[0] = {numba_type(r.dtype)}({r.acc}_)")
    if s == len(k.stages) - 1:
        _earlier_results(e, k.stages, 2)
        e.body(2, k.epilogue)
        e.stores(2, k.epilogue_stores)
    return e.w.lines


def has_finish(k: LoopKernel, s: int) -> bool:
    """A full reduction's stage needs a finishing pass if it reduces, or (last) to run the epilogue."""
    return bool(k.stages[s].reductions) or (s == len(k.stages) - 1 and bool(k.epilogue_stores))


def function_names(k: LoopKernel) -> list[str]:
    """The kernel functions `module_source` defines for `k`, in launch order."""
    if family(k) != "full":
        return ["kernel"]
    names = []
    for s in range(len(k.stages)):
        names.append(f"partial_{s}")
        if has_finish(k, s):
            names.append(f"finish_{s}")
    return names


def functions(k: LoopKernel, target: str) -> list[list[str]]:
    """Each kernel function's lines, in launch order (`function_names`)."""
    _check_target(target)
    fam = family(k)
    if fam == "elementwise":
        return [_elementwise(k, target)]
    if fam == "rows":
        return [_rows(k, target)]
    return [(_partial if name.startswith("partial") else _finish)(k, target, int(name.split("_")[1]))
            for name in function_names(k)]


def module_source(k: LoopKernel, target: str) -> str:
    """A module defining the kernel functions of `k` for `target` ("gpu" or "simulator")."""
    header = GPU_HEADER if target == "gpu" else HEADER
    return header + "".join("\n\n" + "\n".join(lines) + "\n" for lines in functions(k, target))


@dataclass
class Launch:
    """One kernel launch: function name in the module, grid and block shape."""

    function: str
    blocks: int | tuple[int, ...]
    threads: int | tuple[int, ...]


def _threads_for(n: int) -> int:
    """A power of two from one warp to THREADS, enough for `n` work items."""
    t = WARP
    while t < THREADS and t < n:
        t *= 2
    return t


def _size(k: LoopKernel, axes: tuple[int, ...]) -> int:
    return int(np.prod([k.domain[a] for a in axes], dtype=np.int64))


def launches(k: LoopKernel) -> list[Launch]:
    """The launches computing `k` at its lengths, in order (none for an empty domain)."""
    fam = family(k)
    if fam == "elementwise":
        size = _size(k, tuple(range(len(k.domain))))
        if size == 0:
            return []
        return [Launch("kernel", min(-(-size // THREADS), MAX_BLOCKS), THREADS)]
    red = _size(k, k.reduce_axes)
    if fam == "rows":
        rows = _size(k, k.kept_axes)
        return [Launch("kernel", min(rows, MAX_BLOCKS), _threads_for(red))] if rows else []
    blocks = partial_blocks(k)
    return [Launch(name, blocks, _threads_for(red)) if name.startswith("partial") else
            Launch(name, 1, _threads_for(blocks)) for name in function_names(k)]


def partial_blocks(k: LoopKernel) -> int:
    """Blocks of a full reduction's first pass, so one partial per block."""
    return max(1, min(-(-_size(k, k.reduce_axes) // THREADS), MAX_PARTIALS))


def scratch(k: LoopKernel) -> list[tuple[int, np.dtype]]:
    """Lengths and dtypes of the partials and result buffers a full reduction passes after its outputs."""
    if family(k) != "full":
        return []
    out: list[tuple[int, np.dtype]] = []
    for r in reductions(k):
        out += [(partial_blocks(k), accumulator_dtype(r)), (1, r.dtype)]
    return out


def matmul_source(dtype: np.dtype) -> str:
    """A batched tiled matmul `matmul(m, n, kk, a, b, o)` over (batch, m, kk) @ (batch, kk, n):
    each TILE x TILE block stages tiles of `a` and `b` in shared memory; accumulates in `dtype`."""
    typ = numba_type(dtype)
    w = Writer()
    w.line(0, "def matmul(m, n, kk, a, b, o):")
    w.line(1, f"ta = cuda.shared.array(({TILE}, {TILE}), {typ})")
    w.line(1, f"tb = cuda.shared.array(({TILE}, {TILE}), {typ})")
    w.line(1, "tx = cuda.threadIdx.x")
    w.line(1, "ty = cuda.threadIdx.y")
    w.line(1, f"col = cuda.blockIdx.x * {TILE} + tx")
    w.line(1, f"row = cuda.blockIdx.y * {TILE} + ty")
    w.line(1, "z = cuda.blockIdx.z")
    w.line(1, f"acc = {typ}(0)")
    w.line(1, f"for k0 in range(0, kk, {TILE}):")
    w.line(2, f"ta[ty, tx] = a[z, row, k0 + tx] if row < m and k0 + tx < kk else {typ}(0)")
    w.line(2, f"tb[ty, tx] = b[z, k0 + ty, col] if col < n and k0 + ty < kk else {typ}(0)")
    w.line(2, "cuda.syncthreads()")
    w.line(2, f"for j in range({TILE}):")
    w.line(3, "acc += ta[ty, j] * tb[j, tx]")
    w.line(2, "cuda.syncthreads()")
    w.line(1, "if row < m and col < n:")
    w.line(2, "o[z, row, col] = acc")
    return HEADER + "\n\n" + "\n".join(w.lines) + "\n"


def matmul_launch(batch: int, m: int, n: int) -> Launch:
    return Launch("matmul", (-(-n // TILE), -(-m // TILE), batch), (TILE, TILE))
