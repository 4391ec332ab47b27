"""Tracebacks without jitgrad's own frames, as JAX shows them.

An error jitgrad raises for a user's mistake passes through tracing, dispatch, the op's binding and the
plan cache (6-10 frames) before it reaches the user. At each entry point a user calls (a traced function's
call, `grad`, `value_and_grad`, `vjp`, `forward`, `backward`, `jg.<op>`, ...), a `JitgradError` leaving it
has those frames dropped from its traceback, and from the tracebacks of the jitgrad errors it was raised
from: what is left is the user's code, down to the line that made the op, and the one frame of the entry
point that re-raised it. The message already names the user's line.

Other exceptions (a misspelt `np.tahn`, numpy's `ValueError`, the user's own `raise`) lose jitgrad's frames the
same way when they were raised while the user's code ran: when the first frame below jitgrad's is not a
library's (`_from_user_code`). They get a note saying so. An exception raised by a library jitgrad itself
called (numba, numpy from jitgrad's code: a jitgrad bug, most likely) passes untouched.
`JITGRAD_TRACEBACK=full` keeps every frame (read at each error, so it can be set at any time).
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from typing import Any, Callable, TypeVar

from jitgrad.errors import JitgradError

F = TypeVar("F", bound=Callable[..., Any])
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def show_all_frames() -> bool:
    """Is `JITGRAD_TRACEBACK=full` set (keep jitgrad's frames in tracebacks)?"""
    return os.environ.get("JITGRAD_TRACEBACK", "").strip().lower() == "full"


def _internal_dirs() -> tuple[str, ...]:
    """jitgrad's source folders: the package and its kernels (a folder of its own in a checkout)."""
    kernels = sys.modules.get("jitgrad.kernels")
    folders = [_PACKAGE_DIR] + list(getattr(kernels, "__path__", []))
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders)


def without_internal_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback `tb` keeping only the frames whose code is outside jitgrad's folders."""
    internal = _internal_dirs()
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept = None
    for entry in reversed(entries):
        if not os.path.abspath(entry.tb_frame.f_code.co_filename).startswith(internal):
            kept = types.TracebackType(kept, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return kept


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Python's own library and the installed packages' folders: code there is a library's, not the user's."""
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders)


def _from_user_code(exc: BaseException) -> bool:
    """Was `exc` raised while the user's code ran (the function being traced, or a callback jitgrad called)?
    True when the first frame of its traceback below jitgrad's own is neither jitgrad's nor a library's."""
    internal = _internal_dirs()
    tb = exc.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not filename.startswith(internal):
            return not filename.startswith(_library_dirs())
        tb = tb.tb_next
    return False


HIDDEN_NOTE = "(jitgrad's own frames are hidden from this traceback; JITGRAD_TRACEBACK=full shows them)"


def filtered(exc: BaseException) -> BaseException:
    """`exc` with jitgrad's frames dropped from its traceback and from those of the jitgrad errors it was
    raised from or during (`__cause__`, `__context__`, which stay linked); for `raise filtered(exc)`. An `exc`
    that is not a jitgrad error gets a note saying that frames were hidden."""
    if not isinstance(exc, JitgradError) and HIDDEN_NOTE not in getattr(exc, "__notes__", ()):
        exc.add_note(HIDDEN_NOTE)
    exc.__traceback__ = without_internal_frames(exc.__traceback__)
    seen: set[int] = {id(exc)}
    todo: list[BaseException | None] = [exc.__cause__, exc.__context__]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, JitgradError):
            e.__traceback__ = without_internal_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
    return exc


def keeps_all_frames(exc: BaseException) -> bool:
    """Should `exc`, leaving an entry point, keep its traceback as it is? Yes with `JITGRAD_TRACEBACK=full`,
    and for an exception that is not jitgrad's and was not raised while the user's code ran."""
    return show_all_frames() or not (isinstance(exc, JitgradError) or _from_user_code(exc))


def api_boundary(fn: F) -> F:
    """Wrap an entry point users call: a `JitgradError` leaving it, or another exception raised in the user's
    code, loses jitgrad's frames (`filtered`) unless `JITGRAD_TRACEBACK=full`."""
    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if keeps_all_frames(exc):
                raise
            raise filtered(exc)

    return entry  # type: ignore[return-value]
