"""How jitgrad's parallel kernels get their threads, beside the other thread pools of a process.

numba's default threading layer is OpenMP, and in a process that imported torch first it is torch's
GNU OpenMP runtime, started with torch's wait policy: its workers spin between parallel regions, and
torch's own workers (eager ops, inductor kernels) spin on the same cores, so on two cores each library
starves the other. jitgrad's kernels therefore run on numba's `workqueue` layer, plain threads that
sleep on a condition when idle, whatever runtime the process loaded first. The layer is numba's global
choice, made at the first parallel launch: a value the user set (`NUMBA_THREADING_LAYER`, or
`numba.config.THREADING_LAYER` before importing jitgrad) is kept. workqueue runs one parallel region at
a time, which `kernels.build.compiler` queues; it is fork-safe, so forked children keep parallel kernels.

torch's own workers are the other half: where torch started its GNU OpenMP runtime before jitgrad could
set OMP_WAIT_POLICY, they spin for milliseconds after every torch op. libgomp shortens that spin to 100
pauses when it manages more threads than the process has CPUs (GOMP_SPINCOUNT in libgomp's manual), so
jitgrad parks one idle team of that many threads in each such runtime (`quiet_openmp_spinning`).
JITGRAD_OPENMP_SPIN=keep, OMP_WAIT_POLICY or GOMP_SPINCOUNT set before the import leave it alone.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

import numba

from jitgrad.errors import ThreadsWarning

LAYER = "workqueue"
KEEP_SPIN_ENV = "JITGRAD_OPENMP_SPIN"  # "keep": leave the spin of an OpenMP runtime loaded before jitgrad alone
_idle_teams: dict[str, IdleTeam] = {}


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


def _user_chose_spin(policy_was_set: bool) -> bool:
    """Did the user choose how OpenMP threads wait (OMP_WAIT_POLICY before jitgrad, GOMP_SPINCOUNT, or
    JITGRAD_OPENMP_SPIN=keep)? Then jitgrad neither quiets nor warns."""
    return policy_was_set or "GOMP_SPINCOUNT" in os.environ or os.environ.get(KEEP_SPIN_ENV) == "keep"


def quiet_openmp_spinning(policy_was_set: bool) -> list[str]:
    """Shorten the spin of the GNU OpenMP runtimes loaded before jitgrad (torch's) to libgomp's
    oversubscribed count, unless the user chose a wait policy or spin count, or set JITGRAD_OPENMP_SPIN=keep.
    Returns the runtimes quieted so far (each once per process)."""
    chose = _user_chose_spin(policy_was_set)
    if not chose:
        for path in gnu_openmp_runtimes():
            if path not in _idle_teams:
                _idle_teams[path] = IdleTeam(path)
    return sorted(_idle_teams)


def warn_if_torch_spins(policy_was_set: bool, quieted: list[str]) -> None:
    """Warn once, at import, where torch started an OpenMP runtime before jitgrad that jitgrad cannot quiet
    (Intel's or LLVM's, as conda and macOS builds bring): its idle workers then spin after every torch op
    on the cores the next jitgrad call needs. Only the environment before torch's import can change it."""
    chose = _user_chose_spin(policy_was_set)
    if chose or quieted or "torch" not in sys.modules:
        return
    warnings.warn("torch was imported before jitgrad, and its OpenMP runtime is not GNU's, which jitgrad can ask "
                  "to stop spinning: after each torch op its threads spin on the cores the next jitgrad (or numpy) "
                  "call needs. Set OMP_WAIT_POLICY=PASSIVE (and KMP_BLOCKTIME=0 for Intel's runtime) in the "
                  "environment before Python starts, or import jitgrad first; see docs/troubleshooting.md",
                  ThreadsWarning, stacklevel=3)
