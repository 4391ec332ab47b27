"""Tracebacks without jitgrad's own frames, as JAX shows them.

An error jitgrad raises for a user's mistake passes through tracing, dispatch, the op's binding and the
plan cache (6-10 frames) before it reaches the user. At each entry point a user calls (a traced function's
call, `grad`, `value_and_grad`, `vjp`, `forward`, `backward`, `jg.<op>`, ...), a `JitgradError` leaving it
has those frames dropped from its traceback, and from the tracebacks of the jitgrad errors it was raised
from: what is left is the user's code, down to the line that made the op, and the one frame of the entry
point that re-raised it. The message already names the user's line. Other exceptions pass untouched.
`JITGRAD_TRACEBACK=full` keeps every frame (read at each error, so it can be set at any time).
"""
from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any, Callable, TypeVar

from .errors import JitgradError

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


def filtered(exc: JitgradError) -> JitgradError:
    """`exc` with jitgrad's frames dropped from its traceback and from those of the jitgrad errors it was
    raised from or during (`__cause__`, `__context__`, which stay linked); for `raise filtered(exc)`."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, JitgradError):
            e.__traceback__ = without_internal_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
    return exc


def api_boundary(fn: F) -> F:
    """Wrap an entry point users call: a `JitgradError` leaving it loses jitgrad's frames (`filtered`) unless
    `JITGRAD_TRACEBACK=full`."""
    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JitgradError as exc:
            if show_all_frames():
                raise
            raise filtered(exc)

    return entry  # type: ignore[return-value]
