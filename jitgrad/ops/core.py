"""What every op module builds on: operand avals, numpy's dtype promotion (NEP 50), broadcasting,
axes, and the primitives those need themselves: `convert` and the views `broadcast_to`, `reshape`
and `transpose`. Also the helpers that declare an elementwise primitive with its numpy ufunc binding."""
from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import PrecisionWarning, ShapeError, UnsupportedError
from jitgrad.ir.graph import Atom, Aval, Eqn
from jitgrad.ir.primitive import Kind, Lowering, Primitive, batch_elementwise, declare, lowerings
from jitgrad.tracing.tracer import Tracer, bind, builder_aval, constant_of, user_source, where_text

ArrayLike = Any
VECMATH = "jitgrad.kernels.cpu.vecmath"


def aval_of(x: ArrayLike) -> Aval:
    return builder_aval(x)


# ---------------------------------------------------------------------- shape/dtype rules

def same_aval(avals: Sequence[Aval], **_: Any) -> Aval:
    """Elementwise: operands of one shape and dtype; weak (a Python number) only if all are."""
    first = avals[0]
    return Aval(first.shape, first.dtype, all(a.weak for a in avals))


def bool_aval(avals: Sequence[Aval], **_: Any) -> Aval:
    return Aval(avals[0].shape, np.dtype(bool), False)


# ---------------------------------------------------------------------- declaring elementwise primitives

def elementwise_primitive(name: str, impl: Callable[..., Any], vjp: Callable[..., Any] | None,
                          lowering: dict[str, Lowering], *, costly: bool = False,
                          rule: Callable[..., Aval] = same_aval, simplify: Any = None,
                          backward_label: str = "") -> Primitive:
    """Declare an elementwise primitive; `vjp(g, *inputs, out)` returns one cotangent per input (None: zero)."""
    rule_fn = None if vjp is None else (lambda cts, ins, outs, **params: list(_as_tuple(vjp(cts[0], *ins, outs[0]))))
    return declare(Primitive(name, Kind.ELEMENTWISE, rule, impl, rule_fn, lowering, costly=costly,
                             simplify=simplify, backward_label=backward_label, batch=batch_elementwise))


def _as_tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def ufunc_binding(ufunc: np.ufunc, prim: Primitive, name: str | None = None,
                  compute: Callable[..., ArrayLike] | None = None, aliases: tuple[str, ...] = ()) -> Callable:
    """The numpy binding of `ufunc` by `prim`: numpy's broadcasting and promotion, then the primitive
    (`compute` instead, for comparisons and logic). Exported as `jg.<name>`."""
    if ufunc.nin == 1:
        def op(x: ArrayLike, /) -> ArrayLike:
            return compute(x) if compute else elementwise(prim, ufunc, x)
    else:
        def op(x1: ArrayLike, x2: ArrayLike, /) -> ArrayLike:  # type: ignore[misc]
            return compute(x1, x2) if compute else elementwise(prim, ufunc, x1, x2)
    op.__name__ = op.__qualname__ = name or ufunc.__name__
    op.__doc__ = f"numpy.{ufunc.__name__}, elementwise, with numpy's broadcasting and dtype promotion."
    return implements(ufunc, aliases=aliases)(op)


def _math(name: str, vec: str | None = None) -> dict:
    """The lowering of a math function: numpy's, or vecmath's `vec`."""
    cpu = f"{vec}({{0}})" if vec else f"np.{name}({{0}})"
    return lowerings(cpu, imports=(f"{VECMATH}.{vec}",) if vec else ())


# ---------------------------------------------------------------------- promotion and broadcasting

def _dummy(a: Aval) -> Any:
    """A stand-in value numpy can type: a Python scalar for weak values, a 1-element array otherwise."""
    if a.weak:
        return {"b": True, "i": 1, "u": 1, "f": 1.0}[a.dtype.kind]
    return np.ones(1, a.dtype)


@lru_cache(maxsize=None)
def _numpy_result(fn: Any, keys: tuple[tuple[str, bool], ...]) -> tuple[np.dtype, bool]:
    avals = [Aval((), np.dtype(d), w) for d, w in keys]
    with np.errstate(all="ignore"):
        out = fn(*[_dummy(a) for a in avals])
    return np.asarray(out).dtype, all(w for _, w in keys)


def result_type(fn: Any, *xs: ArrayLike) -> tuple[np.dtype, bool]:
    """The dtype numpy's `fn` gives for these operands (NEP 50: Python scalars are weak) and weakness."""
    return _numpy_result(fn, tuple((a.dtype.str, a.weak) for a in map(aval_of, xs)))


@lru_cache(maxsize=4096)
def _broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """np.broadcast_shapes (Python ints; ValueError), once per combination: numpy's takes 9 us for two 2-d shapes."""
    return tuple(np.broadcast_shapes(*shapes))


def _broadcast_avals(op: str, avals: Sequence[Aval]) -> tuple[int, ...]:
    try:
        return _broadcast(shapes := tuple(a.shape for a in avals))
    except ValueError:
        raise ShapeError(f"{op}: operands of shapes {' and '.join(str(s) for s in shapes)} do not broadcast "
                         f"together{where_text()}") from None


def broadcast_shapes(op: str, *xs: ArrayLike) -> tuple[int, ...]:
    return _broadcast_avals(op, [aval_of(x) for x in xs])


def check_computable(op: str, dtype: np.dtype, xs: Sequence[ArrayLike]) -> None:
    if dtype.kind not in "biuf" or dtype == np.float16:
        raise UnsupportedError(f"{op}: dtype {dtype} (from operands {[str(aval_of(x)) for x in xs]}) is not "
                               f"supported{where_text()}")


def elementwise(prim: Primitive, numpy_fn: Any, *xs: ArrayLike, compute_dtype: np.dtype | None = None
                ) -> ArrayLike:
    """Apply an elementwise primitive with numpy's broadcasting and promotion.

    Operands are cast to `compute_dtype` (default: the result dtype numpy gives) and broadcast
    to the common shape before the primitive is recorded.
    """
    avals = [aval_of(x) for x in xs]
    shape = _broadcast_avals(prim.name, avals)
    dtype, weak = _numpy_result(numpy_fn, tuple((a.dtype.str, a.weak) for a in avals))
    check_computable(prim.name, dtype, xs)
    if dtype == np.float64 and len(xs) > 1:
        warn_if_widened(prim.name, avals)
    cdt = dtype if compute_dtype is None else compute_dtype
    if not weak and cdt.kind in "iu":
        xs = tuple(fitting_python_int(x, cdt) for x in xs)
    args = [convert(x, cdt, weak) for x in xs]
    return bind(prim, *[x if aval_of(x).shape == shape else broadcast_to(x, shape) for x in args])


def warn_if_widened(op: str, avals: Sequence[Aval]) -> None:
    """Warn (once per user line) when a float64 scalar that is not a Python float widens float32 arrays."""
    if not any(a.dtype == np.float32 and not a.weak and a.shape for a in avals):
        return
    if not any(a.dtype == np.float64 and not a.weak and not a.shape for a in avals):
        return
    src = user_source()
    filename, lineno = (src.filename, src.lineno) if src else ("<jitgrad>", 0)
    warnings.warn_explicit(
        f"{op}: a float64 scalar (a numpy float64, not a Python float) widens float32 arrays to float64, as numpy "
        f"does; write a Python float (float(lr)) or np.float32(lr) to stay in float32{where_text()}",
        PrecisionWarning, filename, lineno, registry=_widening_warned)


_widening_warned: dict = {}  # warnings' registry for warn_if_widened: each user line warns once


def fitting_python_int(x: ArrayLike, dtype: np.dtype) -> ArrayLike:
    """NEP 50: a Python int meeting an array of integer `dtype` must fit it, or numpy raises OverflowError.
    A constant is checked now; a Python int argument by a step at every call."""
    a = aval_of(x)
    if not a.weak or a.dtype.kind not in "iu" or a.dtype == dtype:
        return x
    if isinstance(x, Tracer):
        return bind(check_int_range_p, x, dtype=dtype)
    info = np.iinfo(dtype)
    if not info.min <= int(x) <= info.max:
        raise OverflowError(f"Python integer {int(x)} out of bounds for {dtype}{where_text()}")
    return x


def compare(prim: Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Comparisons: operands promoted to their common type, result bool. A Python int compares exactly with
    an integer array it does not fit (as numpy's do): both are then compared as int64."""
    common, weak = result_type(np.add, x, y)
    if not weak and common.kind in "iu" and common.itemsize < 8 and any(
            aval_of(v).weak and aval_of(v).dtype.kind in "iu" for v in (x, y)):
        common = np.dtype(np.int64)
    shape = broadcast_shapes(prim.name, x, y)
    return bind(prim, *[broadcast_to(convert(v, common, weak), shape) for v in (x, y)])


def normalize_axes(op: str, shape: Sequence[int], axis: Any) -> tuple[int, ...]:
    """numpy's axis argument (None, int, tuple, negative) as a sorted tuple of non-negative axes."""
    nd = len(shape)
    axis = constant_of(axis)
    if axis is None:
        return tuple(range(nd))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        a = constant_of(a)
        if isinstance(a, Tracer) or not isinstance(a, (int, np.integer)):
            raise UnsupportedError(f"{op}: axis must be a Python int or a tuple of ints, got {a!r}{where_text()}")
        if not -nd <= a < nd:
            raise ShapeError(f"{op}: axis {a} is out of range for an array of shape {tuple(shape)} "
                             f"(ndim {nd}){where_text()}")
        out.append(int(a) % nd if nd else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis!r}{where_text()}")
    return tuple(sorted(out))


# ---------------------------------------------------------------------- convert

def _convert_rule(avals: Sequence[Aval], *, dtype: np.dtype, weak: bool = False) -> Aval:
    return Aval(avals[0].shape, np.dtype(dtype), weak)


def _convert_impl(x: Any, *, dtype: np.dtype, weak: bool = False) -> np.ndarray:
    return np.asarray(x).astype(dtype)


def _convert_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, dtype: Any, weak: bool = False
                 ) -> list[Any]:
    (x,) = ins
    return [L.convert(cts[0], x.dtype, x.aval.weak) if x.aval.is_float else None]


def _unchanged(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | None:
    """A view, cast or reduction that leaves shape and dtype as they are is its input, bit for bit."""
    (x,), (out,) = e.inputs, e.outs
    return x if x.aval.shape == out.aval.shape and x.aval.dtype == out.aval.dtype else None


convert_p = L.convert_p = declare(Primitive("convert", Kind.ELEMENTWISE, _convert_rule, _convert_impl, _convert_vjp,
                                            lowerings("{cast}({0})"), simplify=_unchanged, batch=batch_elementwise,
                                            converts=True))


def convert(x: ArrayLike, dtype: Any, weak: bool = False) -> ArrayLike:
    """Cast to `dtype`; a no-op when it already has it. Constants are cast right away."""
    dtype = np.dtype(dtype)
    a = aval_of(x)
    if a.dtype == dtype and a.weak == weak:
        return x
    if not isinstance(x, Tracer):
        if weak and np.ndim(x) == 0:
            return np.asarray(x).astype(dtype).item()
        return np.asarray(x).astype(dtype)
    return L.convert(x, dtype, weak)


def _check_int_range_impl(x: Any, *, dtype: np.dtype) -> Any:
    """A Python int argument (weakly typed, held as int64) meeting an array of a narrower integer dtype:
    numpy raises OverflowError when it does not fit (NEP 50), and so does this step, at call time."""
    value, info = int(np.asarray(x)), np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise OverflowError(f"Python integer {value} out of bounds for {np.dtype(dtype)}")
    return x


check_int_range_p = declare(Primitive("check_int_range", Kind.HOST, same_aval, _check_int_range_impl,
                                     batch=batch_elementwise))


# ---------------------------------------------------------------------- batching rules of whole families (vmap)

def batch_leading(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Ops over trailing axes that take leading batch axes as they are (LAPACK): every operand batched at 0."""
    outs = e.prim.replay([b.move(x, d, 0) for x, d in zip(args, dims)], e, b.bind)
    return outs, [0] * len(outs)


def batch_along_axis(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Ops along one `axis` parameter (scans, sorts, concatenate, argmax): every operand batched at 0, the axis
    moved by one."""
    ins = [b.move(x, d, 0) for x, d in zip(args, dims)]
    params = dict(e.params, axis=e.params["axis"] % (aval_of(ins[0]).ndim - 1) + 1)
    return batch_rebound(b, e, ins, params)


def batch_rebound(b: Any, e: Eqn, ins: Sequence[Any], params: dict[str, Any], dim: int = 0
                  ) -> tuple[list[Any], list[int]]:
    """`e`'s primitive bound again on batched `ins` with `params`, every output batched at `dim`."""
    res = b.bind(e.prim, *ins, label=e.label, **params)
    outs = res if isinstance(res, list) else [res]
    return outs, [dim] * len(outs)


def _batch_broadcast(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    shape, x = e.params["shape"], b.move(args[0], dims[0], 0)
    src = aval_of(x).shape[1:]
    x = L.reshape(x, (b.size,) + (1,) * (len(shape) - len(src)) + src)
    return [L.broadcast_to(x, (b.size,) + shape)], [0]


def _batch_reshape(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    return [L.reshape(b.move(args[0], dims[0], 0), (b.size,) + e.params["shape"])], [0]


def _batch_transpose(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    return [L.transpose(b.move(args[0], dims[0], 0), (0,) + tuple(p + 1 for p in e.params["perm"]))], [0]


# ---------------------------------------------------------------------- views

def _broadcast_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    """numpy's rule, checked on every equation recorded (a transformation's rule too, not only np.broadcast_to)."""
    src = avals[0].shape
    lead = len(shape) - len(src)
    if lead < 0 or any(s not in (1, d) for s, d in zip(src, shape[lead:])):
        raise ShapeError(f"broadcast_to: cannot broadcast shape {src} to {tuple(shape)}{where_text()}")
    return avals[0].with_shape(shape)


def _broadcast_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, shape: tuple[int, ...]
                   ) -> list[Any]:
    return [L.sum_to_shape(cts[0], ins[0].shape)]


def _broadcast_index(e: Eqn, index: tuple) -> tuple:
    src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
    lead = len(out) - len(src)
    return tuple(None if s == 1 else index[j + lead] for j, s in enumerate(src))


def _compose_or_unchanged(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | Eqn | None:
    """A reshape of a reshape (a broadcast of a broadcast) is one; one that changes nothing is its input."""
    same = _unchanged(e, scalar_of, producer_of)
    if same is not None:
        return same
    inner = producer_of(e.inputs[0])
    if inner is not None and inner.prim is e.prim:
        return Eqn(e.prim, (inner.inputs[0],), e.params, e.outs, e.source, e.label)
    return None


broadcast_to_p = L.broadcast_to_p = declare(Primitive(
    "broadcast_to", Kind.VIEW, _broadcast_rule, lambda x, *, shape: np.broadcast_to(x, shape), _broadcast_vjp,
    index_map=_broadcast_index, simplify=_compose_or_unchanged,
    backward_label="ExpandBackward", batch=_batch_broadcast))


def _reshape_index(e: Eqn, index: tuple) -> tuple | None:
    src, out = e.inputs[0].aval.shape, e.outs[0].aval.shape
    if [d for d in src if d != 1] != [d for d in out if d != 1]:
        return None  # regroups axes: a copy, not a move of indices
    live = iter([a for d, a in zip(out, index) if d != 1])
    return tuple(None if d == 1 else next(live) for d in src)


def _reshape_rule(avals: Sequence[Aval], *, shape: tuple[int, ...]) -> Aval:
    """The same elements in a new shape."""
    if int(np.prod(shape)) != int(np.prod(avals[0].shape)):
        raise ShapeError(f"reshape: cannot reshape shape {avals[0].shape} to {tuple(shape)}{where_text()}")
    return avals[0].with_shape(shape)


reshape_p = L.reshape_p = declare(Primitive(
    "reshape", Kind.VIEW, _reshape_rule, lambda x, *, shape: np.asarray(x).reshape(shape),
    lambda cts, ins, outs, *, shape: [L.reshape(cts[0], ins[0].shape)], index_map=_reshape_index,
    simplify=_compose_or_unchanged, backward_label="ViewBackward", batch=_batch_reshape))


def _transpose_rule(avals: Sequence[Aval], *, perm: tuple[int, ...]) -> Aval:
    return avals[0].with_shape(tuple(avals[0].shape[p] for p in perm))


def _transpose_index(e: Eqn, index: tuple) -> tuple:
    result: list[int | None] = [None] * len(index)
    for j, p in enumerate(e.params["perm"]):
        result[p] = index[j]
    return tuple(result)


def _transpose_simplify(e: Eqn, scalar_of: Any, producer_of: Any) -> Atom | Eqn | None:
    """The identity permutation is its input; a transpose of a transpose is one (x.T.T is x)."""
    perm = e.params["perm"]
    if perm == tuple(range(len(perm))):
        return e.inputs[0]
    inner = producer_of(e.inputs[0])
    if inner is not None and inner.prim is transpose_p:
        composed = tuple(inner.params["perm"][p] for p in perm)
        if composed == tuple(range(len(composed))):
            return inner.inputs[0]
        return Eqn(transpose_p, (inner.inputs[0],), {"perm": composed}, e.outs, e.source, e.label)
    return None


transpose_p = L.transpose_p = declare(Primitive(
    "transpose", Kind.VIEW, _transpose_rule, lambda x, *, perm: np.transpose(x, perm),
    lambda cts, ins, outs, *, perm: [L.transpose(cts[0], tuple(np.argsort(perm)))], index_map=_transpose_index,
    simplify=_transpose_simplify, backward_label="PermuteBackward", batch=_batch_transpose))


@implements(np.broadcast_to)
def broadcast_to(array: ArrayLike, shape: Any) -> ArrayLike:
    """numpy.broadcast_to: a view of `array` in a larger shape (no data is copied)."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    a = aval_of(array)
    if a.shape == shape:
        return array
    try:
        if len(a.shape) > len(shape) or _broadcast((a.shape, shape)) != shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"broadcast_to: cannot broadcast shape {a.shape} to {shape}{where_text()}") from None
    return bind(broadcast_to_p, array, shape=shape)
