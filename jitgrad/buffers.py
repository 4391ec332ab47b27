"""Reused output arrays of kernel call sites, bounded in bytes across the process.

A kernel call site keeps the arrays it wrote last time and writes into one again when its
reference count shows that the pool is its sole owner: an array the user kept (or any view of it,
or a saved residual) is never overwritten. Reuse spares large calls the page faults of fresh
allocations. All pools together hold at most `JITGRAD_BUFFER_POOL_MB` megabytes (default 256);
past that, the least recently used pools let their arrays go. Whether reference counts can tell
sole ownership is checked once on the running interpreter; where they cannot, nothing is pooled.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Sequence

import numpy as np

DEFAULT_POOL_MB = 256.0
MIN_BYTES = 1 << 16  # smaller outputs are allocated afresh: cheaper than the bookkeeping
DEPTH = 2  # buffers per output: `loss, grads = f.value_and_grad(...)` in a loop keeps the last results alive
_SOLE_OWNER = 3  # the pool's list, the local name, and getrefcount's own argument

log = logging.getLogger("jitgrad.runtime")


def _sole_ownership_is_visible() -> bool:
    """Does `sys.getrefcount` in `OutputBuffers._take_one`'s loop tell a buffer nobody else holds from one
    that is held (by a name, or by a view)? Interpreters differ in how they count borrowed references."""
    pool = [np.empty(4)]
    free = [sys.getrefcount(buf) == _SOLE_OWNER for buf in pool]
    held = pool[0]
    named = [sys.getrefcount(buf) == _SOLE_OWNER for buf in pool]
    del held
    view = pool[0][1:]
    viewed = [sys.getrefcount(buf) == _SOLE_OWNER for buf in pool]
    del view
    return free == [True] and named == [False] and viewed == [False]


def pool_limit_bytes() -> int:
    """`JITGRAD_BUFFER_POOL_MB` megabytes (default 256; 0 turns pooling off)."""
    text = os.environ.get("JITGRAD_BUFFER_POOL_MB")
    try:
        megabytes = DEFAULT_POOL_MB if text is None else float(text)
        if not megabytes >= 0:
            raise ValueError(text)
    except ValueError:
        log.warning("JITGRAD_BUFFER_POOL_MB=%r is not a number of megabytes >= 0; using %g", text, DEFAULT_POOL_MB)
        megabytes = DEFAULT_POOL_MB
    return int(megabytes * 2**20)


POOLING = _sole_ownership_is_visible()
if not POOLING:
    log.info("reference counts on this interpreter (%s) cannot show that a buffer is free; output buffers are "
             "not reused", sys.version.split()[0])


class _Budget:
    """Bytes held by every pool, and which pools were used least recently (they give their arrays up first).
    Pools call in while holding their own lock; the budget never takes a pool's lock (`drop` needs none)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.held = 0
        self.pools: OrderedDict[int, list] = OrderedDict()  # id(pool) -> [weakref to it, bytes it holds]

    def reserve(self, pool: "OutputBuffers", nbytes: int) -> bool:
        """Make room for `nbytes` more in `pool`; False if they do not fit even with every other pool emptied."""
        limit = pool_limit_bytes()
        with self.lock:
            key = id(pool)
            if key not in self.pools:
                self.pools[key] = [weakref.ref(pool, self._gone(key)), 0]
            self.pools.move_to_end(key)
            for other in [k for k in self.pools if k != key]:  # least recently used first
                if self.held + nbytes <= limit:
                    break
                ref, held = self.pools.pop(other)
                self.held -= held
                victim = ref()
                if victim is not None:
                    victim.drop()
            if self.held + nbytes > limit:
                return False
            self.pools[key][1] += nbytes
            self.held += nbytes
            return True

    def returned(self, pool: "OutputBuffers", nbytes: int) -> None:
        """`pool` let `nbytes` of its arrays go."""
        with self.lock:
            entry = self.pools.get(id(pool))
            if entry is not None:
                given = min(nbytes, entry[1])
                entry[1] -= given
                self.held -= given

    def _gone(self, key: int):  # type: ignore[no-untyped-def]
        def forget(_: weakref.ref) -> None:
            with self.lock:
                entry = self.pools.pop(key, None)
                if entry is not None:
                    self.held -= entry[1]
        return forget

    def clear(self) -> None:
        """Every pool lets its arrays go."""
        with self.lock:
            refs = [entry[0] for entry in self.pools.values()]
            self.pools.clear()
            self.held = 0
        for ref in refs:
            pool = ref()
            if pool is not None:
                pool.drop()


budget = _Budget()


class OutputBuffers:
    """The output arrays of one kernel call site, reused across calls once nobody else holds them."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]):
        self.shapes = list(shapes)
        self.dtypes = list(dtypes)
        self.held: list[list[np.ndarray]] = [[] for _ in self.shapes]
        self.nbytes = [int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in zip(self.shapes, self.dtypes)]
        self.small = [n < MIN_BYTES for n in self.nbytes]
        self.pooled = POOLING and not all(self.small)
        self.lock = threading.Lock()

    def take(self) -> list[np.ndarray]:
        if not self.pooled:
            return [np.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]
        with self.lock:
            return [self._take_one(k) for k in range(len(self.shapes))]

    def _take_one(self, k: int) -> np.ndarray:
        if self.small[k]:
            return np.empty(self.shapes[k], self.dtypes[k])
        pool = self.held[k]
        for buf in pool:
            if sys.getrefcount(buf) == _SOLE_OWNER:
                return buf
        buf = np.empty(self.shapes[k], self.dtypes[k])
        if len(pool) == DEPTH:
            pool.pop(0)  # the oldest is the user's now; the pool forgets it
            budget.returned(self, self.nbytes[k])
        if budget.reserve(self, self.nbytes[k]):
            pool.append(buf)
        return buf

    def drop(self) -> None:
        """Let every held array go (the budget has stopped counting them). Swapping the lists needs no lock:
        a take running meanwhile works on the old lists, whose arrays are then simply not reused."""
        self.held = [[] for _ in self.shapes]
