"""A new CPU executable's first call run by numpy while its kernels compile (the default; JITGRAD_FIRST_CALL).

Compiling a program's kernels takes seconds (numba's typing and LLVM, 0.3-1.4 s a kernel); tracing and
fusing it takes a tenth of that. Where some kernel is neither compiled in this process nor on disk, the
first call starts compiling them all in the background (`kernels.build.background`, with the compile
helper process taking the largest), runs the optimised graph through the primitives' numpy references
(`interpreter`), and returns. The second call waits for those compiles, and it and every later call run
the compiled kernels. A warm start (every kernel compiled here or on disk, some still to load: a new process
on a filled disk cache) runs numpy too while the kernels load after it (~5 ms a kernel, and numba's own
start-up of ~40 ms in a new process), unless numpy's passes would take longer than those loads.
Which call runs where is a fixed rule, never timing. The first call's numbers are
numpy's, within the documented ulp bounds of the kernels' (docs/ops.md; a sum's association order
differs), so a procedure comparing the first call with later ones in the last bits sees a step:
JITGRAD_FIRST_CALL=compiled runs every call on the kernels, and `jg.gradcheck` always does
(`compiled_only`, handed out by `jitgrad.runtime.backends.compiled_first_calls`). A graph doing more
than MAX_ELEMENTS elements of work, where numpy's temporaries would cost more than compiling,
compiles first.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import threading
from typing import Any, Iterator, Sequence

import numba
import numpy as np
from numba.np import numpy_support

from jitgrad.kernels.build import progress
from jitgrad.ir.interpreter import evaluate
from jitgrad.ir.graph import Graph
from jitgrad.kernels.build import background, compiler, helper, quick_codegen

ENV = "JITGRAD_FIRST_CALL"
MODES = ("numpy", "compiled")
MAX_ELEMENTS = 1 << 25  # elements written by all of a graph's equations together (one float32 pass: ~10 ms)
LOAD_ELEMENTS = 1 << 24  # numpy's passes over as many elements take about as long as loading one kernel (~5 ms)
log = logging.getLogger("jitgrad.compile")
STATS = {"numpy_calls": 0}  # first calls run on numpy (`cache_info()["numpy_calls"]`)
_compiled_only: contextvars.ContextVar[bool] = contextvars.ContextVar("jitgrad_compiled_only", default=False)


def mode() -> str:
    """`compiled` inside `compiled_only`, else JITGRAD_FIRST_CALL: `numpy` (the default) or `compiled`; another
    value is refused, never ignored."""
    chosen = os.environ.get(ENV, "numpy").strip().lower() or "numpy"
    if chosen not in MODES:
        raise ValueError(f"{ENV}={chosen!r}; expected one of {', '.join(MODES)}")
    return "compiled" if _compiled_only.get() else chosen


@contextlib.contextmanager
def compiled_only() -> Iterator[None]:
    """Every first call in this block (this thread or task) runs the compiled kernels: for procedures that
    compare calls in their last bits (`jg.gradcheck`'s finite differences)."""
    token = _compiled_only.set(True)
    try:
        yield
    finally:
        _compiled_only.reset(token)


def stand_in(aval: Any) -> np.ndarray:
    """An array standing for a value a step will compute, to guess a kernel's argument types before the call runs:
    C-contiguous, writable, of the value's dtype and rank."""
    return np.empty((1,) * aval.ndim, aval.dtype)


def numba_type(value: Any, typed: dict[Any, Any]) -> Any:
    """numba's type of `value`; an array's found once in `typed` per what numba's type of an array says (dtype, rank,
    layout, writeable): an unrolled loop's steps pass the same kinds of arrays again and again. A plain array's type
    is made as `numba.typeof` makes it, without its check for masked arrays, which imports numpy.ma (~5 ms of a
    warm first call): a test keeps the two equal."""
    if type(value) is not np.ndarray:
        return numba.typeof(value)
    flags = value.flags
    key = (value.dtype, value.ndim, flags.c_contiguous, flags.f_contiguous, flags.writeable)
    found = typed.get(key)
    if found is None:
        found = typed[key] = numba.types.Array(numpy_support.from_dtype(value.dtype), value.ndim,
                                               numpy_support.map_layout(value), readonly=not flags.writeable)
    return found


def work(graph: Graph) -> int:
    """Elements written by the graph's equations: the size of the numpy run's temporaries, all told."""
    return sum(math.prod(map(int, o.aval.shape)) for e in graph.eqns for o in e.outs)


def kernel_key(compiled: compiler.CompiledSource, signature: tuple) -> tuple:
    """A kernel and its argument types as a key, by identities: an unrolled loop's steps share kernels and numba's
    types are unique objects, and hashing a signature of them takes ~1 us an argument."""
    return (id(compiled), *map(id, signature))


class NumpyFirstCall:
    """One executable's numpy first call and the background compile of its kernels (`targets`: each kernel's
    compiled source and the argument types it will get) that its second call waits for."""

    def __init__(self, graph: Graph, variants: tuple[str, str], targets: Sequence[tuple[compiler.CompiledSource, tuple]],
                 label: str, loads: dict[tuple, str] | None = None):
        self.graph = graph
        self.label = label
        self.serial, self.quick = variants
        self.variant = self.serial  # what `_build` compiles: the quick code where the runtime will run it
        self.targets = list(targets)
        self.loads = loads  # a warm start: per `kernel_key`, the variant each kernel loads (all built already)
        self.state = "queued"  # -> running -> done; or cancelled (by a second call arriving first)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.jobs: list[tuple] = []  # keys offered to the compile helper

    def run(self, args: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """Queue the compiles, then the graph's outputs by numpy; None if numpy could not run it (the caller
        runs the compiled first call, which raises what there is to raise)."""
        self.jobs = self._offer() if self.loads is None else []
        try:
            with np.errstate(all="ignore"):  # the kernels warn of nothing: neither does their stand-in
                outs = evaluate(self.graph, args)
            STATS["numpy_calls"] += 1
            return outs
        except Exception:  # noqa: BLE001 - the compiled call reports it, as it would have without this tier
            log.debug("numpy first call failed; compiling first", exc_info=True)
            return None
        finally:  # this thread's share of the compiles starts after numpy's run, which it would slow (the GIL)
            background.scheduler.submit(self._compile, urgent=True)

    def finish(self) -> None:
        """Before the first compiled call: wait for the compiles, starting them now if the background has not
        (in a thread of their own: an interrupt ends the wait, never a compile). A child forked meanwhile
        cancels them: its compiled call compiles what it needs."""
        if self.pid != os.getpid():
            self.state = "cancelled"
            return
        threading.Thread(target=self._compile, name="jitgrad-first-call-compiles", daemon=True).start()
        report = progress.first_call(self.label, len(self.targets))
        while not self.done.wait(0.25):
            if report is not None:
                report.waiting(sum(sig in c.functions[self._variant(c, sig)].overloads for c, sig in self.targets))
        if report is not None:
            report.end(completed=True)

    def _compile(self) -> None:
        with self.lock:
            if self.state != "queued":
                return
            self.state = "running"
        try:
            self._build()
        finally:
            self.state = "done"
            self.done.set()

    def _variant(self, compiled: compiler.CompiledSource, sig: tuple) -> str:
        """The variant of this kernel that `_build` compiles or loads."""
        return self.variant if self.loads is None else self.loads[kernel_key(compiled, sig)]

    def _jobs(self, variant: str) -> dict[tuple, helper.Job]:
        return {job.key: job for compiled, sig in self.targets for job in [helper.job_for(compiled, variant, sig)]
                if job is not None}

    def _offer(self) -> list[tuple]:
        """Queue the targets for the compile helper process, largest first (it starts on them at once, as it
        needs no GIL of this process); the keys queued. Where the runtime's compiled first call would use the
        helper, it runs quick kernels (`Executable._offer_to_helper`): those are what is built then."""
        compile_helper = helper.helper()
        jobs = self._jobs(self.serial)
        if compile_helper is None or len(jobs) < helper.MIN_KERNELS:
            return []
        if quick_codegen.enabled():
            self.variant = self.quick
            jobs = self._jobs(self.quick)
        compile_helper.offer(sorted(jobs.values(), key=lambda job: -len(job.request[0])))
        return list(jobs)

    def _build(self) -> None:
        """Compile the targets: this thread takes jobs from the front of the helper's queue too, then every
        target is loaded here (from disk, or compiled if the helper failed)."""
        compile_helper = helper.helper()
        if compile_helper is not None and self.jobs:
            while (job := compile_helper.claim_next()) is not None:
                try:
                    helper.compile_here(job)
                except Exception:  # noqa: BLE001 - left for the call that runs it, which raises it
                    pass
            for key in self.jobs:
                compile_helper.take(key)
        for compiled, sig in self.targets:
            try:
                compiled.functions[self._variant(compiled, sig)].compile(sig)
            except Exception:  # noqa: BLE001 - left for the call that runs it, which raises it
                log.debug("background compile of %s failed", compiled.name, exc_info=True)


class Tier:
    """Where an executable's next call runs: its first call on numpy (while the kernels compile), if `plan`
    says so; from the second on, compiled (waiting for the first call's compiles)."""

    def __init__(self, graph: Graph, variants: tuple[str, str], label: str) -> None:
        self.graph = graph
        self.label = label
        self.variants = variants  # the serial variant's name, and its quick code's
        self.first: NumpyFirstCall | None = None
        self.decided = False

    def call(self, args: Sequence[np.ndarray], targets: Sequence[tuple[compiler.CompiledSource, tuple]]
             ) -> list[np.ndarray] | None:
        """The outputs of a numpy first call, or None: the caller runs its compiled first call. `targets` are the
        executable's kernels and the argument types they will get."""
        if not self.decided:
            self.decided = True
            self.first = plan(self.graph, self.variants, targets, self.label)
            outs = None if self.first is None else self.first.run(args)
            if outs is not None:
                return outs
        if self.first is not None:
            self.first.finish()
            self.first = None
        return None


def plan(graph: Graph, variants: tuple[str, str],
         targets: Sequence[tuple[compiler.CompiledSource, tuple]], label: str) -> NumpyFirstCall | None:
    """A numpy first call for an executable whose kernels are `targets`, or None to compile (or load) first: the mode
    says so, every kernel is compiled in this process already, or the graph's work is too large: more than
    MAX_ELEMENTS, or on a warm start (every kernel compiled here or on disk) more than LOAD_ELEMENTS per kernel to
    load, numpy's passes then costing more than loading the kernels."""
    if mode() != "numpy":  # first: the checks below look for every kernel on disk
        return None
    distinct = {kernel_key(c, sig): (c, sig) for c, sig in targets}
    loads: dict[tuple, str] | None = {}
    to_load = 0
    for key, (c, sig) in distinct.items():
        built_here = next((v for v in variants if c.compiled_here(v, sig)), None)
        found = built_here or next((v for v in variants if c.built(v, sig)), None)
        if found is None:
            loads = None
            break
        loads[key] = found
        to_load += built_here is None
    if loads is not None and to_load == 0:
        return None
    elements = work(graph)
    if elements > (MAX_ELEMENTS if loads is None else min(MAX_ELEMENTS, LOAD_ELEMENTS * to_load)):
        return None
    return NumpyFirstCall(graph, variants, targets, label, loads)
