"""What a compiled program is a function of, as text to hash (`jitgrad.runtime.programs` keys its disk cache on it).

A program is what the passes make of a traced graph for one recipe: so it is fixed by the graph (each equation's
primitive, parameters, operands, results and where it was recorded; the inputs' and literals' types and values),
the recipe and the code of the passes. `describe` writes a graph as text (variables numbered by first
appearance, so two traces of the same function read the same), or None where the graph holds something that
text cannot pin down: a call (a custom Function's holds user code), a primitive that is not one of jitgrad's records,
or a parameter that is not plain data (numbers, strings, dtypes, arrays, tuples of them). `code_digest` hashes
every Python file of the installed jitgrad (its kernels folder included), so that any edit to any pass, op
record or rule is another key.
"""
from __future__ import annotations

import functools
import hashlib
import os
from typing import Any

import numpy as np

from jitgrad.ir.graph import Graph, Literal, Var
from jitgrad.ir.primitive import PRIMITIVES, Kind

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
# jitgrad's own records, declared by jitgrad.ops before this module is imported: their rules are in code_digest.
# A primitive declared later (by code outside jitgrad) has rules the digest does not cover, so it gets no key.
_BUILTIN = frozenset(id(p) for p in PRIMITIVES.values())


class Undescribed(Exception):
    """The graph holds something its text would not pin down: it gets no key."""


def _param(v: Any) -> Any:
    """A parameter value as nested tuples of strings, its type named at every level (1, 1.0 and True differ)."""
    t = type(v)
    if t in _PLAIN:
        return (t.__name__, repr(v))
    if t in (tuple, list):
        return (t.__name__, *map(_param, v))
    if t is dict:
        return ("dict", *sorted((repr(_param(k)), _param(x)) for k, x in v.items()))
    if t in (set, frozenset):
        return (t.__name__, *sorted(repr(_param(x)) for x in v))
    if t is slice:
        return ("slice", _param(v.start), _param(v.stop), _param(v.step))
    if v is Ellipsis:
        return ("...",)
    if isinstance(v, np.dtype):
        return ("dtype", _dtype(v))
    if isinstance(v, type) and issubclass(v, np.generic):
        return ("scalar type", v.__module__, v.__qualname__, np.dtype(v).str)
    if isinstance(v, np.generic):
        return ("scalar", v.dtype.str, v.tobytes().hex())
    if t is np.ndarray:
        return _array(v)
    raise Undescribed(f"a parameter of type {t.__module__}.{t.__qualname__}")


def _dtype(d: np.dtype) -> str:
    """A dtype's byte order, kind and size, and a structured one's fields (numpy's repr of one takes 40 us)."""
    return d.str if d.names is None else f"{d.str}{d.descr!r}"


def _array(a: np.ndarray) -> tuple:
    return ("array", _dtype(a.dtype), a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())


def _aval(a: Any) -> tuple:
    return (a.shape, _dtype(a.dtype), a.weak)


# Element types whose equal values (of the same type) have one repr: a tuple of them is written once per
# `describe` (float is not one: 0.0 == -0.0).
_SAME_REPR_WHEN_EQUAL = frozenset((bool, int, str, type(None)))


def _tuple_text(items: list[str]) -> str:
    """repr of the tuple whose items' reprs are `items` (an empty list: "()")."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


class _Texts:
    """The reprs of one graph's avals, parameters and source lines, each written once (the LSTM's 705 equations
    have 6 avals, a few source lines and the same few shapes as parameters). An aval is remembered by its shape,
    dtype object (the graph holds it while it is described) and weakness, a parameter and a source line by
    value, each with the types in it, and only where equal values of those types have one repr."""

    def __init__(self) -> None:
        self.avals: dict[tuple, str] = {}
        self.params: dict[tuple, str] = {}
        self.sources: dict[tuple, str] = {}

    def aval(self, a: Any) -> str:
        shape = a.shape
        if type(shape) is tuple and type(a.weak) is bool:
            dims = tuple(map(type, shape))
            if _SAME_REPR_WHEN_EQUAL.issuperset(dims):
                key = (shape, dims, id(a.dtype), a.weak)
                return self.avals.get(key) or self.avals.setdefault(key, repr(_aval(a)))
        return repr(_aval(a))

    def param(self, name: str, v: Any) -> str:
        """repr((name, _param(v)))."""
        if type(v) is tuple:
            types = tuple(map(type, v))
            if _SAME_REPR_WHEN_EQUAL.issuperset(types):
                key = (name, v, types)
                return self.params.get(key) or self.params.setdefault(key, repr((name, _param(v))))
        return repr((name, _param(v)))

    def source(self, s: Any) -> str:
        if s is None:
            return "None"
        key = (s.filename, s.lineno, type(s.lineno), s.line)
        return self.sources.get(key) or self.sources.setdefault(key, repr((s.filename, s.lineno, s.line)))


def describe(graph: Graph) -> str | None:
    """`graph` as text that two graphs share only when they are the same program's input; None when it holds
    a primitive that is not one of jitgrad's records, a CALL equation or a parameter that is not plain data.
    The text is the repr of a list with a tuple per equation, written from the reprs of its parts (`_Texts`)."""
    numbers: dict[Var, int] = {}
    texts = _Texts()

    def atom(a: Any) -> str:
        number = numbers.get(a)
        if number is not None:
            return str(number)
        if isinstance(a, Literal):
            return f"('literal', {texts.aval(a.aval)}, {_array(a.value)!r})"
        raise Undescribed("a variable read before it is defined")

    def define(v: Var) -> str:
        numbers[v] = len(numbers)
        return texts.aval(v.aval)

    try:
        parts = [_tuple_text(["'inputs'", *map(define, graph.inputs)]), repr(("names", *graph.input_names))]
        for e in graph.eqns:
            if e.prim.kind is Kind.CALL or id(e.prim) not in _BUILTIN:
                raise Undescribed(f"primitive {e.prim!r}")
            params = _tuple_text([texts.param(k, e.params[k]) for k in sorted(e.params)]) if e.params else "()"
            inputs, outs = _tuple_text(list(map(atom, e.inputs))), _tuple_text(list(map(define, e.outs)))
            parts.append(f"({e.prim.name!r}, {params}, {inputs}, {outs}, {e.label!r}, {texts.source(e.source)})")
        parts.append(_tuple_text(["'outputs'", *map(atom, graph.outputs)]))
    except Undescribed:
        return None
    return f"[{', '.join(parts)}]"


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """SHA-256 of the path (within the package), size, inode and modification time of every Python file of the
    installed jitgrad and its kernels folder: an edit to any of them is another digest, as Python's bytecode cache
    takes a source's size and time for its content. Stat calls, not reads: hashing the files' contents took 4-7 ms
    of a warm first call."""
    stats = [(shown, os.stat(path)) for path, shown in _code_files()]
    return hashlib.sha256(repr([(shown, st.st_size, st.st_ino, st.st_mtime_ns) for shown, st in stats])
                          .encode()).hexdigest()


def _code_files() -> list[tuple[str, str]]:
    """Every Python file of jitgrad and its kernels folder (once, where one folder is inside the other, as installed):
    (path, path shown in the digest), by shown path."""
    import jitgrad
    import jitgrad.kernels

    roots = {os.path.dirname(os.path.abspath(m.__file__)) for m in (jitgrad, jitgrad.kernels)}
    files: dict[str, str] = {}
    for root in sorted(roots):
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    files.setdefault(path, os.path.relpath(path, os.path.dirname(root)))
    return sorted(files.items(), key=lambda item: item[1])
