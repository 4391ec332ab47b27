"""What every backend's kernel writer shares: numba type names, the lowerings registered per backend and the
scalar expression of an elementwise op on a backend, reduction identities, array index text, kernel argument
names, and a line writer.

A primitive's record carries one lowering, the CPU's (`Primitive.lowering["cpu"]`). Another backend reads it
too unless it registers its own template for that primitive (`register_lowering`, from its folder's table);
a record template that calls helpers (`Lowering.imports`, the CPU's vector math) is the CPU's alone, so another
backend must register one."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from jitgrad.passes.loops import Branch, Compute, LoopKernel, Reduction
from jitgrad.ir.primitive import Lowering, Offset, Param, Primitive

RECORD = "cpu"  # the backend whose lowering a primitive's record carries
_TABLES: dict[str, dict[Primitive, str]] = {}  # backend -> primitive -> its template there


def register_lowering(prim: Primitive, backend: str, template: str) -> None:
    """`prim`'s scalar expression template on `backend`, in place of its record's (over `{0}`, `{1}`, ... and
    `{cast}`; the record's `integer` template, where it has one, still serves integer results)."""
    _TABLES.setdefault(backend, {})[prim] = template


def lowering(prim: Primitive, backend: str) -> Lowering:
    """`prim`'s lowering on `backend`: the template registered for it there, else its record's."""
    record = prim.lowering[RECORD]
    template = _TABLES.get(backend, {}).get(prim)
    if template is not None:
        return Lowering(template, (), record.integer)
    if backend == RECORD:
        return record
    if record.imports:
        raise LookupError(f"{prim!r} has no lowering on {backend!r}: its record's template calls helpers "
                          f"{record.imports} only the {RECORD} backend imports; register one for {backend!r}")
    return Lowering(record.template, (), record.integer)


def numba_type(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def expression(c: Compute, backend: str) -> str:
    """The scalar expression of one elementwise op on `backend` (`lowering`), cast to its IR dtype where
    numba's rules differ (integer arithmetic widens to int64 in numba)."""
    template = lowering(c.prim, backend).for_dtype(c.dtype)
    expr = template.format(*c.args, cast=numba_type(c.dtype), f="f" if c.dtype == np.float32 else "")
    if c.dtype.kind in "iu" and not template.startswith("{cast}("):
        return f"{numba_type(c.dtype)}({expr})"
    return expr


def accumulator_dtype(r: Reduction) -> np.dtype:
    """The reduction's accumulator: float32 sums accumulate in float64 (then round once), as accurate as
    numpy's pairwise sum; a count (a sum of bools cast to floats) in int64, exact like a float64 one below
    2**53 terms and rounded once at the end alike, but associative, so LLVM vectorises the loop around it
    (a float64 one kept the whole pass scalar: softmax's exp beside max's tie count ran 5× slower)."""
    if r.counts:
        return np.dtype(np.int64)
    return r.prim.reduction.accumulator(r.dtype)


def identity_literal(r: Reduction) -> str:
    """The reduction's starting value in its accumulator's type, as source text."""
    dtype = accumulator_dtype(r)
    value = r.prim.reduction.identity(dtype)
    if isinstance(value, float) and math.isinf(value):
        text = "np.inf" if value > 0 else "-np.inf"
    else:
        text = repr(value)
    return f"{numba_type(dtype)}({text})"


def combine(r: Reduction, acc: str, value: str) -> str:
    """`acc` combined with `value` by the reduction's sequential rule (numpy's order)."""
    return r.prim.reduction.combine.format(acc, f"{numba_type(accumulator_dtype(r))}({value})")


def int_text(x: int | Param) -> str:
    """An integer of index arithmetic as source text: a literal, or the kernel argument of a `Param`."""
    return f"p{x.number}" if isinstance(x, Param) else str(x)


def int_value(x: int | Param) -> int:
    return x.value if isinstance(x, Param) else x


def position_text(entry: int | Offset | None, var: str) -> str:
    """One axis of an array access: loop variable `<var><axis>`, 0, or a moved position (`Offset`). With
    the unsigned loop copies (`var` "u") the arithmetic stays unsigned: a position read is never negative
    (a region read tests its bounds before it reads). A start that is a `Param` is the kernel's argument;
    its sign (known when the source is written) says whether it is added or subtracted."""
    if entry is None:
        return "0"
    if not isinstance(entry, Offset):
        return f"{var}{entry}"
    start = int_text(entry.start)
    if entry.axis is None:
        return start
    if var != "u":
        return f"({var}{entry.axis} * {entry.step} + {start})"
    moved = f"u{entry.axis}" if abs(entry.step) == 1 else f"u{entry.axis} * np.uint64({abs(entry.step)})"
    if entry.step < 0:
        return f"(np.uint64({start}) - {moved})"
    if int_value(entry.start) < 0:  # inside a region read's bounds, where the position is at least -start
        return f"({moved} - np.uint64(-{start}))"
    return moved if int_value(entry.start) == 0 else f"({moved} + np.uint64({start}))"


def bounds_text(bounds: tuple, var: str = "i") -> str:
    """The test that a point lies inside a region read's case: lo <= position < hi for each bound, in the
    signed loop variables `<var><axis>`."""
    return " and ".join(f"{position_text(entry, var)} < {int_text(hi)}"
                        if int_value(lo) <= 0 and not isinstance(entry, Offset)
                        else f"{int_text(lo)} <= {position_text(entry, var)} < {int_text(hi)}"
                        for entry, lo, hi in bounds)


def index_text(index: tuple, rank: int, var: str = "i") -> str:
    """Index expression of an array access: loop variables `<var><axis>`, 0 along broadcast axes, moved
    positions where a view reads at an offset."""
    if rank == 0:
        return "0"
    return ", ".join(position_text(a, var) for a in index)


def scalar_values(k: LoopKernel) -> list[tuple[str, Any]]:
    """A kernel's scalar constants as numpy scalars (numba keeps float32 float32), then its index parameters as
    int64, each with its name in `argument_names`."""
    return ([(f"c{i}", s.value.reshape(())[()]) for i, s in enumerate(k.scalars)]
            + [(f"p{i}", np.int64(v)) for i, v in enumerate(k.index_params)])


def argument_names(k: LoopKernel) -> list[str]:
    """A kernel's arguments: lengths, inputs, typed scalar constants, index parameters (`Param`), outputs."""
    return ([f"n{a}" for a in range(len(k.domain))] + [f"a{i}" for i in range(len(k.inputs))]
            + [f"c{i}" for i in range(len(k.scalars))] + [f"p{i}" for i in range(len(k.index_params))]
            + [f"o{i}" for i in range(len(k.outputs))])


class Writer:
    """Source lines at indentation depths."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)


def case_tests(st: Branch) -> list[str]:
    """The line opening each case of a region read, on the signed loop variables: if/elif its bounds, "else:" for
    a last case without bounds (every point the others leave) and for the `otherwise` fill after the cases."""
    tests = [f"{'if' if n == 0 else 'elif'} {bounds_text(bounds)}:" if bounds else "else:"
             for n, (bounds, _, _) in enumerate(st.cases)]
    return tests + ["else:"] if st.otherwise is not None else tests


def case_values(st: Branch) -> list[tuple[list, str]]:
    """Each case's statements and the name holding its value, in `case_tests`' order (the fill: none, its scalar)."""
    cases = [(sub, value) for _, sub, value in st.cases]
    return cases + [([], st.otherwise)] if st.otherwise is not None else cases


def emit_branch(w: Writer, depth: int, st: Branch, emit: Callable[[int, list], None]) -> None:
    """A region read as if/elif/else; `emit` writes a case's statements."""
    for test, (sub, value) in zip(case_tests(st), case_values(st)):
        w.line(depth, test)
        emit(depth + 1, sub)
        w.line(depth + 1, f"{st.dst} = {value}")
