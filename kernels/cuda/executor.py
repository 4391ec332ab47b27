"""CUDA runtime: a scheduled `Program` run on device arrays with the kernels of `jitgrad.kernels.cuda.codegen`.

Inputs: numba device arrays are used as they are, other objects exposing
`__cuda_array_interface__` (CuPy arrays, PyTorch CUDA tensors) are wrapped without a copy, and
anything else (numpy arrays, Python numbers) is copied to the device once per call (counted in
`stats()["host_to_device_copies"]`). Outputs are fresh numba device arrays, 0-d results included.

Fused kernels launch the generated code. Host steps stay on the device: matmul runs a tiled
shared-memory kernel, or cuBLAS through CuPy when CuPy is installed on a GPU machine
(`JITGRAD_CUDA_MATMUL=tiled|cublas` forces one); views a host step or an output needs are gathered
into fresh arrays by a copy kernel. Host primitives with no device kernel yet (slice, pad,
concatenate, gather, scatter_add, argmax, argmin, custom Functions) run their numpy reference on
copies, counted in `stats()["host_round_trips"]`.

Device code is compiled in memory (not persisted across processes): one module per generated source,
and numba compiles each kernel once per argument signature (`stats()["device_compiles"]`). All
launches go to the default stream, so results are ready for any consumer on that stream.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numba
import numpy as np
from numba import cuda

from jitgrad.errors import UnsupportedError
from jitgrad.passes.loops import HostStep, Load, LoopKernel, Program, Stage, Store, is_transparent, view_kernel
from jitgrad.ir.graph import Atom, Aval, Var
from jitgrad.kernels.cuda import codegen as kc
from jitgrad.ir.primitive import Kind
from jitgrad.kernels.buffers import outputs_to_copy
from jitgrad.kernels.common import scalar_values
from jitgrad.kernels.slots import SlotTable, release_after, run_steps

_lock = threading.RLock()
_modules: dict[str, "DeviceModule"] = {}
_STATS = {"sources": 0, "device_compiles": 0, "launches": 0, "host_to_device_copies": 0, "host_round_trips": 0}


def is_simulator() -> bool:
    """Whether numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1 before numba was first imported)."""
    return bool(numba.config.ENABLE_CUDASIM)


def target() -> str:
    """The code generator's target for this process: ``simulator`` or ``gpu``."""
    return "simulator" if is_simulator() else "gpu"


def require_device() -> None:
    """Raise a jitgrad error naming what is missing unless CUDA code can run here."""
    if getattr(cuda, "implementation", "Built-in") != "NVIDIA":
        raise UnsupportedError("device='cuda' needs the numba-cuda package (numba's CUDA target), which is not "
                               "installed: pip install 'jitgrad[cuda]'")
    if is_simulator() or cuda.is_available():
        return
    reason = " ".join(str(cuda.cuda_error() or "no CUDA GPU was found").split())
    raise UnsupportedError(f"device='cuda' needs a CUDA GPU and driver, and none is usable here ({reason}); "
                           f"to run on numba's CUDA simulator instead, set NUMBA_ENABLE_CUDASIM=1 before numba is "
                           f"first imported")


def stats() -> dict[str, int]:
    with _lock:
        return dict(_STATS)


def _count(key: str, n: int = 1) -> None:
    with _lock:
        _STATS[key] += n


# ---------------------------------------------------------------------- compiled modules

@dataclass
class DeviceModule:
    """The CUDA kernels of one generated source; each compiles on its first launch with new argument types."""

    source: str
    kernels: dict[str, Any]
    signatures: set[tuple] = field(default_factory=set)

    def launch(self, launch: kc.Launch, args: Sequence[Any]) -> None:
        signature = (launch.function, tuple(numba.typeof(a) for a in args))
        if signature not in self.signatures:
            with _lock:
                if signature not in self.signatures:
                    self.signatures.add(signature)
                    _STATS["device_compiles"] += 1
        self.kernels[launch.function][launch.blocks, launch.threads](*args)
        _count("launches")


def load(source: str, names: Sequence[str]) -> DeviceModule:
    """The kernels `names` of `source`, made once per source text in this process."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _lock:
        found = _modules.get(key)
        if found is not None:
            return found
        filename = f"<jitgrad-cuda-{key}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict[str, Any] = {"__name__": f"jitgrad_cuda_{key}"}
        exec(compile(source, filename, "exec"), namespace)
        module = DeviceModule(source, {n: cuda.jit(namespace[n]) for n in names})
        _modules[key] = module
        _STATS["sources"] += 1
        return module


def kernel_module(k: LoopKernel) -> DeviceModule:
    return load(kc.module_source(k, target()), kc.function_names(k))


# ---------------------------------------------------------------------- arrays

def as_device_array(x: Any, aval: Aval) -> Any:
    """`x` as a device array of `aval`'s dtype: device arrays without a copy, host values copied once."""
    if getattr(x, "__cuda_ndarray__", False):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    _count("host_to_device_copies")
    return cuda.to_device(np.asarray(x, dtype=aval.dtype, order="C"))


def _flat0(a: Any) -> Any:
    """Kernels index 0-d arrays as 1-element vectors."""
    return a.reshape(1) if a.ndim == 0 else a


def identity_index(aval: Aval) -> tuple:
    """The index of every point of an array over its own domain (length-1 axes read index 0)."""
    return tuple(None if d == 1 else a for a, d in enumerate(aval.shape))


def gather_kernel(source: Atom, out: Var, index: tuple) -> LoopKernel:
    """A copy kernel writing `out` (contiguous) from `source` read at `index` (domain axes or None)."""
    stage = Stage(body=[Load("v1", 0, index)], stores=[Store(0, identity_index(out.aval), "v1")])
    return LoopKernel(out.aval.shape, (), [source], [], [out], [stage], [], [], [])


# ---------------------------------------------------------------------- steps

class CompiledKernel:
    """A loop kernel bound to its device code, launch configuration and scratch buffers; calling it
    returns fresh output arrays. A lock keeps one call's launches adjacent on the stream, so the
    scratch buffers a full reduction reuses across calls are never shared by two calls at once."""

    def __init__(self, kernel: LoopKernel):
        self.kernel = kernel
        self.module = kernel_module(kernel)
        self.launches = kc.launches(kernel)
        self.scratch = [cuda.device_array(n, d) for n, d in kc.scratch(kernel)]
        self.scalars = [value for _, value in scalar_values(kernel)]
        self.lock = threading.Lock()

    def __call__(self, ins: Sequence[Any]) -> list[Any]:
        outs = [cuda.device_array(o.aval.shape, o.aval.dtype) for o in self.kernel.outputs]
        args = [*self.kernel.domain, *[_flat0(a) for a in ins], *self.scalars, *[_flat0(o) for o in outs],
                *self.scratch]
        with self.lock:
            for launch in self.launches:
                self.module.launch(launch, args)
        return outs


def copy_kernel(aval: Aval) -> CompiledKernel:
    """A kernel returning a C-contiguous copy of any array of `aval` (whatever its strides)."""
    return CompiledKernel(gather_kernel(Var(aval), Var(aval), identity_index(aval)))


@dataclass
class _KernelCall:
    compiled: CompiledKernel
    inputs: list[int]
    outputs: list[int]
    fused: bool  # a kernel of the program (not a copy standing in for a view)

    def run(self, slots: list[Any]) -> None:
        for i, o in zip(self.outputs, self.compiled([slots[i] for i in self.inputs])):
            slots[i] = o


class _Contiguous:
    """Makes a C-contiguous device array of one aval, copying only arrays that are not."""

    def __init__(self, aval: Aval):
        self.copy = copy_kernel(aval)

    def __call__(self, a: Any) -> Any:
        return a if a.is_c_contiguous() else self.copy([a])[0]


def matmul_backend() -> str:
    """``cublas`` (CuPy's cuBLAS, zero-copy) on a GPU where CuPy imports, else ``tiled``; JITGRAD_CUDA_MATMUL
    forces one."""
    choice = os.environ.get("JITGRAD_CUDA_MATMUL", "auto")
    if choice not in ("auto", "tiled", "cublas"):
        raise UnsupportedError(f"JITGRAD_CUDA_MATMUL={choice!r}; expected auto, tiled or cublas")
    if choice != "auto":
        if choice == "cublas" and (is_simulator() or not cupy_available()):
            raise UnsupportedError("JITGRAD_CUDA_MATMUL=cublas needs CuPy on a CUDA GPU")
        return choice
    return "cublas" if not is_simulator() and cupy_available() else "tiled"


def cupy_available() -> bool:
    """Whether CuPy (and so cuBLAS through it) can be imported."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


class _MatmulCall:
    """(..., m, k) @ (..., k, n) on the device, batch dimensions flattened into the grid's z axis."""

    def __init__(self, a: Aval, b: Aval, out: Aval, inputs: list[int], outputs: list[int]):
        *batch, self.m, self.k = a.shape
        self.n = out.shape[-1]
        self.batch = int(np.prod(batch, dtype=np.int64))
        self.out = out
        self.inputs, self.outputs = inputs, outputs
        self.backend = matmul_backend()
        self.contiguous = [_Contiguous(a), _Contiguous(b)]
        self.module = load(kc.matmul_source(out.dtype), ["matmul"])
        self.launch = kc.matmul_launch(self.batch, self.m, self.n)

    def run(self, slots: list[Any]) -> None:
        a, b = (make(slots[i]) for make, i in zip(self.contiguous, self.inputs))
        if self.backend == "cublas":
            import cupy
            out = cuda.as_cuda_array(cupy.matmul(cupy.asarray(a), cupy.asarray(b)), sync=False)
        else:
            out = cuda.device_array(self.out.shape, self.out.dtype)
            if self.batch and self.m and self.n:
                self.module.launch(self.launch, [self.m, self.n, self.k, a.reshape(self.batch, self.m, self.k),
                                                 b.reshape(self.batch, self.k, self.n),
                                                 out.reshape(self.batch, self.m, self.n)])
        slots[self.outputs[0]] = out


@dataclass
class _ReshapeCall:
    """A reshape that regroups axes: a view of a contiguous array (not a fresh array)."""

    contiguous: _Contiguous
    shape: tuple[int, ...]
    inputs: list[int]
    outputs: list[int]

    def run(self, slots: list[Any]) -> None:
        slots[self.outputs[0]] = self.contiguous(slots[self.inputs[0]]).reshape(self.shape)


@dataclass
class _HostCall:
    """A step with no device form: inputs copied to the host, the numpy reference run, results copied back."""

    fn: Callable[..., Any]
    params: dict[str, Any]
    inputs: list[int]
    outputs: list[int]

    def run(self, slots: list[Any]) -> None:
        _count("host_round_trips")
        res = self.fn(*[slots[i].copy_to_host() for i in self.inputs], **self.params)
        results = [res] if len(self.outputs) == 1 else list(res)
        for i, r in zip(self.outputs, results):
            slots[i] = cuda.to_device(np.asarray(r, order="C"))


_Call = _KernelCall | _MatmulCall | _ReshapeCall | _HostCall


class CudaExecutable:
    """A program ready to run on the device: call it with the graph's inputs, get device arrays back."""

    def __init__(self, program: Program):
        self.program = program
        graph = program.graph
        self.table = SlotTable(graph, lambda value: cuda.to_device(np.asarray(value, order="C")))
        self._slot = self.table.slot
        self.input_avals = [v.aval for v in graph.inputs]
        self.calls: list[_Call] = [self._bind(s) for s in program.steps]
        self.output_slots = [self._slot(a) for a in graph.outputs]
        self.initial = self.table.initial
        fresh = {i for c in self.calls if not isinstance(c, _ReshapeCall) for i in c.outputs}
        self.output_copies: list[CompiledKernel | None] = [
            copy_kernel(a.aval) if copy else None
            for a, copy in zip(graph.outputs, outputs_to_copy(self.output_slots, fresh))]
        self.sources = [c.compiled.module.source for c in self.calls if isinstance(c, _KernelCall) and c.fused]
        released = release_after(self.table, [(c.inputs, c.outputs) for c in self.calls], self.output_slots)
        self.steps = list(zip(self.calls, released))

    def _bind(self, step: LoopKernel | HostStep) -> _Call:
        if isinstance(step, LoopKernel):
            return _KernelCall(CompiledKernel(step), [self._slot(a) for a in step.inputs],
                               [self._slot(o) for o in step.outputs], fused=True)
        e = step.eqn
        ins, outs = [self._slot(a) for a in e.inputs], [self._slot(o) for o in e.outs]
        if e.prim.matrix_product:
            return _MatmulCall(e.inputs[0].aval, e.inputs[1].aval, e.out.aval, ins, outs)
        if is_transparent(e):
            copy = view_kernel(e.out, {e.out: e})
            return _KernelCall(CompiledKernel(copy), [self._slot(a) for a in copy.inputs], outs, fused=False)
        if e.prim.kind is Kind.VIEW:  # a view that regroups axes: a contiguous copy, then numpy's reshape
            return _ReshapeCall(_Contiguous(e.inputs[0].aval), e.out.aval.shape, ins, outs)
        return _HostCall(e.prim.impl, dict(e.params), ins, outs)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        slots = list(self.initial)
        slots[:len(args)] = [as_device_array(x, aval) for x, aval in zip(args, self.input_avals)]
        run_steps(self.steps, slots)
        return [slots[s] if copy is None else copy([slots[s]])[0]
                for s, copy in zip(self.output_slots, self.output_copies)]

    @property
    def kernel_count(self) -> int:
        """Fused kernels, as on the CPU (copies and matmuls are not counted)."""
        return sum(isinstance(c, _KernelCall) and c.fused for c in self.calls)
