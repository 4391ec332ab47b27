"""Compiles nobody waits for (the full-level code of quick kernels first, then parallel variants), one at
a time in one worker thread, each started only once no compile on another thread has run for QUIET_S
seconds.

numba compiles one function at a time, under one process-wide lock, and a compile cannot be
interrupted: a background compile in progress makes a foreground compile wait for its end. A first
call compiles its kernels one after another; waiting for quiet keeps the background from slipping
in between them. At interpreter exit, compiles not yet started are dropped (a running one finishes
and lands in the disk cache).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from typing import Callable, Iterator

QUIET_S = 0.5
log = logging.getLogger("jitgrad.compile")


class Scheduler:
    """The queue of background compiles and the one thread that works through it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[Callable[[], None]] = deque()
        self._urgent = 0  # jobs at the front of the queue submitted with `urgent`
        self._worker: threading.Thread | None = None
        self._running = False
        self._foreground = 0  # compiles under way on other threads
        self._holders: set[object] = set()  # `foreground` blocks under way
        self._last_foreground = 0.0
        self._closing = False

    @property
    def worker(self) -> threading.Thread | None:
        return self._worker

    def submit(self, job: Callable[[], None], urgent: bool = False) -> None:
        """Run `job` in the background once the foreground has been quiet for QUIET_S seconds; an urgent job
        runs before every job that is not (quick kernels' full-level code before parallel variants)."""
        with self._cond:
            if self._closing:
                return
            if urgent:
                self._jobs.insert(self._urgent, job)
                self._urgent += 1
            else:
                self._jobs.append(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="jitgrad-background-compiles")
                self._worker.start()
            self._cond.notify_all()

    def idle(self) -> bool:
        """No compile running or waiting: the cores are the caller's (timings taken now are fair)."""
        return not self._running and not self._jobs

    def foreground_started(self) -> None:
        with self._cond:
            self._foreground += 1

    def foreground_ended(self) -> None:
        with self._cond:
            self._foreground -= 1
            self._last_foreground = time.monotonic()
            self._cond.notify_all()

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Hold background compiles back for the whole block, not only while numba compiles in it: a first
        call waiting for a kernel the compile helper builds must not let a parallel variant take the core
        (and numba's compiler lock) the kernels after it need. A token in a set, added and removed inside the
        `try`, so a KeyboardInterrupt anywhere in it leaves no hold behind."""
        token = object()
        try:
            with self._cond:
                self._holders.add(token)
            yield
        finally:
            with self._cond:
                self._holders.discard(token)
                self._last_foreground = time.monotonic()
                self._cond.notify_all()

    def wait(self, running_only: bool = False) -> None:
        """Wait until every submitted compile has run (or, with `running_only`, the one under way)."""
        with self._cond:
            while self._running or (self._jobs and not running_only and not self._closing):
                self._cond.wait(0.05)

    def close(self) -> None:
        """Drop the compiles not yet started (interpreter exit)."""
        with self._cond:
            self._closing = True
            self._jobs.clear()
            self._urgent = 0
            self._cond.notify_all()

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while True:
                if self._closing or not self._jobs:
                    self._worker = None
                    self._cond.notify_all()
                    return None
                quiet = time.monotonic() - self._last_foreground
                if self._foreground == 0 and not self._holders and quiet >= QUIET_S:
                    self._running = True
                    self._urgent = max(self._urgent - 1, 0)
                    return self._jobs.popleft()
                self._cond.wait(max(QUIET_S - quiet, 0.05))

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                job()
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()


scheduler = Scheduler()


def _reset_in_child() -> None:
    """A forked child has no worker thread: it starts with an empty queue of its own."""
    global scheduler
    scheduler = Scheduler()


register_exit = getattr(threading, "_register_atexit", None)  # runs before non-daemon threads are joined
if register_exit is not None:
    register_exit(lambda: scheduler.close())
if hasattr(os, "register_at_fork"):
    # A child forked while a background compile holds numba's compiler lock would inherit the lock held by a
    # thread it does not have, and hang at its first compile: fork waits for the compile under way.
    os.register_at_fork(before=lambda: scheduler.wait(running_only=True), after_in_child=_reset_in_child)
