"""Reused output arrays of kernel call sites, bounded in bytes across the process.

An executable plans its outputs into bins once (`BufferPool.plan`): outputs whose lifetimes in a call do not
overlap share a bin, whatever their shape, size or dtype, so its pool holds about what one call has live at
once. A call writes into a bin's array only when its reference count shows that the pool is its sole owner: an
array the user kept (or any view of it, or a saved residual, or a value the call still reads) is never
overwritten; a new array is allocated instead. Reuse spares large calls the page faults of fresh allocations.
All pools together hold at most `JITGRAD_BUFFER_POOL_MB` megabytes (default 256); past that, the least recently
used pools let their arrays go. Whether reference counts can tell sole ownership is checked once on the running
interpreter; where they cannot, nothing is pooled.
"""
from __future__ import annotations

import bisect
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
DEPTH = 2  # arrays per bin: `loss, grads = f.value_and_grad(...)` in a loop keeps the last results alive
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
    """The output arrays of one program's call sites, planned once per program (`plan`): each output of
    MIN_BYTES or more gets a bin, and outputs whose lifetimes in a call do not overlap share one, whatever their
    shape, size or dtype (a bin is as large as its largest value; a smaller value is a view of its first bytes),
    so the pool holds about what a call has live at once. An output the caller keeps (a result, a residual) has a
    bin of its own. A bin keeps at most DEPTH arrays: a take finds one nobody else holds (reference counts) or
    allocates another, so a value still referenced (a result kept from the last call, a view of it) is never
    overwritten even where the plan's lifetimes are wrong."""

    def __init__(self) -> None:
        self.sizes: list[int] = []  # per bin: the elements of its arrays
        self.dtypes: list[np.dtype] = []  # per bin: the dtype of its arrays (its largest value's)
        self.held: list[list[np.ndarray]] = []
        self.lock = threading.Lock()

    def site(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]) -> "OutputBuffers":
        """The outputs of one call site, taken from this pool once `plan` has given them bins."""
        return OutputBuffers(self, shapes, dtypes)

    def plan(self, steps: Sequence[tuple[Sequence[int], Sequence[int], "OutputBuffers | None", bool]],
             released: Sequence[Sequence[int]], kept: Sequence[int]) -> None:
        """Give every pooled output a bin. `steps`: per step its input and output slots, the site of its pooled
        outputs (None if it has none) and whether its outputs may be views of its inputs (a host view); `released`:
        per step the slots dropped after it (`kernels.slots.release_after`); `kept`: slots that outlive the call."""
        lifetimes, where = plan_lifetimes(steps, released, kept)
        bins, sizes = assign_bins([lifetimes[r] for r in where])
        self.sizes, self.dtypes, self.held = [0] * len(sizes), [np.dtype(np.uint8)] * len(sizes), []
        for (site, j), b in zip(where.values(), bins):
            if site.nbytes[j] == sizes[b] and self.sizes[b] == 0:
                self.sizes[b], self.dtypes[b] = site.keys[j][0], site.dtypes[j]
        for b, nbytes in enumerate(sizes):
            if self.sizes[b] == 0:  # only reached through another dtype's larger value: bytes
                self.sizes[b] = nbytes
        self.held = [[] for _ in sizes]
        for (site, j), b in zip(where.values(), bins):
            site.bins[j] = b
            site.modes[j] = (0 if site.keys[j][0] == self.sizes[b] else 1) if site.dtypes[j] == self.dtypes[b] else 2

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this pool holds."""
        return sum(len(arrays) * size * dt.itemsize for arrays, size, dt in zip(self.held, self.sizes, self.dtypes))

    def take(self, b: int, mode: int, size: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """An array of `shape` over a free array of bin `b`, or over a new one (kept if the bin has room)."""
        with self.lock:
            arrays = self.held[b]
            for buf in arrays:
                if sys.getrefcount(buf) == _SOLE_OWNER:  # views of it count: their `base` is this array
                    break
            else:
                buf = np.empty(self.sizes[b], self.dtypes[b])
                nbytes = buf.nbytes
                if len(arrays) == DEPTH:
                    arrays.pop(0)  # the oldest is someone else's now; the pool forgets it
                    budget.returned(self, nbytes)
                if budget.reserve(self, nbytes):
                    arrays.append(buf)
        if mode == 0:
            return buf.reshape(shape)
        return buf[:size].reshape(shape) if mode == 1 else np.ndarray(shape, dtype, buf)

    def drop(self) -> None:
        """Let every held array go (the budget has stopped counting them). Swapping the list needs no lock: a
        take running meanwhile works on the old lists, whose arrays are then simply not reused."""
        self.held = [[] for _ in self.sizes]


def plan_lifetimes(steps: Sequence[tuple[Sequence[int], Sequence[int], "OutputBuffers | None", bool]],
                   released: Sequence[Sequence[int]], kept: Sequence[int]
                   ) -> tuple[dict[int, tuple[int, int, int | None]], dict[int, tuple["OutputBuffers", int]]]:
    """Per pooled output slot: (bytes, the step writing it, the last step at which it or a view of it is
    live, None if it outlives the call), and where it is written (site, output index)."""
    roots: dict[int, set[int]] = {}  # slot -> the pooled outputs whose memory it may be (itself, or viewed)
    born: dict[int, int] = {}
    where: dict[int, tuple[OutputBuffers, int]] = {}
    for k, (ins, outs, site, views) in enumerate(steps):
        for j, o in enumerate(outs):
            if site is not None and not site.small[j]:
                roots[o], born[o], where[o] = {o}, k, (site, j)
            elif views:
                found = set().union(*(roots.get(i, ()) for i in ins))
                if found:
                    roots[o] = found
    last: dict[int, int | None] = {r: born[r] for r in born}
    dropped: set[int] = set()
    for k, slots in enumerate(released):
        dropped.update(slots)
        for s in slots:
            for r in roots.get(s, ()):
                last[r] = max(last[r], k)  # type: ignore[type-var]
    for s, found in roots.items():
        if s not in dropped:  # small views stay in the slot list to the end of the call
            for r in found:
                last[r] = max(last[r], len(steps))  # type: ignore[type-var]
    for s in kept:
        for r in roots.get(s, ()):
            last[r] = None
    return {r: (where[r][0].nbytes[where[r][1]], born[r], last[r]) for r in where}, where


def assign_bins(values: Sequence[tuple[int, int, int | None]]) -> tuple[list[int], list[int]]:
    """Per value (bytes, first step, last step or None: it outlives the call), a bin, and each bin's bytes.
    Largest first (longest lived first among equals), a value joins the smallest bin none of whose values is live
    at any of its steps, else opens a bin of its size (so a bin is as large as its first value); a value that
    outlives the call has a bin of its own."""
    sizes: list[int] = []
    spans: list[list[tuple[int, int]]] = []  # per bin: the (first, last) steps of its values, sorted
    bins = [0] * len(values)
    for v in sorted(range(len(values)), key=lambda v: (-values[v][0], values[v][1] - (values[v][2] or 1 << 62))):
        nbytes, first, last = values[v]
        span = (first, last) if last is not None else None
        chosen = None
        for b in sorted(range(len(sizes)), key=sizes.__getitem__) if span is not None else ():
            taken = spans[b]
            k = bisect.bisect_left(taken, span)
            if (k == 0 or taken[k - 1][1] < first) and (k == len(taken) or taken[k][0] > span[1]):
                chosen = b
                break
        if chosen is None:
            chosen = len(sizes)
            sizes.append(nbytes)
            spans.append([(-1, 1 << 62)] if span is None else [])
        if span is not None:
            bisect.insort(spans[chosen], span)
        bins[v] = chosen
    return bins, sizes


class OutputBuffers:
    """The output arrays of one kernel call site: small ones allocated afresh, the others from their pool's bins."""

    def __init__(self, pool: BufferPool, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]):
        self.pool = pool
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.keys = [(int(np.prod(s, dtype=np.int64)), d.str) for s, d in zip(self.shapes, self.dtypes)]
        self.nbytes = [size * d.itemsize for (size, _), d in zip(self.keys, self.dtypes)]
        self.small = [n < MIN_BYTES or not POOLING for n in self.nbytes]
        self.pooled = not all(self.small)
        self.bins: list[int | None] = [None] * len(shapes)  # set by `BufferPool.plan`
        self.modes = [0] * len(shapes)  # 0: the bin's array reshaped; 1: its first elements; 2: its bytes as dtype

    def take(self) -> list[np.ndarray]:
        if not self.pooled:
            return [np.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]
        return [np.empty(s, d) if b is None else self.pool.take(b, mode, key[0], d, s)
                for s, d, key, b, mode in zip(self.shapes, self.dtypes, self.keys, self.bins, self.modes)]


def outputs_to_copy(output_slots: Sequence[int], fresh: set[int]) -> list[bool]:
    """Which outputs must be copied so none aliases an input, a constant or another output."""
    seen: set[int] = set()
    copies = []
    for s in output_slots:
        copies.append(s not in fresh or s in seen)
        seen.add(s)
    return copies
