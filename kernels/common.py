"""What the CPU and CUDA kernel writers share: numba type names, the scalar expression of an elementwise
op on a backend (from its primitive's lowering), reduction identities, array index text, kernel argument
names, and a line writer."""
from __future__ import annotations

import math

import numpy as np

from jitgrad.loops import Compute, LoopKernel, Reduction


def numba_type(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def expression(c: Compute, backend: str) -> str:
    """The scalar expression of one elementwise op on `backend` ("cpu", "cuda", "cuda_sim"), cast to its IR
    dtype where numba's rules differ (integer arithmetic widens to int64 in numba)."""
    template = c.prim.lowering[backend].for_dtype(c.dtype)
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


def index_text(index: tuple, rank: int, var: str = "i") -> str:
    """Index expression of an array access: loop variables `<var><axis>`, 0 along broadcast axes."""
    if rank == 0:
        return "0"
    return ", ".join(f"{var}{a}" if a is not None else "0" for a in index)


def argument_names(k: LoopKernel) -> list[str]:
    """A kernel's arguments: lengths, inputs, typed scalar constants, outputs."""
    return ([f"n{a}" for a in range(len(k.domain))] + [f"a{i}" for i in range(len(k.inputs))]
            + [f"c{i}" for i in range(len(k.scalars))] + [f"o{i}" for i in range(len(k.outputs))])


class Writer:
    """Source lines at indentation depths."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)
