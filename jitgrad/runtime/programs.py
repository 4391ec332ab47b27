"""The disk cache of compiled programs: what autodiff, the passes and fusion made of a traced graph for one
recipe (call, value-and-grad, the forward/backward pair), so that a new process tracing the same function
loads the fused program instead of deriving it again (the kernels it runs load from the kernel cache).

An entry's key is the traced graph's text (`graph_keys.describe`: every equation, parameter, literal value and
source line, the inputs' types), the recipe, a digest of every Python file of jitgrad (`graph_keys.code_digest`:
any edit to a pass or an op record is another key), the versions of jitgrad, numba, numpy and Python, the
numpy CPU features that constant folding ran with, and the backend. Entries are `jitgrad.cache` files beside the
kernels (checksummed, keyed inside, owner-checked, evicted with them). A program is stored as a pickle that
names its primitives by their registry names and may only construct the IR's and the loop nests' classes,
numpy arrays and dtypes (`_Pickler`, `_Unpickler`); a graph holding anything else (a custom Function's call,
a parameter that is not plain data) is derived as before and not stored. `JITGRAD_PROGRAM_CACHE=0` turns
the cache off.
"""
from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import pickle
import threading
from typing import Any, Callable, TypeVar

import numpy as np

from jitgrad import cache
from jitgrad.ir import graph as ir_graph
from jitgrad.ir.primitive import PRIMITIVES, Offset, Param, Primitive
from jitgrad.passes import autodiff, loops
from jitgrad.runtime import graph_keys

FORMAT = "program-pickle-3"
T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("jitgrad.cache")
_lock = threading.Lock()
_STATS = {"program_hits": 0, "program_misses": 0, "program_writes": 0, "program_rejected": 0,
          "program_undescribed": 0}
_CLASSES = (ir_graph.Aval, ir_graph.Var, ir_graph.Literal, ir_graph.Eqn, ir_graph.Graph, ir_graph.SourceInfo,
            loops.Program, loops.LoopKernel, loops.HostStep, loops.Stage, loops.Load, loops.Compute, loops.Branch,
            loops.Reduction, loops.Store, Offset, Param, autodiff.SplitGraphs)  # what a stored program is made of


def enabled() -> bool:
    """False when `JITGRAD_PROGRAM_CACHE=0` (or the whole disk cache is off, `JITGRAD_CACHE=0`)."""
    return cache.enabled() and os.environ.get("JITGRAD_PROGRAM_CACHE", "1").strip() != "0"


def stats() -> dict[str, int]:
    """Process-wide counts: programs loaded from disk (`program_hits`), derived because none was stored
    (`program_misses`), stored (`program_writes`), found but refused (`program_rejected`: damaged, another
    key's, another owner's or not loadable), and graphs whose text is not a key (`program_undescribed`)."""
    with _lock:
        return dict(_STATS)


def _count(key: str) -> None:
    with _lock:
        _STATS[key] += 1


@functools.lru_cache(maxsize=None)
def _numpy_cpu() -> tuple:
    """The CPU features numpy dispatches its ufunc loops on (constant folding runs them) and the settings
    that restrict them."""
    from numpy._core._multiarray_umath import __cpu_features__ as features

    return (tuple(sorted(k for k, on in features.items() if on)),
            os.environ.get("NPY_DISABLE_CPU_FEATURES"), os.environ.get("NPY_ENABLE_CPU_FEATURES"))


def entry_key(text: str, recipe: tuple, backend: str) -> str:
    """The key of the program `recipe` makes of the graph whose text is `text`, on `backend`."""
    return repr((cache.version_tag(), FORMAT, graph_keys.code_digest(), np.__version__,
                 _numpy_cpu(), backend, recipe, hashlib.sha256(text.encode()).hexdigest()))


def _allowed(obj: Any) -> bool:
    """May a program entry hold `obj` (other than plain data: numbers, strings, tuples, lists, dicts, sets)?"""
    if isinstance(obj, type):
        return obj in _CLASS_SET or issubclass(obj, (np.generic, np.dtype, np.ndarray)) or obj in _BUILTINS
    if callable(obj) and not isinstance(obj, (np.generic, np.dtype, np.ndarray)):
        named = (getattr(obj, "__module__", None), getattr(obj, "__name__", None))
        return obj is _shared or obj is _primitive or named in _NUMPY_FUNCTIONS
    return type(obj) in _CLASS_SET or type(obj) in _BUILTINS or obj is Ellipsis or \
        isinstance(obj, (np.ndarray, np.dtype, np.generic))


def _shared(value: Any) -> Any:
    """The first of equal immutable records (an `Aval`, a `SourceInfo`): a program stores each value once (the
    LSTM's loop records its 705 equations from a few lines, over a few shapes), a fifth less to load."""
    return value


def _primitive(name: str) -> Primitive:
    """The primitive registered as `name`: a program stores each primitive it uses once, by name (the pickle's memo
    answers every later use, where a persistent id would call back into Python at each of them)."""
    found = next((p for p in PRIMITIVES.values() if p.name == name), None)  # once per primitive an entry uses
    if found is None:
        raise pickle.UnpicklingError(f"no primitive {name!r}")
    return found


class _Pickler(pickle.Pickler):
    """Primitives by registry name (`_primitive`); variables made anew on loading (fresh ids, the same sharing);
    equal avals and source lines once (`_shared`); anything `_Unpickler` would refuse raises
    `graph_keys.Undescribed` here, so such a program is not stored."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=5)
        self.records = {id(p) for p in PRIMITIVES.values()}
        self.first: dict[Any, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if isinstance(obj, Primitive):
            if id(obj) not in self.records:
                raise graph_keys.Undescribed(f"primitive {obj!r}")
            return _primitive, (obj.name,)
        if t is ir_graph.Var:
            return ir_graph.Var, (obj.aval,)
        if t is ir_graph.Aval or t is ir_graph.SourceInfo:
            first = self.first.setdefault(obj, obj)
            if first is not obj:
                return _shared, (first,)
        if _allowed(obj):
            return NotImplemented
        raise graph_keys.Undescribed(f"{obj!r:.80}")


class _Unpickler(pickle.Unpickler):
    """Constructs only the IR's and the loop nests' classes, numpy arrays, dtypes and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _MODULES:  # imported already: finding a name there runs nothing
            found = super().find_class(module, name)
            if _allowed(found):
                return found
        raise pickle.UnpicklingError(f"a program entry may not construct {module}.{name}")


_CLASS_SET = set(_CLASSES)
_MODULES = {c.__module__ for c in _CLASSES} | {__name__, "builtins", "numpy", "numpy.dtypes",
                                               "numpy._core.multiarray", "numpy._core.numeric"}
_BUILTINS = {slice, complex, type(Ellipsis)}
_NUMPY_FUNCTIONS = {("numpy._core.numeric", "_frombuffer"), ("numpy._core.multiarray", "_reconstruct"),
                    ("numpy._core.multiarray", "scalar")}  # what numpy's arrays and scalars pickle as


def _path(folder: str, key: str) -> str:
    return os.path.join(folder, f"{cache.PROGRAM_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:24]}.jgp")


def _load(folder: str, key: str) -> Any:
    path = _path(folder, key)
    found = cache.load_entry(path, key, lambda data: _Unpickler(io.BytesIO(data)).load(),
                             lambda: _count("program_rejected"), "deriving the program again")
    if found is not None:
        cache.touch(path)
    return found


def _store(folder: str, key: str, program: Any) -> None:
    buffer = io.BytesIO()
    try:
        _Pickler(buffer).dump(program)
    except graph_keys.Undescribed as exc:
        log.debug("program not stored: it holds %s", exc)
        return
    path = _path(folder, key)
    if cache.write_entry(path, key, buffer.getvalue()):
        _count("program_writes")
        cache.enforce_limit(keep=os.path.basename(path).split(".", 1)[0])


def cached(text_of: Callable[[], str | None], recipe: tuple, backend: str, build: Callable[[], T],
           bind: Callable[[T], R]) -> R:
    """`bind` of what `build()` makes for `recipe` of the graph whose text (`graph_keys.describe`) `text_of()` gives:
    loaded from the disk cache where a process stored it before, else built, bound and then stored, with what the
    binding added to it (`LoopKernel.lowered`; a text None: built only)."""
    folder = cache.directory() if enabled() else None
    if folder is None:
        return bind(build())
    text = text_of()
    if text is None:
        _count("program_undescribed")
        return bind(build())
    key = entry_key(text, recipe, backend)
    found = _load(folder, key)
    if found is not None:
        _count("program_hits")
        return bind(found)
    _count("program_misses")
    program = build()
    bound = bind(program)
    _store(folder, key, program)
    return bound
