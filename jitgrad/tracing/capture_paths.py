"""Where a traced function's captured values live: paths from a root slot (closure cell, dict entry,
default argument, object) through attributes and items, followed afresh at every call, and the guards
that check a captured container still has the structure a trace saw (`jitgrad.tracing.captures`)."""
from __future__ import annotations

import functools
import keyword
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

@dataclass(frozen=True)
class ArrayPath:
    """How a function reaches an array: a root slot (closure cell, dict entry, default argument or a
    fixed object) and then attributes and items. `resolve` follows it afresh."""

    root: tuple  # ("cell", cell, name) | ("entry", dict, key) | ("default", function, index) | ("object", obj)
    steps: tuple[tuple[str, Any], ...] = ()  # ("attr", name) | ("item", key)

    def then(self, kind: str, key: Any) -> "ArrayPath":
        return ArrayPath(self.root, self.steps + ((kind, key),))

    @functools.cached_property
    def key(self) -> tuple:
        """The same place whoever walks to it: the root's holder by identity, then the root slot and steps."""
        return (self.root[0], id(self.root[1])) + self.root[2:] + self.steps

    @functools.cached_property
    def resolve(self) -> Callable[[], Any]:
        """A function returning what the path leads to now (it raises if the path is broken)."""
        get = _root_getter(self.root)
        for step, key in self.steps:
            get = _attr_getter(get, key) if step == "attr" else _item_getter(get, key)
        return get

    def __str__(self) -> str:
        kind, holder = self.root[0], self.root[1]
        if kind == "cell":
            head = self.root[2]
        elif kind == "entry":
            head = str(self.root[2]) if "__name__" in holder else f"[{self.root[2]!r}]"  # a global, or a dict entry
        elif kind == "default":
            head = f"{holder.__name__}.__defaults__[{self.root[2]}]"
        else:
            head = f"<{type(holder).__name__} object>"
        return head + "".join(f".{k}" if s == "attr" else f"[{k!r}]" for s, k in self.steps)


def _root_getter(root: tuple) -> Callable[[], Any]:
    kind, holder = root[0], root[1]
    if kind == "cell":
        return lambda: holder.cell_contents
    if kind == "entry":
        key = root[2]
        return lambda: holder[key]
    if kind == "default":
        index = root[2]
        return lambda: holder.__defaults__[index]
    return lambda: holder


def _attr_getter(get: Callable[[], Any], name: str) -> Callable[[], Any]:
    return lambda: getattr(get(), name)


def _item_getter(get: Callable[[], Any], key: Any) -> Callable[[], Any]:
    return lambda: get()[key]


SCALARS = (bool, int, float, complex, str, bytes, np.generic, type(None))  # constants of a trace
CONTAINERS = (dict, list, tuple)  # walked into, each guarded through its own path
BROKEN_PATH = (AttributeError, KeyError, IndexError, TypeError, ValueError)


@dataclass
class StructureGuard:
    """A container (list, tuple, dict) a trace walked through: its type, length, keys and the identity
    of its members that are functions or objects (arrays are read through their paths, scalars are
    constants, inner containers have guards of their own). A call
    whose container no longer has that structure is traced again: a list that grew, a dict with a new
    key, a layer swapped for another. `arrays` are the captured arrays found beneath it while tracing."""

    path: ArrayPath
    kind: type
    length: int
    keys: tuple | None  # a dict's keys in order
    members: tuple[tuple[Any, Any], ...]  # (index or key, the object held there)
    arrays: list = field(default_factory=list)
    container: Any = None  # while the trace runs: the container itself, whose structure `settle` reads

    @classmethod
    def of(cls, container: dict | list | tuple, path: ArrayPath) -> "StructureGuard":
        """A guard of `container`, reached through `path`; its structure is read when the trace ends."""
        return cls(path, type(container), 0, None, (), container=container)

    def settle(self, is_array: Callable[[Any], bool]) -> None:
        """Read the container's structure as the trace leaves it (the function may have appended to it while
        it ran), then drop the reference to it."""
        container, self.container = self.container, None
        items = container.items() if isinstance(container, dict) else enumerate(container)
        self.members = tuple((k, v) for k, v in items if not (is_array(v) or isinstance(v, SCALARS + CONTAINERS)))
        self.keys = tuple(container) if isinstance(container, dict) else None
        self.length = len(container)

    def matters(self, used: set[int]) -> bool:
        """Does the trace depend on this structure: it was empty (what is added later must be seen), it
        holds functions or objects, or an array beneath it (`id` of its CapturedArray in `used`) was used?"""
        return self.length == 0 or bool(self.members) or any(id(a) in used for a in self.arrays)

    def holds(self) -> bool:
        """Does the path still lead to a container of the same structure?"""
        try:
            now = self.path.resolve()
            if type(now) is not self.kind or len(now) != self.length:
                return False
            if self.keys is not None and tuple(now) != self.keys:
                return False
            return all(now[k] is v for k, v in self.members)
        except BROKEN_PATH:
            return False

    def __str__(self) -> str:
        what = f"keys {list(self.keys)}" if self.keys is not None else f"length {self.length}"
        return f"{self.path}: {self.kind.__name__} of {what} (structure checked at every call)"


def path_expression(path: ArrayPath, const: Callable[[Any], str]) -> str:
    """`path.resolve()` as one Python expression, its holders and keys read from constants named by `const`."""
    kind, expr = path.root[0], const(path.root[1])
    if kind == "cell":
        expr = f"{expr}.cell_contents"
    elif kind == "entry":
        expr = f"{expr}[{const(path.root[2])}]"
    elif kind == "default":
        expr = f"{expr}.__defaults__[{int(path.root[2])}]"
    for step, key in path.steps:
        plain = step == "attr" and isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)
        expr = f"{expr}.{key}" if plain else f"getattr({expr}, {const(key)})" if step == "attr" else \
            f"{expr}[{const(key)}]"
    return expr


def read_source(src: Any, captures: Any, stale: str) -> list[str]:
    """Lines of a generated repeat call (`jitgrad.runtime.plans.RepeatCall`, `src` a `jitgrad.tracing.trees.Source` naming
    `ndarray`) that read `captures` as `Captures.read` does, `return {stale}` where it returns None: the structure
    guards and constants by their own checks, each implicit input through its paths written out. The variables
    holding the implicit inputs' arrays, in order."""
    src.lines += [f"if not {src.const(g.holds)}(): return {stale}" for g in captures.structures]
    checked = [*captures.constants, *(c for c in captures.inputs if c.snapshot is not None)]  # by value: as read
    src.lines += [f"if {src.const(c.current)}() is None: return {stale}" for c in checked]
    names = [src.fresh() for _ in captures.inputs]
    if names:
        src.line("try:")
        for v, c in zip(names, captures.inputs):
            src.line(f"    {v} = {path_expression(c.paths[0], src.const)}")
            src.lines += [f"    if {path_expression(p, src.const)} is not {v}: return {stale}" for p in c.paths[1:]]
        src.line(f"except {src.const(BROKEN_PATH)}: return {stale}")
    for v, c in zip(names, captures.inputs):
        dt, shape = src.const(c.aval.dtype), tuple(map(int, c.aval.shape))
        src.line(f"if type({v}) is not ndarray or {v}.shape != {shape!r} or ({v}.dtype is not {dt} and "
                 f"{v}.dtype != {dt}): return {stale}")
    return names
