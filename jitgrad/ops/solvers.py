"""numpy.linalg's inverses, solutions and determinants: inv, solve, pinv, det and slogdet (and det's gradient,
the cofactor matrix), host primitives (`lapack`) batched over leading axes like numpy."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import NO_VALUE, implements
from jitgrad.errors import ArgumentError, ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.tracing.tracer import Tracer, bind, constant_of, where_text
from jitgrad.ops.core import ArrayLike, aval_of, broadcast_to, convert
from jitgrad.ops.shapes import reshape
from jitgrad.ops.lapack import (SlogdetResult, _declare, _dropped, _grad_site, _matrices, _mm, _no_hermitian, _packed,
                                _packed_rule, _results, _same, _site, _t, _unpack)


# ---------------------------------------------------------------------- VJPs


def _matrix_scale(g: Any, shape: Sequence[int]) -> Any:
    """A per-matrix value (batch shape) broadcast over each matrix of `shape`."""
    return L.broadcast_to(L.reshape(g, tuple(g.shape) + (1, 1)), tuple(shape))


def _inv_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], **_: Any) -> list[Any]:
    """-A^-T G A^-T, from inv's own output."""
    ai_t = _t(outs[0])
    return [L.neg(_mm(ai_t, cts[0], ai_t))]


def _solve_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, _site: str) -> list[Any]:
    """X = A^-1 B: gB = A^-T G (a solve), gA = -gB X^T."""
    (a, _), (x,), (g,) = ins, outs, cts
    gb = bind(solve_p, _t(a), g, _site=_grad_site(_site))
    return [L.neg(_mm(gb, _t(x))), gb]


def _det_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, _site: str) -> list[Any]:
    """The cofactor matrix (det(A) A^-T where A is invertible), also at singular matrices."""
    a = ins[0]
    return [L.mul(_matrix_scale(cts[0], a.shape), bind(cofactor_p, a, _site=_grad_site(_site)))]


def _cofactor_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, _site: str) -> list[Any]:
    """d(det(A) A^-T): <G, C> A^-T - det(A) A^-T G^T A^-T (an invertible A: det's second derivative)."""
    (a,), (c,), (g,) = ins, outs, cts
    nd = len(a.shape)
    ai_t = _t(bind(inv_p, a, _site=_grad_site(_site)))
    pair = L.broadcast_to(L.reduce_sum(L.mul(g, c), (nd - 2, nd - 1)), a.shape)
    d = _matrix_scale(bind(det_p, a, _site=_site), a.shape)
    return [L.sub(L.mul(pair, ai_t), L.mul(d, _mm(ai_t, _t(g), ai_t)))]


def _slogdet_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, _site: str) -> list[Any]:
    """log|det A| has gradient A^-T; the sign has none."""
    a = ins[0]
    _, g_log = _unpack(cts[0], [(), ()])
    return [L.mul(_matrix_scale(g_log, a.shape), _t(bind(inv_p, a, _site=_grad_site(_site))))]


def _pinv_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], **_: Any) -> list[Any]:
    """Golub and Pereyra's derivative of P = pinv(A) at a fixed rank:
    -P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)."""
    (a,), (p,), (g,) = ins, outs, cts
    pt, gt = _t(p), _t(g)
    z, w = _mm(gt, p, pt), _mm(pt, p, gt)
    return [L.add(L.add(L.neg(_mm(pt, g, pt)), L.sub(z, _mm(a, p, z))), L.sub(w, _mm(w, p, a)))]


# ---------------------------------------------------------------------- the primitives


def _cofactor_impl(a: np.ndarray) -> np.ndarray:
    """det(U) det(Vh) U diag(prod of the other singular values) Vh: the cofactor matrix, singular A included."""
    u, s, vh = np.linalg.svd(np.asarray(a, np.float64))
    ones = np.ones(s.shape[:-1] + (1,))
    before = np.cumprod(np.concatenate([ones, s], -1), -1)[..., :-1]
    after = np.flip(np.cumprod(np.concatenate([ones, np.flip(s, -1)], -1), -1)[..., :-1], -1)
    sign = np.linalg.det(u) * np.linalg.det(vh)
    return (sign[..., None, None] * ((u * (before * after)[..., None, :]) @ vh)).astype(np.asarray(a).dtype)


_SINGULAR = "the matrix is singular: check its rank, or use np.linalg.pinv"
inv_p = _declare("inv", _same, np.linalg.inv, _inv_vjp, _SINGULAR)
solve_p = _declare("solve", _same, np.linalg.solve, _solve_vjp, _SINGULAR)
det_p = _declare("det", _dropped(2), np.linalg.det, _det_vjp)
cofactor_p = _declare("cofactor", _same, _cofactor_impl, _cofactor_vjp)
slogdet_p = _declare("slogdet", _packed_rule(lambda m, n, **_: [(), ()]), _packed(np.linalg.slogdet), _slogdet_vjp)
pinv_p = _declare("pinv", _dropped(2, lambda s: (s[1], s[0])), lambda a, *, rcond: np.linalg.pinv(a, rcond),
                  _pinv_vjp, "check the matrix for NaN or inf")


# ---------------------------------------------------------------------- numpy bindings


@implements(np.linalg.inv)
def inv(a: ArrayLike) -> ArrayLike:
    """numpy.linalg.inv; a singular matrix raises numpy's LinAlgError when the traced function runs."""
    return bind(inv_p, _matrices("inv", a), _site=_site("inv"))


@implements(np.linalg.solve)
def solve(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """numpy.linalg.solve: `b` a vector (M,) or stacked matrices (..., M, K), batch axes broadcast."""
    a2, bv = _matrices("solve", a), aval_of(b)
    n, b_float = aval_of(a2).shape[-1], bv.dtype if bv.is_float else np.dtype(np.float64)
    dtype = np.result_type(aval_of(a2).dtype, b_float)
    b2 = reshape(b, bv.shape + (1,)) if bv.ndim == 1 else b
    sb = aval_of(b2).shape
    if bv.ndim == 0 or sb[-2] != n:
        raise ShapeError(f"numpy.linalg.solve: b of shape {bv.shape} does not match a of shape {aval_of(a).shape} "
                         f"(b must be (M,) or (..., M, K) with M = {n}){where_text()}")
    try:
        batch = tuple(np.broadcast_shapes(aval_of(a2).shape[:-2], sb[:-2]))
    except ValueError:
        raise ShapeError(f"numpy.linalg.solve: the batch axes of a {aval_of(a).shape} and b {bv.shape} do not "
                         f"broadcast{where_text()}") from None
    a3, b3 = broadcast_to(convert(a2, dtype), batch + (n, n)), broadcast_to(convert(b2, dtype), batch + sb[-2:])
    x = bind(solve_p, a3, b3, _site=_site("solve"))
    return reshape(x, batch + (n,)) if bv.ndim == 1 else x


@implements(np.linalg.det)
def det(a: ArrayLike) -> ArrayLike:
    """numpy.linalg.det; its gradient is the cofactor matrix, singular matrices included."""
    return bind(det_p, _matrices("det", a), _site=_site("det"))


@implements(np.linalg.slogdet)
def slogdet(a: ArrayLike) -> ArrayLike:
    """numpy.linalg.slogdet: (sign, logabsdet); the sign carries no gradient."""
    return _results(SlogdetResult, _unpack(bind(slogdet_p, _matrices("slogdet", a), _site=_site("slogdet")),
                                          [(), ()]))


def _rcond(a: Aval, rcond: Any, rtol: Any) -> float:
    """numpy.linalg.pinv's cutoff relative to the largest singular value, from `rcond` or numpy 2's `rtol`."""
    if rcond is not None and rtol is not NO_VALUE:
        raise ArgumentError(f"numpy.linalg.pinv: `rtol` and `rcond` can't be both set{where_text()}")
    value = rcond if rcond is not None else (1e-15 if rtol is NO_VALUE else rtol)
    if value is None:
        value = builtins.max(a.shape[-2:]) * np.finfo(a.dtype).eps
    value = constant_of(value)
    if isinstance(value, Tracer) or np.ndim(value):
        raise UnsupportedError(f"numpy.linalg.pinv: the cutoff (rcond/rtol) must be one number known while tracing, "
                               f"got {value!r}{where_text()}")
    return float(value)


@implements(np.linalg.pinv)
def pinv(a: ArrayLike, rcond: Any = None, hermitian: bool = False, *, rtol: Any = NO_VALUE) -> ArrayLike:
    """numpy.linalg.pinv: singular values at most the cutoff times the largest are dropped (as numpy)."""
    _no_hermitian("pinv", hermitian)
    m = _matrices("pinv", a, square=False)
    return bind(pinv_p, m, rcond=_rcond(aval_of(m), rcond, rtol), _site=_site("pinv"))
