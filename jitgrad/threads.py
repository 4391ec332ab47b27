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

import numba

LAYER = "workqueue"


def choose_threading_layer() -> None:
    """Make numba's parallel kernels use the `workqueue` layer unless the user chose a layer."""
    if "NUMBA_THREADING_LAYER" in os.environ or numba.config.THREADING_LAYER != "default":
        return
    numba.config.THREADING_LAYER = LAYER
