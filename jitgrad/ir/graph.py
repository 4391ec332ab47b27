"""The SSA intermediate representation: abstract values, variables, literals, equations, graphs.

A `Graph` is a list of `Eqn`s in topological order, each applying one primitive to atoms
(`Var`s or `Literal`s) and defining new `Var`s. It prints like a jaxpr. This module imports
nothing else of jitgrad's: everything above it (tracing, autodiff, passes, fusion, lowering)
works on these types.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

_FLOAT_KINDS = "f"


@dataclass(frozen=True)
class Aval:
    """Abstract value: what tracing knows of an array (shape, dtype, and weak typing of Python scalars)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    weak: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))  # Python ints: exact, and 10x faster than np.prod on a tuple

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype.kind in _FLOAT_KINDS

    def with_shape(self, shape: Sequence[int]) -> "Aval":
        return Aval(tuple(int(d) for d in shape), self.dtype, self.weak)

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.dtype.name}{'~' if self.weak else ''}[{dims}]"


_var_ids = itertools.count()


class Var:
    """An SSA value; identity is the object itself, `id` only orders and names it."""

    __slots__ = ("id", "aval")

    def __init__(self, aval: Aval):
        self.id = next(_var_ids)
        self.aval = aval

    def __repr__(self) -> str:
        return f"Var({self.id}, {self.aval})"


class Literal:
    """A constant in the graph: a numpy array (0-d for scalars) with its aval."""

    __slots__ = ("value", "aval")

    def __init__(self, value: Any, aval: Aval):
        self.value = np.asarray(value, dtype=aval.dtype).reshape(aval.shape)
        self.aval = aval

    @property
    def is_scalar(self) -> bool:
        return self.value.size == 1

    def scalar(self) -> Any:
        return self.value.reshape(-1)[0]

    def key(self) -> tuple:
        """Hashable identity used by CSE and plan keys (small values only are ever compared)."""
        if self.value.size <= 16:
            return ("lit", str(self.aval), self.value.tobytes())
        return ("lit", str(self.aval), id(self.value))

    def __repr__(self) -> str:
        return f"Literal({self.value!r})"


Atom = Var | Literal


@dataclass(frozen=True)
class SourceInfo:
    """Where in the user's code an equation was recorded."""

    filename: str
    lineno: int
    line: str

    def __str__(self) -> str:
        return f'{self.filename}:{self.lineno}: {self.line.strip()}'


@dataclass(eq=False)
class Eqn:
    """One primitive application: outs = prim(*inputs, **params)."""

    prim: Any  # jitgrad.ir.primitive.Primitive; typed loosely so the IR imports nothing of ours
    inputs: tuple[Atom, ...]
    params: dict[str, Any]
    outs: tuple[Var, ...]
    source: SourceInfo | None = None
    label: str | None = None  # readable name shown by printers, e.g. "MulBackward"

    @property
    def out(self) -> Var:
        (o,) = self.outs
        return o


@dataclass(eq=False)
class Graph:
    """A closed SSA program: inputs, equations in topological order, outputs."""

    inputs: list[Var]
    eqns: list[Eqn]
    outputs: list[Atom]
    input_names: list[str] = field(default_factory=list)

    def producers(self) -> dict[Var, Eqn]:
        return {o: e for e in self.eqns for o in e.outs}

    def __str__(self) -> str:
        return format_graph(self)


def iter_vars(atoms: Iterable[Atom]) -> Iterator[Var]:
    return (a for a in atoms if isinstance(a, Var))


def format_params(params: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, np.dtype):
            return v.name
        if isinstance(v, type) and issubclass(v, np.generic):
            return np.dtype(v).name
        if callable(v) and hasattr(v, "__name__"):
            return v.__name__
        if isinstance(v, Graph):
            return "{graph}"
        return repr(v)

    shown = {k: v for k, v in params.items() if not k.startswith("_")}
    return "[" + " ".join(f"{k}={fmt(v)}" for k, v in shown.items()) + "]" if shown else ""


def format_graph(graph: Graph, title: str = "", show_source: bool = False) -> str:
    """Render a graph as text, one SSA line per equation (a jaxpr-like listing)."""
    names: dict[Var, str] = {}

    def name(a: Atom) -> str:
        if isinstance(a, Literal):
            if a.is_scalar and a.aval.ndim == 0:
                return repr(a.scalar().item())
            return f"const{a.aval}"
        if a not in names:
            names[a] = _var_name(len(names))
        return names[a]

    def decl(v: Var) -> str:
        return f"{name(v)}:{v.aval}"

    ins = " ".join(decl(v) for v in graph.inputs)
    lines = [f"{{ lambda {ins} ."] if not title else [f"{title}", f"{{ lambda {ins} ."]
    for e in graph.eqns:
        outs = " ".join(decl(o) for o in e.outs)
        args = " ".join(name(a) for a in e.inputs)
        label = f"  # {e.label}" if e.label else ""
        src = f"  @ {e.source}" if show_source and e.source else ""
        lines.append(f"    {outs} = {e.prim.name}{format_params(e.params)} {args}{label}{src}")
    lines.append(f"  in ( {' '.join(name(a) for a in graph.outputs)} ) }}")
    return "\n".join(lines)


def _var_name(i: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    s = ""
    i += 1
    while i > 0:
        i, r = divmod(i - 1, 26)
        s = letters[r] + s
    return s


def substitute(graph: Graph, mapping: dict[Var, Atom]) -> Graph:
    """Return a copy of `graph` with atoms replaced through `mapping` (transitively resolved)."""

    def res(a: Atom) -> Atom:
        while isinstance(a, Var) and a in mapping:
            a = mapping[a]
        return a

    eqns = [Eqn(e.prim, tuple(res(a) for a in e.inputs), e.params, e.outs, e.source, e.label) for e in graph.eqns]
    return Graph(list(graph.inputs), eqns, [res(a) for a in graph.outputs], list(graph.input_names))
