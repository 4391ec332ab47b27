"""IR-level binders for VJP rules, with exact dtypes (as JAX's `lax` is to its numpy layer).

Each function binds one primitive. Array operands must share one dtype; a Python number takes the
dtype of the array it meets and is broadcast to its shape; nothing is promoted. So a float32
backward stays float32, and every rule reads as the math it computes. Primitives are looked up in
the registry when a rule runs: the modules that declare them import this one, not the other way.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import PRIMITIVES
from jitgrad.tracing.tracer import bind, builder_aval

Value = Any  # a tracer, or a numpy constant


def aval(x: Value) -> Aval:
    return builder_aval(x)


def _is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def full_like(x: Value, value: Any, dtype: Any = None) -> Value:
    """`value` everywhere in x's shape, in x's dtype (or `dtype`): a broadcast constant."""
    a = aval(x)
    return broadcast_to(np.asarray(value, dtype=a.dtype if dtype is None else dtype), a.shape)


def zeros_like(x: Value) -> Value:
    return full_like(x, 0)


def ones_like(x: Value) -> Value:
    return full_like(x, 1)


def _operands(name: str, xs: Sequence[Any]) -> list[Value]:
    """Python numbers and 0-d constants made arrays of the other operands' dtype and shape."""
    arrays = [x for x in xs if not _is_number(x)]
    if not arrays:
        raise TypeError(f"lax.{name} needs at least one array operand")
    ref = max((aval(x) for x in arrays), key=lambda a: a.ndim)
    out = []
    for x in xs:
        if _is_number(x):
            x = broadcast_to(np.asarray(x, ref.dtype), ref.shape)
        elif aval(x).shape != ref.shape:
            if aval(x).ndim:
                raise ValueError(f"lax.{name}: operands of shapes {[aval(v).shape for v in xs]}; broadcast first")
            x = broadcast_to(x, ref.shape)
        if aval(x).dtype != ref.dtype:
            raise TypeError(f"lax.{name}: operands of dtypes {[str(aval(v).dtype) for v in xs]}; convert first")
        out.append(x)
    return out


def _elementwise(name: str) -> Callable[..., Value]:
    def op(*xs: Any) -> Value:
        return bind(PRIMITIVES[name], *_operands(name, xs))

    op.__name__ = name
    op.__doc__ = f"The `{name}` primitive, elementwise, operands of one dtype."
    return op


neg = _elementwise("neg")
exp = _elementwise("exp")
log = _elementwise("log")
sin = _elementwise("sin")
cos = _elementwise("cos")
sinh = _elementwise("sinh")
cosh = _elementwise("cosh")
sqrt = _elementwise("sqrt")
floor = _elementwise("floor")
floor_divide = _elementwise("floor_divide")
add = _elementwise("add")
sub = _elementwise("sub")
mul = _elementwise("mul")
div = _elementwise("div")
pow = _elementwise("pow")
eq = _elementwise("eq")
ne = _elementwise("ne")
lt = _elementwise("lt")
le = _elementwise("le")
gt = _elementwise("gt")
ge = _elementwise("ge")
logical_and = _elementwise("logical_and")
logical_or = _elementwise("logical_or")
logical_not = _elementwise("logical_not")


def select(cond: Value, x: Any, y: Any) -> Value:
    """`x` where `cond` (bool, of x's or y's shape) holds, else `y`."""
    x, y = _operands("select", (x, y))
    return bind(PRIMITIVES["where"], broadcast_to(cond, aval(x).shape), x, y)


def convert(x: Value, dtype: Any, weak: bool = False) -> Value:
    """x cast to `dtype` (a no-op when it has it already); to bool it is `x != 0`, as numpy's cast."""
    a, dtype = aval(x), np.dtype(dtype)
    if a.dtype == dtype and a.weak == weak:
        return x
    if dtype == np.bool_:
        return ne(x, 0)
    return bind(PRIMITIVES["convert"], x, dtype=dtype, weak=weak)


def broadcast_to(x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if aval(x).shape == shape:
        return x
    return bind(PRIMITIVES["broadcast_to"], x, shape=shape)


def reshape(x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if aval(x).shape == shape:
        return x
    return bind(PRIMITIVES["reshape"], x, shape=shape)


def transpose(x: Value, perm: Sequence[int]) -> Value:
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind(PRIMITIVES["transpose"], x, perm=perm)


def swap_last(x: Value) -> Value:
    """The last two axes exchanged (a matrix transposed, batch axes kept)."""
    n = aval(x).ndim
    return transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))


def reduce(name: str, x: Value, axes: Sequence[int]) -> Value:
    """The reduction `name` ("reduce_sum", ...) over `axes`, kept as length 1."""
    axes = tuple(sorted(int(a) for a in axes))
    return bind(PRIMITIVES[name], x, axes=axes) if axes else x


def reduce_sum(x: Value, axes: Sequence[int]) -> Value:
    return reduce("reduce_sum", x, axes)


def sum_to_shape(g: Value, shape: Sequence[int]) -> Value:
    """Un-broadcast: sum `g` over the axes broadcasting to its shape created or stretched from `shape`."""
    shape = tuple(shape)
    gshape = aval(g).shape
    lead = len(gshape) - len(shape)
    padded = (1,) * lead + shape
    axes = tuple(i for i, (a, b) in enumerate(zip(padded, gshape)) if a == 1 and b != 1)
    return reshape(reduce_sum(g, axes), shape)


def matmul(x: Value, y: Value) -> Value:
    """A batched matrix product of operands with equal batch shapes and one dtype."""
    return bind(PRIMITIVES["matmul"], x, y)


def slice_region(x: Value, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> Value:
    starts, steps, shape = (tuple(int(v) for v in t) for t in (starts, steps, shape))
    if shape == aval(x).shape and not any(starts) and all(s == 1 for s in steps):
        return x
    return bind(PRIMITIVES["slice"], x, starts=starts, steps=steps, shape=shape)


def pad_region(x: Value, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int], value: Any = 0
               ) -> Value:
    starts, steps, shape = (tuple(int(v) for v in t) for t in (starts, steps, shape))
    if shape == aval(x).shape and not any(starts) and all(s == 1 for s in steps):
        return x
    return bind(PRIMITIVES["pad"], x, starts=starts, steps=steps, shape=shape, value=value)


def gather(x: Value, indices: Sequence[Value]) -> Value:
    return bind(PRIMITIVES["gather"], x, *indices)


def scatter_add(g: Value, indices: Sequence[Value], shape: Sequence[int]) -> Value:
    return bind(PRIMITIVES["scatter_add"], g, *indices, shape=tuple(int(d) for d in shape))
