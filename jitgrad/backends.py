"""Where compiled programs run. A backend compiles a scheduled program into something callable on its
arrays, turns arguments into its inputs and outputs into results, takes cotangents, and counts what it
compiled: the CPU (numba kernels on numpy arrays) and CUDA (numba's CUDA target on device arrays, its
runtime imported on first use, so CPU-only code never loads it)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .arguments import as_array, cotangent_array, device_array_aval
from .errors import InputError, UnsupportedError
from .loops import Program
from .ir import Aval
from .kernels.build import compiler
from .kernels.cpu.executor import Executable


class CpuBackend:
    """numba's CPU kernels on numpy arrays; 0-d results come back as numpy scalars, as numpy's do."""

    name = "cpu"

    def executable(self, program: Program, label: str) -> Executable:
        """`program` bound to compiled kernels; `label` names it in the progress of a slow first call."""
        return Executable(program, label)

    def inputs(self, args: Sequence[Any], avals: Sequence[Aval]) -> list[Any]:
        return [as_array(x, a) for x, a in zip(args, avals)]

    def result(self, a: np.ndarray) -> Any:
        return a[()] if a.ndim == 0 else a

    def cotangent(self, g: Any, aval: Aval, fname: str, k: int) -> Any:
        return cotangent_array(g, aval, fname, k)

    def stats(self) -> dict[str, int]:
        """Process-wide: kernel sources loaded, machine-code builds, and kernels loaded from the disk cache."""
        st = compiler.stats()
        return {"kernels": st["sources"], "compiles": st["builds"], "disk_loads": st["disk_hits"]}


class CudaBackend:
    """numba's CUDA target (or its simulator) on device arrays; host values are moved to the device, results
    stay there (0-d included)."""

    name = "cuda"

    def __init__(self) -> None:
        self.runtime = cuda_runtime()
        self.runtime.require_device()

    def executable(self, program: Program, label: str) -> Any:
        """`program` bound to device kernels; `label` names it for the CPU's compile progress only: CUDA first
        calls report none yet (a cold device kernel compiles in about 0.2-0.7 s)."""
        return self.runtime.CudaExecutable(program)

    def inputs(self, args: Sequence[Any], avals: Sequence[Aval]) -> list[Any]:
        return list(args)  # the executable moves host values to the device

    def result(self, a: Any) -> Any:
        return a

    def cotangent(self, g: Any, aval: Aval, fname: str, k: int) -> Any:
        on_device = device_array_aval(g)
        if on_device is None:
            return cotangent_array(g, aval, fname, k)
        if on_device.dtype != aval.dtype:
            raise InputError(f"{fname}: cotangent {k} is a {on_device.dtype} device array but output {k} is "
                             f"{aval.dtype}")
        return g  # a device cotangent is used where it lives

    def stats(self) -> dict[str, int]:
        """Process-wide: kernel sources, device compiles; CUDA kernels have no disk cache."""
        st = self.runtime.stats()
        return {"kernels": st["sources"], "compiles": st["device_compiles"], "disk_loads": 0}


def cuda_runtime() -> Any:
    """The CUDA runtime module, imported on first use."""
    try:
        from .kernels.cuda import executor
    except ImportError as exc:
        raise UnsupportedError(f"device='cuda' needs numba's CUDA target (pip install 'jitgrad[cuda]'): "
                               f"{exc}") from None
    return executor


def backend(device: str) -> CpuBackend | CudaBackend:
    """The backend of `device` ("cpu" or "cuda")."""
    if device == "cpu":
        return CpuBackend()
    if device == "cuda":
        return CudaBackend()
    raise UnsupportedError(f"device {device!r} is not available; jitgrad supports device='cpu' and 'cuda'")
