"""numpy.linalg's decompositions and what is built on them: inv, solve, det, slogdet, cholesky, eigh/eigvalsh,
svd/svdvals, pinv, qr and norm (every ord), batched over leading axes like numpy.

Each decomposition is a host primitive running numpy's LAPACK routine on the whole stack of matrices; one
with several results packs them into one array (host steps have one output) that slices unpack. The VJPs
are the standard matrix-calculus rules written with jitgrad.tracing.lax and these primitives (inv's uses inv), so
they are differentiable again. docs/ops.md lists the conventions at degenerate points.

Over 400 lines: the rules share the lax helpers and the packed-result machinery at the top, and the
bindings and norms bind these primitives; split, one set of conventions would spread over modules.
"""
from __future__ import annotations

import builtins
import inspect
import math
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import NO_VALUE, implements
from jitgrad.errors import ArgumentError, ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval, Eqn
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, constant_of, user_source, where_text
from jitgrad.ops.core import (ArrayLike, aval_of, batch_leading, broadcast_to, check_computable, convert,
                              normalize_axes)
from jitgrad.ops.elementwise import absolute, equal, multiply, not_equal, power, where
from jitgrad.ops.shapes import moveaxis, reshape
from jitgrad.ops.reductions import _sqrt_zero_grad, max, min, sum

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


def _eigh_shapes(m: int, n: int, **_: Any) -> list[tuple[int, ...]]:
    """eigh's results: eigenvalues, eigenvectors."""
    return [(n,), (n, n)]


def _svd_shapes(m: int, n: int, full_matrices: bool, **_: Any) -> list[tuple[int, ...]]:
    """svd's results: U, S, Vh."""
    k = builtins.min(m, n)
    return [(m, m), (k,), (n, n)] if full_matrices else [(m, k), (k,), (k, n)]


def _qr_shapes(m: int, n: int, mode: str, **_: Any) -> list[tuple[int, ...]]:
    """qr's results: Q, R ('reduced' or 'complete')."""
    k = m if mode == "complete" else builtins.min(m, n)
    return [(m, k), (k, n)]


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


def _const(values: np.ndarray, like: Any, shape: Sequence[int] | None = None) -> Any:
    """A constant matrix (a mask, the identity) in `like`'s dtype, broadcast to `shape` (default: like's)."""
    return L.broadcast_to(np.asarray(values, like.dtype), tuple(like.shape if shape is None else shape))


def _scale_cols(x: Any, v: Any) -> Any:
    """x @ diag(v): column j times v[..., j]."""
    return L.mul(x, L.broadcast_to(L.reshape(v, tuple(v.shape[:-1]) + (1, v.shape[-1])), x.shape))


def _scale_rows(x: Any, v: Any) -> Any:
    """diag(v) @ x: row i times v[..., i]."""
    return L.mul(x, L.broadcast_to(L.reshape(v, tuple(v.shape) + (1,)), x.shape))


def _diag_embed(v: Any) -> Any:
    """diag(v), per batch element."""
    n = v.shape[-1]
    return _scale_cols(_const(np.eye(n), v, tuple(v.shape) + (n,)), v)


def _gaps(v: Any) -> Any:
    """E[..., i, j] = v[..., j] - v[..., i]."""
    n = v.shape[-1]
    square = tuple(v.shape) + (n,)
    return L.sub(L.broadcast_to(L.reshape(v, tuple(v.shape[:-1]) + (1, n)), square),
                 L.broadcast_to(L.reshape(v, tuple(v.shape) + (1,)), square))


def _ratio(num: Any, den: Any) -> Any:
    """num / den, 0 where both are 0: a vector cotangent that contributes nothing gives no 0/0 at repeated
    eigen- or singular values (nor on the diagonal); a nonzero one over a zero gap is ±inf, as torch."""
    return L.div(num, L.select(L.logical_and(L.eq(num, 0), L.eq(den, 0)), 1, den))


def _skew(x: Any) -> Any:
    """X - X^T."""
    return L.sub(x, _t(x))


def _matrix_scale(g: Any, shape: Sequence[int]) -> Any:
    """A per-matrix value (batch shape) broadcast over each matrix of `shape`."""
    return L.broadcast_to(L.reshape(g, tuple(g.shape) + (1, 1)), tuple(shape))


def _columns(x: Any, start: int, count: int, axis: int = -1) -> Any:
    """`count` columns (rows, with axis=-2) of x from `start`."""
    starts, shape = [0] * len(x.shape), list(x.shape)
    starts[axis], shape[axis] = start, count
    return L.slice_region(x, starts, (1,) * len(shape), shape)


def _placed(x: Any, start: int, n: int) -> Any:
    """x (batch + (m, c)) as columns start.. of a zero batch + (m, n) matrix."""
    starts = (0,) * (len(x.shape) - 1) + (start,)
    return L.pad_region(x, starts, (1,) * len(x.shape), tuple(x.shape[:-1]) + (n,))


# ---------------------------------------------------------------------- VJPs


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


def _cholesky_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, upper: bool, _site: str
                  ) -> list[Any]:
    """A = L L^T: the symmetric gradient sym(L^-T Phi(L^T gL) L^-1), Phi the lower triangle, diagonal halved."""
    l, gl = (_t(outs[0]), _t(cts[0])) if upper else (outs[0], cts[0])
    n = l.shape[-1]
    phi = L.mul(_mm(_t(l), gl), _const(np.tril(np.ones((n, n)), -1) + 0.5 * np.eye(n), l))
    li = bind(inv_p, l, _site=_grad_site(_site))
    s = _mm(_t(li), phi, li)
    return [L.mul(L.add(s, _t(s)), 0.5)]


def _eigh_backward(w: Any, v: Any, gw: Any, gv: Any) -> Any:
    """V (diag(gw) + skew(V^T gV) / 2 / (w_j - w_i)) V^T: symmetric, as torch and JAX."""
    vt = _t(v)
    inner = L.add(_diag_embed(gw), _ratio(L.mul(_skew(_mm(vt, gv)), 0.5), _gaps(w)))
    return _mm(v, inner, vt)


def _eigh_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], **_: Any) -> list[Any]:
    """The packed cotangent unpacked into the eigenvalues' and the eigenvectors'."""
    n = ins[0].shape[-1]
    (w, v), (gw, gv) = (_unpack(x, _eigh_shapes(n, n)) for x in (outs[0], cts[0]))
    return [_eigh_backward(w, v, gw, gv)]


def _eigvalsh_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, UPLO: str, _site: str
                  ) -> list[Any]:
    """V diag(g) V^T, the vectors from eigh (no gap appears: finite at repeated eigenvalues)."""
    a = ins[0]
    _, v = _unpack(bind(eigh_p, a, UPLO=UPLO, _site=_site), _eigh_shapes(*a.shape[-2:]))
    return [_mm(_scale_cols(v, cts[0]), _t(v))]


def _per_column(x: Any, s: Any) -> Any:
    """x @ diag(1/s), 0 where a column and its s are both 0."""
    return _ratio(x, L.broadcast_to(L.reshape(s, tuple(s.shape[:-1]) + (1, s.shape[-1])), x.shape))


def _svd_backward(u: Any, s: Any, vh: Any, gu: Any, gs: Any, gvh: Any) -> Any:
    """The reduced SVD's rule: U [skew(U^T gU) / E S + S skew(V^T gV) / E + diag(gs)] V^T, E_ij = s_j^2 - s_i^2,
    plus (I - U U^T) gU S^-1 V^T for a tall and U S^-1 gV^T (I - V V^T) for a wide matrix."""
    m, k = u.shape[-2:]
    n = vh.shape[-1]
    v, gv = _t(vh), _t(gvh)
    j, kk = _mm(_t(u), gu), _mm(vh, gv)
    gaps = _gaps(L.mul(s, s))
    inner = L.add(L.add(_scale_cols(_ratio(_skew(j), gaps), s), _scale_rows(_ratio(_skew(kk), gaps), s)),
                  _diag_embed(gs))
    ga = _mm(u, inner, vh)
    if m > k:
        ga = L.add(ga, _mm(_per_column(L.sub(gu, _mm(u, j)), s), vh))
    if n > k:
        ga = L.add(ga, _mm(u, _t(_per_column(L.sub(gv, _mm(v, kk)), s))))
    return ga


def _svd_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, full_matrices: bool, _site: str
             ) -> list[Any]:
    """full_matrices: the gradient with respect to U's and Vh's vectors past min(m, n) is ignored, as torch's."""
    m, n = ins[0].shape[-2:]
    k = builtins.min(m, n)
    shapes = _svd_shapes(m, n, full_matrices)
    (u, s, vh), (gu, gs, gvh) = (_unpack(x, shapes) for x in (outs[0], cts[0]))
    u, vh, gu, gvh = _columns(u, 0, k), _columns(vh, 0, k, -2), _columns(gu, 0, k), _columns(gvh, 0, k, -2)
    return [_svd_backward(u, s, vh, gu, gs, gvh)]


def _svdvals_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, _site: str) -> list[Any]:
    """U diag(g) Vh from the reduced svd (finite at repeated and zero singular values)."""
    a = ins[0]
    u, _, vh = _unpack(bind(svd_p, a, full_matrices=False, _site=_site), _svd_shapes(*a.shape[-2:], False))
    return [_mm(_scale_cols(u, cts[0]), vh)]


def _pinv_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], **_: Any) -> list[Any]:
    """Golub and Pereyra's derivative of P = pinv(A) at a fixed rank:
    -P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)."""
    (a,), (p,), (g,) = ins, outs, cts
    pt, gt = _t(p), _t(g)
    z, w = _mm(gt, p, pt), _mm(pt, p, gt)
    return [L.add(L.add(L.neg(_mm(pt, g, pt)), L.sub(z, _mm(a, p, z))), L.sub(w, _mm(w, p, a)))]


def _qr_tall(q: Any, r: Any, gq: Any, gr: Any, site: str) -> Any:
    """m >= n: (gQ + Q copyltu(M)) R^-T with M = R gR^T - gQ^T Q, copyltu the symmetric matrix of M's lower
    triangle."""
    n = r.shape[-1]
    m_ = L.sub(_mm(r, _t(gr)), _mm(_t(gq), q))
    lower = np.tril(np.ones((n, n)))
    sym = L.add(L.mul(m_, _const(lower, m_)), _t(L.mul(m_, _const(lower - np.eye(n), m_))))
    b = L.add(gq, _mm(q, sym))
    return _t(bind(solve_p, r, _t(b), _site=site))


def _qr_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any], *, mode: str, _site: str) -> list[Any]:
    """A wide A = [X | Y] = Q [R1 | R2]: X's rule with gQ + Y gR2^T, and Q gR2 for Y."""
    m, n = ins[0].shape[-2:]
    if mode == "complete" and m > n:
        raise UnsupportedError(f"{_site}: mode='complete' of a tall {m}x{n} matrix is not differentiable (Q's last "
                               f"{m - n} columns are any orthonormal basis of the complement, as torch says); use "
                               f"mode='reduced', which gives the same first {n} columns and R")
    shapes = _qr_shapes(m, n, mode)
    (q, r), (gq, gr) = (_unpack(x, shapes) for x in (outs[0], cts[0]))
    k = q.shape[-1]
    if n <= k:
        return [_qr_tall(q, r, gq, gr, _grad_site(_site))]
    r1, r2, g1, g2 = _columns(r, 0, k), _columns(r, k, n - k), _columns(gr, 0, k), _columns(gr, k, n - k)
    gx = _qr_tall(q, r1, L.add(gq, _mm(q, r2, _t(g2))), g1, _grad_site(_site))
    return [L.add(_placed(gx, 0, n), _placed(_mm(q, g2), k, n))]


# ---------------------------------------------------------------------- the primitives


def _cofactor_impl(a: np.ndarray) -> np.ndarray:
    """det(U) det(Vh) U diag(prod of the other singular values) Vh: the cofactor matrix, singular A included."""
    u, s, vh = np.linalg.svd(np.asarray(a, np.float64))
    ones = np.ones(s.shape[:-1] + (1,))
    before = np.cumprod(np.concatenate([ones, s], -1), -1)[..., :-1]
    after = np.flip(np.cumprod(np.concatenate([ones, np.flip(s, -1)], -1), -1)[..., :-1], -1)
    sign = np.linalg.det(u) * np.linalg.det(vh)
    return (sign[..., None, None] * ((u * (before * after)[..., None, :]) @ vh)).astype(np.asarray(a).dtype)


def _cholesky_impl(a: np.ndarray, *, upper: bool) -> np.ndarray:
    """`upper` is numpy 2's; numpy 1.26 has only the lower factor (and its binding never passes upper=True)."""
    return np.linalg.cholesky(a, upper=True) if upper else np.linalg.cholesky(a)


_SINGULAR = "the matrix is singular: check its rank, or use np.linalg.pinv"
inv_p = _declare("inv", _same, np.linalg.inv, _inv_vjp, _SINGULAR)
solve_p = _declare("solve", _same, np.linalg.solve, _solve_vjp, _SINGULAR)
det_p = _declare("det", _dropped(2), np.linalg.det, _det_vjp)
cofactor_p = _declare("cofactor", _same, _cofactor_impl, _cofactor_vjp)
slogdet_p = _declare("slogdet", _packed_rule(lambda m, n, **_: [(), ()]), _packed(np.linalg.slogdet), _slogdet_vjp)
cholesky_p = _declare("cholesky", _same, _cholesky_impl, _cholesky_vjp,
                      "np.linalg.cholesky needs a symmetric positive-definite matrix")
eigh_p = _declare("eigh", _packed_rule(_eigh_shapes), _packed(lambda a, *, UPLO: np.linalg.eigh(a, UPLO)), _eigh_vjp,
                  "check the matrix for NaN or inf")
eigvalsh_p = _declare("eigvalsh", _dropped(1), lambda a, *, UPLO: np.linalg.eigvalsh(a, UPLO), _eigvalsh_vjp,
                      "check the matrix for NaN or inf")
svd_p = _declare("svd", _packed_rule(_svd_shapes), _packed(lambda a, *, full_matrices: np.linalg.svd(a, full_matrices)),
                 _svd_vjp, "check the matrix for NaN or inf")
svdvals_p = _declare("svdvals", _dropped(2, lambda s: (builtins.min(s),)),
                     lambda a: np.linalg.svd(a, compute_uv=False), _svdvals_vjp, "check the matrix for NaN or inf")
pinv_p = _declare("pinv", _dropped(2, lambda s: (s[1], s[0])), lambda a, *, rcond: np.linalg.pinv(a, rcond),
                  _pinv_vjp, "check the matrix for NaN or inf")
qr_p = _declare("qr", _packed_rule(_qr_shapes), _packed(lambda a, *, mode: np.linalg.qr(a, mode)), _qr_vjp)


# ---------------------------------------------------------------------- numpy bindings


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


@implements(np.linalg.cholesky)
def cholesky(a: ArrayLike, /, *, upper: bool = False) -> ArrayLike:
    """numpy.linalg.cholesky (lower, or `upper`); a matrix that is not positive definite raises LinAlgError."""
    return bind(cholesky_p, _matrices("cholesky", a), upper=bool(upper), _site=_site("cholesky"))


def _uplo(UPLO: Any) -> str:
    """numpy's UPLO check ('l' and 'u' too)."""
    uplo = str(UPLO).upper()
    if uplo not in ("L", "U"):
        raise ArgumentError(f"numpy.linalg.eigh: UPLO argument must be 'L' or 'U', got {UPLO!r}{where_text()}")
    return uplo


@implements(np.linalg.eigh)
def eigh(a: ArrayLike, UPLO: str = "L") -> ArrayLike:
    """numpy.linalg.eigh: ascending eigenvalues and eigenvectors of (stacked) symmetric matrices."""
    m = _matrices("eigh", a)
    n = aval_of(m).shape[-1]
    return _results(EighResult, _unpack(bind(eigh_p, m, UPLO=_uplo(UPLO), _site=_site("eigh")), _eigh_shapes(n, n)))


@implements(np.linalg.eigvalsh)
def eigvalsh(a: ArrayLike, UPLO: str = "L") -> ArrayLike:
    """numpy.linalg.eigvalsh: eigenvalues only (their gradient needs no vectors at repeated eigenvalues)."""
    return bind(eigvalsh_p, _matrices("eigvalsh", a), UPLO=_uplo(UPLO), _site=_site("eigvalsh"))


@implements(np.linalg.svd)
def svd(a: ArrayLike, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False) -> ArrayLike:
    """numpy.linalg.svd: (U, S, Vh), full or reduced, or the singular values alone."""
    _no_hermitian("svd", hermitian)
    m = _matrices("svd", a, square=False)
    if not compute_uv:
        return bind(svdvals_p, m, _site=_site("svd"))
    shapes = _svd_shapes(*aval_of(m).shape[-2:], bool(full_matrices))
    return _results(SVDResult, _unpack(bind(svd_p, m, full_matrices=bool(full_matrices), _site=_site("svd")), shapes))


def svdvals(x: ArrayLike, /) -> ArrayLike:
    """numpy.linalg.svdvals: the singular values, descending."""
    return bind(svdvals_p, _matrices("svdvals", x, square=False), _site=_site("svdvals"))


if hasattr(np.linalg, "svdvals"):  # numpy >= 2.0
    implements(np.linalg.svdvals)(svdvals)


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


@implements(np.linalg.qr)
def qr(a: ArrayLike, mode: str = "reduced") -> ArrayLike:
    """numpy.linalg.qr: (Q, R) for modes 'reduced' and 'complete', R alone for 'r'."""
    if mode not in ("reduced", "complete", "r"):
        raise UnsupportedError(f"numpy.linalg.qr: mode {mode!r} is not supported (jitgrad supports 'reduced', "
                               f"'complete' and 'r'; 'raw' gives LAPACK's Householder reflectors){where_text()}")
    m = _matrices("qr", a, square=False)
    kind = "complete" if mode == "complete" else "reduced"
    q, r = _unpack(bind(qr_p, m, mode=kind, _site=_site("qr")), _qr_shapes(*aval_of(m).shape[-2:], kind))
    return r if mode == "r" else _results(QRResult, (q, r))


# ---------------------------------------------------------------------- norms


def _zero_grad_at_zero(r: ArrayLike) -> ArrayLike:
    """r, with no gradient where it is 0 (a zero matrix, or a singular one for ord=-2)."""
    return where(equal(r, 0), 0.0, r)


def _p_norm(x: ArrayLike, p: float, axes: tuple[int, ...], keepdims: bool) -> ArrayLike:
    """(sum |x|^p)^(1/p) for p other than 0, 1, 2, ±inf (negative too): numpy's numbers; zero elements and a
    zero result pass no gradient (as torch)."""
    zero = equal(x, 0)
    powered = where(zero, 0.0 if p > 0 else math.inf, power(absolute(where(zero, 1.0, x)), p))
    total = sum(powered, axis=axes, keepdims=keepdims)
    nil = equal(total, 0)
    return where(nil, 0.0, power(where(nil, 1.0, total), 1.0 / p))


def _vector_norm(x: ArrayLike, ord: Any, axes: tuple[int, ...], keepdims: bool) -> ArrayLike:
    """numpy's vector norms over one axis, in numpy's order of cases."""
    if isinstance(ord, str):
        raise ArgumentError(f"numpy.linalg.norm: Invalid norm order '{ord}' for vectors{where_text()}")
    if ord == math.inf:
        return max(absolute(x), axis=axes, keepdims=keepdims, initial=0.0)
    if ord == -math.inf:
        return min(absolute(x), axis=axes, keepdims=keepdims)
    if ord == 0:
        return sum(convert(not_equal(x, 0), aval_of(x).dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return sum(absolute(x), axis=axes, keepdims=keepdims)
    if ord is None or ord == 2:
        return _sqrt_zero_grad(sum(multiply(x, x), axis=axes, keepdims=keepdims))
    return _p_norm(x, float(ord), axes, keepdims)


def _matrix_norm(x: ArrayLike, ord: Any, row: int, col: int) -> ArrayLike:
    """numpy's matrix norms over axes (row, col), those axes dropped."""
    if not isinstance(ord, str) and ord in (2, -2) or ord == "nuc":
        s = bind(svdvals_p, moveaxis(x, (row, col), (-2, -1)), _site=_site("norm"))
        pick = {2: lambda: max(s, axis=-1, initial=0.0), -2: lambda: min(s, axis=-1)}.get(ord, lambda: sum(s, axis=-1))
        return _zero_grad_at_zero(pick())
    if not isinstance(ord, str) and ord in (1, -1, math.inf, -math.inf):
        summed, other = (row, col - (col > row)) if ord in (1, -1) else (col, row - (row > col))
        extreme = max if ord in (1, math.inf) else min
        return extreme(sum(absolute(x), axis=summed), axis=other, **({"initial": 0.0} if extreme is max else {}))
    if ord in (None, "fro", "f"):
        return _sqrt_zero_grad(sum(multiply(x, x), axis=(row, col)))
    raise ArgumentError(f"numpy.linalg.norm: Invalid norm order {ord!r} for matrices{where_text()}")


def _norm_axes(shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    """numpy's axis argument in its order (row axis first for matrix norms)."""
    items = axis if isinstance(axis, tuple) else (axis,)
    axes = tuple(normalize_axes("numpy.linalg.norm", shape, a)[0] for a in items)
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"numpy.linalg.norm: Duplicate axes given ({axis!r}){where_text()}")
    return axes


@implements(np.linalg.norm)
def norm(x: ArrayLike, ord: Any = None, axis: Any = None, keepdims: bool = False) -> ArrayLike:
    """numpy.linalg.norm for every ord numpy accepts: vector p-norms (0, ±inf, negative p too) and matrix norms
    ('fro', 'nuc', ±1, ±2, ±inf). The gradient at a zero vector or matrix is 0; docs/ops.md has the rest."""
    a = aval_of(x)
    x = x if a.is_float else convert(x, np.float64)
    if axis is None and (ord is None or ord in ("f", "fro") and a.ndim == 2 or ord == 2 and a.ndim == 1):
        return _sqrt_zero_grad(sum(multiply(x, x), keepdims=keepdims))
    axes = tuple(range(a.ndim)) if axis is None else _norm_axes(a.shape, axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) != 2:
        raise ArgumentError(f"numpy.linalg.norm: Improper number of dimensions to norm (axes {axes} of an array of "
                         f"shape {a.shape}){where_text()}")
    out = _matrix_norm(x, ord, *axes)
    return reshape(out, tuple(1 if k in axes else d for k, d in enumerate(a.shape))) if keepdims else out


# ---------------------------------------------------------------------- what numpy.linalg has and jitgrad refuses

_REFUSED = {
    np.linalg.lstsq: "its residuals and rank outputs depend on the values (a data-dependent shape); for a "
                     "full-rank a write np.linalg.solve(a.T @ a, a.T @ b), or np.linalg.pinv(a) @ b for the "
                     "minimum-norm solution",
    np.linalg.matrix_rank: "the rank is an integer that depends on the values; compute it outside the traced function, "
                           "or use the singular values np.linalg.svd(a, compute_uv=False) inside it",
    np.linalg.eig: "a general matrix's eigenvalues and eigenvectors are complex, and jitgrad's arrays are real; for a "
                   "symmetric matrix use np.linalg.eigh",
    np.linalg.eigvals: "a general matrix's eigenvalues are complex, and jitgrad's arrays are real; for a symmetric "
                       "matrix use np.linalg.eigvalsh",
    np.linalg.cond: "write it from supported ops: s = np.linalg.svd(x, compute_uv=False); s[..., 0] / s[..., -1], or "
                    "np.linalg.norm(x, p, axis=(-2, -1)) * np.linalg.norm(np.linalg.inv(x), p, axis=(-2, -1))",
    np.linalg.matrix_power: "write the product with @ (and np.linalg.inv for a negative power)",
    np.linalg.multi_dot: "write the product with @",
    np.linalg.tensorinv: "reshape to a matrix and use np.linalg.inv",
    np.linalg.tensorsolve: "reshape to matrices and use np.linalg.solve",
}


def _refuse(fn: Any, why: str) -> None:
    """Register a binding of `fn` that raises UnsupportedError saying why and what to write instead."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        given = ", ".join(kwargs)  # the binding passes numpy's named arguments by keyword
        raise UnsupportedError(f"numpy.linalg.{fn.__name__}({given}) is not supported by jitgrad: {why}{where_text()}")
    refused.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    implements(fn, export=False)(refused)


for _fn, _why in _REFUSED.items():
    _refuse(_fn, _why)
