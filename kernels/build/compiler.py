"""Generated kernel source into numba dispatchers: once per text in a process, per signature and CPU on a machine.

A source runs as a module named by its content hash (`source_keys.source_key`: the text and the jitgrad modules it
imports, whose code numba compiles into the kernel), each function's dispatcher made when first asked for. Machine code
persists through `DiskCache`, numba's per-dispatcher cache protocol written over `jitgrad.cache`: one checksummed file
per (function, numba options, argument types, CPU), renamed into place, holding its full key so a file copied or
renamed over another is a miss, never another kernel's code; what the file holds is `entries`' (object code and the
names it defines; the module's code is an entry too). numba's own `cache=True` is not used because its per-function
index is read-modified-written without a lock (two processes can drop each other's entries or pair an index slot with
another signature's code) and a damaged index or data file raises instead of recompiling. numba's compile event says
which kernels compile and for how long (logger `jitgrad.compile`), and `numba_passes` and `quick_codegen` when one is
under way. Threads: modules load under a lock, numba compiles under its own (a main thread's in a `shield` worker),
parallel calls queue under workqueue.
"""
from __future__ import annotations

import hashlib
import linecache
import logging
import os
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numba
from numba.core import config as numba_config
from numba.core import event as numba_event
from numba.core import registry as numba_registry
from numba.core.caching import _Cache
from numba.core.compiler import CompileResult
from numba.core.runtime import rtsys

from jitgrad import cache
from jitgrad.kernels.build import background, collector, entries, numba_passes, pinned_pool, quick_codegen, shield
from jitgrad.kernels.build.source_keys import source_key
from jitgrad.logging_setup import configure_from_env

PROGRESS_INTERVAL_S = 5.0  # a compile running longer than this logs "still compiling" at this period

log = logging.getLogger("jitgrad.compile")
cache_log = logging.getLogger("jitgrad.cache")
_lock = threading.RLock()
_modules: dict[str, "CompiledSource"] = {}
_builds: dict[int, int] = {}  # thread ident -> machine code compiled for it (`shield.caller`)
_STATS = {"kernels_loaded": 0, "signatures": 0, "builds": 0, "disk_hits": 0, "disk_writes": 0, "disk_rejected": 0}


def _count(key: str) -> None:
    """Add one to a process-wide counter of `stats()`."""
    with _lock:
        _STATS[key] += 1


def thread_builds() -> int:
    """Machine code compiled for this thread (`builds` of `stats()`, its `shield` workers' included): a first
    call compares it before and after to see whether it compiled (jitgrad.progress)."""
    return _builds.get(threading.get_ident(), 0)


# ---------------------------------------------------------------------- the disk cache numba calls

_magic_tuples: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _magic_tuple(codegen: Any) -> tuple:
    """numba's magic tuple of `codegen`'s CPU (LLVM calls, about 0.1 ms), once per code generator."""
    found = _magic_tuples.get(codegen)
    if found is None:
        found = _magic_tuples[codegen] = codegen.magic_tuple()
    return found


class DiskCache(_Cache):
    """Machine code of one generated function, one verified file per signature and CPU.

    numba calls `load_overload` before compiling a new signature and `save_overload` after, both
    under its compiler lock; this class turns those calls into `jitgrad.cache` entry files. numba's
    own loader first refreshes its whole compilation target (importing numba.np.*, SciPy: ~0.3 s,
    most of a warm start); machine code needs only the NRT memory runtime started, so that is all
    `load_overload` starts (numba refreshes the target itself before any compile).
    """

    def __init__(self, folder: str, module_name: str, function: str, options: dict[str, Any]):
        self._folder = folder
        self._stem = f"{module_name}.{function}"
        self._options = repr(sorted(options.items()))
        self.enabled = True  # loads and saves machine code (numba's `enable`/`disable` set it)

    @property
    def cache_path(self) -> str:
        return self._folder

    def entry_key(self, sig: Any, codegen: Any) -> str:
        """Everything the machine code for `sig` depends on: the jitgrad, numba and Python versions,
        the kernel's source hash and function, its numba options, the argument types, numba's magic
        tuple of the CPU (target triple, CPU name, CPU features), numba's OPT and BOUNDSCHECK, what
        `numba_passes` and `quick_codegen` change in machine code, and the form of the entry (`entries`)."""
        return repr((cache.version_tag(), self._stem, self._options, str(sig), _magic_tuple(codegen), numba_config.OPT,
                     numba_config.BOUNDSCHECK, numba_passes.cache_tag(), quick_codegen.cache_tag(), entries.FORMAT))

    def entry_path(self, sig: Any, codegen: Any, key: str | None = None) -> str:
        """The file for `sig` on this CPU, named by a hash of its key (the key itself is inside)."""
        digest = hashlib.sha256((key or self.entry_key(sig, codegen)).encode()).hexdigest()[:20]
        return os.path.join(self._folder, f"{self._stem}.{digest}.nbk")

    def on_disk(self, sig: Any, codegen: Any) -> bool:
        """Is there a file for `sig` on this CPU (not yet verified: a load checks it)?"""
        return self.enabled and os.path.exists(self.entry_path(sig, codegen))

    def load_overload(self, sig: Any, target_context: Any) -> CompileResult | None:
        """The machine code for `sig` from disk, or None (numba then compiles): absent, or rejected
        for damage, another key or another owner (counted in `disk_rejected`)."""
        if not self.enabled:
            return None
        start = time.perf_counter()
        rtsys.initialize(target_context)
        codegen = target_context.codegen()
        key = self.entry_key(sig, codegen)
        path = self.entry_path(sig, codegen, key)
        cres = cache.load_entry(path, key, lambda payload: entries.rebuild(target_context, payload),
                                lambda: _count("disk_rejected"), "recompiling")
        if cres is None:
            return None
        _count("disk_hits")
        cache_log.debug("loaded %s from %s in %.1f ms", self._stem, path, 1e3 * (time.perf_counter() - start))
        return cres

    def save_overload(self, sig: Any, cres: CompileResult) -> None:
        if not self.enabled or any(not f.can_cache for f in cres.lifted) or cres.library.has_dynamic_globals:
            return
        key = self.entry_key(sig, cres.codegen)
        if cache.write_entry(self.entry_path(sig, cres.codegen, key), key, entries.payload(cres)):
            _count("disk_writes")
            cache.enforce_limit(keep=self._stem.split(".", 1)[0])

    def enable(self) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def flush(self) -> None:
        """Delete this function's machine code files."""
        for entry in cache.scan(self._folder).values():
            for path in entry.files:
                if os.path.basename(path).startswith(self._stem + "."):
                    cache.discard(path)


# ---------------------------------------------------------------------- compile logging

def _is_kernel(dispatcher: Any) -> bool:
    module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
    return module.startswith(cache.ENTRY_PREFIX)


def _label(dispatcher: Any, args: Any) -> str:
    module = dispatcher.py_func.__module__[len(cache.ENTRY_PREFIX):]
    return f"kernel {module[:12]}.{dispatcher.py_func.__name__}({', '.join(str(a) for a in args)})"


class _CompileLog(numba_event.Listener):
    """Counts and logs numba compiles of generated kernels, pausing the garbage collector during the
    foreground ones (`jitgrad.kernels.build.collector`); a long compile logs progress."""

    def __init__(self) -> None:
        self._running: dict[tuple[int, int], tuple[float, threading.Event]] = {}

    def on_start(self, event: numba_event.Event) -> None:
        dispatcher = event.data["dispatcher"]
        if not _is_kernel(dispatcher):
            return
        label = _label(dispatcher, event.data["args"])
        start, done = time.perf_counter(), threading.Event()
        self._running[(threading.get_ident(), id(dispatcher))] = (start, done)
        numba_passes.kernel_compile_started()
        quick_codegen.compile_started(dispatcher)
        if threading.current_thread() is not background.scheduler.worker:
            collector.pause.enter()
            background.scheduler.foreground_started()
        log.debug("compiling %s", label)
        threading.Thread(target=self._progress, args=(label, start, done), daemon=True,
                         name="jitgrad-compile-progress").start()

    @staticmethod
    def _progress(label: str, start: float, done: threading.Event) -> None:
        while not done.wait(PROGRESS_INTERVAL_S):
            log.info("still compiling %s: %.0f s so far", label, time.perf_counter() - start)

    def on_end(self, event: numba_event.Event) -> None:
        dispatcher = event.data["dispatcher"]
        running = self._running.pop((threading.get_ident(), id(dispatcher)), None)
        if running is None:
            return
        numba_passes.kernel_compile_ended()
        quick_codegen.compile_ended(dispatcher)
        if threading.current_thread() is not background.scheduler.worker:
            collector.pause.exit()
            background.scheduler.foreground_ended()
        start, done = running
        done.set()
        seconds = time.perf_counter() - start
        label = _label(dispatcher, event.data["args"])
        if tuple(event.data["args"]) not in dispatcher.overloads:  # numba raised: the error reaches the caller
            log.warning("compiling %s failed after %.2f s", label, seconds)
            return
        _count("builds")
        _builds[shield.caller()] = _builds.get(shield.caller(), 0) + 1
        log.info("compiled %s in %.2f s", label, seconds)


numba_event.register("numba:compile", _CompileLog())
configure_from_env()


# ---------------------------------------------------------------------- loading and calling

_parallel_calls_safe = False  # set once a parallel call has shown the threading layer is not workqueue
_parallel_lock = threading.Lock()


def _call_parallel(fn: Callable[..., Any], args: list[Any]) -> None:
    """numba's workqueue threading layer aborts the process when two threads run parallel code at
    once; until a parallel call has shown which layer is active, and under workqueue, calls queue."""
    global _parallel_calls_safe
    if _parallel_calls_safe:
        fn(*args)
        return
    with _parallel_lock:
        pinned_pool.call(fn, *args)  # the first parallel call of a forked child pins the pool it starts
        try:
            _parallel_calls_safe = numba.threading_layer() != "workqueue"
        except ValueError:  # no parallel region has run yet: the layer is still unknown
            pass


@dataclass
class CompiledSource:
    """The dispatchers of one generated module; each compiles (or loads) on first call with new argument
    types, or ahead of its first call in a background thread (`compile_in_background`)."""

    name: str
    source: str
    functions: dict[str, Callable[..., Any]]
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # numba options per function, as `load` got them
    _counted: dict[str, int] = field(default_factory=dict)
    _background: set[tuple] = field(default_factory=set)  # (variant, signature) submitted to the background
    failed: set[str] = field(default_factory=set)

    def _count_new_overloads(self, variant: str) -> None:
        with _lock:
            new = len(self.functions[variant].overloads) - self._counted.get(variant, 0)
            if new > 0:
                _STATS["signatures"] += new
                self._counted[variant] = len(self.functions[variant].overloads)

    def call(self, variant: str, args: list[Any]) -> None:
        fn = self.functions[variant]
        before = len(fn.overloads)
        if self.options[variant].get("parallel"):
            _call_parallel(fn, args)
        else:
            fn(*args)
        if len(fn.overloads) != before:
            self._count_new_overloads(variant)

    def compiled_here(self, variant: str, signature: tuple) -> bool:
        """Is `variant` compiled (or loaded) in this process for `signature`? Makes no dispatcher."""
        fn = self.functions.get(variant)
        return fn is not None and signature in fn.overloads

    def built(self, variant: str, signature: tuple) -> bool:
        """Is `variant` compiled in this process for `signature`, or its machine code on disk? Makes no dispatcher
        (numba's costs ~0.4 ms)."""
        if self.compiled_here(variant, signature):
            return True
        disk = getattr(self.functions, "caches", {}).get(variant)
        return disk is not None and disk.on_disk(signature, numba_registry.cpu_target.target_context.codegen())

    def ready(self, variant: str, args: list[Any]) -> bool:
        """Is `variant` compiled (or loaded) for these arguments' types? Not while its dispatcher is not made yet
        (`_Dispatchers`) or holds no code: such a call neither makes one nor types its arguments."""
        fn = self.functions.get(variant)
        return fn is not None and bool(fn.overloads) and tuple(numba.typeof(a) for a in args) in fn.overloads

    def compile_in_background(self, variant: str, args: list[Any], urgent: bool = False) -> None:
        """Compile `variant` for these arguments' types in the background (`jitgrad.kernels.build.background`:
        one at a time, when no other compile runs; `urgent` ones first), once per signature; calls meanwhile
        use another variant. A failure marks the variant `failed` and is logged."""
        signature = tuple(numba.typeof(a) for a in args)
        with _lock:
            if (variant, signature) in self._background or variant in self.failed:
                return
            self._background.add((variant, signature))

        def compile_variant() -> None:
            try:
                self.functions[variant].compile(signature)
            except Exception:
                log.exception("background compile of %s.%s failed; another variant stays in use", self.name, variant)
                self.failed.add(variant)
            self._count_new_overloads(variant)

        background.scheduler.submit(compile_variant, urgent)


def _module(name: str, source: str, folder: str | None) -> types.ModuleType:
    """Run `source` as module `name` (its code from the disk cache in `folder` when stored there:
    `entries.module_code`); numba's cached environments find their globals through sys.modules."""
    filename = f"<{name}>" if folder is None else os.path.join(folder, name + ".py")
    module = types.ModuleType(name)
    module.__file__ = filename
    if folder is None:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(entries.module_code(source, filename, folder, name), module.__dict__)
    sys.modules[name] = module
    return module


class _Dispatchers(dict):
    """A generated module's numba dispatchers by function name, each made when first asked for (a warm process
    runs one or two of a kernel's three variants; making a dispatcher costs a fifth of a kernel's load). The
    module itself runs when the first dispatcher is made (~0.3 ms a kernel that a numpy first call never needs)."""

    def __init__(self, name: str, source: str, variants: dict[str, dict[str, Any]], folder: str | None):
        super().__init__()
        self.name, self.source, self.variants, self.folder = name, source, variants, folder
        self.caches = {f: DiskCache(folder, name, f, opts) for f, opts in variants.items()} if folder else {}
        self._module: types.ModuleType | None = None

    @property
    def module(self) -> types.ModuleType:
        """The generated module, run on first use (under `_dispatchers_lock`, as `__missing__` asks for it)."""
        if self._module is None:
            self._module = _module(self.name, self.source, self.folder)
        return self._module

    def __missing__(self, fname: str) -> Any:
        with _dispatchers_lock:
            if fname in self:
                return dict.__getitem__(self, fname)
            opts = self.variants[fname]
            if opts.get("parallel"):
                pinned_pool.start()  # before numba starts the pool while compiling, beside other threads
            dispatcher = numba.njit(error_model="numpy", **quick_codegen.numba_options(opts))(
                getattr(self.module, fname))
            quick_codegen.mark(dispatcher, opts)
            shield.shield(dispatcher)
            if fname in self.caches:
                dispatcher._cache = self.caches[fname]
            self[fname] = dispatcher
            return dispatcher


_dispatchers_lock = threading.Lock()
_by_source: dict[str, CompiledSource] = {}  # the same modules by source text: a program's repeated kernels


def load(source: str, variants: dict[str, dict[str, Any]]) -> CompiledSource:
    """The module of `source`, its functions named in `variants` compiled (lazily) with those options (numba's,
    QUICK's): once per source text in a process."""
    found = _by_source.get(source)
    if found is not None:
        return found
    key = source_key(source)
    with _lock:
        found = _modules.get(key)
        if found is None:
            name = cache.ENTRY_PREFIX + key
            folder = cache.directory()
            if folder is not None and not cache.write_source(os.path.join(folder, name + ".py"), source):
                folder = None
            functions = _Dispatchers(name, source, variants, folder)
            found = _modules[key] = CompiledSource(name, source, functions, variants)
            _STATS["kernels_loaded"] += 1
        _by_source[found.source] = found
        return found


def wait_for_background_compiles() -> None:
    """Wait until every background compile submitted so far has finished."""
    background.scheduler.wait()


def stats() -> dict[str, int]:
    """Process-wide counters, shared by every traced function (see docs/caching.md, counters): `sources` kernel
    sources held and `kernels_loaded` made into modules; `builds` machine code compiled by numba, `disk_hits` machine
    code loaded from the disk cache instead, `signatures` the two together (new argument signatures of kernel
    dispatchers; `numba_compiles` is its former name, kept for existing callers); `disk_writes` entries stored and
    `disk_rejected` entries found but refused (damaged, another key's, another owner's, or unloadable), each built."""
    with _lock:
        return dict(_STATS, sources=len(_modules), numba_compiles=_STATS["signatures"])
