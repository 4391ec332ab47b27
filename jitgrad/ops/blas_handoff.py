"""A split product's second part handed to the BLAS helper thread without the GIL (blas_threads.py).

Handing a part over through Python semaphores cost about 100 us a product on this project's 2-core machine
(a (256, 128) @ (128, 512) product, measured: the helper started its part 37 us after the offer, the caller woke
37 us after the helper's end, the offer itself 11 us): each wake-up of a thread blocked on a lock, the GIL's
included, waits for the operating system to run it again. Here the caller and the helper meet in compiled code
that runs without the GIL: the caller writes the part's description (the arguments of one BLAS gemm) into a
shared array and computes its own part; the helper, polling that array for up to SPIN_NS after its last part,
claims and computes the offered one and marks it done, which the caller polls for. Atomic loads, stores and a
compare-and-swap order the two; a part the helper has not claimed when the caller's own is done is taken back and
computed by the caller, as in blas_threads. After SPIN_NS without an offer the helper sleeps on a semaphore, which
the caller releases when it finds it asleep, so an idle process spins nowhere; while polling, it gives its core
to any other thread that wants it every YIELD_EVERY polls (sched_yield). Measured (docs/benchmarks.md): the medium
LSTM's step 0.84-0.94 of its time alone, 0.81-0.97 beside torch's; polling without yielding, 1.13 beside torch's.

Each part is the one gemm call that numpy's matmul makes for it (the same routine of the same library, the same
transposition flags and leading dimensions: `describe` applies numpy's rule), so its bits are np.matmul's, who
ever runs it. Parts numpy would not give to gemm (batched, vectors, strided) keep the Python handover. Used only
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

YIELD_EVERY = 8  # polls between two sched_yield calls (and two reads of the clock)
SPIN_NS = 300_000  # how long the helper polls for a next part, and the caller for the helper's, before sleeping:
# the medium LSTM's step alone 0.957 / 0.907 / 0.908 of the Python handover's with 100 / 300 / 1000 us, beside
# torch's steps 0.994 / 0.942 / 0.970
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # cblas enumerations
BLAS_MAX = (1 << 31) - 1  # numpy gives gemm no dimension or leading dimension above this

# the functions array: cblas_sgemm, cblas_dgemm, sched_yield (0: none), clock_gettime, the monotonic clock's id
SGEMM, DGEMM, YIELD, CLOCK, CLOCK_ID = range(5)
# the shared array's slots: the offer's state, whether the helper sleeps (or is about to), whether a part waits
# for it through blas_threads' Python handover, then the offered part's gemm; then the caller's own part's gemm
STATE, SLEEPING, PYTHON_PART, DOUBLE, TRANS_A, TRANS_B, M, N, K, A, LDA, B, LDB, C, LDC = range(15)
SLOTS = 15
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
    """The gemm described at state[base:] (base 0: the offer's slots)."""
    gemm = (state[base + TRANS_A], state[base + TRANS_B], state[base + M], state[base + N], state[base + K],
            state[base + A], state[base + LDA], state[base + B], state[base + LDB], state[base + C], state[base + LDC])
    if state[base + DOUBLE]:
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
    """Computes the caller's part (described at state[SLOTS:]), then the offered one if the helper has not
    claimed it (returns IDLE), else polls for the helper's for up to `window` ns (DONE, or CLAIMED if not yet)."""
    _run_offered(state, functions, SLOTS)
    if _swap(state, STATE, OFFERED, IDLE):
        _run_offered(state, functions, 0)
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
            _run_offered(state, functions, 0)
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


def _operand(x: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """numpy's rule for a gemm operand: (transposition, leading dimension), or None where numpy does not call
    gemm (no unit stride, a leading stride not a whole number of items or below the other dimension)."""
    size, (s0, s1) = x.itemsize, x.strides
    if s1 == size and s0 % size == 0 and cols <= s0 // size <= BLAS_MAX:
        return NO_TRANS, s0 // size
    if s0 == size and s1 % size == 0 and rows <= s1 // size <= BLAS_MAX:
        return TRANS, s1 // size
    return None


def describe(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[int] | None:
    """The gemm numpy's matmul makes for `a @ b` into `out` (the slots DOUBLE..LDC), or None where numpy would do
    something else: other than 2-D float32/float64 of one dtype, a dimension below 2 (numpy's vector and scalar
    routines), a non-gemm layout, misaligned data, a product of an array with its own transpose (syrk)."""
    if not (a.ndim == b.ndim == out.ndim == 2 and a.dtype == b.dtype == out.dtype
            and a.dtype in (np.float32, np.float64)):
        return None
    (m, k), n = a.shape, b.shape[1]
    if min(m, n, k) < 2 or max(m, n, k) > BLAS_MAX or not (a.flags.aligned and b.flags.aligned and out.flags.aligned):
        return None
    first, second = _operand(a, m, k), _operand(b, k, n)
    size = out.itemsize
    if first is None or second is None or out.strides[1] != size or out.strides[0] % size \
            or not n <= out.strides[0] // size <= BLAS_MAX:
        return None
    if a.ctypes.data == b.ctypes.data:
        return None
    return [int(a.dtype == np.float64), first[0], second[0], m, n, k, a.ctypes.data, first[1], b.ctypes.data,
            second[1], out.ctypes.data, out.strides[0] // size]


class Handoff:
    """The shared array and the compiled functions, once compiled; one per process (a forked child makes its
    own)."""

    def __init__(self, pointers: tuple[int, int], wake: threading.Semaphore) -> None:
        self.functions = np.array([*pointers, *_libc_functions()], np.int64)
        self.state = np.zeros(2 * SLOTS, np.int64)  # the offered part, then the caller's own
        self.state[SLEEPING] = 1  # the helper is not polling: it waits on `wake` (or computes a Python part)
        self.wake = wake  # the semaphore the helper sleeps on (blas_threads' Python handover's too)
        self.handed = self.taken_back = 0  # parts the helper computed, and parts offered but computed by the caller

    def split(self, first: list[int], second: list[int]) -> bool:
        """Computes both described parts, the second on the helper if it claims it in time; whether it did. The
        caller holds blas_threads' helper lock: one split at a time."""
        state = self.state
        state[DOUBLE:SLOTS] = second
        state[SLOTS + DOUBLE:] = first
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

    describe = staticmethod(describe)

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
