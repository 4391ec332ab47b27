"""jitgrad's matrix products on one OpenBLAS thread, larger ones split in parts, by a fixed rule on their shape.

numpy's OpenBLAS splits every product above about 2^18 multiply-adds over its threads. On a machine
whose cores other work keeps busy, each split product waits for a thread that must first get a core:
measured on 2 cores beside other jobs, the small transformer block's step took 190-350 ms in three of
five fresh processes (each of its 68 products about 3 ms) against 6 ms with one OpenBLAS thread.
So OpenBLAS's thread count is set to 1 around every product jitgrad runs and put back after it: products
of at most SPLIT_FROM multiply-adds (up to 0.3 ms on one core) have numpy's one-thread bits. Products of
more than SPLIT_FROM multiply-adds are cut into PARTS slices of the output (rows, or
columns when there are more of them), each an ordinary one-thread np.matmul into its slice; the caller
computes the first and hands the second to a helper thread when that is idle, taking it back if the
helper has not started it by the time the first is done (cores busy; the helper is then left out for the
next LATE_SKIP products). Each part is the same one-thread call whoever runs it, so the bits never
depend on the load, the core count or whether the parts ran side by side: the rule reads the shape and
dtype only (OpenBLAS's bits depend on its thread count, and a row or column part's bits differ from the
whole product's in the last places). A batched product is cut along a batch dimension where it can be
(`_batch_axis`): numpy makes one gemm call per matrix, so its parts have the whole product's bits.
JITGRAD_BLAS_SPLIT=0 (read at import) turns the split off: larger products up to SMALL_PRODUCT then run on one
thread, larger ones keep numpy's setting. SPLIT_FROM was 2^24 until the medium LSTM's 2^23 and 2^24 products
were measured split (bench/run.py, torch first, two runs each): its step took 33.7-34.5 ms against 40.2-40.5
unsplit (torch.compile 32.8-33.0 in the same runs), and beside a busy core 41.8 against 40.7 ms (the helper then
mostly late, the parts in turn); no other row moved. 2^21 was tried once parts were handed over without the GIL
(blas_handoff) and not kept: products of 2^21 to 2^22 multiply-adds took 62-88 us split against 88-100 us whole,
and the small transformer's step 0.963 of its time with 2^22 alone, but 1.021-1.033 of it right after eager
torch's steps (torch's OpenMP worker then spins on the helper's core; docs/benchmarks.md).
A product whose parts would each have GIL_HELD_OUTPUT output elements or fewer runs whole on one thread: numpy's
matmul keeps the GIL through it, so the helper never started beside it, and each such product, found late,
left the helper out of the next LATE_SKIP products (the medium conv net's first-layer weight gradient, 27 x 32768
by 32768 x 16, did so at every step: 79% of its split products ran their parts in turn on a quiet machine).

The count is process-wide: a numpy product another thread starts while a product runs here also gets
one thread. Nested and concurrent products share one setting (a depth count under a lock); where
numpy's BLAS is not OpenBLAS, or its thread count cannot be found, nothing changes and nothing splits.
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from typing import Any, Callable

import numpy as np

from jitgrad.cores import on_one_core  # a call kept on one core: the parts in turn, the same bits

log = logging.getLogger("jitgrad.blas")
SMALL_PRODUCT = 1 << 24  # multiply-adds: every product of the small bench models, and the medium LSTM's per step
_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")


def _openblas() -> tuple[Callable[[int], None], Callable[[], int], ctypes.CDLL] | None:
    """numpy's OpenBLAS thread-count setter and getter, and the library, found among those this process mapped."""
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
            return setter, getter, lib
    return None


class _OneThread:
    """Holds OpenBLAS at one thread while any small product runs, then restores the count found."""

    def __init__(self) -> None:
        found = _openblas()
        self.found = found and found[:2]
        self.library = found and found[2]
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


def _batch(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """Matrices in a (..., M, K) @ (..., K, N) product: its broadcast batch dimensions' product."""
    return math.prod(_batch_shape(a_shape, b_shape))


def multiply_adds(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """Multiply-adds of a (..., M, K) @ (..., K, N) product, batch dimensions broadcast."""
    return _batch(a_shape, b_shape) * a_shape[-2] * a_shape[-1] * b_shape[-1]


SPLIT_FROM = 1 << 22  # multiply-adds: above this a product is computed as PARTS one-thread products
PARTS = 2  # fixed, like the rule's other inputs: never the machine's core count or load
BATCH_CUT_MIN = 8  # a batch dimension of odd length is cut from this length on (else rows or columns are)
LATE_SKIP = 2  # products run without the helper after it did not start in time (cores busy). It was 16: right
# after torch's ops, whose OpenMP workers spin on a core for milliseconds, one late start then kept the helper out of
# most of the medium transformer's split products after the spin had ended (58.3 ms a step against 39.2 at 2, 36-37
# alone); beside a busy process 2 and 16 took the same (63.7-64.1 against 63.0-66.1 ms; small 4.96 against 5.00 ms)
GIL_HELD_OUTPUT = 500  # numpy 2's matmul releases the GIL only around products of more output elements than this
SPLIT = os.environ.get("JITGRAD_BLAS_SPLIT", "1") != "0"  # JITGRAD_BLAS_SPLIT=0: numpy's product, as before
HANDOFF = os.environ.get("JITGRAD_BLAS_HANDOFF", "1") != "0"  # JITGRAD_BLAS_HANDOFF=0: parts handed over in Python
HANDOFF_AFTER = 32  # split products before blas_handoff is built (a script with a few never compiles it)


def _on_a_thread(job: Callable[[], None]) -> None:
    threading.Thread(target=job, name="jitgrad-blas-handoff-build", daemon=True).start()


background_job: Callable[[Callable[[], None]], None] = _on_a_thread  # how the handoff is built off the caller's
# thread; `import jitgrad` makes it the background-compile queue (runtime.threads.build_blas_handoff_in_background)


def _in_turn(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """A split product's parts computed one after the other on the calling thread."""
    for a, b, out in parts:
        np.matmul(a, b, out=out)


class _Helper:
    """One daemon thread that computes the second part of a split product while the caller computes the
    first. The caller hands a part over only when the helper is idle (a non-blocking try), and takes the
    part back if the helper has not started it when the caller's own part is done, so a helper kept off
    the cores by other work costs at most the handover: the product then runs as two parts in turn. Once
    the process has split HANDOFF_AFTER products, parts that numpy gives to gemm are handed over
    without the GIL (blas_handoff: the helper polls for SPIN_NS after each part), others as before."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by the caller whose part the helper may hold
        self.ready = threading.Semaphore(0)  # the helper sleeps on it
        self.done = threading.Semaphore(0)  # released once for each part the helper claimed
        self.job: tuple[threading.Lock, tuple[np.ndarray, np.ndarray, np.ndarray], list[BaseException]] | None = None
        self.thread: threading.Thread | None = None
        self.skip = 0  # products to run without the helper, after it was late
        self.splits = 0  # split products so far (the handoff is built at HANDOFF_AFTER)
        self.building = False  # whether the handoff's build was submitted
        self.handoff: Any = None  # blas_handoff.Handoff, once built

    def run(self) -> None:
        while True:
            handoff = self.handoff if HANDOFF else None
            if handoff is not None:
                handoff.serve()  # returns when idle for SPIN_NS, or when a part comes the Python way
            self.ready.acquire()
            if self.handoff is not None:
                self.handoff.awake()
            self._take(self.job)  # one read: the claim goes with its part; no array stays bound while waiting

    def _take(self, job: Any) -> None:
        """Compute the offered part unless its caller took it back (a late wake-up)."""
        if job is None or not job[0].acquire(blocking=False):
            return
        (a, b, out), errors = job[1], job[2]
        try:
            np.matmul(a, b, out=out)
        except BaseException as e:  # noqa: BLE001 - the caller raises it
            errors.append(e)
        job = a = b = out = errors = None  # nothing held once the caller goes on: its buffer pool counts refs
        self.done.release()

    def split(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """a @ b into out as the `_parts` of it, the second on the helper when it is free."""
        self.splits += 1
        if self.splits >= HANDOFF_AFTER and HANDOFF and not self.building:
            self.building = True
            background_job(self._build_handoff)
        if on_one_core.on:
            _in_turn(_parts(a, b, out))
            return
        if self.skip > 0 or not self.lock.acquire(blocking=False):
            self.skip = max(self.skip - 1, 0)
            _in_turn(_parts(a, b, out))
            return
        try:
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name="jitgrad-blas-part", daemon=True)
                self.thread.start()
            handoff = self.handoff if HANDOFF else None
            calls = handoff.calls(a, b, out, _parts) if handoff is not None else None
            if calls is not None:
                if not handoff.split(*calls):  # the helper did not claim its part in time
                    self.skip = LATE_SKIP
            else:
                self._split_in_python(_parts(a, b, out), handoff)
        finally:
            self.job = None  # the operands and output are not kept alive
            self.lock.release()

    def _split_in_python(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], handoff: Any) -> None:
        """The second part handed over through Python locks (the caller holds `lock`)."""
        claim, errors = threading.Lock(), []
        self.job = (claim, parts[1], errors)
        if handoff is not None:
            handoff.python_part()
        self.ready.release()
        a, b, out = parts[0]
        np.matmul(a, b, out=out)
        if claim.acquire(blocking=False):  # not started: cores busy, the caller computes it
            self.skip = LATE_SKIP
            a, b, out = parts[1]
            np.matmul(a, b, out=out)
        else:
            self.done.acquire()
            if errors:
                raise errors[0]

    def _build_handoff(self) -> None:
        """Compiles or loads blas_handoff (numba), off the caller's thread (`background_job`); the helper and the
        callers switch to it once it is set."""
        try:
            from jitgrad.ops import blas_handoff  # compiles its functions: only in processes that split many products

            self.handoff = blas_handoff.build(_one_thread.library, self.ready)
        except Exception:  # noqa: BLE001 - a numba or llvmlite without what it needs: the Python handover stays
            log.warning("the GIL-free BLAS handoff did not build; split products keep the Python handover",
                        exc_info=True)


_helper = _Helper()


def _new_helper() -> None:
    """In a forked child: a helper of its own (the parent's thread is not there, its locks may be held)."""
    global _helper
    _helper = _Helper()


os.register_at_fork(after_in_child=_new_helper)


def _batch_axis(batch: tuple[int, ...]) -> int | None:
    """The batch dimension a batched product is cut along: the first of even length, else the first of BATCH_CUT_MIN
    or more (parts within an eighth of each other); None: rows or columns are cut."""
    even = [d for d, n in enumerate(batch) if n >= PARTS and n % PARTS == 0]
    long = [d for d, n in enumerate(batch) if n >= BATCH_CUT_MIN]
    return even[0] if even else long[0] if long else None


def _parts(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The product cut into PARTS: a batched one along a batch dimension (`_batch_axis`), so each part has the
    whole product's bits (numpy's matmul makes one call per matrix, the same in any stack); else slices of the
    output's larger dimension (rows, else columns), so that the operand each part packs again is the smaller one.
    Fixed by the shapes alone."""
    batch = out.shape[:-2]
    axis = _batch_axis(batch)
    if axis is not None:
        edges = [batch[axis] * i // PARTS for i in range(PARTS + 1)]

        def cut(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
            at = axis - len(batch) + x.ndim - 2  # the axis in x (batch dimensions align at the right)
            return x if at < 0 or x.shape[at] == 1 else x[(slice(None),) * at + (slice(lo, hi),)]

        return [(cut(a, lo, hi), cut(b, lo, hi), cut(out, lo, hi)) for lo, hi in zip(edges, edges[1:])]
    m, n = a.shape[-2], b.shape[-1]
    along_rows = m >= n
    size = m if along_rows else n
    edges = [size * i // PARTS for i in range(PARTS + 1)]
    if along_rows:
        return [(a[..., lo:hi, :], b, out[..., lo:hi, :]) for lo, hi in zip(edges, edges[1:])]
    return [(a, b[..., lo:hi], out[..., lo:hi]) for lo, hi in zip(edges, edges[1:])]


def _batch_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast batch dimensions of a (..., M, K) @ (..., K, N) product; () for two matrices."""
    return np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) if len(a_shape) > 2 or len(b_shape) > 2 else ()


def _smallest_part_output(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """Output elements of the smallest of `_parts`' slices (batch dimensions included)."""
    m, n = a_shape[-2], b_shape[-1]
    batch = _batch_shape(a_shape, b_shape)
    axis = _batch_axis(batch)
    if axis is not None:
        return math.prod(batch) // batch[axis] * (batch[axis] // PARTS) * m * n
    return math.prod(batch) * (max(m, n) // PARTS) * min(m, n)


def splits(a: np.ndarray, b: np.ndarray, madds: int | None = None) -> bool:
    """Whether matmul computes this product as PARTS one-thread products (a rule on shape and dtype). Not where a
    part's output would have GIL_HELD_OUTPUT elements or fewer: numpy's matmul keeps the GIL through such a
    product, so the helper could not start beside the caller's part."""
    return (SPLIT and a.ndim >= 2 and b.ndim >= 2 and _one_thread.found is not None
            and (multiply_adds(a.shape, b.shape) if madds is None else madds) > SPLIT_FROM
            and a.dtype == b.dtype and a.dtype in (np.float32, np.float64)
            and max(a.shape[-2], b.shape[-1]) >= 2 * PARTS
            and _smallest_part_output(a.shape, b.shape) > GIL_HELD_OUTPUT)


def matmul(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> np.ndarray:
    """np.matmul on one OpenBLAS thread; above SPLIT_FROM multiply-adds as PARTS one-thread products into
    slices of the output, side by side when the helper is free. Without the split, products above
    SMALL_PRODUCT keep numpy's setting."""
    if a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b, **kwargs)
    out, madds = kwargs.get("out"), multiply_adds(a.shape, b.shape)
    split = splits(a, b, madds) and set(kwargs) <= {"out"} and (out is None or (
        out.dtype == a.dtype and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)))
    if not split and madds > SMALL_PRODUCT:
        return np.matmul(a, b, **kwargs)
    if split and out is None:
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), a.dtype)
    held = _one_thread.enter()
    try:
        if not split:
            return np.matmul(a, b, **kwargs)
        _helper.split(a, b, out)
        return out
    finally:
        if held:
            _one_thread.exit()
