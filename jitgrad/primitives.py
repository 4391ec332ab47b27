"""The primitive op set, each declared once, side by side: its shape/dtype rule, numpy
reference, VJP rule (written with jitgrad ops, so backward graphs are differentiable again)
and its lowering (a scalar expression template for elementwise ops).

Conventions the rest of the stack relies on:
- elementwise primitives take inputs of one shape and (except `where`, `convert`) one dtype:
  `ops` broadcasts and promotes before binding;
- reductions keep reduced axes with length 1 (`ops` reshapes for keepdims=False);
- `view` primitives (broadcast_to, reshape, transpose) only move indices, never compute;
- `host` primitives (matmul, slicing, padding, concatenation, gather/scatter, argmax) run their
  numpy reference on whole arrays between kernels;
- a VJP rule gets (cotangents of outputs, input tracers, output tracers, params) and returns
  one cotangent per input, None meaning zero.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import math

import numpy as np

from .errors import ShapeError
from .ir import Aval

PRIMITIVES: dict[str, "Primitive"] = {}


@dataclass(eq=False)
class Primitive:
    """One IR operation. `kind` tells fusion how it may be grouped."""

    name: str
    kind: str  # "elementwise" | "reduce" | "view" | "host" | "custom"
    abstract_eval: Callable[..., Aval | list[Aval]]
    impl: Callable[..., Any]
    vjp: Callable[..., Sequence[Any]] | None = None
    cpu: str | None = None  # elementwise: template over {0}, {1}, ... ; reduce: the combiner
    backward_label: str = ""
    params_doc: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Primitive({self.name})"

    @property
    def label(self) -> str:
        return self.backward_label or "".join(p.capitalize() for p in self.name.split("_")) + "Backward"


def declare(prim: Primitive) -> Primitive:
    PRIMITIVES[prim.name] = prim
    return prim


# ---------------------------------------------------------------- shape/dtype rules

def _same(avals: Sequence[Aval], **_: Any) -> Aval:
    first = avals[0]
    return Aval(first.shape, first.dtype, all(a.weak for a in avals))


def _to_bool(avals: Sequence[Aval], **_: Any) -> Aval:
    return Aval(avals[0].shape, np.dtype(bool), False)


def _where_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    return Aval(avals[1].shape, avals[1].dtype, avals[1].weak and avals[2].weak)


def _convert_rule(avals: Sequence[Aval], *, dtype: np.dtype, weak: bool = False) -> Aval:
    return Aval(avals[0].shape, np.dtype(dtype), weak)


def _reduce_rule(avals: Sequence[Aval], *, axes: tuple[int, ...]) -> Aval:
    (a,) = avals
    return Aval(tuple(1 if i in axes else d for i, d in enumerate(a.shape)), a.dtype, a.weak)


def _broadcast_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(shape)


def _reshape_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(shape)


def _transpose_rule(avals: Sequence[Aval], *, perm: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(tuple(avals[0].shape[p] for p in perm))


def _matmul_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    a, b = avals
    if a.ndim < 2 or b.ndim < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not line up")
    return Aval(a.shape[:-1] + (b.shape[-1],), a.dtype, a.weak and b.weak)


# ---------------------------------------------------------------- declarations

def _ops() -> Any:
    from . import ops
    return ops


def unary(name: str, impl: Callable, cpu: str, vjp: Callable | None, out_rule: Callable = _same) -> Primitive:
    """Declare an elementwise primitive of one input; `vjp(g, x, out)` returns the input cotangent."""
    rule = None if vjp is None else (lambda cts, ins, outs: [vjp(cts[0], ins[0], outs[0])])
    return declare(Primitive(name, "elementwise", out_rule, impl, rule, cpu))


def binary(name: str, impl: Callable, cpu: str, vjp: Callable | None, out_rule: Callable = _same) -> Primitive:
    """Declare an elementwise primitive of two inputs; `vjp(g, x, y, out)` returns both cotangents."""
    rule = None if vjp is None else (lambda cts, ins, outs: list(vjp(cts[0], ins[0], ins[1], outs[0])))
    return declare(Primitive(name, "elementwise", out_rule, impl, rule, cpu))


def _max_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """Ties split the gradient evenly, as torch.maximum and JAX do."""
    o = _ops()
    share_x = o.where(x > y, 1.0, o.where(x == y, 0.5, 0.0)).astype(g.dtype)
    return g * share_x, g * (1.0 - share_x)


def _min_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    o = _ops()
    share_x = o.where(x < y, 1.0, o.where(x == y, 0.5, 0.0)).astype(g.dtype)
    return g * share_x, g * (1.0 - share_x)


def _pow_vjp(g: Any, x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """d/dx = y*x**(y-1) (0 where y == 0); d/dy = out*log(x) (0 where x == 0 and y >= 0), as torch."""
    o = _ops()
    gx = o.where(y == 0, 0.0, g * y * x ** (y - 1.0))
    gy = o.where((x == 0) & (y >= 0), 0.0, g * out * o.log(o.where(x == 0, 1.0, x)))
    return gx, gy


def _erf_impl(x: Any) -> np.ndarray:
    """numpy has no erf: evaluate math.erf per element in float64, round once to the input's dtype."""
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _atan2_vjp(g: Any, y: Any, x: Any, out: Any) -> tuple[Any, Any]:
    denom = x * x + y * y
    return g * x / denom, -g * y / denom


neg_p = unary("neg", np.negative, "(-{0})", lambda g, x, out: -g)
exp_p = unary("exp", np.exp, "vexp({0})", lambda g, x, out: g * out)
expm1_p = unary("expm1", np.expm1, "vexpm1({0})", lambda g, x, out: g * (out + 1.0))
log_p = unary("log", np.log, "vlog({0})", lambda g, x, out: g / x)
log1p_p = unary("log1p", np.log1p, "vlog1p({0})", lambda g, x, out: g / (x + 1.0))
sin_p = unary("sin", np.sin, "np.sin({0})", lambda g, x, out: g * _ops().cos(x))
cos_p = unary("cos", np.cos, "np.cos({0})", lambda g, x, out: -(g * _ops().sin(x)))
tan_p = unary("tan", np.tan, "np.tan({0})", lambda g, x, out: g * (1.0 + out * out))
tanh_p = unary("tanh", np.tanh, "vtanh({0})", lambda g, x, out: g * (1.0 - out * out))


def _logistic_impl(x: Any) -> Any:
    """1 / (1 + exp(-x)) without overflow: exp is only ever taken of -|x|."""
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


logistic_p = unary("logistic", _logistic_impl, "vsigmoid({0})", lambda g, x, out: g * out * (1.0 - out))
sinh_p = unary("sinh", np.sinh, "np.sinh({0})", lambda g, x, out: g * _ops().cosh(x))
cosh_p = unary("cosh", np.cosh, "np.cosh({0})", lambda g, x, out: g * _ops().sinh(x))
arcsin_p = unary("arcsin", np.arcsin, "np.arcsin({0})", lambda g, x, out: g / _ops().sqrt(1.0 - x * x))
arccos_p = unary("arccos", np.arccos, "np.arccos({0})", lambda g, x, out: -g / _ops().sqrt(1.0 - x * x))
arctan_p = unary("arctan", np.arctan, "np.arctan({0})", lambda g, x, out: g / (1.0 + x * x))
arcsinh_p = unary("arcsinh", np.arcsinh, "np.arcsinh({0})", lambda g, x, out: g / _ops().sqrt(x * x + 1.0))
arctanh_p = unary("arctanh", np.arctanh, "np.arctanh({0})", lambda g, x, out: g / (1.0 - x * x))
erf_p = unary("erf", _erf_impl, "{cast}(math.erf({0}))",
               lambda g, x, out: g * (2.0 / math.sqrt(math.pi)) * _ops().exp(-(x * x)))
sqrt_p = unary("sqrt", np.sqrt, "np.sqrt({0})", lambda g, x, out: g * 0.5 / out)
abs_p = unary("abs", np.absolute, "abs({0})", lambda g, x, out: g * _ops().sign(x))
sign_p = unary("sign", np.sign, "np.sign({0})", None)
floor_p = unary("floor", np.floor, "np.floor({0})", None)
ceil_p = unary("ceil", np.ceil, "np.ceil({0})", None)
rint_p = unary("rint", np.rint, "np.rint({0})", None)
isnan_p = unary("isnan", np.isnan, "np.isnan({0})", None, _to_bool)
isfinite_p = unary("isfinite", np.isfinite, "np.isfinite({0})", None, _to_bool)
logical_not_p = unary("logical_not", np.logical_not, "(not {0})", None, _to_bool)

add_p = binary("add", np.add, "({0} + {1})", lambda g, x, y, out: (g, g))
sub_p = binary("sub", np.subtract, "({0} - {1})", lambda g, x, y, out: (g, -g))
mul_p = binary("mul", np.multiply, "({0} * {1})", lambda g, x, y, out: (g * y, g * x))
div_p = binary("div", np.true_divide, "({0} / {1})", lambda g, x, y, out: (g / y, -(g * out) / y))
pow_p = binary("pow", np.power, "({0} ** {1})", _pow_vjp)
# Ties return the second operand, as numpy's do (maximum(-0.0, 0.0) is 0.0); NaN in either operand propagates.
maximum_p = binary("maximum", np.maximum, "({0} if ({0} > {1} or {0} != {0}) else {1})", _max_vjp)
minimum_p = binary("minimum", np.minimum, "({0} if ({0} < {1} or {0} != {0}) else {1})", _min_vjp)
atan2_p = binary("atan2", np.arctan2, "np.arctan2({0}, {1})", _atan2_vjp)
lt_p = binary("lt", np.less, "({0} < {1})", None, _to_bool)
le_p = binary("le", np.less_equal, "({0} <= {1})", None, _to_bool)
gt_p = binary("gt", np.greater, "({0} > {1})", None, _to_bool)
ge_p = binary("ge", np.greater_equal, "({0} >= {1})", None, _to_bool)
eq_p = binary("eq", np.equal, "({0} == {1})", None, _to_bool)
ne_p = binary("ne", np.not_equal, "({0} != {1})", None, _to_bool)
logical_and_p = binary("logical_and", np.logical_and, "({0} and {1})", None, _to_bool)
logical_or_p = binary("logical_or", np.logical_or, "({0} or {1})", None, _to_bool)
logical_xor_p = binary("logical_xor", np.logical_xor, "({0} != {1})", None, _to_bool)

where_p = declare(Primitive(
    "where", "elementwise", _where_rule, np.where,
    lambda cts, ins, outs: [None, _ops().where(ins[0], cts[0], 0.0), _ops().where(ins[0], 0.0, cts[0])],
    "({1} if {0} else {2})"))


def _convert_impl(x: Any, *, dtype: np.dtype, weak: bool = False) -> np.ndarray:
    return np.asarray(x).astype(dtype)


def _convert_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, dtype: Any, weak: bool = False
                 ) -> list[Any]:
    (x,) = ins
    return [_ops().convert(cts[0], x.dtype, x.aval.weak) if x.aval.is_float else None]


convert_p = declare(Primitive("convert", "elementwise", _convert_rule, _convert_impl, _convert_vjp,
                              "{cast}({0})"))
stop_gradient_p = declare(Primitive("stop_gradient", "elementwise", _same, lambda x: np.array(x, copy=True),
                                    lambda cts, ins, outs: [None], "{0}"))


def _reduce_impl(fn: Callable) -> Callable:
    return lambda x, *, axes: fn(x, axis=tuple(axes), keepdims=True)


def _sum_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]) -> list[Any]:
    return [_ops().broadcast_to(cts[0], ins[0].shape)]


def _extremum_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]
                  ) -> list[Any]:
    """The gradient goes to the extreme elements, split evenly among ties (as torch.amax and JAX)."""
    o = _ops()
    (x,), (out,), (g,) = ins, outs, cts
    hit = (x == o.broadcast_to(out, x.shape)).astype(g.dtype)
    count = o.reduce(reduce_sum_p, hit, axes)
    return [o.broadcast_to(g / count, x.shape) * hit]


reduce_sum_p = declare(Primitive("reduce_sum", "reduce", _reduce_rule, _reduce_impl(np.sum), _sum_vjp,
                                 "({0} + {1})", "SumBackward"))
reduce_max_p = declare(Primitive("reduce_max", "reduce", _reduce_rule, _reduce_impl(np.max), _extremum_vjp,
                                 "({0} if ({0} > {1} or {0} != {0}) else {1})", "MaxBackward"))
reduce_min_p = declare(Primitive("reduce_min", "reduce", _reduce_rule, _reduce_impl(np.min), _extremum_vjp,
                                 "({0} if ({0} < {1} or {0} != {0}) else {1})", "MinBackward"))


def _prod_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axes: tuple[int, ...]) -> list[Any]:
    """d prod / d x_i is the product of the other elements, also where some are zero (as torch):
    out / x_i when the row has no zero; the product of the nonzero rest at a row's only zero; else 0."""
    o = _ops()
    (x,), (out,), (g,) = ins, outs, cts
    is_zero = x == 0
    zeros = o.broadcast_to(o.reduce(reduce_sum_p, is_zero.astype(np.int64), axes), x.shape)
    others = o.broadcast_to(o.reduce(reduce_prod_p, o.where(is_zero, 1.0, x), axes), x.shape)
    no_zero = o.broadcast_to(out, x.shape) / o.where(is_zero, 1.0, x)
    share = o.where(zeros == 0, no_zero, o.where(is_zero & (zeros == 1), others, 0.0))
    return [o.broadcast_to(g, x.shape) * share]


reduce_prod_p = declare(Primitive("reduce_prod", "reduce", _reduce_rule, _reduce_impl(np.prod), _prod_vjp,
                                  "({0} * {1})", "ProdBackward"))
REDUCE_IDENTITY = {"reduce_sum": 0.0, "reduce_prod": 1.0, "reduce_max": -np.inf, "reduce_min": np.inf}


def _broadcast_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, shape: tuple[int, ...]
                   ) -> list[Any]:
    """Un-broadcast: sum over the axes broadcasting created or stretched, then restore the shape."""
    o = _ops()
    (x,), (g,) = ins, cts
    lead = len(shape) - x.ndim
    padded = (1,) * lead + tuple(x.shape)
    axes = tuple(i for i, (a, b) in enumerate(zip(padded, shape)) if a == 1 and b != 1)
    summed = o.reduce(reduce_sum_p, g, axes) if axes else g
    return [o.reshape(summed, x.shape)]


def _broadcast_impl(x: Any, *, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(x, shape)


broadcast_to_p = declare(Primitive("broadcast_to", "view", _broadcast_rule, _broadcast_impl, _broadcast_vjp,
                                   backward_label="ExpandBackward"))
reshape_p = declare(Primitive(
    "reshape", "view", _reshape_rule, lambda x, *, shape: np.asarray(x).reshape(shape),
    lambda cts, ins, outs, *, shape: [_ops().reshape(cts[0], ins[0].shape)], backward_label="ViewBackward"))
transpose_p = declare(Primitive(
    "transpose", "view", _transpose_rule, lambda x, *, perm: np.transpose(x, perm),
    lambda cts, ins, outs, *, perm: [_ops().transpose(cts[0], tuple(np.argsort(perm)))],
    backward_label="PermuteBackward"))


def _matmul_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    o = _ops()
    (a, b), (g,) = ins, cts
    return [o.matmul_nd(g, o.swap_last(b)), o.matmul_nd(o.swap_last(a), g)]


matmul_p = declare(Primitive("matmul", "host", _matmul_rule, np.matmul, _matmul_vjp, backward_label="MmBackward"))


# ---------------------------------------------------------------- host data movement

def region(starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> tuple[slice, ...]:
    """Python slices selecting `shape[k]` elements from `starts[k]` every `steps[k]` (steps may be negative)."""
    out = []
    for start, step, n in zip(starts, steps, shape):
        if n == 0:
            out.append(slice(0, 0))
            continue
        stop = start + step * (n - 1) + (1 if step > 0 else -1)
        out.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(out)


def _slice_rule(avals: Sequence[Aval], *, starts: tuple[int, ...], steps: tuple[int, ...],
                shape: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(shape)


def _slice_impl(x: Any, *, starts: tuple[int, ...], steps: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """A contiguous copy, so kernels reading it compile for one memory layout."""
    return np.ascontiguousarray(np.asarray(x)[region(starts, steps, shape)])


def _slice_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, starts: tuple[int, ...],
               steps: tuple[int, ...], shape: tuple[int, ...]) -> list[Any]:
    return [_ops().pad_region(cts[0], starts, steps, ins[0].shape, 0)]


def _pad_rule(avals: Sequence[Aval], *, starts: tuple[int, ...], steps: tuple[int, ...], shape: tuple[int, ...],
              value: Any) -> Aval:
    return avals[0].with_shape(shape)


def _pad_impl(x: Any, *, starts: tuple[int, ...], steps: tuple[int, ...], shape: tuple[int, ...], value: Any
              ) -> np.ndarray:
    x = np.asarray(x)
    out = np.full(shape, value, x.dtype)
    out[region(starts, steps, x.shape)] = x
    return out


def _pad_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, starts: tuple[int, ...],
             steps: tuple[int, ...], shape: tuple[int, ...], value: Any) -> list[Any]:
    return [_ops().slice_region(cts[0], starts, steps, ins[0].shape)]


slice_p = declare(Primitive("slice", "host", _slice_rule, _slice_impl, _slice_vjp, backward_label="SliceBackward"))
pad_p = declare(Primitive("pad", "host", _pad_rule, _pad_impl, _pad_vjp, backward_label="PadBackward"))


def _concatenate_rule(avals: Sequence[Aval], *, axis: int) -> Aval:
    first = avals[0]
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return Aval(tuple(shape), first.dtype, all(a.weak for a in avals))


def _concatenate_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, axis: int) -> list[Any]:
    o = _ops()
    (g,) = cts
    grads, offset = [], 0
    for x in ins:
        starts = tuple(offset if k == axis else 0 for k in range(x.ndim))
        grads.append(o.slice_region(g, starts, (1,) * x.ndim, x.shape))
        offset += x.shape[axis]
    return grads


concatenate_p = declare(Primitive("concatenate", "host", _concatenate_rule,
                                  lambda *xs, axis: np.concatenate(xs, axis=axis), _concatenate_vjp,
                                  backward_label="CatBackward"))


def _gather_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    x, *indices = avals
    return x.with_shape(indices[0].shape + x.shape[len(indices):])


def _gather_impl(x: Any, *indices: Any) -> np.ndarray:
    """x[i0, i1, ...]: integer arrays (of one shape) indexing the leading axes of x."""
    return np.asarray(x)[tuple(np.asarray(i) for i in indices)]


def _gather_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    x, *indices = ins
    if _picks_one_per_row(x, indices):
        return [_one_hot_rows(cts[0], indices[1], x)] + [None] * len(indices)
    return [_ops().scatter_add(cts[0], indices, x.shape)] + [None] * len(indices)


def _picks_one_per_row(x: Any, indices: Sequence[Any]) -> bool:
    """Is this gather x[np.arange(rows), cols] on a matrix, the cross-entropy pattern?"""
    if len(x.shape) != 2 or len(indices) != 2 or not isinstance(indices[0], np.ndarray):
        return False
    rows = indices[0]
    return rows.shape == (x.shape[0],) and np.array_equal(rows, np.arange(x.shape[0]))


def _one_hot_rows(g: Any, cols: Any, x: Any) -> Any:
    """The gradient of x[arange(rows), cols] as where(cols[:, None] == arange(n), g[:, None], 0): elementwise,
    so it fuses with the rest of the backward instead of scattering into a fresh array."""
    o = _ops()
    rows, n = x.shape
    wrapped = o.where(o.less(cols, 0), o.add(cols, n), cols)  # numpy's negative indices count from the end
    hit = o.equal(o.reshape(wrapped, (rows, 1)), np.arange(n).reshape(1, n))
    return o.where(hit, o.reshape(g, (rows, 1)), 0.0)


def _scatter_add_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(shape)


def _scatter_add_impl(g: Any, *indices: Any, shape: tuple[int, ...]) -> np.ndarray:
    """zeros(shape) with g added at [i0, i1, ...]; repeated indices accumulate (np.add.at)."""
    g = np.asarray(g)
    out = np.zeros(shape, g.dtype)
    np.add.at(out, tuple(np.asarray(i) for i in indices), g)
    return out


def _scatter_add_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, shape: tuple[int, ...]
                     ) -> list[Any]:
    _, *indices = ins
    return [_ops().gather(cts[0], indices)] + [None] * len(indices)


gather_p = declare(Primitive("gather", "host", _gather_rule, _gather_impl, _gather_vjp,
                             backward_label="IndexBackward"))
scatter_add_p = declare(Primitive("scatter_add", "host", _scatter_add_rule, _scatter_add_impl, _scatter_add_vjp,
                                  backward_label="IndexPutBackward"))


def _arg_rule(avals: Sequence[Aval], *, axis: int) -> Aval:
    (x,) = avals
    return Aval(tuple(1 if k == axis else d for k, d in enumerate(x.shape)), np.dtype(np.int64), False)


def _check_int_range_impl(x: Any, *, dtype: np.dtype) -> Any:
    """A Python int argument (weakly typed, held as int64) meeting an array of a narrower integer dtype:
    numpy raises OverflowError when it does not fit (NEP 50), and so does this step, at call time."""
    value, info = int(np.asarray(x)), np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise OverflowError(f"Python integer {value} out of bounds for {np.dtype(dtype)}")
    return x


check_int_range_p = declare(Primitive("check_int_range", "host", _same, _check_int_range_impl))

argmax_p = declare(Primitive("argmax", "host", _arg_rule,
                             lambda x, *, axis: np.argmax(x, axis=axis, keepdims=True).astype(np.int64)))
argmin_p = declare(Primitive("argmin", "host", _arg_rule,
                             lambda x, *, axis: np.argmin(x, axis=axis, keepdims=True).astype(np.int64)))
