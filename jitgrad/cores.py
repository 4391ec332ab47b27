"""Which cores the calling thread's work may use: a per-thread flag that an executable's call kept on one core
sets (`kernels.cpu.variants.CallSpread`) and that the work reads (`jitgrad.ops.blas_threads`: a split product
then runs its parts in turn on the calling thread). A utility below every wing, so both sides can reach it."""
from __future__ import annotations

import threading


class _OnOneCore(threading.local):
    """`on` is True while this thread runs a call that must not hand work to other threads."""

    on = False


on_one_core = _OnOneCore()
