"""A split product's second part handed to the BLAS helper thread without the GIL (blas_threads.py).

Handing a part over through Python semaphores cost about 100 us a product on this project's 2-core machine
(a (256, 128) @ (128, 512) product, measured: the helper started its part 37 us after the offer, the caller woke
37 us after the helper's end, the offer itself 11 us): each wake-up of a thread blocked on a lock, the GIL's
included, waits for the operating system to run it again. Here the caller and the helper meet in compiled code
that runs without the GIL: the caller writes the part's description (the arguments of its BLAS gemm calls) into a
shared array and computes its own part; the helper, polling that array for up to SPIN_NS after its last part,
claims and computes the offered one and marks it done, which the caller polls for. Atomic loads, stores and a
compare-and-swap order the two; a part the helper has not claimed when the caller's own is done is taken back and
computed by the caller, as in blas_threads. After SPIN_NS without an offer the helper sleeps on a semaphore, which
the caller releases when it finds it asleep, so an idle process spins nowhere; while polling, it gives its core
to any other thread that wants it every YIELD_EVERY polls (sched_yield). Measured (docs/benchmarks.md): the medium
LSTM's step 0.84-0.94 of its time alone, 0.81-0.97 beside torch's; polling without yielding, 1.13 beside torch's.

Each part is the gemm calls that numpy's matmul makes for it (the same routine of the same library, the same
transposition flags and leading dimensions, one call per matrix of a batched part: gemm_calls applies numpy's
rule), so its bits are np.matmul's, whoever runs it. Parts numpy would not give to gemm (vectors, strided, more
than two levels of batch dimensions that do not merge) keep the Python handover. Used only
where numpy's BLAS exports ILP64 cblas gemm (numpy's own wheels do), once a process has split
blas_threads.HANDOFF_AFTER products (a short script never compiles these functions: about 2 s once, then numba's
disk cache), and not with JITGRAD_BLAS_HANDOFF=0.
"""
from __future__ import annotations

import ctypes
import platform
import threading
import time
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from jitgrad.ops import gemm_calls
from jitgrad.ops.gemm_calls import (A, B, C, COUNT0, COUNT1, DOUBLE, K, LDA, LDB, LDC, M, N, ROW_MAJOR, STEP_A0,
                                    STEP_A1, STEP_B0, STEP_B1, STEP_C0, STEP_C1, TRANS_A, TRANS_B)

YIELD_EVERY = 8  # polls between two sched_yield calls (and two reads of the clock)
SPIN_NS = 300_000  # how long the helper polls for a next part, and the caller for the helper's, before sleeping:
# the medium LSTM's step alone 0.957 / 0.907 / 0.908 of the Python handover's with 100 / 300 / 1000 us, beside
# torch's steps 0.994 / 0.942 / 0.970
# the functions array: cblas_sgemm, cblas_dgemm, sched_yield (0: none), clock_gettime, the monotonic clock's id
SGEMM, DGEMM, YIELD, CLOCK, CLOCK_ID = range(5)
# the shared array's slots: the offer's state, whether the helper sleeps (or is about to), whether a part waits
# for it through blas_threads' Python handover, then the offered part's calls (gemm_calls' FIELDS from CALL); then
# the caller's own part's, SLOTS further
STATE, SLEEPING, PYTHON_PART, CALL = range(4)
SLOTS = CALL + gemm_calls.FIELDS
# numba's disk cache knows this file's text only, and the compiled code holds gemm_calls' field numbers as
# constants: they are repeated here, so that a change there cannot meet code compiled for the old numbers
_FIELDS = ("DOUBLE TRANS_A TRANS_B M N K A LDA B LDB C LDC COUNT0 STEP_A0 STEP_B0 STEP_C0 COUNT1 STEP_A1 STEP_B1 "
           "STEP_C1").split()
if [getattr(gemm_calls, name) for name in _FIELDS] != list(range(gemm_calls.FIELDS)):
    raise ImportError("gemm_calls' fields changed: repeat them in blas_handoff._FIELDS (its compiled code reads them)")
IDLE, OFFERED, CLAIMED, DONE = 0, 1, 2, 3
_state_type = _functions_type = types.Array(types.int64, 1, "C")
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _slot_pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any) -> Any:
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def _load(typingctx: Any, array: Any, index: Any) -> Any:
    """array[index] read atomically (sequentially consistent)."""
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_slot_pointer(context, builder, signature.args[0], *args), "seq_cst", 8)
    return types.int64(array, index), codegen


@intrinsic
def _store(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """array[index] = value, atomically (sequentially consistent: later loads are not moved before it)."""
    def codegen(context, builder, signature, args):
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], pointer, "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


@intrinsic
def _swap(typingctx: Any, array: Any, index: Any, expected: Any, value: Any) -> Any:
    """Sets array[index] to value if it holds expected, atomically; whether it did."""
    def codegen(context, builder, signature, args):
        pointer = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(pointer, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(array, index, expected, value), codegen


@intrinsic
def _pause(typingctx: Any) -> Any:
    """The processor's spin-wait hint (x86 `pause`), which frees the core's resources while polling."""
    def codegen(context, builder, signature, args):
        if _X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _call(typingctx: Any, function: Any) -> Any:
    """Calls the C function `void f(void)` at address `function` (sched_yield: its int result is ignored)."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@intrinsic
def _clock_ns(typingctx: Any, function: Any, clock_id: Any) -> Any:
    """clock_gettime(clock_id) at address `function`, in nanoseconds."""
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        timespec = ir.LiteralStructType([i64, i64])  # time_t seconds, long nanoseconds (LP64)
        slot = cgutils.alloca_once(builder, timespec)
        fnty = ir.FunctionType(i32, [i32, timespec.as_pointer()])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [builder.trunc(args[1], i32), slot])
        seconds = builder.load(builder.gep(slot, [ir.Constant(i32, 0), ir.Constant(i32, 0)]))
        nanoseconds = builder.load(builder.gep(slot, [ir.Constant(i32, 0), ir.Constant(i32, 1)]))
        return builder.add(builder.mul(seconds, ir.Constant(i64, 1_000_000_000)), nanoseconds)
    return types.int64(types.int64, types.int64), codegen


@numba.njit(types.int64(_functions_type), nogil=True, cache=True, inline="always")
def _now(functions):
    return _clock_ns(functions[CLOCK], functions[CLOCK_ID])


@numba.njit(types.boolean(_functions_type, types.int64, types.int64), nogil=True, cache=True, inline="always")
def _relax(functions, polls, deadline):
    """Between two polls: a spin-wait hint; every YIELD_EVERY polls the core to any other thread that wants it
    (torch's spinning OpenMP workers, a busy neighbour), and whether the monotonic clock has passed `deadline`."""
    _pause()
    if polls % YIELD_EVERY:
        return False
    if functions[YIELD] != 0:
        _call(functions[YIELD])
    return _now(functions) > deadline


def _gemm_intrinsic(real: ir.Type) -> Any:
    @intrinsic
    def call(typingctx, function, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc):
        """cblas_?gemm(RowMajor, trans_a, trans_b, m, n, k, 1, a, lda, b, ldb, 0, c, ldc) through a pointer."""
        def codegen(context, builder, signature, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            pointer = real.as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, real, pointer, i64, pointer,
                                                   i64, real, pointer, i64])
            fn, ta, tb, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_ = args
            callee = builder.inttoptr(fn, fnty.as_pointer())
            builder.call(callee, [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta, i32), builder.trunc(tb, i32),
                                  m_, n_, k_, ir.Constant(real, 1.0), builder.inttoptr(a_, pointer), lda_,
                                  builder.inttoptr(b_, pointer), ldb_, ir.Constant(real, 0.0),
                                  builder.inttoptr(c_, pointer), ldc_])
            return context.get_dummy_value()
        return types.void(*([types.int64] * 12)), codegen
    return call


_sgemm = _gemm_intrinsic(ir.FloatType())
_dgemm = _gemm_intrinsic(ir.DoubleType())


@numba.njit(types.void(_state_type, _state_type, types.int64), nogil=True, cache=True)
def _run_offered(state, functions, base):
    """The gemm calls described at state[base:] (base CALL: the offer's), one per matrix of the stack."""
    at = base + DOUBLE
    for i in range(state[at + COUNT0]):
        for j in range(state[at + COUNT1]):
            a = state[at + A] + i * state[at + STEP_A0] + j * state[at + STEP_A1]
            b = state[at + B] + i * state[at + STEP_B0] + j * state[at + STEP_B1]
            c = state[at + C] + i * state[at + STEP_C0] + j * state[at + STEP_C1]
            gemm = (state[at + TRANS_A], state[at + TRANS_B], state[at + M], state[at + N], state[at + K],
                    a, state[at + LDA], b, state[at + LDB], c, state[at + LDC])
            if state[at + DOUBLE]:
                _dgemm(functions[DGEMM], *gemm)
            else:
                _sgemm(functions[SGEMM], *gemm)


@numba.njit(types.boolean(_state_type), nogil=True, cache=True)
def _offer(state):
    """Publishes the part written to the offer's slots; whether the helper sleeps (the caller then wakes it)."""
    _store(state, STATE, OFFERED)
    return _load(state, SLEEPING) != 0


@numba.njit(types.int64(_state_type, _functions_type, types.int64), nogil=True, cache=True)
def _own_then_wait(state, functions, window):
    """Computes the caller's part (described at state[SLOTS + CALL:]), then the offered one if the helper has not
    claimed it (returns IDLE), else polls for the helper's for up to `window` ns (DONE, or CLAIMED if not yet)."""
    _run_offered(state, functions, SLOTS + CALL)
    if _swap(state, STATE, OFFERED, IDLE):
        _run_offered(state, functions, CALL)
        return IDLE
    deadline, polls = _now(functions) + window, 0
    while _load(state, STATE) != DONE:
        polls += 1
        if _relax(functions, polls, deadline):
            return CLAIMED
    _store(state, STATE, IDLE)
    return DONE


@numba.njit(types.void(_state_type), nogil=True, cache=True)
def _mark_python_part(state):
    """A part waits for the Python handover: the polling helper returns to Python."""
    _store(state, PYTHON_PART, 1)


@numba.njit(types.int64(_state_type), nogil=True, cache=True)
def _finished(state):
    """Whether the claimed part is done (then the offer is reset)."""
    if _load(state, STATE) == DONE:
        _store(state, STATE, IDLE)
        return 1
    return 0


@numba.njit(types.void(_state_type, _functions_type, types.int64), nogil=True, cache=True)
def _serve(state, functions, window):
    """The helper: computes each offered part until none came for `window` ns (unless one comes while it
    announces that it sleeps) or a part waits for the Python handover. SLEEPING is 0 only in here."""
    _store(state, SLEEPING, 0)
    deadline, polls = _now(functions) + window, 0
    while _load(state, PYTHON_PART) == 0:
        if _load(state, STATE) == OFFERED and _swap(state, STATE, OFFERED, CLAIMED):
            _run_offered(state, functions, CALL)
            _store(state, STATE, DONE)
            deadline, polls = _now(functions) + window, 0
            continue
        polls += 1
        if _relax(functions, polls, deadline):
            _store(state, SLEEPING, 1)
            if _load(state, STATE) != OFFERED:
                return
            _store(state, SLEEPING, 0)
            deadline = _now(functions) + window
    _store(state, SLEEPING, 1)


def _gemm_pointers(lib: ctypes.CDLL) -> tuple[int, int] | None:
    """The addresses of ILP64 cblas_sgemm and cblas_dgemm in numpy's OpenBLAS (numpy's wheels: scipy_ prefix)."""
    for prefix in ("scipy_cblas_", "cblas_"):
        s, d = getattr(lib, prefix + "sgemm64_", None), getattr(lib, prefix + "dgemm64_", None)
        if s is not None and d is not None:
            return ctypes.cast(s, ctypes.c_void_p).value, ctypes.cast(d, ctypes.c_void_p).value
    return None


class Handoff:
    """The shared array and the compiled functions, once compiled; one per process (a forked child makes its
    own)."""

    def __init__(self, pointers: tuple[int, int], wake: threading.Semaphore) -> None:
        self.functions = np.array([*pointers, *_libc_functions()], np.int64)
        self.state = np.zeros(2 * SLOTS, np.int64)  # the offered part, then the caller's own
        self.state[SLEEPING] = 1  # the helper is not polling: it waits on `wake` (or computes a Python part)
        self.wake = wake  # the semaphore the helper sleeps on (blas_threads' Python handover's too)
        self.handed = self.taken_back = 0  # parts the helper computed, and parts offered but computed by the caller
        self.layouts = gemm_calls.SplitCalls()  # the parts' calls per layout of a split product

    def split(self, first: list[int], second: list[int]) -> bool:
        """Computes both described parts, the second on the helper if it claims it in time; whether it did. The
        caller holds blas_threads' helper lock: one split at a time."""
        state = self.state
        state[CALL:SLOTS] = second
        state[SLOTS + CALL:] = first
        if _offer(state):
            self.wake.release()
        outcome = _own_then_wait(state, self.functions, SPIN_NS)
        while outcome == CLAIMED:  # the helper lost its core mid-part: wait without spinning
            time.sleep(20e-6)
            outcome = DONE if _finished(state) else CLAIMED
        if outcome == DONE:
            self.handed += 1
            return True
        self.taken_back += 1
        return False

    describe = staticmethod(gemm_calls.describe)

    def calls(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: gemm_calls.Parts) -> list[list[int]] | None:
        """The calls of `parts(a, b, out)`, each as `describe` gives it, or None where one is not described."""
        return self.layouts.calls(a, b, out, parts)

    def python_part(self) -> None:
        """Before a part is offered through the Python handover (and `wake` released): the helper stops polling."""
        _mark_python_part(self.state)

    def serve(self) -> None:
        """On the helper: computes offered parts until none came for SPIN_NS or a part waits for the Python
        handover; then returns, and the helper waits on `wake`."""
        _serve(self.state, self.functions, SPIN_NS)

    def awake(self) -> None:
        """On the helper, woken from `wake`: no Python part pending (the one that woke it, it takes now)."""
        self.state[PYTHON_PART] = 0


def _libc_functions() -> tuple[int, int, int]:
    """The addresses of the C library's sched_yield (0 where it has none) and clock_gettime, and the id of the
    monotonic clock."""
    libc = ctypes.CDLL(None)
    yield_fn = getattr(libc, "sched_yield", None)
    return (ctypes.cast(yield_fn, ctypes.c_void_p).value if yield_fn is not None else 0,
            ctypes.cast(libc.clock_gettime, ctypes.c_void_p).value, time.CLOCK_MONOTONIC)


def build(lib: ctypes.CDLL, wake: threading.Semaphore) -> Handoff | None:
    """The handoff for numpy's OpenBLAS `lib`, its helper sleeping on `wake`; None where `lib` has no ILP64 cblas
    gemm, or the platform is not a 64-bit one with a monotonic clock_gettime (the Python handover then stays)."""
    pointers = _gemm_pointers(lib)
    if pointers is None or ctypes.sizeof(ctypes.c_long) != 8 or not hasattr(time, "CLOCK_MONOTONIC"):
        return None
    return Handoff(pointers, wake)
