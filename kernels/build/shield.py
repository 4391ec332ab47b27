"""numba compiles that a KeyboardInterrupt cannot cut in half: on the main thread, the one Python delivers
signals to, a kernel's compile runs in a worker thread while the main thread waits for it.

A compile interrupted between two statements leaves state behind that nothing undoes: numba's compiler lock
held (an RLock: the next compile on the main thread proceeds, every other thread waits for ever), numba's
registries half imported (its first compile imports numba.np.* and SciPy; a later compile can fail to type
or lower), jitgrad's compile bookkeeping unbalanced (the garbage collector paused, background compiles held
back, a thread's quick code generation left on). Here Ctrl-C stops the wait at once, the compile finishes
behind it (into the dispatcher and the disk cache), and the next call finds it done or waits for it.

A compile in a thread must also leave `sys.stdout` alone: see `stop_stdout_rebinding`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable, TypeVar

from numba.core import errors as numba_errors
from numba.core.compiler_lock import global_compiler_lock

T = TypeVar("T")
_local = threading.local()  # in a worker: `caller`, the ident of the thread it compiles for


def caller() -> int:
    """The thread this one works for: the waiting thread in a worker, else this thread."""
    return getattr(_local, "caller", None) or threading.get_ident()


def run(work: Callable[[], T]) -> T:
    """`work()`, in a worker thread when called on the main thread (outside numba's compiler lock, which a
    worker would wait for), so that a KeyboardInterrupt ends the wait and never the work."""
    if threading.current_thread() is not threading.main_thread() or global_compiler_lock.is_locked():
        return work()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    ident = threading.get_ident()

    def target() -> None:
        _local.caller = ident
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the waiting thread
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, name="jitgrad-compile").start()
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
