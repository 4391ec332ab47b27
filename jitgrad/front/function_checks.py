"""Checks of what a `jg.Function`'s user code gives back: whether a value is an array, and the gradients that
`backward` returns (their count, array-ness, shapes and dtypes), each refusal naming the method's definition."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.errors import FunctionError
from jitgrad.tracing.tracer import Tracer, builder_aval

_ARRAY_TYPES = (Tracer, np.ndarray, np.generic)


def is_array(x: Any) -> bool:
    return isinstance(x, _ARRAY_TYPES)


def defined_at(method: Callable[..., Any]) -> str:
    code = getattr(method, "__code__", None)
    return f"\n  {method.__qualname__} is defined at {code.co_filename}:{code.co_firstlineno}" if code else ""


def checked_gradients(call: Any, returned: Any, ins: Sequence[Any]) -> list[Any]:
    """One gradient per forward argument of `call` (a `jitgrad.front.function.FunctionCall`), checked: count,
    array-ness, shape and dtype."""
    fn = call.function
    name = fn.__name__
    where = defined_at(fn.backward)
    grads = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    n_inputs = len(call.input_slots)
    if len(grads) < call.n_given or any(g is not None for g in grads[n_inputs:]):
        args = ", ".join(call.input_names[:call.n_given])
        raise FunctionError(f"{name}.backward returned {len(grads)} gradient(s), but {name}.apply was given "
                            f"{call.n_given} input(s) ({args}); return one gradient per input, None for an "
                            f"input that has none{where}")
    grads = grads[:n_inputs] + [None] * (n_inputs - len(grads))
    for k, (g, slot) in enumerate(zip(grads, call.input_slots)):
        if g is None:
            continue
        what = f"{name}.backward: gradient {k} (for input {call.input_names[k]!r})"
        if slot is None:
            raise FunctionError(f"{what} is not None, but that input is not an array and cannot have a gradient; "
                                f"return None there{where}")
        want = builder_aval(ins[slot])
        if not want.is_float:
            grads[k] = None  # an integer or bool input has no gradient; what backward returns for it is unused
            continue
        if not is_array(g):
            raise FunctionError(f"{what} is a {type(g).__name__}, not an array{where}")
        got = builder_aval(g)
        if got.shape != want.shape:
            raise FunctionError(f"{what} has shape {got.shape}, but the input has shape {want.shape}{where}")
        if got.dtype != want.dtype and not (want.weak and got.is_float):
            raise FunctionError(f"{what} has dtype {got.dtype}, but the input is {want.dtype}; a gradient has "
                                f"its input's dtype (cast with .astype(np.{want.dtype.name})){where}")
    return grads
