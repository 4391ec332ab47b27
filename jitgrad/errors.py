"""Exceptions jitgrad raises for a user's mistakes, each naming the op, the shapes and the user's line, and
what a `ConcretizationError` advises for each way Python asks a traced value for its numbers."""
from __future__ import annotations

import re

import numpy as np


class JitgradError(Exception):
    """Base class of every error jitgrad raises on purpose."""


class TraceError(JitgradError, TypeError):
    """A traced function did something that cannot be recorded (raised at trace time)."""


class ConcretizationError(TraceError):
    """Python needed a concrete value (`if t > 0`, `float(t)`) where only a traced one exists."""


class UnsupportedError(TraceError, NotImplementedError):
    """A numpy function, ufunc, dtype or argument jitgrad does not support."""


class UnsupportedAttributeError(UnsupportedError, AttributeError):
    """An ndarray attribute or method traced arrays do not have (`hasattr` still answers False)."""


class ShapeError(JitgradError, ValueError):
    """Shapes that do not broadcast, an out-of-range axis, a reshape that cannot hold the data."""


class InputError(JitgradError, TypeError):
    """A call passed arguments a compiled function cannot take (count, type, dtype, shape)."""


class FunctionError(JitgradError, TypeError):
    """A `jg.Function` subclass broke its protocol (gradient count, shape or dtype; saved values)."""


class GradcheckError(JitgradError, AssertionError):
    """`jg.gradcheck` found an analytic gradient that disagrees with finite differences."""


class PrecisionWarning(UserWarning):
    """A traced op widened float32 arrays to float64 because a numpy float64 scalar took part (numpy's rule,
    so the result is right, but slower and twice the memory: usually a `np.float64` learning rate or
    constant where a Python float or `np.float32` was meant)."""


class ArgumentError(JitgradError, ValueError):
    """An argument value numpy refuses (an unknown mode, an invalid norm order, conflicting keywords)."""


# What to do instead, per way of asking a traced value for numbers (`Tracer._concrete`).
CONTROL_FLOW = ("Python control flow cannot depend on traced values: use np.where(cond, a, b) to select values, "
                "or mark the argument as static with jg.trace(fn, static_argnums=...)")
PYTHON_NUMBER = ("float(), int(), .item() and the math module's functions (math.exp, math.sqrt, ...) need a "
                 "concrete number: keep the value an array and use numpy's functions, which trace (np.exp(x), "
                 "x.astype(np.float64)), or compute the number outside the traced function and pass it in as an "
                 "argument (static, with static_argnums=..., if the trace depends on its value)")
INDEX = ("range(), shapes, sizes, repeat counts and indices of Python lists need Python ints: mark the argument "
         "as static with jg.trace(fn, static_argnums=...), or index arrays with the traced value itself (x[i], "
         "jg.take(x, i, axis=0)), which traces")
TO_ARRAY = ("numpy's functions take traced arrays as they are, no conversion needed. A numpy array indexed by a "
            "traced one, `table[y]`, or np.take(table, y), which numpy dispatches on `table` only, converts: write "
            "jg.take(table, y, axis=0), or for one-hot rows jg.one_hot(y, n)")
FORMAT = ("Format the values the traced function returns, after the call (f'{x}' without a format spec prints a "
          "traced array's shape and dtype)")
_MATH_CALL = re.compile(r"\bmath\.(\w+)\s*\(")


def python_number_advice(conversion: str, line: str, advice: str = PYTHON_NUMBER) -> tuple[str, str]:
    """What asked for a Python number (`conversion`, whose `advice` says what to do, or the `math` function the
    user's `line` calls, which converts through float() or an index) and what to write instead."""
    called = _MATH_CALL.search(line)
    if called is None:
        return conversion, advice
    name = called.group(1)
    instead = (f"use np.{name} instead (numpy's functions trace)" if callable(getattr(np, name, None)) else
               "write it with numpy's functions, which trace, or compute it outside the traced function and pass "
               "the result in as an argument (static, with static_argnums=..., if the trace depends on it)")
    return f"math.{name}", f"math.{name}, like float() and int(), turns its argument into a Python number; {instead}"
