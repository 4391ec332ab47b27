"""numba compiles that a KeyboardInterrupt cannot cut in half: on the main thread, the one Python delivers
signals to, a kernel's compile runs in a worker thread while the main thread waits for it.

A compile interrupted between two statements leaves state behind that nothing undoes: numba's compiler lock
held (an RLock: the next compile on the main thread proceeds, every other thread waits for ever), numba's
registries half imported (its first compile imports numba.np.* and SciPy; a later compile can fail to type
or lower), jitgrad's compile bookkeeping unbalanced (the garbage collector paused, background compiles held
back, a thread's quick code generation left on). Here Ctrl-C stops the wait at once, the compile finishes
behind it (into the dispatcher and the disk cache), and the next call finds it done or waits for it.

The worker is one thread that serves the main thread's compiles and disk loads in turn and ends once idle
(`_Worker`). A compile in a thread must also leave `sys.stdout` alone: see `stop_stdout_rebinding`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import deque
from typing import Any, Callable, TypeVar

from numba.core import errors as numba_errors
from numba.core.compiler_lock import global_compiler_lock

T = TypeVar("T")
_local = threading.local()  # in a worker: `caller`, the ident of the thread it compiles for


def caller() -> int:
    """The thread this one works for: the waiting thread in a worker, else this thread."""
    return getattr(_local, "caller", None) or threading.get_ident()


class _Worker:
    """The thread the main thread's compiles and disk loads run in, one at a time, in the order asked: started
    for the first one, it waits LINGER_S for the next before it ends (a first call loads its kernels one after
    another; starting a thread for each cost 0.3-1.7 ms of a 2-3 ms load), and ends at once at interpreter
    exit, after the work under way."""

    LINGER_S = 0.2

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: deque[Callable[[], None]] = deque()
        self.thread: threading.Thread | None = None
        self.closing = False

    def submit(self, item: Callable[[], None]) -> None:
        with self.cond:
            self.queue.append(item)
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="jitgrad-compile")
                self.thread.start()
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()

    def _serve(self) -> None:
        while True:
            with self.cond:
                deadline = time.monotonic() + self.LINGER_S
                while not self.queue and not self.closing and deadline > time.monotonic():
                    self.cond.wait(deadline - time.monotonic())
                if not self.queue:
                    self.thread = None
                    return
                item = self.queue.popleft()
            item()
            del item  # holds the call's arguments (a kernel's arrays): not kept while the thread waits


_worker = _Worker()


def run(work: Callable[[], T]) -> T:
    """`work()`, in the worker thread when called on the main thread (outside numba's compiler lock, which the
    worker would wait for), so that a KeyboardInterrupt ends the wait and never the work."""
    if threading.current_thread() is not threading.main_thread() or global_compiler_lock.is_locked():
        return work()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    ident = threading.get_ident()

    def item() -> None:
        _local.caller = ident
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the waiting thread
            outcome.append((False, exc))
        finally:
            _local.caller = None
            done.set()

    _worker.submit(item)
    done.wait()
    ok, value = outcome.pop()
    if not ok:
        raise value
    return value


def _shielded(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return run(lambda: method(*args, **kwargs))


def shield(dispatcher: Any) -> None:
    """Make a numba dispatcher compile through `run`: for new argument types on a call, and on `compile`."""
    for name in ("_compile_for_args", "compile"):
        setattr(dispatcher, name, functools.partial(_shielded, getattr(dispatcher, name)))


def stop_stdout_rebinding() -> None:
    """Make numba's error formatting leave `sys.stdout` and `sys.stderr` as they are.

    Each message numba formats while typing (many, in a compile that succeeds) enters colorama's init()/deinit(),
    which reads `sys.stdout` on entry and assigns it back on exit. Run in a background compile, that undoes
    whatever the main thread bound meanwhile (contextlib.redirect_stdout, pytest's capsys): the user's prints
    went to a stream they had already closed or replaced. On POSIX colorama wraps no stream (it converts ANSI
    codes for Windows consoles only), so doing nothing there is the same output without the race."""
    if os.name != "nt" and hasattr(numba_errors, "ColorShell"):
        numba_errors.ColorShell = contextlib.nullcontext


stop_stdout_rebinding()


def _reset_in_child() -> None:
    """A forked child has no worker thread: it starts one of its own when it first needs one."""
    global _worker
    _worker = _Worker()


register_exit = getattr(threading, "_register_atexit", None)  # runs before non-daemon threads are joined
if register_exit is not None:
    register_exit(lambda: _worker.close())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
