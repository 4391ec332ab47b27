"""Tracing: run a Python function on `Tracer` values and record each op as an IR equation.

A `Builder` owns the graph under construction. Builders nest (tracing `jg.grad(f)` inside
another traced function opens a child builder); a tracer from an enclosing builder used in a
child is captured as an extra input of the child graph. The active builders live on a
thread-local stack, so threads trace independently.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from jitgrad.tracing import captures
from jitgrad.errors import (CONTROL_FLOW, FORMAT, INDEX, PYTHON_NUMBER, TO_ARRAY, ConcretizationError, TraceError,
                            UnsupportedError, python_number_advice)
from jitgrad.ir.graph import Atom, Aval, Eqn, Graph, Literal, SourceInfo, Var
from jitgrad.ir.primitive import stop_gradient_p
from jitgrad.tracing.sources import user_source, where_text

SUPPORTED_DTYPES = tuple(np.dtype(d) for d in ("float32", "float64", "int8", "int16", "int32", "int64",
                                                "uint8", "uint16", "uint32", "uint64", "bool"))


class Builder:
    """Collects equations for one graph; `parent` is the builder of the enclosing trace, if any."""

    def __init__(self, parent: "Builder | None" = None):
        self.parent = parent
        self.inputs: list[Var] = []
        self.input_names: list[str] = []
        self.eqns: list[Eqn] = []
        self.captured: dict[Var, Var] = {}  # outer var -> inner input var
        self.captured_tracers: list["Tracer"] = []
        self.no_grad_depth = 0
        self.label: str | None = None  # names equations recorded by a VJP rule, e.g. "MulBackward"
        self.source: SourceInfo | None = None  # while replaying or differentiating: the original user line
        # A plan's root builder: arrays read from outside the arguments, by id, as traced stand-ins
        # (jitgrad.tracing.captures); None where a trace does not capture (autodiff's replays).
        self.known_arrays: dict[int, CapturedTracer] | None = None
        self.implicit: list[CapturedTracer] = []
        self.structure_guards: dict[int, captures.StructureGuard] = {}  # the root's: containers walked

    def new_input(self, aval: Aval, name: str = "") -> "Tracer":
        v = Var(aval)
        self.inputs.append(v)
        self.input_names.append(name)
        return Tracer(self, v)

    def capture_root(self) -> "Builder | None":
        """The outermost builder, if it captures arrays read from outside the arguments."""
        b = self
        while b.parent is not None:
            b = b.parent
        return b if b.known_arrays is not None else None

    def new_implicit(self, array: np.ndarray, path: captures.ArrayPath) -> "CapturedTracer":
        """A traced stand-in for an array read through `path`; an input of the graph if the trace uses it."""
        aval = Aval(array.shape, array.dtype, False)
        t = CapturedTracer(self, Var(aval), captures.CapturedArray([path], aval), array)
        self.implicit.append(t)
        return t

    def is_ancestor(self, other: "Builder") -> bool:
        b = self.parent
        while b is not None:
            if b is other:
                return True
            b = b.parent
        return False

    def atom(self, x: Any) -> Atom:
        """Turn a tracer, numpy value or Python number into an atom of this builder's graph."""
        if isinstance(x, Tracer):
            if type(x) is CapturedTracer:
                x.capture.used = True
            if x.builder is self:
                return x.var
            if self.is_ancestor(x.builder):
                if x.var not in self.captured:
                    inner = Var(x.var.aval)
                    self.captured[x.var] = inner
                    self.captured_tracers.append(x)
                return self.captured[x.var]
            raise TraceError(
                "a traced value escaped the function that traced it (stored in a global or closure and "
                f"used in a later call?); pass it as an argument instead{where_text()}")
        if isinstance(x, np.ndarray):
            root = self.capture_root()
            stand_in = root.known_arrays.get(id(x)) if root is not None else None
            if stand_in is not None:
                return self.atom(stand_in)
        return literal(x)

    def add(self, prim: Any, inputs: Sequence[Any], params: dict[str, Any], out_avals: Sequence[Aval],
            label: str | None = None) -> list["Tracer"]:
        atoms = tuple(self.atom(a) for a in inputs)
        outs = tuple(Var(a) for a in out_avals)
        self.eqns.append(Eqn(prim, atoms, dict(params), outs, self.source or user_source(), label or self.label))
        return [Tracer(self, o) for o in outs]

    def graph(self, outputs: Sequence[Any]) -> tuple[Graph, captures.Captures]:
        """Close the graph: inputs are the declared inputs, then the arrays read from outside the
        arguments that the graph uses, then captured outer values. Also returns what was captured."""
        outs = [self.atom(o) for o in outputs]
        referenced = {a for e in self.eqns for a in e.inputs if isinstance(a, Var)} | set(outs)
        found = captures.Captures()
        implicit = []
        for t in self.implicit:
            if t.var in referenced:
                implicit.append(t.var)
                found.inputs.append(t.capture)
            elif t.capture.used or t.capture.snapshot is not None:
                found.constants.append(t.capture)  # its shape or values shaped the trace: guard them
        found.keep_structures(self.structure_guards)
        inputs = self.inputs + implicit + [self.captured[t.var] for t in self.captured_tracers]
        names = (self.input_names + [str(c.paths[0]) for c in found.inputs]
                 + ["<captured>"] * len(self.captured_tracers))
        return Graph(inputs, list(self.eqns), outs, names), found


def literal(x: Any) -> Literal:
    """A graph constant from a Python number (weakly typed) or a numpy array/scalar."""
    if isinstance(x, (np.ndarray, np.generic)):  # first: np.float64 is also a Python float, but not weak
        arr = np.asarray(x)
        check_dtype(arr.dtype, "a constant")
        return Literal(arr.copy(), Aval(arr.shape, arr.dtype, False))
    if isinstance(x, bool):
        return Literal(x, Aval((), np.dtype(bool), True))
    if isinstance(x, int):
        return Literal(x, Aval((), np.dtype(np.int64), True))
    if isinstance(x, float):
        return Literal(x, Aval((), np.dtype(np.float64), True))
    if isinstance(x, (list, tuple)):
        return literal(np.asarray(x))
    raise UnsupportedError(f"cannot use an object of type {type(x).__name__} as an array in a traced "
                           f"function{where_text()}")


def check_dtype(dtype: np.dtype, what: str) -> None:
    if np.dtype(dtype) not in SUPPORTED_DTYPES:
        raise UnsupportedError(f"dtype {np.dtype(dtype)} of {what} is not supported; jitgrad handles float32, "
                               f"float64, integer and bool arrays{where_text()}")


_state = threading.local()


def _stack() -> list[Builder]:
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


def current_builder() -> Builder | None:
    s = _stack()
    return s[-1] if s else None


@contextmanager
def building(builder: Builder) -> Iterator[Builder]:
    _stack().append(builder)
    try:
        yield builder
    finally:
        _stack().pop()


def bind(prim: Any, *inputs: Any, label: str | None = None, **params: Any) -> Any:
    """Record `prim` applied to `inputs` in the innermost active builder; returns tracer(s).

    Outside any trace, evaluates the primitive's numpy reference right away (eager mode).
    """
    builder = _builder_for(inputs)
    if builder is None:
        arrays = [np.asarray(a) if not isinstance(a, (int, float, bool)) else a for a in inputs]
        out = prim.impl(*arrays, **params)
        return out
    avals = [builder_aval(a) for a in inputs]
    out_avals = prim.abstract_eval(avals, **params)
    multi = isinstance(out_avals, (list, tuple))
    outs = builder.add(prim, inputs, params, out_avals if multi else [out_avals], label)
    if builder.no_grad_depth and prim is not stop_gradient_p:
        outs = [bind(stop_gradient_p, o) if o.aval.is_float else o for o in outs]
    return outs if multi else outs[0]


def _builder_for(inputs: Sequence[Any]) -> Builder | None:
    """The innermost active builder; a tracer used outside any trace still names its own."""
    cur = current_builder()
    if cur is not None:
        return cur
    return next((a.builder for a in inputs if isinstance(a, Tracer)), None)


def builder_aval(x: Any) -> Aval:
    if isinstance(x, Tracer):
        return x.aval
    if isinstance(x, np.ndarray):  # without literal()'s copy
        check_dtype(x.dtype, "a constant")
        return Aval(x.shape, x.dtype, False)
    weak = _PYTHON_SCALAR_AVALS.get(type(x))  # a bool or float: literal()'s aval, without making the constant
    return weak if weak is not None else literal(x).aval


# The avals literal() gives a Python bool and float (a Python int can be out of int64's range: literal() checks).
_PYTHON_SCALAR_AVALS = {bool: Aval((), np.dtype(bool), True), float: Aval((), np.dtype(np.float64), True)}


class Tracer:
    """A value under tracing: it knows its shape and dtype, not its numbers. numpy's protocols, the
    operators and indexing are installed by `jitgrad.ops.numpy_api`, which answers them from the ops."""

    __slots__ = ("builder", "var")
    __array_priority__ = 1000

    def __init__(self, builder: Builder, var: Var):
        self.builder = builder
        self.var = var

    @property
    def aval(self) -> Aval:
        return self.var.aval

    @property
    def shape(self) -> tuple[int, ...]:
        return self.var.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.var.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self.var.aval.size

    def __len__(self) -> int:
        if not self.shape:
            raise TraceError(f"len() of a 0-d traced array{where_text()}")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    def _concrete(self, what: str, advice: str = CONTROL_FLOW) -> ConcretizationError:
        root = self.builder.capture_root()
        captured = ("; arrays the function reads from its closure, globals or attributes are traced values too "
                    "(jitgrad reads them afresh at every call), so compute such a condition outside the traced "
                    "function" if root is not None and root.implicit else "")
        return ConcretizationError(
            f"{what} needs a concrete value, but this is a traced {self.aval} array whose numbers are not "
            f"known while tracing. {advice}{captured}{where_text()}")

    def _python_number(self, conversion: str, advice: str = PYTHON_NUMBER) -> ConcretizationError:
        """float(), int(), .item() of a tracer, or a `math` function calling one, named from the user's line."""
        src = user_source()
        return self._concrete(*python_number_advice(conversion, src.line if src is not None else "", advice))

    def __bool__(self) -> bool:
        raise self._concrete("bool() / an if or while statement")

    def __float__(self) -> float:
        raise self._python_number("float()")

    def __int__(self) -> int:
        raise self._python_number("int()")

    def __index__(self) -> int:
        raise self._python_number("using a traced value as an index or size", INDEX)

    def __complex__(self) -> complex:
        raise self._python_number("complex()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise self._concrete("converting to a numpy array (np.asarray / np.array, or numpy using a traced array "
                             "where it needs numbers)", TO_ARRAY)

    def item(self, *args: Any) -> Any:
        raise self._python_number(".item()")

    def __format__(self, spec: str) -> str:
        if not spec:
            return repr(self)
        raise self._concrete(f"formatting with {spec!r} (f'{{x:{spec}}}')", FORMAT)

    def tolist(self) -> Any:
        raise self._python_number(".tolist()")

    def __hash__(self) -> int:
        return id(self)


class CapturedTracer(Tracer):
    """The traced stand-in of an array read from outside the arguments (`jitgrad.tracing.captures`). Using it
    makes it an implicit input of the plan; needing its numbers (`int(n)`, a mask, repeat counts)
    makes them a constant of the plan, guarded by value at every call."""

    __slots__ = ("capture", "array")

    def __init__(self, builder: Builder, var: Var, capture: captures.CapturedArray, array: np.ndarray):
        super().__init__(builder, var)
        self.capture = capture
        self.array = array

    @property
    def aval(self) -> Aval:
        self.capture.used = True
        return self.var.aval

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)

    def concrete(self) -> np.ndarray:
        """The array's values at trace time, which the plan then checks at every call."""
        if self.array.size > captures.CONCRETE_LIMIT:
            raise ConcretizationError(
                f"this {self.var.aval} array is read from {self.capture.paths[0]} (outside the function's "
                f"arguments), so jitgrad reads it afresh at every call and its numbers are not known while "
                f"tracing; only arrays of up to {captures.CONCRETE_LIMIT} elements can shape a trace (they are "
                f"then checked at every call). Pass it as an argument, or compute what you need from it outside "
                f"the traced function{where_text()}")
        if self.capture.snapshot is None:
            self.capture.snapshot = self.array.copy()
        return self.capture.snapshot

    def __bool__(self) -> bool:
        return bool(self.concrete())

    def __float__(self) -> float:
        return float(self.concrete())

    def __int__(self) -> int:
        return int(self.concrete())

    def __index__(self) -> int:
        return self.concrete().__index__()

    def __complex__(self) -> complex:
        return complex(self.concrete())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.concrete(), dtype=dtype)

    def item(self, *args: Any) -> Any:
        return self.concrete().item(*args)

    def tolist(self) -> Any:
        return self.concrete().tolist()


def constant_of(x: Any) -> Any:
    """`x`, or for an array read from outside the arguments its values (a constant guarded by value):
    for ops whose arguments must be known while tracing (masks, counts, sizes)."""
    return x.concrete() if isinstance(x, CapturedTracer) else x


@contextmanager
def no_grad() -> Iterator[None]:
    """Inside a traced function, values computed in this block carry no gradient."""
    b = current_builder()
    if b is None:
        yield
        return
    b.no_grad_depth += 1
    try:
        yield
    finally:
        b.no_grad_depth -= 1
