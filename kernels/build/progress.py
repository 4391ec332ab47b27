"""Progress of slow first calls: which traced function compiles, kernel k of n, seconds so far.

An executable's first call compiles its kernels one after another, each on its first run (unless the disk
cache has its machine code). Once that call has built machine code and run for `JITGRAD_PROGRESS_AFTER`
seconds (default 2), it reports before each further kernel and once at its end: on stderr as one updating
line when stderr is a terminal, otherwise as INFO records of the `jitgrad.progress` logger (at most one a
second, then the total; `JITGRAD_LOG=progress`, or any logging configuration, shows them).
`JITGRAD_PROGRESS=0` turns it off. The checks sit between kernels (a clock and a counter; no thread), so a
fast first call, or one whose kernels all come from the disk cache, shows nothing. Only the calling thread's
builds count: the parallel variants compiled in the background thread (`jitgrad.kernels.build.background`) are
waited for by no call.
"""
from __future__ import annotations

import inspect
import logging
import os
import shutil
import sys
import time
from typing import Any, Callable, TextIO

from jitgrad import logging_setup
from jitgrad.kernels.build import compiler

DEFAULT_AFTER_S = 2.0
LOG_EVERY_S = 1.0  # at most one "compiling" record a second (a terminal line just updates)
log = logging.getLogger("jitgrad.progress")


def enabled() -> bool:
    """Is progress reporting on (`JITGRAD_PROGRESS` unset, or anything but 0/false/no/off)?"""
    return os.environ.get("JITGRAD_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def after_seconds() -> float:
    """`JITGRAD_PROGRESS_AFTER`: how long a first call compiles before it reports (default 2 s; 0 always)."""
    text = os.environ.get("JITGRAD_PROGRESS_AFTER")
    if text is None:
        return DEFAULT_AFTER_S
    try:
        return max(float(text), 0.0)
    except ValueError:
        log.warning("JITGRAD_PROGRESS_AFTER=%r is not a number of seconds; using %g", text, DEFAULT_AFTER_S)
        return DEFAULT_AFTER_S


def describe(fn: Callable[..., Any]) -> str:
    """A user's function as progress names it: its qualified name and where it is defined (file:line)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return name
    path = code.co_filename
    try:
        relative = os.path.relpath(path)
        path = path if relative.startswith("..") else relative
    except ValueError:  # another drive (Windows)
        pass
    return f"{name} ({path}:{code.co_firstlineno})"


def _terminal() -> TextIO | None:
    """stderr when it is a terminal that JITGRAD_LOG does not print progress records to."""
    stream = sys.stderr
    try:
        tty = stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return None
    return stream if tty and not logging_setup.printing("progress") else None


class FirstCall:
    """Reports the first call of one executable of `n` kernels: `kernel(k)` before its k-th kernel runs,
    `end(completed)` after the last (or when the call raised)."""

    def __init__(self, label: str, n: int):
        self.label = label
        self.n = n
        self.start = time.perf_counter()
        self.builds = compiler.thread_builds()
        self.after = after_seconds()
        self.line = _terminal()
        self.shown = False
        self.logged_at = -LOG_EVERY_S

    def kernel(self, k: int) -> None:
        """Kernel `k` (from 1) is about to run: report it if the call has compiled long enough."""
        elapsed = self._due()
        if elapsed is not None:
            self._show("compiling", f"kernel {k} of {self.n}, {elapsed:.1f} s")

    def building(self, ready: int) -> None:
        """Before compiling ahead of the steps (with the compile helper): the machine code of `ready` of the
        call's `n` kernels is built (the same total as `kernel`'s)."""
        elapsed = self._due()
        if elapsed is not None:
            self._show("compiling", f"{ready} of {self.n} kernels ready, {elapsed:.1f} s")

    def waiting(self, ready: int) -> None:
        """While the call waits for its kernels compiling on other threads (after a numpy first call,
        `first_call`): `ready` of `n` are built; due by time alone, as no build runs on this thread."""
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.after:
            self._show("compiling", f"{ready} of {self.n} kernels ready, {elapsed:.1f} s")

    def end(self, completed: bool) -> None:
        """The call finished (or raised): report the total, or end the terminal line, if anything was due."""
        elapsed = time.perf_counter() - self.start if self.shown else self._due()
        if elapsed is None:
            return
        if completed:
            built = compiler.thread_builds() - self.builds
            self._show("compiled", f"{self.n} kernel{'s' if self.n != 1 else ''} ({built} built) in {elapsed:.1f} s",
                       last=True)
        elif self.shown and self.line is not None:
            self.line.write("\n")  # the call raised: leave the last progress line as it was

    def _due(self) -> float | None:
        """Seconds since the call started, once it has built machine code for at least `after` seconds."""
        if compiler.thread_builds() == self.builds:
            return None
        elapsed = time.perf_counter() - self.start
        return elapsed if elapsed >= self.after else None

    def _show(self, verb: str, counts: str, last: bool = False) -> None:
        """One progress line, `jitgrad: <verb> <label>: <counts>`; on a terminal the label is shortened to fit
        its width, never the counts."""
        text = f"{verb} {self.label}: {counts}"
        if self.line is None:
            now = time.perf_counter()
            if last or now - self.logged_at >= LOG_EVERY_S:
                self.shown, self.logged_at = True, now
                log.info("%s", text)
            return
        self.shown = True
        room = shutil.get_terminal_size().columns - 1 - len(f"jitgrad: {verb} : {counts}")
        label = self.label if len(self.label) <= room else self.label[:max(room - 1, 0)] + "…"
        self.line.write(f"\rjitgrad: {verb} {label}: {counts}\x1b[K" + ("\n" if last else ""))
        self.line.flush()


def first_call(label: str, n: int) -> FirstCall | None:
    """A reporter for an executable's first call, or None when progress is off or it runs no kernel."""
    return FirstCall(label, n) if n and enabled() else None
