"""Where a recorded op came from: the user's line that made it (`user_source`), for equations and error messages."""
from __future__ import annotations

import linecache
import os
import sys

import numpy as np

from jitgrad.ir.graph import SourceInfo

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jitgrad/, not this wing
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))
_user_files: dict[str, str | None] = {}  # a frame's absolute code file name -> `_decide_user_file` of it, decided once
_UNDECIDED = object()
_sources: dict[tuple[str, int, str], SourceInfo] = {}  # (code file, line number, line) -> its record, shared
_MAX_SOURCES = 4096


def _decide_user_file(raw: str) -> str | None:
    """The absolute name of the code file `raw` (a frame's `co_filename`) when it is the user's; None for jitgrad's,
    numpy's or the import system's. Remembered in `_user_files` for an absolute name; a relative one depends on the
    working directory, so it is decided each time."""
    fname = os.path.abspath(raw)
    internal = fname.startswith((_PACKAGE_DIR, _NUMPY_DIR)) or raw.startswith("<frozen") or "contextlib" in fname
    if os.path.isabs(raw):
        _user_files[raw] = None if internal else fname
    return None if internal else fname


def user_source() -> SourceInfo | None:
    """The innermost stack frame outside jitgrad and numpy: the user's line that made the op (one record per
    file, line number and text: a loop records many ops from each of a few lines)."""
    frame = sys._getframe(1)
    while frame is not None:
        raw = frame.f_code.co_filename
        fname = _user_files.get(raw, _UNDECIDED)
        if fname is _UNDECIDED:
            fname = _decide_user_file(raw)
        if fname is not None:
            key = (raw, frame.f_lineno, linecache.getline(fname, frame.f_lineno))
            found = _sources.get(key)
            if found is None:
                if len(_sources) >= _MAX_SOURCES:
                    _sources.clear()
                found = _sources[key] = SourceInfo(*key)
            return found
        frame = frame.f_back
    return None


def where_text() -> str:
    """The user's line for an error message ("at <file>:<line>" on a line of its own), or nothing."""
    src = user_source()
    return f"\n  at {src}" if src else ""
