"""What numpy.linalg's host primitives share: the LAPACK primitive and its declaration, results packed into one
array, the lax helpers every VJP uses, and the checks of the matrices numpy.linalg takes.

Each decomposition is a host primitive running numpy's LAPACK routine on the whole stack of matrices; one
with several results packs them into one array (host steps have one output) that slices unpack. The VJPs
(`solvers`, `factorizations`) are the standard matrix-calculus rules written with jitgrad.tracing.lax and these
primitives (inv's uses inv), so they are differentiable again. docs/ops.md lists the conventions at degenerate
points.
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.errors import ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval, Eqn
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import user_source, where_text
from jitgrad.ops.core import ArrayLike, aval_of, batch_leading, check_computable, convert

# ---------------------------------------------------------------------- host primitives calling LAPACK


class _Lapack(Primitive):
    """A host primitive calling numpy.linalg. Its `_site` parameter (the op and the user's line, for error
    messages) does not make two applications different."""

    def cse_key(self, e: Eqn) -> Any:
        return tuple(sorted((k, repr(v)) for k, v in e.params.items() if k != "_site"))


def _site(op: str) -> str:
    """The op and the user's line, recorded at trace time for the host step's errors."""
    src = user_source()
    return f"numpy.linalg.{op}" + (f" at {src}" if src else "")


def _lapack(fn: Callable[..., Any], hint: str) -> Callable[..., Any]:
    """numpy's routine as a host step: its LinAlgError (a singular matrix...) is raised again when the traced
    function runs, naming the op, the shapes and the user's line, so a call never returns garbage."""
    def impl(*arrays: Any, _site: str = "", **params: Any) -> Any:
        try:
            return fn(*arrays, **params)
        except np.linalg.LinAlgError as exc:
            shapes = ", ".join(str(np.shape(a)) for a in arrays)
            raise np.linalg.LinAlgError(f"{exc}: {_site} (input shapes {shapes}); {hint}") from None
    return impl


def _declare(name: str, rule: Callable[..., Aval], fn: Callable[..., Any], vjp: Any, hint: str = "") -> Primitive:
    """Declare a host primitive running `fn`; `hint` says what to do when LAPACK refuses a matrix."""
    return declare(_Lapack(name, Kind.HOST, rule, _lapack(fn, hint), vjp, batch=batch_leading))


def _grad_site(site: str) -> str:
    """Where a primitive a VJP binds comes from, for its errors."""
    return f"the gradient of {site}"


def _packed(fn: Callable[..., Sequence[np.ndarray]]) -> Callable[..., np.ndarray]:
    """A routine with several results as one whose results are flattened after the batch axes and joined."""
    def impl(a: np.ndarray, **params: Any) -> np.ndarray:
        batch = np.shape(a)[:-2]
        parts = [np.reshape(p, batch + (math.prod(np.shape(p)[len(batch):]),)) for p in fn(a, **params)]
        return np.concatenate(parts, axis=-1)
    return impl


def _unpack(packed: Any, shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    """The results a packed primitive joined, each of batch + its shape."""
    batch, start, parts = tuple(packed.shape[:-1]), 0, []
    for shape in shapes:
        size = math.prod(shape)
        piece = L.slice_region(packed, (0,) * len(batch) + (start,), (1,) * (len(batch) + 1), batch + (size,))
        parts.append(L.reshape(piece, batch + tuple(shape)))
        start += size
    return parts


def _packed_rule(shapes: Callable[..., Sequence[tuple[int, ...]]]) -> Callable[..., Aval]:
    """The rule of a packed primitive whose results have `shapes(m, n, **params)` after the batch axes."""
    def rule(avals: Sequence[Aval], **params: Any) -> Aval:
        a = avals[0]
        total = builtins.sum(math.prod(s) for s in shapes(*a.shape[-2:], **params))
        return Aval(a.shape[:-2] + (total,), a.dtype, False)
    return rule


def _same(avals: Sequence[Aval], **_: Any) -> Aval:
    """The rule of a result shaped as the last operand (inv, cholesky; solve's b)."""
    return Aval(avals[-1].shape, avals[-1].dtype, False)


def _dropped(count: int, keep: Callable[[tuple[int, ...]], tuple[int, ...]] = lambda s: ()) -> Callable[..., Aval]:
    """The rule of a result of the batch shape (the last `count` axes dropped) plus `keep(matrix shape)`."""
    return lambda avals, **_: Aval(avals[0].shape[:-count] + keep(avals[0].shape[-2:]), avals[0].dtype, False)


# ---------------------------------------------------------------------- lax helpers of the rules


def _t(x: Any) -> Any:
    """Each matrix transposed."""
    return L.swap_last(x)


def _mm(*xs: Any) -> Any:
    """The batched product of the matrices, left to right."""
    out = xs[0]
    for x in xs[1:]:
        out = L.matmul(out, x)
    return out


# ---------------------------------------------------------------------- numpy.linalg's arguments and results


# numpy's own result types (namedtuples since numpy 2.0; plain tuples before)
SlogdetResult, EighResult, SVDResult, QRResult = (type(f(np.eye(1))) for f in (
    np.linalg.slogdet, np.linalg.eigh, np.linalg.svd, np.linalg.qr))


def _results(kind: type, parts: Sequence[Any]) -> Any:
    """numpy's result tuple of `kind` holding `parts`."""
    return kind._make(parts) if hasattr(kind, "_make") else tuple(parts)


def _matrices(op: str, a: ArrayLike, square: bool = True) -> ArrayLike:
    """`a` as numpy.linalg takes it: at least 2-D (square if asked), floats kept, ints and bools as float64."""
    av = aval_of(a)
    if av.ndim < 2:
        raise ShapeError(f"numpy.linalg.{op}: {av.ndim}-dimensional array given (shape {av.shape}); the array must be "
                         f"at least two-dimensional{where_text()}")
    if square and av.shape[-1] != av.shape[-2]:
        raise ShapeError(f"numpy.linalg.{op}: the last 2 dimensions of the array must be square, got shape "
                         f"{av.shape}{where_text()}")
    dtype = av.dtype if av.is_float else np.dtype(np.float64)
    check_computable(f"numpy.linalg.{op}", dtype, (a,))
    return convert(a, dtype)


def _no_hermitian(op: str, hermitian: Any) -> None:
    """Refuse numpy's eigh-based hermitian=True path (its gradient would be eigh's, of one triangle)."""
    if hermitian:
        raise UnsupportedError(f"numpy.linalg.{op}(..., hermitian=True) is not supported by jitgrad: pass "
                               f"hermitian=False, which gives the same result for a symmetric matrix{where_text()}")
