"""numpy.linalg's factorizations: cholesky, eigh and eigvalsh, svd and svdvals, and qr, host primitives
(`lapack`) batched over leading axes like numpy, with the standard matrix-calculus rules as their VJPs."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ArgumentError, UnsupportedError
from jitgrad.tracing.tracer import bind, where_text
from jitgrad.ops.core import ArrayLike, aval_of
from jitgrad.ops.lapack import (EighResult, QRResult, SVDResult, _declare, _dropped, _grad_site, _matrices, _mm,
                                _no_hermitian, _packed, _packed_rule, _results, _same, _site, _t, _unpack)
from jitgrad.ops.solvers import inv_p, solve_p


# ---------------------------------------------------------------------- the results' shapes


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


# ---------------------------------------------------------------------- lax helpers of the rules


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


def _cholesky_impl(a: np.ndarray, *, upper: bool) -> np.ndarray:
    """`upper` is numpy 2's; numpy 1.26 has only the lower factor (and its binding never passes upper=True)."""
    return np.linalg.cholesky(a, upper=True) if upper else np.linalg.cholesky(a)


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
qr_p = _declare("qr", _packed_rule(_qr_shapes), _packed(lambda a, *, mode: np.linalg.qr(a, mode)), _qr_vjp)


# ---------------------------------------------------------------------- numpy bindings


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
