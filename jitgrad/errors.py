"""Exceptions jitgrad raises for a user's mistakes, each naming the op, the shapes and the user's line."""
from __future__ import annotations


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
