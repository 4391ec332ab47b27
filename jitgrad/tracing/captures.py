"""Arrays a traced function reads from outside its arguments, read again at every call.

A function may read arrays from its closure, from module globals, from default arguments, from
attributes of the objects it reaches (`self.W`) and from the dicts, lists and tuples those hold.
While jitgrad traces it, each such array is temporarily replaced, where it lives, by a traced
value (a `CapturedTracer`), so that whatever the function computes from it (`x @ self.W.T`,
`np.exp(self.log_scale)`) is recorded instead of being run once by numpy and frozen; the original
is put back when the trace ends. Arrays the trace used become implicit inputs of the plan: each
call reads them again through the paths that led to them (`ArrayPath`), so updates in place and
rebinding are both seen. A path that no longer leads to an array of the same shape and dtype makes
the plan re-trace (`Captures.read` returns None). An array whose values the trace needed as Python
numbers (a mask, repeat counts, a size) is a constant of the plan, guarded by value.

Only user code is followed: functions and modules outside numpy, jitgrad, the standard library and
site-packages are not entered. Python numbers and numpy scalars (`np.float32(2)`) stay constants.
Traces that substitute run one at a time (`lock`): another thread reading the same arrays during a
trace (milliseconds, on a plan's first call) would see traced values.
"""
from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jitgrad.tracing.capture_paths import BROKEN_PATH, CONTAINERS, ArrayPath, StructureGuard
from jitgrad.ir.graph import Aval

NODE_BUDGET = 20_000  # objects visited per trace at most: a bound on the search through user state
MAX_DEPTH = 8  # containers and attributes followed from a root at most
CONCRETE_LIMIT = 1 << 16  # largest captured array whose values a trace may use as constants (guarded by value)

lock = threading.RLock()

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jitgrad/, not this wing
_LIBRARY_DIRS = tuple({os.path.abspath(p) for p in [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                     sysconfig.get_paths()["platlib"], *site.getsitepackages(),
                                                     os.path.dirname(os.path.abspath(np.__file__)), _PACKAGE_DIR]})


def is_user_file(filename: str | None) -> bool:
    """Code outside jitgrad, numpy, the standard library and installed packages (`<string>` and
    `<stdin>` code is the user's; frozen modules are not)."""
    if not filename:
        return False
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    path = os.path.abspath(filename)
    return not any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS)


def is_user_type(cls: type) -> bool:
    """Is `cls` defined in `__main__`, in a user file, or by user code run from a string (its methods' code
    says where)?"""
    name = getattr(cls, "__module__", None) or ""
    if name == "__main__":
        return True
    module = sys.modules.get(name)
    if module is not None:
        return is_user_file(getattr(module, "__file__", None))
    codes = [getattr(getattr(m, "__func__", m), "__code__", None) for m in vars(cls).values()]
    return any(c is not None and is_user_file(c.co_filename) for c in codes)


# ---------------------------------------------------------------------- what a plan keeps

@dataclass
class CapturedArray:
    """One array read from outside the arguments: every path reaching it, its aval, and whether the
    trace used it as data (an implicit input) or needed its values (a constant guarded by value)."""

    paths: list[ArrayPath]
    aval: Aval
    used: bool = False
    snapshot: np.ndarray | None = None

    def current(self) -> np.ndarray | None:
        """The array the first path leads to now, if every path still leads to that one array with the
        traced shape and dtype (and, for a constant, the same values); None if not."""
        try:
            value = self.paths[0].resolve()
            if len(self.paths) > 1 and any(p.resolve() is not value for p in self.paths[1:]):
                return None
        except BROKEN_PATH:
            return None
        if type(value) is not np.ndarray or value.shape != self.aval.shape or value.dtype != self.aval.dtype:
            return None
        if self.snapshot is not None and not np.array_equal(value, self.snapshot):
            return None
        return value


@dataclass
class Captures:
    """The captured arrays of one plan, in the order of the graph's implicit inputs."""

    inputs: list[CapturedArray] = field(default_factory=list)
    constants: list[CapturedArray] = field(default_factory=list)
    structures: list[StructureGuard] = field(default_factory=list)  # containers whose shape the trace followed

    def __bool__(self) -> bool:
        return bool(self.inputs or self.constants or self.structures)

    def read(self) -> list[np.ndarray] | None:
        """The implicit inputs' current arrays; None when a path or a container's structure changed so that
        the plan must re-trace."""
        for guard in self.structures:
            if not guard.holds():
                return None
        for c in self.constants:
            if c.current() is None:
                return None
        values = []
        for c in self.inputs:
            v = c.current()
            if v is None:
                return None
            values.append(v)
        return values

    def describe(self) -> list[str]:
        """One line per captured array: its path and aval (for `explain`)."""
        lines = [f"{c.paths[0]}: {c.aval} (read at every call)" for c in self.inputs]
        lines += [f"{c.paths[0]}: {c.aval} (a constant: its values shaped the trace)" for c in self.constants]
        return lines + [str(g) for g in self.structures]

    def keep_structures(self, guards: dict[int, StructureGuard]) -> None:
        """Keep the guards of the containers this plan's trace depends on (`StructureGuard.matters`)."""
        used = {id(c) for c in self.inputs + self.constants}
        for g in guards.values():
            g.settle(_is_array)
        self.structures = [g for g in guards.values() if g.matters(used)]


# ---------------------------------------------------------------------- substitution during a trace

class _Substitution:
    """One walk over the state a function reaches, replacing arrays by traced values (`make`) and
    recording how to put everything back."""

    def __init__(self, make: Callable[[np.ndarray, ArrayPath], Any], known: dict[int, Any],
                 guards: dict[int, StructureGuard]):
        self.make = make
        self.known = known  # id(array) -> its tracer (shared by every path to it)
        self.guards = guards  # id(container) -> the guard of its structure (shared across nested traces)
        self.open: list[StructureGuard] = []  # the containers being walked, outermost first
        self.replacement: dict[int, Any] = {}  # id -> what a visited object became (also a cycle guard)
        self.restore: list[Callable[[], None]] = []
        self.budget = NODE_BUDGET
        self.names: set[str] = set()  # attribute names user code reads: modules are followed on these only
        self.code_seen: set[int] = set()

    # ---- entry points

    def function(self, fn: Any, depth: int = 0) -> None:
        """Follow a callable: a function's closure, globals and defaults, a bound method's object,
        a partial's arguments, a Traced function's wrapped one, a callable object's __call__."""
        if depth > MAX_DEPTH or id(fn) in self.replacement or not self._spend():
            return
        self.replacement[id(fn)] = fn
        if isinstance(fn, types.MethodType):
            self.function(fn.__func__, depth)
            self.value(fn.__self__, ArrayPath(("object", fn.__self__)), depth + 1)
        elif isinstance(fn, functools.partial):
            self.function(fn.func, depth + 1)
            for arg in fn.args:
                self.value(arg, ArrayPath(("object", arg)), depth + 1)
            self.value(fn.keywords, ArrayPath(("object", fn.keywords)), depth + 1)
        elif isinstance(fn, types.FunctionType):
            self._plain_function(fn, depth)
        elif callable(getattr(fn, "__wrapped__", None)):  # functools.wraps decorators, jg.trace among them
            self.function(fn.__wrapped__, depth + 1)
        elif callable(fn) and not isinstance(fn, type) and is_user_type(type(fn)):
            self._class(type(fn), depth + 1)
            self.value(fn, ArrayPath(("object", fn)), depth + 1)

    def _plain_function(self, fn: types.FunctionType, depth: int) -> None:
        code = fn.__code__
        if not is_user_file(code.co_filename):
            return
        self._add_names(code)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                old = cell.cell_contents
            except ValueError:  # an empty cell: the name is not bound yet
                continue
            new = self.value(old, ArrayPath(("cell", cell, name)), depth + 1)
            if new is not old:
                self._set(lambda v, c=cell: setattr(c, "cell_contents", v), old, new)
        for name in sorted(_global_names(code)):
            if name in fn.__globals__:
                self._entry(fn.__globals__, name, depth + 1)
        if fn.__defaults__:
            old_defaults = fn.__defaults__
            new_defaults = tuple(self.value(v, ArrayPath(("default", fn, i)), depth + 1)
                                 for i, v in enumerate(old_defaults))
            if any(n is not o for n, o in zip(new_defaults, old_defaults)):
                self._set(lambda v, f=fn: setattr(f, "__defaults__", v), old_defaults, new_defaults)
        if fn.__kwdefaults__:
            for name in list(fn.__kwdefaults__):
                self._entry(fn.__kwdefaults__, name, depth + 1)

    def _class(self, cls: type, depth: int) -> None:
        """Methods of a user class (their code names what instances' attributes are read)."""
        for klass in cls.__mro__:
            if klass is object or not is_user_type(klass) or id(klass) in self.replacement:
                continue
            self.replacement[id(klass)] = klass
            for member in vars(klass).values():
                member = getattr(member, "__func__", member)
                if isinstance(member, property):
                    member = member.fget
                if isinstance(member, types.FunctionType):
                    self.function(member, depth)

    # ---- values

    def value(self, x: Any, path: ArrayPath, depth: int) -> Any:
        """What `x` becomes in the trace: a tracer for an array, a rebuilt tuple holding replacements, or
        `x` itself (mutable containers and objects are changed in place)."""
        if isinstance(x, np.ndarray):
            return self._array(x, path)
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes, np.generic)) or depth > MAX_DEPTH:
            return x
        key = id(x)
        if key in self.replacement:
            return self.replacement[key]
        if not self._spend():
            return x
        self.replacement[key] = x
        if isinstance(x, CONTAINERS):
            return self._container(x, path, depth)
        if isinstance(getattr(x, "capture", None), CapturedArray):  # substituted already, by an enclosing trace
            self._beneath(x.capture)
        if isinstance(x, types.ModuleType):
            if is_user_file(getattr(x, "__file__", None)):
                for name in sorted(self.names & set(vars(x))):
                    self._entry(vars(x), name, depth + 1, path.then("attr", name))
        elif isinstance(x, (types.FunctionType, types.MethodType, functools.partial)):
            self.function(x, depth)
        elif isinstance(x, type):
            if is_user_type(x):
                self._class(x, depth)
        elif callable(x) and callable(getattr(x, "__wrapped__", None)):
            self.function(x, depth)
        elif hasattr(x, "__dict__") and is_user_type(type(x)):
            self._class(type(x), depth)
            attrs = vars(x)
            for name in list(attrs):
                self._entry(attrs, name, depth + 1, path.then("attr", name))
        return x

    def _container(self, x: dict | list | tuple, path: ArrayPath, depth: int) -> Any:
        """Walk a dict, list or tuple under a guard of its structure; a tuple holding replacements is rebuilt."""
        guard = self.guards.get(id(x))
        if guard is None:
            guard = self.guards[id(x)] = StructureGuard.of(x, path)
        self.open.append(guard)
        try:
            if isinstance(x, dict):
                for k in list(x):
                    self._entry(x, k, depth + 1, path.then("item", k))
            elif isinstance(x, list):
                for i in range(len(x)):
                    old = x[i]
                    new = self.value(old, path.then("item", i), depth + 1)
                    if new is not old:
                        self._set(lambda v, lst=x, j=i: lst.__setitem__(j, v), old, new)
            else:
                items = [self.value(v, path.then("item", i), depth + 1) for i, v in enumerate(x)]
                if any(n is not o for n, o in zip(items, x)):
                    rebuilt = type(x)._make(items) if hasattr(type(x), "_make") else tuple(items)
                    self.replacement[id(x)] = rebuilt
                    return rebuilt
        finally:
            self.open.pop()
        return x

    def _array(self, x: np.ndarray, path: ArrayPath) -> Any:
        found = self.known.get(id(x))
        if found is None:
            if x.dtype.kind not in "biuf" or x.dtype == np.float16 or isinstance(x, (np.matrix, np.ma.MaskedArray)):
                return x  # a dtype jitgrad refuses: left for the op that reads it to say so
            found = self.known[id(x)] = self.make(x, path)
        else:
            capture = getattr(found, "capture", None)
            if capture is not None:
                capture.paths.append(path)
        if isinstance(getattr(found, "capture", None), CapturedArray):
            self._beneath(found.capture)
        return found

    def _beneath(self, capture: CapturedArray) -> None:
        """Note a captured array under the containers being walked (their guards matter if it is used)."""
        for guard in self.open:
            guard.arrays.append(capture)

    def _entry(self, mapping: dict, key: Any, depth: int, path: ArrayPath | None = None) -> None:
        old = mapping[key]
        new = self.value(old, path or ArrayPath(("entry", mapping, key)), depth)
        if new is not old:
            self._set(lambda v, m=mapping, k=key: m.__setitem__(k, v), old, new)

    def _set(self, assign: Callable[[Any], None], old: Any, new: Any) -> None:
        assign(new)
        self.restore.append(lambda: assign(old))

    def _spend(self) -> bool:
        self.budget -= 1
        return self.budget >= 0

    def _add_names(self, code: types.CodeType) -> None:
        if id(code) in self.code_seen:
            return
        self.code_seen.add(id(code))
        self.names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._add_names(const)


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the functions, lambdas and comprehensions inside it) may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or isinstance(getattr(x, "capture", None), CapturedArray)


def substituted(fn: Any, make: Callable[[np.ndarray, ArrayPath], Any], known: dict[int, Any],
                guards: dict[int, StructureGuard]) -> "_Restorer":
    """Replace the arrays `fn` reaches by `make(array, path)` until the returned context exits.
    `known` maps arrays already replaced in this trace to their tracers, `guards` the containers walked
    to their structure guards (both shared across nested traces)."""
    return _Restorer(_Substitution(make, known, guards), fn)


def substituted_as_traced(fn: Any, by_path: dict[tuple, Any], by_id: dict[int, Any]) -> "_Restorer":
    """Replace the arrays `fn` reaches by the values a trace gave them: found by path (`ArrayPath.key`), else
    by the array's identity; other arrays stay. A custom Function's backward, run again when the plan is
    differentiated, reads through this the captured arrays its traced forward's equation holds as inputs."""

    def make(x: np.ndarray, path: ArrayPath) -> Any:
        found = by_path.get(path.key)
        return found if found is not None else by_id.get(id(x), x)

    return _Restorer(_Substitution(make, {}, {}), fn)


class _Restorer:
    """Context manager of one substitution: walks on entry (under `lock`), puts everything back on exit."""

    def __init__(self, walk: _Substitution, fn: Any):
        self.walk = walk
        self.fn = fn

    def __enter__(self) -> "_Restorer":
        lock.acquire()
        try:
            if isinstance(self.fn, types.FunctionType):
                self.walk._add_names(self.fn.__code__)
            self.walk.function(self.fn)
        except BaseException:
            self._undo()
            lock.release()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._undo()
        finally:
            lock.release()

    def _undo(self) -> None:
        """Put every replaced value back, last first. A restore is dropped only after it ran (running one
        twice is harmless), and a KeyboardInterrupt in the middle still lets the rest run before it goes on."""
        pending = self.walk.restore
        try:
            while pending:
                pending[-1]()
                pending.pop()
        finally:
            while pending:
                pending[-1]()
                pending.pop()
