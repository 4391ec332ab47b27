"""Reused output arrays of kernel call sites, bounded in bytes across the process.

An executable plans its outputs once (`BufferPool.plan`). The values that die within a call get places in one arena
(`place`): values live at a common step never share a byte, so the arena holds about the most bytes a call has live
at once (values of any shape, size or dtype pack around each other; bins that each hold one value at a time would be
as large as their largest value). An output the caller keeps (a result, a residual) gets arrays of its own. Each
value is handed out as a view of its own array over the arena (`_region`: numpy's views of it have it as their
`base`), and a call writes into it only when the reference counts of every array over its bytes show that the pool
is their sole owner: an array the user kept (or any view of it, or a saved residual, or a value the call still
reads) is never overwritten; a new array is allocated instead. Reuse spares large calls the page faults of fresh
allocations. All pools together hold at most `JITGRAD_BUFFER_POOL_MB` megabytes (by default 1/32 of the memory the
process may use, at least 256 MB: `jitgrad.kernels.pool_limit`); past that, the least recently used pools let their
arrays go. Whether reference counts can tell sole ownership is checked once on the running interpreter; where they
cannot, nothing is pooled.
"""
from __future__ import annotations

import logging
import math
import random
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Sequence

import numpy as np

from jitgrad.kernels.pool_limit import pool_limit_bytes

MIN_BYTES = 1 << 16  # smaller outputs are allocated afresh: cheaper than the bookkeeping
DEPTH = 2  # arrays per kept output: `loss, grads = f.value_and_grad(...)` in a loop keeps the last results alive
ALIGN = 64  # bytes: each value in the arena starts on a cache line
SEARCH_WORK = 20_000  # pairs of values live together `place` may visit in orders beyond the first (about 5 ms)
SOLE_OWNER = 3  # the pool's list, `_held_elsewhere`'s local name, and getrefcount's own argument

log = logging.getLogger("jitgrad.runtime")


def _held_elsewhere(arrays: list[np.ndarray], i: int) -> bool:
    """Does anyone but the list `arrays` hold `arrays[i]`, or a view of it (reference counts)?"""
    buf = arrays[i]
    return sys.getrefcount(buf) != SOLE_OWNER


def _region(memory: memoryview, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
    """An array of `count` elements over `memory` from `offset`. Its base is the memoryview, not an array, so
    numpy does not collapse the base of views of it past it: they keep it, and its reference count, alive."""
    return np.frombuffer(memory, dtype, count, offset)


def _sole_ownership_is_visible() -> bool:
    """Does `_held_elsewhere` tell an array nobody else holds from one that is held (by a name, by a view, by a
    view of a view), for arrays of their own and arrays over an arena? Interpreters differ in how they count
    borrowed references."""
    arena = np.empty(64, np.uint8)
    arrays = [np.empty(4), _region(memoryview(arena), 32, np.dtype(np.float64), 4)]
    found = []
    for i in range(len(arrays)):
        free = _held_elsewhere(arrays, i)
        named = arrays[i]
        held = _held_elsewhere(arrays, i)
        del named
        view = arrays[i][1:].reshape(3, 1)[1:]
        viewed = _held_elsewhere(arrays, i)
        del view
        found.append((free, held, viewed, _held_elsewhere(arrays, i)))
    return found == [(False, True, True, False)] * 2


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


class _Arena:
    """The memory of a pool's values that die within a call: an array per value over it (`_region`), and which
    of them were handed out since a reference count last showed them free (a bit per value)."""

    def __init__(self, nbytes: int, homes: Sequence[tuple[np.dtype, int, int | None]]):
        memory = np.empty(nbytes + ALIGN, np.uint8)
        start = -memory.ctypes.data % ALIGN
        view = memoryview(memory)[start:start + nbytes]
        self.regions = [_region(view, offset, dtype, count) for dtype, count, offset in homes if offset is not None]
        self.nbytes = memory.nbytes
        self.lent = 0


class BufferPool:
    """The output arrays of one program's call sites, planned once per program (`plan`): each output of MIN_BYTES
    or more gets a home. An output that dies within the call has its place in the pool's arena, shared over time
    with values never live at a step with it (`place`); an output the caller keeps has up to DEPTH arrays of its
    own. A take hands out a value's array only when no array over the same bytes is held elsewhere (reference
    counts), else allocates a new one, so a value still referenced (a result kept from the last call, a view of
    it) is never overwritten even where the plan's lifetimes are wrong."""

    def __init__(self) -> None:
        self.homes: list[tuple[np.dtype, int, int | None]] = []  # per home: dtype, elements, offset in the arena
        self.overlaps: list[int] = []  # per home in the arena (they come first): a bit for each home on its bytes
        self.arena_bytes = 0
        self.arena: _Arena | None = None  # made by the first take that needs it
        self.held: list[list[np.ndarray]] = []  # per home of its own (after the arena's): its arrays
        self.lock = threading.Lock()

    def site(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]) -> "OutputBuffers":
        """The outputs of one call site, taken from this pool once `plan` has given them homes."""
        return OutputBuffers(self, shapes, dtypes)

    def plan(self, steps: Sequence[tuple[Sequence[int], Sequence[int], "OutputBuffers | None", bool]],
             released: Sequence[Sequence[int]], kept: Sequence[int]) -> None:
        """Give every pooled output a home. `steps`: per step its input and output slots, the site of its pooled
        outputs (None if it has none) and whether its outputs may be views of its inputs (a host view); `released`:
        per step the slots dropped after it (`kernels.slots.release_after`); `kept`: slots that outlive the call."""
        lifetimes, where = plan_lifetimes(steps, released, kept)
        dying = [r for r in where if lifetimes[r][2] is not None]
        offsets, self.arena_bytes = place([lifetimes[r] for r in dying])  # type: ignore[arg-type]
        outliving = [r for r in where if lifetimes[r][2] is None]
        self.homes = [(where[r][0].dtypes[where[r][1]], where[r][0].counts[where[r][1]], offset)
                      for r, offset in zip(dying + outliving, [*offsets, *[None] * len(outliving)])]
        self.overlaps = _overlaps(offsets, [offset + lifetimes[r][0] for r, offset in zip(dying, offsets)])
        self.arena, self.held = None, [[] for _ in self.homes]
        for home, r in enumerate(dying + outliving):
            site, j = where[r]
            site.homes[j] = home

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this pool holds."""
        arena = self.arena
        return (arena.nbytes if arena is not None else 0) + sum(a.nbytes for arrays in self.held for a in arrays)

    def take(self, home: int, shape: tuple[int, ...]) -> np.ndarray:
        """An array of `shape` over `home`'s array, or over a new one if anyone else may hold its bytes."""
        with self.lock:
            buf = self._from_arena(home) if home < len(self.overlaps) else self._own(home)
        return buf.reshape(shape)

    def _from_arena(self, home: int) -> np.ndarray:
        """`home`'s array over the arena if no array over any of its bytes is held elsewhere. An array is held
        elsewhere only if a take handed it out since its count last showed it free (its bit in `lent`)."""
        arena = self.arena
        if arena is None:
            if not budget.reserve(self, self.arena_bytes + ALIGN):
                return np.empty(self.homes[home][1], self.homes[home][0])
            arena = self.arena = _Arena(self.arena_bytes, self.homes)
        lent = arena.lent & self.overlaps[home]
        while lent:
            bit = lent & -lent
            if _held_elsewhere(arena.regions, bit.bit_length() - 1):
                return np.empty(self.homes[home][1], self.homes[home][0])
            arena.lent ^= bit
            lent ^= bit
        arena.lent |= 1 << home
        return arena.regions[home]

    def _own(self, home: int) -> np.ndarray:
        """A free array of `home`'s own, or a new one (kept if the home has room: the oldest is dropped)."""
        arrays = self.held[home]
        for i in range(len(arrays)):
            if not _held_elsewhere(arrays, i):
                return arrays[i]
        dtype, count, _ = self.homes[home]
        buf = np.empty(count, dtype)
        if len(arrays) == DEPTH:
            arrays.pop(0)  # the oldest is someone else's now; the pool forgets it
            budget.returned(self, buf.nbytes)
        if budget.reserve(self, buf.nbytes):
            arrays.append(buf)
        return buf

    def drop(self) -> None:
        """Let every held array go (the budget has stopped counting them). Swapping the references needs no lock:
        a take running meanwhile works on the old arena and lists, whose arrays are then simply not reused."""
        self.arena, self.held = None, [[] for _ in self.homes]


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


def live_peak(values: Sequence[tuple[int, int, int]]) -> int:
    """The most bytes live at one step among values (bytes, first step, last step): no arena holds less."""
    changes = sorted([(first, nbytes) for nbytes, first, _ in values]
                     + [(last + 1, -nbytes) for nbytes, _, last in values])
    live = peak = 0
    for _, change in changes:  # at a step, the values ending before it (negative) go first
        live += change
        peak = max(peak, live)
    return peak


def place(values: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets in one arena of values (bytes, first step, last step) such that values live at a common step share
    no byte, each a multiple of ALIGN, and the arena's bytes. Largest first (earliest first among equals), each
    value takes the tightest gap it fits among the values live with it that are placed, or the offset above them
    all. While the arena is larger than `live_peak` (the least any placement needs) and SEARCH_WORK allows, other
    orders drawn by a generator of fixed seed are tried and the smallest arena kept: the same values always get
    the same offsets, and never a larger arena than the first order's."""
    sizes = [-(-nbytes // ALIGN) * ALIGN for nbytes, _, _ in values]
    spans = [(first, last) for _, first, last in values]
    together = _live_together(spans)
    order = sorted(range(len(values)), key=lambda v: (-sizes[v], spans[v]))
    best = _place_in_order(sizes, together, order)
    floor = live_peak([(n, first, last) for n, (first, last) in zip(sizes, spans)])
    shuffle = random.Random(0).shuffle
    for _ in range(SEARCH_WORK // max(1, sum(map(len, together)))):
        if best[1] <= floor:
            break
        shuffle(order)
        found = _place_in_order(sizes, together, order)
        if found[1] < best[1]:
            best = found
    return best


def _live_together(spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Per value (first step, last step), the other values live at one of its steps."""
    by_first = sorted(range(len(spans)), key=spans.__getitem__)
    together: list[list[int]] = [[] for _ in spans]
    for k, v in enumerate(by_first):
        for u in by_first[k + 1:]:
            if spans[u][0] > spans[v][1]:  # and so do the later ones
                break
            together[v].append(u)
            together[u].append(v)
    return together


def _place_in_order(sizes: Sequence[int], together: Sequence[Sequence[int]], order: Sequence[int]
                    ) -> tuple[list[int], int]:
    """`place`'s offsets and arena bytes when values are placed in `order`."""
    offsets: list[int | None] = [None] * len(sizes)
    top = 0
    for v in order:
        taken = sorted((at, at + sizes[u]) for u in together[v] for at in [offsets[u]] if at is not None)
        free, tightest = 0, None  # the lowest free offset so far; the (gap, offset) that fits most tightly
        for start, end in taken:
            if start - free >= sizes[v] and (tightest is None or start - free < tightest[0]):
                tightest = (start - free, free)
            free = max(free, end)
        offsets[v] = at = free if tightest is None else tightest[1]
        top = max(top, at + sizes[v])
    return offsets, top  # type: ignore[return-value]


def _overlaps(offsets: Sequence[int], ends: Sequence[int]) -> list[int]:
    """Per value placed at offsets[v]:ends[v], a bit for each value sharing a byte with it (itself included)."""
    masks = [1 << v for v in range(len(offsets))]
    by_start = sorted(range(len(offsets)), key=offsets.__getitem__)
    for k, v in enumerate(by_start):
        for u in by_start[k + 1:]:
            if offsets[u] >= ends[v]:
                break
            masks[v] |= 1 << u
            masks[u] |= 1 << v
    return masks


class OutputBuffers:
    """The output arrays of one kernel call site: small ones allocated afresh, the others from their pool's homes."""

    def __init__(self, pool: BufferPool, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]):
        self.pool = pool
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.counts = [math.prod(map(int, s)) for s in self.shapes]  # Python ints: exact, faster than np.prod
        self.nbytes = [count * d.itemsize for count, d in zip(self.counts, self.dtypes)]
        self.small = [n < MIN_BYTES or not POOLING for n in self.nbytes]
        self.pooled = not all(self.small)
        self.homes: list[int | None] = [None] * len(shapes)  # set by `BufferPool.plan`

    def take(self) -> list[np.ndarray]:
        if not self.pooled:
            return [np.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]
        return [np.empty(s, d) if home is None else self.pool.take(home, s)
                for s, d, home in zip(self.shapes, self.dtypes, self.homes)]


def outputs_to_copy(output_slots: Sequence[int], fresh: set[int]) -> list[bool]:
    """Which outputs must be copied so none aliases an input, a constant or another output."""
    seen: set[int] = set()
    copies = []
    for s in output_slots:
        copies.append(s not in fresh or s in seen)
        seen.add(s)
    return copies
