"""Which variant of a CPU kernel runs: the serial one for small domains, for large ones whichever of serial and
parallel proved faster on the first calls, re-timed now and then (`VariantChooser`); in a child forked after GNU
OpenMP ran parallel kernels, the serial one always."""
from __future__ import annotations

import os
import weakref

import numba

from jitgrad.kernels.cpu import codegen as cpu

PARALLEL, SERIAL = "parallel_kernel", "serial_kernel"  # the two variants of every CPU kernel


class VariantChooser:
    """Picks the serial or parallel kernel for a large domain by timing both, on the first calls and
    again every RECHECK_EVERY calls.

    On an idle machine the parallel kernel wins; when other processes occupy the cores, waking
    worker threads can cost more than the work, and the serial kernel wins. The load changes, so
    the choice is re-timed now and then (two calls of each variant, about 2% of calls). Small
    domains always run serially.
    """

    TRIALS = 3  # timed calls of each variant before the first choice
    RECHECK_TRIALS = 2  # timed calls of each variant at a re-check
    RECHECK_EVERY = 100  # calls between re-checks

    def __init__(self, size: int):
        self.fixed = size < cpu.PARALLEL_MIN_SIZE or _serial_only
        self.choice: str | None = SERIAL if self.fixed else None
        self.trials = self.TRIALS
        self.timings: dict[str, list[float]] = {PARALLEL: [], SERIAL: []}
        self.calls_since_choice = 0
        _choosers.add(self)

    def next(self) -> str:
        """The variant to run now; while `choice` is None the caller times it and calls `record`."""
        if self.choice is not None:
            if self.fixed:
                return self.choice
            self.calls_since_choice += 1
            if self.calls_since_choice <= self.RECHECK_EVERY:
                return self.choice
            self.choice, self.trials = None, self.RECHECK_TRIALS
            self.timings = {PARALLEL: [], SERIAL: []}
        return PARALLEL if len(self.timings[PARALLEL]) <= len(self.timings[SERIAL]) else SERIAL

    def keep(self, variant: str) -> None:
        """Use `variant` from now on, without timing (the other one cannot run)."""
        self.fixed, self.choice = True, variant

    def record(self, variant: str, seconds: float) -> None:
        if self.choice is not None:
            return
        self.timings[variant].append(seconds)
        if all(len(t) >= self.trials for t in self.timings.values()):
            self.choice = min(self.timings, key=lambda v: sorted(self.timings[v])[self.trials // 2])
            self.calls_since_choice = 0


_choosers: "weakref.WeakSet[VariantChooser]" = weakref.WeakSet()
_serial_only = False  # in a child forked after GNU OpenMP ran parallel kernels, which it cannot do again


def _pin_serial_after_fork() -> None:
    """GNU OpenMP kills a forked child that starts parallel work after its parent did (numba's `omp`
    threading layer): in such a child every kernel runs its serial variant, which gives the same
    numbers. Other layers (workqueue, tbb) keep their choice."""
    global _serial_only
    try:
        unsafe = numba.threading_layer() == "omp"
    except ValueError:  # no parallel kernel ran before the fork: the child may start its own pool
        return
    if unsafe:
        _serial_only = True
        for chooser in list(_choosers):
            chooser.keep(SERIAL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pin_serial_after_fork)
