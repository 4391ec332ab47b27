"""Quick machine code for a cold first call's kernels: the same optimised LLVM IR, lowered to machine code
at LLVM's lowest code generation level.

numba turns a kernel's optimised IR into machine code at level 3 (numba's OPT): instruction scheduling,
the greedy register allocator and machine-level loop passes, about a fifth of a kernel's compile. At level
0 (`CODEGEN_LEVEL`) that step is quicker and the code runs about 1.5x slower; the IR, and so every
floating-point operation and its rounding, is the same. A first call that compiles many kernels with the
compile helper compiles them this way (the `quick_kernel` variant, here and in the helper); once one runs
again, its full level compiles in the background (`jitgrad.kernels.cpu.executor`), and later calls run that.

Level 0 normally selects instructions with FastISel, which does not fuse a multiply and an add that
vecmath marks `contract` where the full level does (other bits than the full-level kernel, e.g. float64
log1p); this module turns FastISel off (the LLVM option `-fast-isel=false`, process-wide, which only
matters at level 0: numba's own code is compiled at OPT, and a user's `NUMBA_OPT=0` code then compiles a
little slower), so both levels select instructions the same way and give the same bits
(tests/test_quick_codegen.py). That matters beyond the quick kernels themselves: a vecmath function LLVM
does not inline (float64 log1p) is linked, in every kernel of the process, from the first kernel that
defined it, quick or not. `JITGRAD_QUICK_KERNELS=0` turns quick kernels off.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import llvmlite.binding as llvm
from numba.core import codegen as numba_codegen

CODEGEN_LEVEL = 0  # LLVM's code generation level for quick kernels (part of their disk cache key)
QUICK = {"codegen": "quick"}  # options of a function `compiler.load` compiles the quick way (not numba's)
_thread = threading.local()  # per thread: `depth`, how many quick kernel compiles are under way
_quick: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the dispatchers that compile the quick way
_machines: dict[int, Any] = {}  # id(numba codegen) -> its target machine at CODEGEN_LEVEL
_machines_lock = threading.Lock()


def enabled() -> bool:
    """May a first call compile quick kernels (`JITGRAD_QUICK_KERNELS` not 0)?"""
    return os.environ.get("JITGRAD_QUICK_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def numba_options(options: dict[str, Any]) -> dict[str, Any]:
    """`options` without QUICK's, for numba."""
    return {k: v for k, v in options.items() if k not in QUICK}


def mark(dispatcher: Any, options: dict[str, Any]) -> None:
    """Remember `dispatcher` as one that compiles the quick way when `options` hold QUICK's."""
    if all(options.get(k) == v for k, v in QUICK.items()):
        _quick.add(dispatcher)


def compile_started(dispatcher: Any) -> None:
    """numba starts compiling a kernel on this thread: a quick one makes it (and what it compiles on the
    way) quick until `compile_ended`."""
    if dispatcher in _quick:
        _thread.depth = depth() + 1


def compile_ended(dispatcher: Any) -> None:
    """numba ended compiling a kernel on this thread."""
    if dispatcher in _quick:
        _thread.depth = depth() - 1


def depth() -> int:
    """How many quick kernels this thread is compiling."""
    return getattr(_thread, "depth", 0)


def cache_tag() -> tuple[str, int, str]:
    """What this module changes in a quick kernel's machine code, for the disk cache key."""
    return ("quick-codegen", CODEGEN_LEVEL, "no-fast-isel")


def _machine(codegen: Any) -> Any:
    """A target machine like numba's (same CPU, features, relocation and code model) at CODEGEN_LEVEL."""
    with _machines_lock:
        machine = _machines.get(id(codegen))
        if machine is None:
            options: dict[str, Any] = {"opt": CODEGEN_LEVEL}
            codegen._customize_tm_options(options)
            machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(**options)
            _machines[id(codegen)] = machine
        return machine


def _install() -> None:
    library = numba_codegen.CPUCodeLibrary
    finalize = getattr(library, "_finalize_final_module", None)
    if finalize is None or not hasattr(numba_codegen.CodeLibrary, "_set_compiled_object"):
        return  # another numba: kernels compile as numba does it
    llvm.set_option("", "-fast-isel=false")

    def finalize_final_module(self: Any) -> None:
        # numba hands the engine an object it was given (its disk-cache path) instead of compiling the module;
        # this gives it one made at CODEGEN_LEVEL, kept for numba's serialisation into the disk cache.
        if not depth() or not self._object_caching_enabled or self._compiled_object is not None:
            finalize(self)
            return
        machine_code = _machine(self._codegen).emit_object(self._final_module)
        self._set_compiled_object(machine_code)
        finalize(self)
        self._compiled_object = machine_code

    library._finalize_final_module = finalize_final_module


_install()
