"""Turns generated kernel source into numba dispatchers, once per source text.

Sources are written to content-hashed modules under the cache directory and compiled with
numba's `cache=True`, so a new process reuses the machine code (numba cannot cache functions made
by `exec`). `JITGRAD_CACHE_DIR` moves the directory; `JITGRAD_CACHE=0` keeps everything in memory.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numba

_lock = threading.RLock()
_modules: dict[str, "CompiledSource"] = {}
_STATS = {"kernels_loaded": 0, "numba_compiles": 0}


def cache_dir() -> str:
    """Where generated modules (and numba's cache beside them) live."""
    if os.environ.get("JITGRAD_CACHE", "1") == "0":
        path = os.path.join(tempfile.gettempdir(), f"jitgrad-nocache-{os.getpid()}")
    else:
        base = os.environ.get("JITGRAD_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "jitgrad")
        path = os.path.join(base, f"numba-{numba.__version__}")
    os.makedirs(path, exist_ok=True)
    return path


@dataclass
class CompiledSource:
    """The dispatchers of one generated module; each compiles on first call with a new signature."""

    name: str
    source: str
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def call(self, variant: str, args: list[Any]) -> None:
        fn = self.functions[variant]
        before = len(fn.signatures)
        fn(*args)
        if len(fn.signatures) != before:
            with _lock:
                _STATS["numba_compiles"] += 1


def load(source: str, variants: dict[str, dict[str, Any]]) -> CompiledSource:
    """Compile (lazily) the functions named in `variants` from `source`, with those numba options."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _lock:
        found = _modules.get(key)
        if found is not None:
            return found
        name = f"jitgrad_kernel_{key}"
        path = os.path.join(cache_dir(), name + ".py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as fh:
                fh.write(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        cache = os.environ.get("JITGRAD_CACHE", "1") != "0"
        functions = {fname: numba.njit(cache=cache, error_model="numpy", **opts)(getattr(module, fname))
                     for fname, opts in variants.items()}
        compiled = CompiledSource(name, source, functions)
        _modules[key] = compiled
        _STATS["kernels_loaded"] += 1
        return compiled


def stats() -> dict[str, int]:
    with _lock:
        return dict(_STATS, sources=len(_modules))
