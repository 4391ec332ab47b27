"""numba's parallel workers, each kept on a CPU of its own.

Under the workqueue layer (`jitgrad.runtime.threads`) every parallel kernel call wakes numba's sleeping
workers and waits for them. Linux often queues both woken workers on one CPU, and the call then runs at one
core's speed until the load balancer moves one (milliseconds later): W1's jvp at N = 1e6 took 1.73 ms per
call through jitgrad, against 0.90 for its parallel kernel called in a loop and 1.66 for the serial one, and
the variant chooser, seeing parallel calls no faster, kept the serial kernels. Pinning each worker to its
own CPU of the process's affinity set gives every call both cores.

The workers are found as the threads that appear while the pool starts: `start` launches it before the
first parallel kernel is made (numba would start it while compiling, beside other threads), and a forked
child, whose workqueue starts again inside its first parallel call, diffs the threads around that call.
Nothing is pinned where the new threads are not exactly numba's worker count, where there are more
workers than CPUs, under another layer (OpenMP and TBB place their own threads), or with
JITGRAD_PIN_WORKERS=0. Pinning changes which CPU runs a chunk, never a result.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable

import numba
from numba.np.ufunc import parallel as numba_parallel

PIN_ENV = "JITGRAD_PIN_WORKERS"  # "0": leave numba's workers where Linux puts them
_lock = threading.Lock()
_settled_pid: int | None = None  # the process whose pool was started (and pinned where it could be) here


def _threads() -> set[int]:
    """The ids of this process's threads, as Linux lists them (empty where it does not)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _pin(new_threads: set[int]) -> None:
    """Pin numba's workers, the threads in `new_threads`, one per CPU of the process, if that is what they are."""
    workers = sorted(new_threads)
    try:
        cpus = sorted(os.sched_getaffinity(0))
        layer = numba.threading_layer()
    except (AttributeError, ValueError, OSError):
        return
    if layer != "workqueue" or len(workers) != numba.config.NUMBA_NUM_THREADS or len(workers) > len(cpus):
        return
    for tid, cpu in zip(workers, cpus):
        with contextlib.suppress(OSError):  # a worker gone meanwhile
            os.sched_setaffinity(tid, {cpu})


def _wanted() -> bool:
    return os.environ.get(PIN_ENV, "1") != "0" and hasattr(os, "sched_setaffinity")


def _pool_started() -> bool:
    """Has numba started its pool in this process (or forked from one that had)? True where this numba does not
    say (its private `_is_initialized` and `_launch_threads`): then numba starts the pool itself, unpinned."""
    return getattr(numba_parallel, "_is_initialized", True) or not hasattr(numba_parallel, "_launch_threads")


def start() -> None:
    """Start numba's thread pool in this process, its workers pinned (once per process; a forked child whose
    parent started it pins around its first parallel call instead, `call`)."""
    if _settled_pid == os.getpid() or _pool_started():
        return
    with _lock:
        if _settled_pid != os.getpid() and not _pool_started():
            call(numba_parallel._launch_threads)


def call(fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)`; the first time in this process, pin the numba workers that appear while it runs (numba's pool
    starts inside it: `start`'s launch, or a forked child's first parallel call). Callers keep other threads'
    parallel work out meanwhile (the compiler's parallel lock, `start`'s lock)."""
    global _settled_pid
    if _settled_pid == os.getpid():
        fn(*args)
        return
    before = _threads()
    fn(*args)
    _settled_pid = os.getpid()
    if _wanted():
        _pin(_threads() - before)
