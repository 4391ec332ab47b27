"""A second process that compiles a first call's kernels into the disk cache while this one compiles others.

numba compiles one function at a time under a process-wide lock, so a first call that builds ten
kernels uses one core. Before such a call runs, `offer` queues the kernels it will need, largest first
(by source length), with the argument types they will get (the call's own inputs and constants as they
are, intermediates C-contiguous and writable). The helper (a child interpreter that imports jitgrad and
nothing else) takes jobs from the front of that queue and compiles each into the disk cache
(`compiler.DiskCache`: the same source through the same numba, so the same machine code); the call
compiles ahead from the same front (`claim_next`) until the queue is empty, so both processes work
largest first and finish at about the same time. Then the call runs its steps: before each kernel,
`take` waits for one the helper is still compiling and says when one is on disk, which this process
loads from there. A kernel whose real argument types differ from the guess (an input a host step made
Fortran-ordered, say) is compiled when it runs, so a wrong guess costs compile time, never a result.

The helper starts on the first call with at least MIN_KERNELS kernels to build and lives as long as
this process. It is not used when the disk cache is off or cannot be written, on one core, in a child
forked after it started, or with `JITGRAD_COMPILE_HELPER=0`. If it fails to start or dies, its kernels
are compiled here.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from jitgrad import cache
from jitgrad.kernels.build import compiler

log = logging.getLogger("jitgrad.compile")
MIN_KERNELS = 3  # fewer: the helper's start-up (an interpreter importing numba) saves nothing
TAKE_TIMEOUT_S = 300.0  # a kernel the helper has compiled this long is compiled here instead
_MAGIC = b"JGH1"  # starts every message, so stray output on the helper's stdout stops it rather than hangs it
_HEADER = struct.Struct("<4sI")
_SERVE = "from jitgrad.kernels.build import helper; helper.serve()"


def wanted() -> bool:
    """May a first call use the helper (`JITGRAD_COMPILE_HELPER` not 0, and more than one core)?"""
    if os.environ.get("JITGRAD_COMPILE_HELPER", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > 1


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(_MAGIC, len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream or on anything that is not a message."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    magic, size = _HEADER.unpack(header)
    if magic != _MAGIC:
        return None
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


@dataclass(eq=False)
class Job:
    """One kernel variant for one argument signature: (source, numba options per function, function, types)."""

    key: tuple[str, str, tuple]
    request: tuple[str, dict[str, dict[str, Any]], str, tuple]
    state: str = "queued"  # queued -> sent -> done | failed; or claimed (compiled by this process instead)
    error: str = ""


def job_for(compiled: compiler.CompiledSource, variant: str, signature: tuple) -> Job | None:
    """A job for the helper, or None where it cannot help: the variant is compiled here already, its machine
    code is on disk, or the disk cache is off (this process would not load what the helper writes) or cannot be
    written."""
    fn = compiled.functions[variant]
    disk = getattr(fn, "_cache", None)
    if signature in fn.overloads or not isinstance(disk, compiler.DiskCache) or not disk.enabled:
        return None
    folder = disk.cache_path
    if not (cache.usable(folder) and os.access(folder, os.W_OK)):
        return None
    if disk.on_disk(signature, fn.targetctx.codegen()):
        return None
    return Job((compiled.name, variant, signature), (compiled.source, compiled.options, variant, signature))


@dataclass(eq=False)
class CompileHelper:
    """The helper process, the jobs offered to it, and the thread that feeds it one job at a time."""

    jobs: dict[tuple, Job] = field(default_factory=dict)
    queue: deque[Job] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=threading.Condition)
    process: subprocess.Popen | None = None
    broken: bool = False
    built: int = 0  # jobs the helper compiled into the disk cache

    def offer(self, jobs: list[Job]) -> None:
        """Queue `jobs` (in the order the helper should compile them), starting the helper if needed."""
        with self.cond:
            if self.broken:
                return
            for job in jobs:
                if job.key not in self.jobs:
                    self.jobs[job.key] = job
                    self.queue.append(job)
            if self.process is None and self.queue and not self._start():
                return
            self.cond.notify_all()

    def claim_next(self) -> Job | None:
        """The next queued job, claimed for this process to compile (so the helper never starts it), or None
        when nothing is queued: a first call compiles ahead from the same queue as the helper."""
        with self.cond:
            if not self.queue:
                return None
            job = self.queue.popleft()
            job.state = "claimed"
            return job

    def settled(self, keys: list[tuple]) -> int:
        """How many of these jobs (a job once per kernel step that runs it) are compiled by now, here or by the
        helper (progress)."""
        with self.cond:
            return sum(self.jobs[key].state in ("done", "claimed", "failed") for key in keys)

    def take(self, key: tuple) -> bool:
        """Before this process compiles `key`: True when the helper has put it on disk (waiting while it
        compiles it), False when this process must compile it (never offered, claimed back, or failed)."""
        with self.cond:
            job = self.jobs.get(key)
            if job is None:
                return False
            if job.state == "queued":
                job.state = "claimed"
                self.queue.remove(job)
                return False
            if job.state == "sent" and not self.cond.wait_for(lambda: job.state != "sent", TAKE_TIMEOUT_S):
                log.warning("the compile helper has compiled %s.%s for %.0f s; compiling it here", job.key[0],
                            job.key[1], TAKE_TIMEOUT_S)
                job.state = "claimed"
            return job.state == "done"

    def wait_idle(self) -> None:
        """Wait until no job is queued or being compiled (tests, benchmarks)."""
        with self.cond:
            while not self.broken and (self.queue or any(j.state == "sent" for j in self.jobs.values())):
                self.cond.wait()

    def _start(self) -> bool:
        env = dict(os.environ, JITGRAD_COMPILE_HELPER="0", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            # Its own session: a Ctrl-C at the terminal interrupts the user's process, not the helper, which
            # ends when that process closes the pipe.
            self.process = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, env=env, close_fds=True, start_new_session=True)
        except (OSError, ValueError) as exc:
            log.warning("cannot start the compile helper (%s); kernels compile in this process", exc)
            self._fail_all()
            return False
        threading.Thread(target=self._feed, args=(self.process,), daemon=True, name="jitgrad-compile-helper").start()
        return True

    def _fail_all(self) -> None:
        self.broken = True
        for job in self.jobs.values():
            if job.state in ("queued", "sent"):
                job.state = "failed"
        self.queue.clear()
        self.cond.notify_all()

    def _feed(self, process: subprocess.Popen) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.broken:
                    self.cond.wait()
                if self.broken:
                    return
                job = self.queue.popleft()
                job.state = "sent"
            try:
                _send(process.stdin, job.request)
                reply = _receive(process.stdout)
            except (OSError, ValueError, pickle.UnpicklingError, EOFError):
                reply = None
            with self.cond:
                if reply is None:
                    log.warning("the compile helper stopped (exit code %s); kernels compile in this process",
                                process.poll())
                    self._fail_all()
                    return
                if job.state == "sent":
                    job.state, job.error = ("done", "") if reply == "" else ("failed", reply)
                    self.built += job.state == "done"
                self.cond.notify_all()

    def close(self) -> None:
        """End the helper: it finishes the kernel it is compiling, which still lands on disk."""
        with self.cond:
            self._fail_all()
            process, self.process = self.process, None
        if process is not None and process.stdin is not None:
            try:
                process.stdin.close()
            except OSError:
                pass


def compile_here(job: Job) -> None:
    """Compile a job this process claimed (`CompileHelper.claim_next`), into the disk cache as the helper would."""
    source, variants, function, signature = job.request
    compiler.load(source, variants).functions[function].compile(signature)


_helper: CompileHelper | None = None
_helper_lock = threading.Lock()


def helper() -> CompileHelper | None:
    """This process's helper (created on first use), or None where it is not used (`wanted`)."""
    global _helper
    if not wanted():
        return None
    with _helper_lock:
        if _helper is None:
            _helper = CompileHelper()
        return _helper


def _close_at_exit() -> None:
    if _helper is not None:
        _helper.close()


def _forget_in_child() -> None:
    """A forked child must not write to its parent's helper: it starts its own if it needs one."""
    global _helper, _helper_lock
    _helper, _helper_lock = None, threading.Lock()


atexit.register(_close_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def serve() -> None:
    """The helper's loop: compile each requested kernel into the disk cache; reply "" or the error."""
    from jitgrad.kernels.build import compiler

    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed while compiling goes to stderr, never into the replies
    while True:
        request = _receive(requests)
        if request is None:
            return
        source, variants, function, signature = request
        try:
            compiler.load(source, variants).functions[function].compile(signature)
            reply = ""
        except Exception as exc:  # the caller compiles it itself and sees the error there
            reply = f"{type(exc).__name__}: {exc}"
        _send(replies, reply)
