"""One OpenBLAS thread for jitgrad's small matrix products, by a fixed rule on their shape.

numpy's OpenBLAS splits every product above about 2^18 multiply-adds over its threads. On a machine
whose cores other work keeps busy, each split product waits for a thread that must first get a core:
measured on 2 cores beside other jobs, the small transformer block's step took 190-350 ms in three of
five fresh processes (each of its 68 products about 3 ms) against 6 ms with one OpenBLAS thread.
Products of at most SMALL_PRODUCT multiply-adds (0.5-2 ms on one core) gain little from a second
thread even on an idle machine, so they run on one: the count is set to 1 around the product and
put back after it. The rule reads the shape only, never the load, so a product's bits are the same
in every run (OpenBLAS's bits depend on its thread count). Larger products keep numpy's setting.

The count is process-wide: a numpy product another thread starts while a small product runs here
also gets one thread. Nested and concurrent small products share one setting (a depth count under a
lock); where numpy's BLAS is not OpenBLAS, or its thread count cannot be found, nothing changes.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import numpy as np

SMALL_PRODUCT = 1 << 24  # multiply-adds: every product of the small bench models, and the medium LSTM's per step
_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")


def _openblas() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """numpy's OpenBLAS thread-count setter and getter, found among the libraries this process mapped."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, s) for s in _SETTERS if hasattr(lib, s)), None)
        getter = next((getattr(lib, g) for g in _GETTERS if hasattr(lib, g)), None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
            return setter, getter
    return None


class _OneThread:
    """Holds OpenBLAS at one thread while any small product runs, then restores the count found."""

    def __init__(self) -> None:
        self.found = _openblas()
        self.lock = threading.Lock()
        self.depth = 0
        self.saved = 0

    def enter(self) -> bool:
        if self.found is None:
            return False
        setter, getter = self.found
        with self.lock:
            if self.depth == 0:
                self.saved = getter()
                if self.saved <= 1:
                    return False
                setter(1)
            self.depth += 1
        return True

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.found[0](self.saved)


_one_thread = _OneThread()


def multiply_adds(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """Multiply-adds of a (..., M, K) @ (..., K, N) product, batch dimensions broadcast."""
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return int(np.prod(batch, dtype=np.int64)) * a_shape[-2] * a_shape[-1] * b_shape[-1]


def matmul(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> np.ndarray:
    """np.matmul, on one OpenBLAS thread when the product has at most SMALL_PRODUCT multiply-adds."""
    if a.ndim < 2 or b.ndim < 2 or multiply_adds(a.shape, b.shape) > SMALL_PRODUCT or not _one_thread.enter():
        return np.matmul(a, b, **kwargs)
    try:
        return np.matmul(a, b, **kwargs)
    finally:
        _one_thread.exit()
