"""The conditions a benchmark process runs in (issue 33): which of torch and jitgrad it imports first, and
whether a busy neighbour keeps a core occupied.

Users write `import torch` first ("torch-first"); "jitgrad-first" is the other order. Until 2026-12-06
`import jitgrad` set OMP_WAIT_POLICY=PASSIVE, which reached torch's OpenMP runtime only jitgrad-first; it
changes nothing in torch's runtime now, but the order still decides which library loads its libraries
first. The order is fixed per process, so bench/run.py puts
it in IMPORT_ORDER_ENV for its children and bench/models.py calls `import_first` before it imports
the workloads (which import both). The busy neighbour is a `python -c` loop spinning on one core,
as another program on the machine would. Only the standard library is imported here, so bench/run.py
can import this module before torch or jitgrad.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from typing import Iterator

IMPORT_ORDERS = ("torch-first", "jitgrad-first")
IMPORT_ORDER_ENV = "JITGRAD_BENCH_IMPORT_ORDER"
BUSY_LIMIT_S = 600.0  # the neighbour stops by itself after this long, should the benchmark die without killing it
OPENBLAS_HINTS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # they slow a current numpy's BLAS (bench/run.py)
SPIN = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def requested_order() -> str:
    """The import order this process was asked for: IMPORT_ORDER_ENV, torch-first if unset."""
    order = os.environ.get(IMPORT_ORDER_ENV, IMPORT_ORDERS[0])
    if order not in IMPORT_ORDERS:
        raise ValueError(f"{IMPORT_ORDER_ENV}={order!r}; choose from {IMPORT_ORDERS}")
    return order


def import_first(order: str) -> None:
    """Import torch (torch-first) or jitgrad (jitgrad-first), unless the process imported either already."""
    if "torch" not in sys.modules and "jitgrad" not in sys.modules:
        importlib.import_module("torch" if order == "torch-first" else "jitgrad")


def observed_order() -> str:
    """Which of torch and jitgrad this process imported first (sys.modules keeps the order of imports)."""
    first = next((name for name in sys.modules if name in ("torch", "jitgrad")), None)
    return f"{first}-first" if first else "neither imported"


def unset_openblas_hints() -> dict[str, str]:
    """Remove OPENBLAS_HINTS from this process's environment (before numpy loads its BLAS; children inherit it);
    the values removed."""
    return {k: os.environ.pop(k) for k in OPENBLAS_HINTS if k in os.environ}


def mode_label(order: str, busy: bool) -> str:
    """The table's mode of a model row: the import order, and ", busy" beside a busy neighbour."""
    return f"{order}, busy" if busy else order


@contextlib.contextmanager
def busy_neighbour(busy: bool = True) -> Iterator[subprocess.Popen | None]:
    """While open, a child process spins on one core (at most BUSY_LIMIT_S); killed on exit. Nothing if not busy."""
    if not busy:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(limit=BUSY_LIMIT_S)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
