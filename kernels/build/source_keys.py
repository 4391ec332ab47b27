"""A kernel's content hash (`source_key`), the first part of its disk-cache key: its generated source and every
jitgrad module that source imports, transitively (numba compiles the `vecmath` and `reductions` helpers into
the kernel, so editing one re-keys every kernel that calls it)."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import re

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import|import[ \t]+([\w.]+))", re.MULTILINE)


def _imported_jitgrad_modules(text: str, package: str) -> list[str]:
    names = []
    for relative, absolute in _IMPORT.findall(text):
        name = absolute or relative
        if name.startswith("."):
            name = importlib.util.resolve_name(name, package)
        if name == "jitgrad" or name.startswith("jitgrad."):
            names.append(name)
    return names


_module_digests: dict[str, bytes] = {}


def _module_digest(name: str) -> bytes:
    """SHA-256 of a jitgrad module's file (read once per process)."""
    found = _module_digests.get(name)
    if found is None:
        spec = importlib.util.find_spec(name)
        with open(spec.origin, "rb") as fh:
            found = _module_digests[name] = hashlib.sha256(fh.read()).digest()
    return found


def helper_modules(source: str) -> tuple[str, ...]:
    """The jitgrad modules a kernel source imports, directly or through one another."""
    return _import_closure(tuple(sorted(set(_imported_jitgrad_modules(source, "")))))


@functools.lru_cache(maxsize=None)
def _import_closure(direct: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    todo = list(direct)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as fh:
                package = name if spec.submodule_search_locations else name.rpartition(".")[0]
                todo += _imported_jitgrad_modules(fh.read(), package)
    return tuple(sorted(seen))


def source_key(source: str) -> str:
    """A stable content hash of what a kernel's code depends on: its text and the helper modules'."""
    h = hashlib.sha256(source.encode())
    for name in helper_modules(source):
        h.update(b"\0" + name.encode() + b"\0" + _module_digest(name))
    return h.hexdigest()[:24]
