"""Which variant of a CPU kernel runs: the serial one for small domains, for large ones whichever of serial and
parallel proved faster on the first calls, re-timed now and then (`VariantChooser`); in a child forked after GNU
OpenMP ran parallel kernels, the serial one always. And whether a whole call may use the other cores at all
(`CallSpread`), chosen the same way. No choice here changes a result: the variants compute the same bits."""
from __future__ import annotations

import os
import time
import weakref
from typing import Callable

import numba

from jitgrad.kernels.build import background
from jitgrad.kernels.cpu import codegen as cpu
from jitgrad.cores import on_one_core

PARALLEL, SERIAL = "parallel_kernel", "serial_kernel"  # the two variants of every CPU kernel
SPREAD, ONE_CORE = "spread", "one_core"  # how a call runs: each kernel's choice and the BLAS helper, or serially
STATS = {"one_core_calls": 0}  # calls `CallSpread` kept on one core (`cache_info()["one_core_calls"]`)


class VariantChooser:
    """Picks the serial or parallel kernel for a large domain by timing both, on the first calls and
    again every RECHECK_EVERY calls.

    On an idle machine the parallel kernel wins; when other processes occupy the cores, waking
    worker threads can cost more than the work, and the serial kernel wins. The load changes, so
    the choice is re-timed now and then (three calls of each variant, about 4% of calls). Small
    domains always run serially.

    Each variant is timed in a streak of calls, the first of which (right after a call of the other
    variant) is not timed: W1's parallel kernel at N = 1e6 took 1.6-1.9 ms right after a serial call and
    0.8-0.9 ms after a parallel one (the serial kernel 1.35), so trials that alternated kept the serial one.
    """

    TRIALS = 3  # timed calls of each variant before the first choice
    RECHECK_TRIALS = 3  # timed calls of each variant at a re-check
    RECHECK_EVERY = 150  # calls between re-checks

    def __init__(self, size: int, options: tuple[str, str] = (PARALLEL, SERIAL)):
        self.options = options  # the one tried first, then the one kept without timing (small, or forked)
        self.fixed = size < cpu.PARALLEL_MIN_SIZE or _serial_only
        self.choice: str | None = options[1] if self.fixed else None
        self.trials = self.TRIALS
        self.timings: dict[str, list[float]] = {o: [] for o in options}
        self.calls_since_choice = 0
        self.last: str | None = None  # the variant the previous call ran
        self.after_switch = False  # whether the variant `next` gave differs from the previous call's (not timed)
        _choosers.add(self)

    def next(self) -> str:
        """The variant to run now; while `choice` is None the caller times it and calls `record`."""
        if self.choice is not None:
            if self.fixed:
                return self.choice
            self.calls_since_choice += 1
            if self.calls_since_choice <= self.RECHECK_EVERY:
                self.last = self.choice
                return self.choice
            self.choice, self.trials = None, self.RECHECK_TRIALS
            self.timings = {o: [] for o in self.options}
        first, second = self.options
        variant = first if len(self.timings[first]) < self.trials else second  # a streak of each
        self.after_switch, self.last = variant != self.last, variant
        return variant

    def keep(self, variant: str) -> None:
        """Use `variant` from now on, without timing (the other one cannot run)."""
        self.fixed, self.choice = True, variant

    def record(self, variant: str, seconds: float) -> None:
        """Count `seconds` for `variant`, unless it ran right after the other one."""
        if self.choice is not None or self.after_switch:
            return
        self.timings[variant].append(seconds)
        if all(len(t) >= self.trials for t in self.timings.values()):
            self.choice = min(self.timings, key=lambda v: sorted(self.timings[v])[self.trials // 2])
            self.calls_since_choice = 0


class CallSpread:
    """Whether an executable's calls spread over the cores (each kernel's `VariantChooser`, the BLAS helper for
    split products) or run on one core (serial kernels, a split product's parts in turn), by timing whole calls
    as `VariantChooser` times a kernel's variants, once every kernel has chosen and while no background compile
    shares the cores; a call right after one run the other way is not timed (W2's spread step took 14 ms after
    calls on one core, 10.7 after a spread one, 18.8 on one core). Which is faster changes with the machine:
    measured on 2 vCPUs, the medium conv net's step took 7.1-8.2 ms spread and 8.5 on one core in some fresh
    processes, and 11-12.3 ms spread against 8.6-9.0 on one core in others (where every step that used the
    second core, kernels and BLAS parts alike, ran slower: memory moving between the cores)."""

    def __init__(self, kernels: list[VariantChooser], host_steps: bool):
        self.kernels = [k for k in kernels if not k.fixed]  # whose first choice the timing waits for
        self.active = bool(self.kernels) or host_steps
        self.chooser = VariantChooser(cpu.PARALLEL_MIN_SIZE, (SPREAD, ONE_CORE))  # a size never fixed serial

    def run(self, call: Callable[[], None]) -> None:
        """Run `call` (one call of the executable's steps) spread or on one core, timing it while choosing."""
        if not self.active or self.kernels and any(k.choice is None for k in self.kernels):
            call()
            return
        self.kernels = []
        quiet = background.scheduler.idle()  # while compiles share the cores, no way is timed (nor switched to)
        option = self.chooser.next() if quiet or self.chooser.choice is not None else self.chooser.last or SPREAD
        outer, on_one_core.on = on_one_core.on, option == ONE_CORE
        if option == ONE_CORE:
            STATS["one_core_calls"] += 1
        start = time.perf_counter()
        try:
            call()
        finally:
            on_one_core.on = outer
        if quiet:  # `record` skips a call right after the other way: it pays for the switch (the second core waking)
            self.chooser.record(option, time.perf_counter() - start)


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
            chooser.keep(chooser.options[1])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pin_serial_after_fork)
