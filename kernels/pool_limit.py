"""How many bytes the reused output buffers of all programs may hold together (`jitgrad.kernels.buffers`).

`JITGRAD_BUFFER_POOL_MB` megabytes where set (0 turns reuse off); by default 1/MEMORY_SHARE of the memory the
process may use (the machine's, or its cgroup's limit where lower), at least MIN_DEFAULT_POOL_MB.
"""
from __future__ import annotations

import functools
import logging
import os

MIN_DEFAULT_POOL_MB = 256.0
MEMORY_SHARE = 32  # the default limit is this fraction of the memory the process may use (at least the minimum)

log = logging.getLogger("jitgrad.runtime")


def _cgroup_memory_limit_files() -> list[str]:
    """Files that may hold this process's cgroup memory limit: those of its own cgroups (from /proc/self/cgroup;
    v2's memory.max, v1's memory.limit_in_bytes), then those at the mounts' roots (a container's own)."""
    files = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if path != "/" and controllers == "":
                    files.append(f"/sys/fs/cgroup{path}/memory.max")
                elif path != "/" and "memory" in controllers.split(","):
                    files.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    return files + ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]


def usable_memory_bytes() -> int | None:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit where that is lower (v2's
    memory.max, v1's memory.limit_in_bytes); None where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in _cgroup_memory_limit_files():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            limits.append(int(text))
    return min(limits) if limits else None


@functools.lru_cache(maxsize=1)
def default_pool_bytes() -> int:
    """The pool limit without JITGRAD_BUFFER_POOL_MB: 1/MEMORY_SHARE of `usable_memory_bytes`, at least
    MIN_DEFAULT_POOL_MB. Large enough that an output of a few hundred megabytes (per-example gradients) keeps its
    DEPTH arrays on a machine with the memory for them; fresh memory of that size costs its page faults at every
    call (about as long as writing it)."""
    usable = usable_memory_bytes() or 0
    return max(int(MIN_DEFAULT_POOL_MB * 2**20), usable // MEMORY_SHARE)


def pool_limit_bytes() -> int:
    """`JITGRAD_BUFFER_POOL_MB` megabytes (default `default_pool_bytes`; 0 turns pooling off)."""
    text = os.environ.get("JITGRAD_BUFFER_POOL_MB")
    if text is None:
        return default_pool_bytes()
    try:
        megabytes = float(text)
        if not megabytes >= 0:
            raise ValueError(text)
    except ValueError:
        log.warning("JITGRAD_BUFFER_POOL_MB=%r is not a number of megabytes >= 0; using the default, %.0f MB",
                    text, default_pool_bytes() / 2**20)
        return default_pool_bytes()
    return int(megabytes * 2**20)
