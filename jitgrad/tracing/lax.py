"""IR-level binders for VJP rules, with exact dtypes (as JAX's `lax` is to its numpy layer).

Each function binds one primitive. Array operands must share one dtype; a Python number takes the
dtype of the array it meets and is broadcast to its shape; nothing is promoted. So a float32
backward stays float32, and every rule reads as the math it computes.

The binders bind primitive objects, never names: the modules that declare the primitives import this one, not
the other way, so each primitive bound here has a typed handle below (`convert_p`) that the op module declaring it
fills at its declaration (`convert_p = L.convert_p = declare(Primitive("convert", ...))` in jitgrad.ops.core),
and `jitgrad.ops` checks on import that every handle is filled (`unfilled`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Primitive
from jitgrad.tracing.tracer import bind, builder_aval

Value = Any  # a tracer, or a numpy constant

# ---- the handles: each filled by the op module that declares the primitive (one home per op)

neg_p: Primitive  # jitgrad.ops.arithmetic
exp_p: Primitive  # jitgrad.ops.transcendental, as are log, sin, cos, sinh and cosh
log_p: Primitive
sin_p: Primitive
cos_p: Primitive
sinh_p: Primitive
cosh_p: Primitive
sqrt_p: Primitive  # jitgrad.ops.arithmetic, as are floor to pow
floor_p: Primitive
floor_divide_p: Primitive
add_p: Primitive
sub_p: Primitive
mul_p: Primitive
div_p: Primitive
pow_p: Primitive
eq_p: Primitive  # jitgrad.ops.comparisons, as are ne to where
ne_p: Primitive
lt_p: Primitive
le_p: Primitive
gt_p: Primitive
ge_p: Primitive
logical_and_p: Primitive
logical_or_p: Primitive
logical_not_p: Primitive
where_p: Primitive
convert_p: Primitive  # jitgrad.ops.core, as are broadcast_to, reshape and transpose
broadcast_to_p: Primitive
reshape_p: Primitive
transpose_p: Primitive
reduce_sum_p: Primitive  # jitgrad.ops.reductions
matmul_p: Primitive  # jitgrad.ops.linalg
slice_p: Primitive  # jitgrad.ops.regions, as is pad
pad_p: Primitive
gather_p: Primitive  # jitgrad.ops.indexing, as is scatter_add
scatter_add_p: Primitive


def unfilled() -> list[str]:
    """The handles above that no op module has filled with its primitive (none once jitgrad.ops is imported)."""
    return [h for h in __annotations__ if h.endswith("_p") and not isinstance(globals().get(h), Primitive)]


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


def _elementwise(prim: Primitive, *xs: Any) -> Value:
    """`prim`, an elementwise primitive, applied to operands of one dtype."""
    return bind(prim, *_operands(prim.name, xs))


def neg(x: Value) -> Value:
    return _elementwise(neg_p, x)


def exp(x: Value) -> Value:
    return _elementwise(exp_p, x)


def log(x: Value) -> Value:
    return _elementwise(log_p, x)


def sin(x: Value) -> Value:
    return _elementwise(sin_p, x)


def cos(x: Value) -> Value:
    return _elementwise(cos_p, x)


def sinh(x: Value) -> Value:
    return _elementwise(sinh_p, x)


def cosh(x: Value) -> Value:
    return _elementwise(cosh_p, x)


def sqrt(x: Value) -> Value:
    return _elementwise(sqrt_p, x)


def floor(x: Value) -> Value:
    return _elementwise(floor_p, x)


def floor_divide(x: Any, y: Any) -> Value:
    return _elementwise(floor_divide_p, x, y)


def add(x: Any, y: Any) -> Value:
    return _elementwise(add_p, x, y)


def sub(x: Any, y: Any) -> Value:
    return _elementwise(sub_p, x, y)


def mul(x: Any, y: Any) -> Value:
    return _elementwise(mul_p, x, y)


def div(x: Any, y: Any) -> Value:
    return _elementwise(div_p, x, y)


def pow(x: Any, y: Any) -> Value:
    return _elementwise(pow_p, x, y)


def eq(x: Any, y: Any) -> Value:
    return _elementwise(eq_p, x, y)


def ne(x: Any, y: Any) -> Value:
    return _elementwise(ne_p, x, y)


def lt(x: Any, y: Any) -> Value:
    return _elementwise(lt_p, x, y)


def le(x: Any, y: Any) -> Value:
    return _elementwise(le_p, x, y)


def gt(x: Any, y: Any) -> Value:
    return _elementwise(gt_p, x, y)


def ge(x: Any, y: Any) -> Value:
    return _elementwise(ge_p, x, y)


def logical_and(x: Any, y: Any) -> Value:
    return _elementwise(logical_and_p, x, y)


def logical_or(x: Any, y: Any) -> Value:
    return _elementwise(logical_or_p, x, y)


def logical_not(x: Value) -> Value:
    return _elementwise(logical_not_p, x)


def select(cond: Value, x: Any, y: Any) -> Value:
    """`x` where `cond` (bool, of x's or y's shape) holds, else `y`."""
    x, y = _operands("select", (x, y))
    return bind(where_p, broadcast_to(cond, aval(x).shape), x, y)


def convert(x: Value, dtype: Any, weak: bool = False) -> Value:
    """x cast to `dtype` (a no-op when it has it already); to bool it is `x != 0`, as numpy's cast."""
    a, dtype = aval(x), np.dtype(dtype)
    if a.dtype == dtype and a.weak == weak:
        return x
    if dtype == np.bool_:
        return ne(x, 0)
    return bind(convert_p, x, dtype=dtype, weak=weak)


def broadcast_to(x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if aval(x).shape == shape:
        return x
    return bind(broadcast_to_p, x, shape=shape)


def reshape(x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if aval(x).shape == shape:
        return x
    return bind(reshape_p, x, shape=shape)


def transpose(x: Value, perm: Sequence[int]) -> Value:
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind(transpose_p, x, perm=perm)


def swap_last(x: Value) -> Value:
    """The last two axes exchanged (a matrix transposed, batch axes kept)."""
    n = aval(x).ndim
    return transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))


def reduce(prim: Primitive, x: Value, axes: Sequence[int]) -> Value:
    """The reduction `prim` (a REDUCE primitive: reduce_sum_p, ...) over `axes`, kept as length 1."""
    axes = tuple(sorted(int(a) for a in axes))
    return bind(prim, x, axes=axes) if axes else x


def reduce_sum(x: Value, axes: Sequence[int]) -> Value:
    return reduce(reduce_sum_p, x, axes)


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
    return bind(matmul_p, x, y)


def slice_region(x: Value, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> Value:
    starts, steps, shape = (tuple(int(v) for v in t) for t in (starts, steps, shape))
    if shape == aval(x).shape and not any(starts) and all(s == 1 for s in steps):
        return x
    return bind(slice_p, x, starts=starts, steps=steps, shape=shape)


def pad_region(x: Value, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int], value: Any = 0
               ) -> Value:
    starts, steps, shape = (tuple(int(v) for v in t) for t in (starts, steps, shape))
    if shape == aval(x).shape and not any(starts) and all(s == 1 for s in steps):
        return x
    return bind(pad_p, x, starts=starts, steps=steps, shape=shape, value=value)


def gather(x: Value, indices: Sequence[Value]) -> Value:
    return bind(gather_p, x, *indices)


def scatter_add(g: Value, indices: Sequence[Value], shape: Sequence[int]) -> Value:
    return bind(scatter_add_p, g, *indices, shape=tuple(int(d) for d in shape))
