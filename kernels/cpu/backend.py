"""The CPU backend's adapter (`jitgrad.runtime.backends.Backend`): numba's CPU kernels on numpy arrays."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.ir.graph import Aval
from jitgrad.kernels.build import compiler
from jitgrad.kernels.cpu import first_call, variants
from jitgrad.kernels.cpu.executor import Executable
from jitgrad.kernels.host import as_array, cotangent_array
from jitgrad.passes.loops import Program


class CpuBackend:
    """numba's CPU kernels on numpy arrays; 0-d results come back as numpy scalars, as numpy's do."""

    name = "cpu"
    title = "CPU"
    on_host = True
    repeat_calls = True

    @staticmethod
    def device_aval(x: Any) -> Aval | None:
        """None: the CPU's arrays are numpy's, which `jitgrad.runtime.arguments` describes itself."""
        return None

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
        """Process-wide: kernel sources loaded, machine-code builds, kernels loaded from the disk cache, first
        calls run on numpy while their kernels compiled (`first_call`), and calls kept on one core (`variants`)."""
        st = compiler.stats()
        return {"kernels": st["sources"], "compiles": st["builds"], "disk_loads": st["disk_hits"],
                "numpy_calls": first_call.STATS["numpy_calls"], "one_core_calls": variants.STATS["one_core_calls"]}
