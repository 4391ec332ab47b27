"""Lighter LLVM optimisation while a generated kernel compiles: no per-function round, and the whole-module
round at level KERNEL_MODULE_OPT instead of numba's OPT (3).

numba optimises each function of a new library at its OPT level on its own, then the linked module at that
level again. For the generated kernels (and what they compile on the way: vecmath, np.empty) the first round
is redundant: the same bits and the same speed over the bench models' kernels, and about 10% less time in a
cold first call (transformer 4.0-4.3 -> 3.5-3.8 s with the compile helper, interleaved). The module round at
level 2 rather than 3 gives the same bits (no fast-math flags: LLVM may not reorder float arithmetic at any
level) and the same speed over the bench models' kernels (sum of the per-kernel minimum run times of the
transformer's twenty kernels at both sizes, 8557 us at 3 and 8570 us at 2), while its passes and the machine
code generation after them (less unrolled code) take about a quarter less time. Other numba code in the
process, compiled outside a kernel's compile, is optimised as numba does it. With a numba that lacks these
methods, nothing changes.
"""
from __future__ import annotations

import threading
from typing import Any

from numba.core import codegen as numba_codegen

KERNEL_MODULE_OPT = 2  # LLVM level of the whole-module round in a kernel's compile (part of the disk cache key)
_thread = threading.local()  # per thread: `depth`, how many kernel compiles are under way (a kernel's nests)


def kernel_compile_started() -> None:
    """This thread starts compiling a generated kernel (numba compiles a kernel's callees inside it)."""
    _thread.depth = depth() + 1


def kernel_compile_ended() -> None:
    """This thread's innermost kernel compile ended."""
    _thread.depth = depth() - 1


def depth() -> int:
    """How many generated kernels this thread is compiling."""
    return getattr(_thread, "depth", 0)


def cache_tag() -> tuple[str, int]:
    """What these passes change in a kernel's machine code, for the disk cache key."""
    return ("kernel-module-opt", KERNEL_MODULE_OPT)


def _install() -> None:
    codegen = numba_codegen.CPUCodegen
    module_passes = getattr(codegen, "_module_pass_manager", None)
    if module_passes is not None:
        def module_pass_manager(self: Any, **kwargs: Any) -> Any:
            if depth() and "opt" not in kwargs:  # the full round; numba's cheap round before it names its level
                kwargs["opt"] = KERNEL_MODULE_OPT
            return module_passes(self, **kwargs)

        codegen._module_pass_manager = module_pass_manager

    library = numba_codegen.CPUCodeLibrary
    function_passes = getattr(library, "_optimize_functions", None)
    if function_passes is not None:
        def optimize_functions(self: Any, ll_module: Any) -> None:
            if not depth():
                function_passes(self, ll_module)
                return
            ll_module.data_layout = self._codegen._data_layout  # what numba's method sets before its passes

        library._optimize_functions = optimize_functions


_install()
