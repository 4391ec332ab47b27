"""Python's cyclic garbage collector paused while a caller waits for jitgrad to build: a kernel compiling
(kernels/compiler.py's compile listener enters and exits it) or a plan tracing, differentiating and fusing
(jitgrad/runtime/plans.py, as a `with` block)."""
from __future__ import annotations

import gc
import os
import threading


class CollectorPause:
    """Python's cyclic garbage collector paused while a caller waits for a build, then one
    youngest-generation pass (background compiles, which nobody waits for, leave it on).

    A numba compile allocates some 10^5 objects, many in reference cycles, and the full collections
    they trigger walk every live object in the process (numba's, the user's, torch's): about 15% of a
    cold first call. Tracing and fusing a long unrolled loop allocates as many (IR equations, avals,
    fusion groups), and a full collection falling in it made the tanh-RNN's trace-to-fusion at T = 100
    slower than at T = 200. While the collector is off, the compile's objects all stay in generation 0, so
    `gc.collect(0)` at the end frees its garbage without walking older objects. Re-entrant across
    threads; a collector the process had turned off stays off. A child forked while another thread
    compiles has no compile running: it gets the collector back as the process had it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._resume = False

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth or not self._resume:
                return
            gc.enable()
        gc.collect(0)

    def __enter__(self) -> "CollectorPause":
        self.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        if self._depth and self._resume:
            gc.enable()
        self._depth = 0


pause = CollectorPause()  # the one the compile listener uses
os.register_at_fork(after_in_child=pause.after_fork_in_child)
