"""How jitgrad's parallel kernels get their threads, beside the other thread pools of a process.

numba's default threading layer is OpenMP, and in a process that imported torch first it is torch's
GNU OpenMP runtime, started with torch's wait policy: its workers spin between parallel regions, and
torch's own workers (eager ops, inductor kernels) spin on the same cores, so on two cores each library
starves the other. jitgrad's kernels therefore run on numba's `workqueue` layer, plain threads that
sleep on a condition when idle, whatever runtime the process loaded first. The layer is numba's global
choice, made at the first parallel launch: a value the user set (`NUMBA_THREADING_LAYER`, or
`numba.config.THREADING_LAYER` before importing jitgrad) is kept. workqueue runs one parallel region at
a time, which `kernels.compiler` queues; it is fork-safe, so forked children keep parallel kernels.
"""
from __future__ import annotations

import os
import sys
import warnings

import numba

from .errors import ThreadsWarning

LAYER = "workqueue"


def choose_threading_layer() -> None:
    """Make numba's parallel kernels use the `workqueue` layer unless the user chose a layer."""
    if "NUMBA_THREADING_LAYER" in os.environ or numba.config.THREADING_LAYER != "default":
        return
    numba.config.THREADING_LAYER = LAYER


def warn_if_torch_spins(policy_was_set: bool) -> None:
    """Warn once, at import, where torch's OpenMP runtime started before jitgrad could ask for passive
    waiting: its idle workers then spin for milliseconds after every torch op (GOMP_SPINCOUNT, 300,000
    pauses), on the cores the next jitgrad call needs (measured: the small bench models' steps 2x slower
    when eager torch steps run between them). Only the environment before torch's import can change it."""
    if policy_was_set or "GOMP_SPINCOUNT" in os.environ or "torch" not in sys.modules:
        return
    warnings.warn("torch was imported before jitgrad, so its OpenMP threads keep OpenMP's default wait policy: "
                  "after each torch op they spin for milliseconds on the cores the next jitgrad (or numpy) call "
                  "needs. Set OMP_WAIT_POLICY=PASSIVE in the environment before Python starts (or before "
                  "`import torch`), or import jitgrad first; see docs/troubleshooting.md",
                  ThreadsWarning, stacklevel=3)
