"""The CUDA backend's adapter (`jitgrad.runtime.backends.Backend`): numba's CUDA target (or its simulator) on device
arrays. It imports no numba: the executor, which does, is imported when a backend is made, so recognising a
device array (`device_aval`) costs CPU-only code nothing."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.errors import InputError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.kernels.host import cotangent_array
from jitgrad.passes.loops import Program


class CudaBackend:
    """numba's CUDA target (or its simulator) on device arrays; host values are moved to the device, results
    stay there (0-d included)."""

    name = "cuda"
    title = "CUDA"
    on_host = False
    repeat_calls = False

    def __init__(self) -> None:
        self.runtime = runtime()
        self.runtime.require_device()

    @staticmethod
    def device_aval(x: Any) -> Aval | None:
        """Shape and dtype of a CUDA device array (numba's, or anything with `__cuda_array_interface__`: CuPy
        arrays, PyTorch CUDA tensors); None for anything else."""
        interface = getattr(x, "__cuda_array_interface__", None)
        if interface is not None:
            return Aval(tuple(interface["shape"]), np.dtype(interface["typestr"]), False)
        if getattr(x, "__cuda_ndarray__", False):
            return Aval(tuple(x.shape), np.dtype(x.dtype), False)
        return None

    def executable(self, program: Program, label: str) -> Any:
        """`program` bound to device kernels; `label` names it for the CPU's compile progress only: CUDA first
        calls report none yet (a cold device kernel compiles in about 0.2-0.7 s)."""
        return self.runtime.CudaExecutable(program)

    def inputs(self, args: Sequence[Any], avals: Sequence[Aval]) -> list[Any]:
        return list(args)  # the executable moves host values to the device

    def result(self, a: Any) -> Any:
        return a

    def cotangent(self, g: Any, aval: Aval, fname: str, k: int) -> Any:
        on_device = self.device_aval(g)
        if on_device is None:
            return cotangent_array(g, aval, fname, k)
        if on_device.dtype != aval.dtype:
            raise InputError(f"{fname}: cotangent {k} is a {on_device.dtype} device array but output {k} is "
                             f"{aval.dtype}")
        return g  # a device cotangent is used where it lives

    def stats(self) -> dict[str, int]:
        """Process-wide: kernel sources, device compiles; CUDA kernels have no disk cache, and every call runs
        them (no numpy first call)."""
        st = self.runtime.stats()
        return {"kernels": st["sources"], "compiles": st["device_compiles"], "disk_loads": 0, "numpy_calls": 0,
                "one_core_calls": 0}


def runtime() -> Any:
    """The CUDA executor module, imported on first use."""
    try:
        from jitgrad.kernels.cuda import executor
    except ImportError as exc:
        raise UnsupportedError(f"device='cuda' needs numba's CUDA target (pip install 'jitgrad[cuda]'): "
                               f"{exc}") from None
    except RuntimeError as exc:  # numba-cuda loads the CUDA runtime library on import (cuda.pathfinder's error)
        raise UnsupportedError(f"device='cuda' needs the CUDA runtime library, which numba's CUDA target could not "
                               f"load (pip install 'jitgrad[cuda]'): {str(exc).splitlines()[0]}") from None
    return executor
