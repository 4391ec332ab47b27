"""Skips numba's per-function optimisation round while a generated kernel compiles.

numba optimises each function of a new library at its OPT level on its own, then the linked module at that
level again. For the generated kernels (and what they compile on the way: vecmath, np.empty) the first round
is redundant: the same bits and the same speed over the bench models' kernels, and about 10% less time in a
cold first call (transformer 4.0-4.3 -> 3.5-3.8 s with the compile helper, interleaved). Other numba code in
the process, compiled outside a kernel's compile, is optimised as numba does it. With a numba that lacks the
method, nothing is skipped.
"""
from __future__ import annotations

import threading
from typing import Any

from numba.core import codegen as numba_codegen

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


def _install() -> None:
    library = numba_codegen.CPUCodeLibrary
    original = getattr(library, "_optimize_functions", None)
    if original is None:
        return

    def optimize_functions(self: Any, ll_module: Any) -> None:
        if not depth():
            original(self, ll_module)
            return
        ll_module.data_layout = self._codegen._data_layout  # what numba's method sets before its passes

    library._optimize_functions = optimize_functions


_install()
