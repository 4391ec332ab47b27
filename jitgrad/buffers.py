"""Reused output arrays of kernel call sites, bounded in bytes across the process.

An executable's pool keeps the arrays its kernels wrote, by shape and dtype, and a kernel writes
into one again when its reference count shows that the pool is its sole owner: an array the user
kept (or any view of it, or a saved residual, or a value the call still reads) is never
overwritten. Reuse spares large calls the page faults of fresh allocations, and sharing by shape
lets one array serve every output of its shape whose lifetimes do not overlap. All pools together
hold at most `JITGRAD_BUFFER_POOL_MB` megabytes (default 256); past that, the least recently used
pools let their arrays go. Whether reference counts can tell
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
    """Does `sys.getrefcount` in `BufferPool.take`'s loop tell a buffer nobody else holds from one
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

    def reserve(self, pool: "BufferPool", nbytes: int) -> bool:
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

    def returned(self, pool: "BufferPool", nbytes: int) -> None:
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


class BufferPool:
    """The output arrays of one program's call sites, shared by size and dtype and reused once nobody else
    holds them: an intermediate the call has dropped (`runtime.release_after`) serves the next output of its
    size within the same call, whatever its shape (a view of the same flat array), so the pool holds about
    what a call has live at once rather than one array per output. Each (size, dtype) keeps at most DEPTH
    arrays per output of that kind."""

    def __init__(self) -> None:
        self.held: dict[tuple[int, str], list[np.ndarray]] = {}
        self.limit: dict[tuple[int, str], int] = {}
        self.lock = threading.Lock()

    def site(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]) -> "OutputBuffers":
        """The outputs of one call site, taken from this pool."""
        site = OutputBuffers(self, shapes, dtypes)
        for key, small in zip(site.keys, site.small):
            if not small:
                self.limit[key] = self.limit.get(key, 0) + DEPTH
                self.held.setdefault(key, [])
        return site

    def take(self, key: tuple[int, str], nbytes: int, shape: tuple[int, ...]) -> np.ndarray:
        """An array of `shape` over a free flat array of `key` (size, dtype), or over a new one."""
        with self.lock:
            pool = self.held[key]
            for buf in pool:
                if sys.getrefcount(buf) == _SOLE_OWNER:  # views of it count: their `base` is this array
                    return buf.reshape(shape)
            buf = np.empty(key[0], key[1])
            if len(pool) == self.limit[key]:
                pool.pop(0)  # the oldest is the user's now; the pool forgets it
                budget.returned(self, nbytes)
            if budget.reserve(self, nbytes):
                pool.append(buf)
            return buf.reshape(shape)

    def drop(self) -> None:
        """Let every held array go (the budget has stopped counting them). Swapping the lists needs no lock:
        a take running meanwhile works on the old lists, whose arrays are then simply not reused."""
        self.held = {key: [] for key in self.held}


class OutputBuffers:
    """The output arrays of one kernel call site: small ones allocated afresh, the others from its pool."""

    def __init__(self, pool: BufferPool, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]):
        self.pool = pool
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.keys = [(int(np.prod(s, dtype=np.int64)), d.str) for s, d in zip(self.shapes, self.dtypes)]
        self.nbytes = [size * d.itemsize for (size, _), d in zip(self.keys, self.dtypes)]
        self.small = [n < MIN_BYTES or not POOLING for n in self.nbytes]
        self.pooled = not all(self.small)

    def take(self) -> list[np.ndarray]:
        if not self.pooled:
            return [np.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]
        return [np.empty(s, d) if small else self.pool.take(key, n, s)
                for s, d, key, n, small in zip(self.shapes, self.dtypes, self.keys, self.nbytes, self.small)]
