"""How jitgrad's parallel kernels get their threads, beside the other thread pools of a process.

numba's default threading layer is OpenMP, and in a process that imported torch first it is torch's
GNU OpenMP runtime, started with torch's wait policy: its workers spin between parallel regions, and
torch's own workers (eager ops, inductor kernels) spin on the same cores, so on two cores each library
starves the other. jitgrad's kernels therefore run on numba's `workqueue` layer, plain threads that
sleep on a condition when idle, whatever runtime the process loaded first. The layer is numba's global
choice, made at the first parallel launch: a value the user set (`NUMBA_THREADING_LAYER`, or
`numba.config.THREADING_LAYER` before importing jitgrad) is kept. workqueue runs one parallel region at
a time, which `kernels.build.compiler` queues; it is fork-safe, so forked children keep parallel kernels.

torch's own workers are the other library's business: torch's GNU OpenMP runtime lets them spin for
milliseconds after every torch op, which makes torch's many small ops fast on a quiet machine (the bench's
small LSTM: eager torch 3.5-5.7 ms per step with its spin against 13.8-17 ms without). jitgrad leaves that
runtime as torch started it and sets no OpenMP variable: it slowed torch 1.6-6x when it did
(docs/troubleshooting.md). On a machine whose cores other processes keep busy, the spin costs every thread
of the process; JITGRAD_OPENMP_SPIN=throttle then parks one idle team in each GNU OpenMP runtime loaded
before jitgrad, with more threads than the process has CPUs, so that libgomp shortens the spin to 100
pauses (GOMP_SPINCOUNT in libgomp's manual; `quiet_openmp_spinning`).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Callable

import numba

LAYER = "workqueue"
SPIN_ENV = "JITGRAD_OPENMP_SPIN"  # "keep" (the default): leave OpenMP runtimes loaded before jitgrad as they are
SPIN_CHOICES = ("keep", "throttle")  # "throttle": park an idle team in each, so that libgomp shortens the spin
_idle_teams: dict[str, IdleTeam] = {}


def build_blas_handoff_in_background() -> None:
    """blas_threads builds its GIL-free handoff (numba compiles, blas_handoff) in the background-compile queue, so
    that it never overlaps a kernel's compile and whatever waits for background compiles (timing a kernel's
    variants, a benchmark's warm-up) waits for it too."""
    from jitgrad.kernels.build import background
    from jitgrad.ops import blas_threads

    def submit(job: Callable[[], None]) -> None:
        background.scheduler.submit(job)  # the scheduler of the moment: a forked child has a new one

    blas_threads.background_job = submit


def choose_threading_layer() -> None:
    """Make numba's parallel kernels use the `workqueue` layer unless the user chose a layer."""
    if "NUMBA_THREADING_LAYER" in os.environ or numba.config.THREADING_LAYER != "default":
        return
    numba.config.THREADING_LAYER = LAYER


def gnu_openmp_runtimes() -> list[str]:
    """Paths of the GNU OpenMP runtimes (libgomp) mapped into this process, as Linux lists them."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libgomp" in line}
    except OSError:
        return []
    return sorted(paths)


class IdleTeam:
    """A team started in the libgomp at `path` whose threads then sleep until `release`: one more than the
    CPUs, so that libgomp counts more managed threads than CPUs whatever team sizes torch uses. Its work is
    `free(NULL)`, a no-op needing no Python; its master thread waits, as the team's threads (and libgomp's
    count of them) go when it ends."""

    def __init__(self, path: str) -> None:
        gomp = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        gomp.GOMP_parallel.restype = None
        no_op = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
        self.size = max(os.cpu_count() or 1, len(os.sched_getaffinity(0))) + 1
        started, self._end = threading.Event(), threading.Event()

        def master() -> None:
            gomp.GOMP_parallel(no_op, None, self.size, 0)
            started.set()
            self._end.wait()

        self._master = threading.Thread(target=master, name="jitgrad-openmp-idle", daemon=True)
        self._master.start()
        started.wait()

    def release(self) -> None:
        """End the team: libgomp's spin goes back to what it was."""
        self._end.set()
        self._master.join()


def spin_choice() -> str:
    """JITGRAD_OPENMP_SPIN's value, `keep` where unset; any other value than SPIN_CHOICES is refused."""
    choice = os.environ.get(SPIN_ENV, "keep")
    if choice not in SPIN_CHOICES:
        raise ValueError(f"{SPIN_ENV}={choice!r}: write {SPIN_ENV}=keep (the default: torch's OpenMP threads spin "
                         f"as torch chose) or {SPIN_ENV}=throttle (they sleep soon after each op; "
                         "docs/troubleshooting.md)")
    return choice


def quiet_openmp_spinning() -> None:
    """With JITGRAD_OPENMP_SPIN=throttle, shorten the spin of the GNU OpenMP runtimes loaded before jitgrad
    (torch's) to libgomp's oversubscribed count, each once per process."""
    if spin_choice() == "throttle":
        for path in gnu_openmp_runtimes():
            if path not in _idle_teams:
                _idle_teams[path] = IdleTeam(path)
