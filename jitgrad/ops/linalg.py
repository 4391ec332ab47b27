"""Linear algebra: the matmul primitive (BLAS between kernels) and dot, inner, outer, tensordot, einsum."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from jitgrad.ops import blas_threads
from jitgrad.tracing import lax as L
from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ShapeError, UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.ir.primitive import Kind, Primitive, declare
from jitgrad.tracing.tracer import Tracer, bind, where_text
from jitgrad.ops.core import (ArrayLike, aval_of, batch_leading, broadcast_to, check_computable, convert,
                              normalize_axes, result_type)
from jitgrad.ops.arithmetic import multiply
from jitgrad.ops.shapes import diagonal, reshape, transpose
from jitgrad.ops.reductions import sum


def _matmul_rule(avals: Sequence[Aval], **_: Any) -> Aval:
    a, b = avals
    if a.ndim < 2 or b.ndim < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not line up")
    return Aval(a.shape[:-1] + (b.shape[-1],), a.dtype, a.weak and b.weak)


def _matmul_vjp(cts: Sequence[Any], ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
    (a, b), (g,) = ins, cts
    return [L.matmul(g, L.swap_last(b)), L.matmul(L.swap_last(a), g)]


def _batch_matmul(b: Any, e: Any, args: Sequence[Any], dims: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Both operands batched: a batched product. One batched: its batch axis joins the rows of the left operand
    (the columns of the right one), so a batch of products with one shared matrix is one larger product."""
    (x, y), (dx, dy) = args, dims
    if dx is not None and dy is not None:  # K read once the batch axis is first (it may be last, of length 1)
        x, y = b.move(x, dx, 0), b.move(y, dy, 0)
        if aval_of(x).shape[-1] != 1:
            return batch_leading(b, e, [x, y], [0, 0])
        shape = aval_of(x).shape[:-1] + aval_of(y).shape[-1:]  # outer products (per-example weight gradients):
        return [L.mul(L.broadcast_to(x, shape), L.broadcast_to(y, shape))], [0]  # elementwise, so it fuses
    if dy is None:  # (..., B, M, K) as (..., B*M, K)
        n = aval_of(x).ndim
        x = b.move(x, dx, n - 3)
        s = aval_of(x).shape
        out = L.matmul(L.reshape(x, s[:-3] + (s[-3] * s[-2], s[-1])), y)
        return [L.reshape(out, s[:-1] + (aval_of(y).shape[-1],))], [n - 3]
    n = aval_of(y).ndim  # (..., K, B, N) as (..., K, B*N)
    y = b.move(y, dy, n - 2)
    s = aval_of(y).shape
    out = L.matmul(x, L.reshape(y, s[:-2] + (s[-2] * s[-1],)))
    return [L.reshape(out, aval_of(x).shape[:-1] + s[-2:])], [n - 2]


matmul_p = L.matmul_p = declare(Primitive(
    "matmul", Kind.HOST, _matmul_rule, blas_threads.matmul, _matmul_vjp, backward_label="MmBackward",
    fresh_output=True, takes_out=True, contiguous_operands=(1,), matrix_product=True,  # BLAS between kernels
    batch=_batch_matmul))


@implements(np.matmul)
def matmul(x: ArrayLike, y: ArrayLike, /) -> ArrayLike:
    """numpy.matmul: 1-D operands are promoted and squeezed, batch dimensions broadcast."""
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        raise ShapeError(f"matmul: operands must not be 0-d (shapes {ax.shape}, {ay.shape}); use *{where_text()}")
    dtype, weak = result_type(np.add, x, y)
    check_computable("matmul", dtype, (x, y))
    x2 = reshape(x, (1,) + ax.shape) if ax.ndim == 1 else x
    y2 = reshape(y, ay.shape + (1,)) if ay.ndim == 1 else y
    sx, sy = aval_of(x2).shape, aval_of(y2).shape
    if sx[-1] != sy[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {ax.shape} @ {ay.shape} ({sx[-1]} != {sy[-2]})"
                         f"{where_text()}")
    try:
        batch = tuple(np.broadcast_shapes(sx[:-2], sy[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions of {ax.shape} and {ay.shape} do not broadcast{where_text()}") \
            from None
    out_shape = batch + ((sx[-2],) if ax.ndim > 1 else ()) + ((sy[-1],) if ay.ndim > 1 else ())
    if len(sy) == 2 and len(sx) > 2:
        # (..., M, K) @ (K, N) is one (prod(...) * M, K) @ (K, N) product: one large GEMM instead of one per
        # batch element, and a gradient for the matrix that is one GEMM too, not a batch of them summed.
        flat = reshape(convert(x2, dtype, weak), (-1, sx[-1]))
        return reshape(bind(matmul_p, flat, convert(y2, dtype, weak)), out_shape)
    x2 = broadcast_to(convert(x2, dtype, weak), batch + sx[-2:])
    y2 = broadcast_to(convert(y2, dtype, weak), batch + sy[-2:])
    return reshape(bind(matmul_p, x2, y2), out_shape)


@implements(np.dot, method="dot")
def dot(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """numpy.dot: products for 0-d operands, matmul up to 2-D, else a sum over x's last and y's
    second-to-last axis."""
    x, y = a, b
    ax, ay = aval_of(x), aval_of(y)
    if ax.ndim == 0 or ay.ndim == 0:
        return multiply(x, y)
    if ax.ndim <= 2 and ay.ndim <= 2:
        return matmul(x, y)
    return _tensordot(x, y, ([-1], [0 if ay.ndim == 1 else -2]), "dot")


@implements(np.inner)
def inner(x: ArrayLike, y: ArrayLike, /) -> ArrayLike:
    """numpy.inner: a sum over the last axes of both operands."""
    if aval_of(x).ndim == 0 or aval_of(y).ndim == 0:
        return multiply(x, y)
    return _tensordot(x, y, ([-1], [-1]), "inner")


@implements(np.outer)
def outer(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """numpy.outer: the flattened operands' outer product."""
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@implements(np.tensordot)
def tensordot(a: ArrayLike, b: ArrayLike, axes: Any = 2) -> ArrayLike:
    """numpy.tensordot: sum over `axes` (a count of a's last / b's first axes, or two axis lists)."""
    return _tensordot(a, b, axes, "tensordot")


def _tensordot(x: ArrayLike, y: ArrayLike, axes: Any, op: str) -> ArrayLike:
    sx, sy = aval_of(x).shape, aval_of(y).shape
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= builtins.min(len(sx), len(sy)):
            raise ShapeError(f"{op}: cannot sum over {axes} axes of shapes {sx} and {sy}{where_text()}")
        ax_x, ax_y = list(range(len(sx) - axes, len(sx))), list(range(axes))
    else:
        ax_x, ax_y = ([a] if isinstance(a, (int, np.integer)) else list(a) for a in axes)
        ax_x = [normalize_axes(op, sx, a)[0] for a in ax_x]
        ax_y = [normalize_axes(op, sy, a)[0] for a in ax_y]
    if len(ax_x) != len(ax_y) or any(sx[a] != sy[b] for a, b in zip(ax_x, ax_y)):
        raise ShapeError(f"{op}: shape-mismatch for sum: axes {ax_x} of {sx} and {ax_y} of {sy}{where_text()}")
    if len(sx) + len(sy) - len(ax_x) > len(_LETTERS):
        raise UnsupportedError(f"{op}: too many dimensions ({sx}, {sy}){where_text()}")
    lx = _LETTERS[:len(sx)]
    fresh = iter(_LETTERS[len(sx):])
    ly = "".join(lx[ax_x[ax_y.index(k)]] if k in ax_y else next(fresh) for k in range(len(sy)))
    out = "".join(c for k, c in enumerate(lx) if k not in ax_x) + "".join(c for k, c in enumerate(ly)
                                                                         if k not in ax_y)
    return _einsum(f"{lx},{ly}->{out}", x, y)


@implements(np.einsum)
def einsum(*operands: Any, optimize: Any = False) -> ArrayLike:
    """numpy.einsum: subscripts with '...' (broadcast dimensions) or numpy's interleaved form (operand, sublist,
    ..., [output sublist]); a letter repeated in one operand takes its diagonal; size-1 dimensions broadcast;
    the implicit output as numpy's. Operands are contracted left to right, each pair by transposes, reshapes and
    one (batched) matmul, or a broadcast multiply when nothing is summed. `optimize` is accepted: jitgrad
    chooses its own contraction order."""
    if not operands:
        raise ShapeError(f"einsum: no subscripts given{where_text()}")
    if isinstance(operands[0], str):
        return _einsum(operands[0], *operands[1:])
    return _einsum(*_interleaved(operands))


def _interleaved(operands: Sequence[Any]) -> list[Any]:
    """(op0, sublist0, op1, sublist1, ..., [output sublist]) as [subscripts, op0, op1, ...]."""
    arrays, sublists = list(operands[0::2]), list(operands[1::2])
    out = arrays.pop() if len(operands) % 2 else None
    spec = ",".join(_sublist_text(s) for s in sublists) + ("" if out is None else "->" + _sublist_text(out))
    return [spec] + arrays


def _sublist_text(sublist: Any) -> str:
    """A sublist of ints in [0, 52) and Ellipsis as subscripts: 0-25 are 'A'-'Z', 26-51 'a'-'z' (numpy's)."""
    if not isinstance(sublist, (list, tuple)):
        raise ShapeError(f"einsum: in the interleaved form, each operand is followed by a list of ints, got "
                         f"{sublist!r}{where_text()}")
    text = ""
    for s in sublist:
        if s is Ellipsis:
            text += "..."
        elif isinstance(s, (int, np.integer)) and 0 <= s < 52:
            text += _LETTERS[26 + s] if s < 26 else _LETTERS[s - 26]
        else:
            raise ShapeError(f"einsum: subscript {s!r} in {sublist!r} is not within the valid range [0, 52)"
                             f"{where_text()}")
    return text


def _einsum(subscripts: Any, *operands: ArrayLike) -> ArrayLike:
    operands = tuple(x if isinstance(x, Tracer) else np.asarray(x) for x in operands)
    shapes = [aval_of(x).shape for x in operands]
    terms, out = _parse_subscripts(subscripts, shapes)
    sizes = _label_sizes(subscripts, terms, shapes)
    dtype = np.result_type(*[aval_of(x).dtype for x in operands])
    check_computable("einsum", dtype, operands)
    work = np.dtype(np.int64) if dtype == np.bool_ else dtype  # a sum of bool products is their logical or
    pairs = [_unique_letters(convert(x, work), term) for term, x in zip(terms, operands)]
    pairs = [(broadcast_to(x, [sizes[c] for c in term]), term) for x, term in pairs]
    acc, acc_term = pairs[0]
    for k, (x, term) in enumerate(pairs[1:], start=1):
        needed = set(out).union(*[t for _, t in pairs[k + 1:]])
        acc, acc_term = _contract(acc, acc_term, x, term, needed)
    acc, acc_term = _sum_letters(acc, acc_term, set(acc_term) - set(out))
    return convert(transpose(acc, [acc_term.index(c) for c in out]), dtype)


def _parse_subscripts(subscripts: Any, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """One label per dimension of each operand and of the output: the letters, with '...' as broadcast labels
    (right-aligned, as numpy broadcasts); without '->', numpy's implicit output ('...', then the letters
    used once, in alphabetical order)."""
    if not isinstance(subscripts, str):
        raise ShapeError(f"einsum: subscripts must be a string or interleaved sublists, got {subscripts!r}"
                         f"{where_text()}")
    lhs, arrow, out = subscripts.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes) or not builtins.all(_well_formed(t) for t in terms + [out]):
        raise ShapeError(f"einsum: subscripts {subscripts!r} do not fit {len(shapes)} operand(s) of shapes "
                         f"{shapes}{where_text()}")
    dims = []
    for term, sh in zip(terms, shapes):
        letters = len(term.replace("...", ""))
        if len(sh) < letters or len(sh) != letters and "..." not in term:
            raise ShapeError(f"einsum: subscripts {term!r} have {letters} letters for an operand of shape {sh} "
                             f"({subscripts!r}){where_text()}")
        dims.append(len(sh) - letters)
    broadcast = "".join(chr(0x100 + k) for k in range(builtins.max(dims, default=0)))
    terms = [t.replace("...", broadcast[len(broadcast) - d:]) for t, d in zip(terms, dims)]
    if not arrow:
        used = "".join(terms)
        return terms, broadcast + "".join(sorted(c for c in set(used) if c.isascii() and used.count(c) == 1))
    if broadcast and "..." not in out:
        raise ShapeError(f"einsum: the operands have '...' dimensions {shapes} but the output {out!r} has no '...' "
                         f"to put them in ({subscripts!r}){where_text()}")
    out = out.replace("...", broadcast)
    if len(set(out)) != len(out) or any(c not in "".join(terms) for c in out):
        raise ShapeError(f"einsum: output subscripts {out!r} must be distinct letters of the inputs "
                         f"({subscripts!r}){where_text()}")
    return terms, out


def _well_formed(term: str) -> bool:
    """Letters with at most one '...'."""
    rest = term.replace("...", "", 1)
    return builtins.all(c in _LETTERS for c in rest)


def _label_sizes(subscripts: str, terms: list[str], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Each label's length: a label repeated in one operand must have one length there; across operands,
    length 1 broadcasts."""
    sizes: dict[str, int] = {}
    for term, sh in zip(terms, shapes):
        own: dict[str, int] = {}
        for c, d in zip(term, sh):
            name = repr(c) if c in _LETTERS else "a '...' dimension"
            if own.setdefault(c, d) != d:
                raise ShapeError(f"einsum: index {name} is repeated in an operand of shape {sh} with lengths "
                                 f"{own[c]} and {d}; a diagonal needs equal lengths ({subscripts!r}){where_text()}")
            if sizes.get(c, 1) not in (1, d) and d != 1:
                raise ShapeError(f"einsum: index {name} has lengths {sizes[c]} and {d} in operands of shapes "
                                 f"{shapes}, which do not broadcast ({subscripts!r}){where_text()}")
            sizes[c] = d if d != 1 else sizes.get(c, 1)
    return sizes


def _unique_letters(x: ArrayLike, term: str) -> tuple[ArrayLike, str]:
    """Take the diagonal over each letter repeated in `term` ('ii' -> 'i'), appended last (a strided slice)."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i = term.index(c)
        j = term.index(c, i + 1)
        x = diagonal(x, 0, i, j)
        term = term[:i] + term[i + 1:j] + term[j + 1:] + c
    return x, term


def _sum_letters(x: ArrayLike, term: str, letters: set[str]) -> tuple[ArrayLike, str]:
    axes = tuple(k for k, c in enumerate(term) if c in letters)
    if not axes:
        return x, term
    return sum(x, axis=axes, dtype=aval_of(x).dtype), "".join(c for c in term if c not in letters)


def _contract(x: ArrayLike, tx: str, y: ArrayLike, ty: str, needed: set[str]) -> tuple[ArrayLike, str]:
    """Contract two operands over their shared letters that no later operand or the output needs."""
    x, tx = _sum_letters(x, tx, set(tx) - set(ty) - needed)
    y, ty = _sum_letters(y, ty, set(ty) - set(tx) - needed)
    batch = [c for c in tx if c in ty and c in needed]
    summed = [c for c in tx if c in ty and c not in needed]
    only_x = [c for c in tx if c not in ty]
    only_y = [c for c in ty if c not in tx]
    sx = dict(zip(tx, aval_of(x).shape))
    sy = dict(zip(ty, aval_of(y).shape))
    dims = [sx[c] for c in batch]
    if not summed:
        xt = reshape(transpose(x, [tx.index(c) for c in batch + only_x]),
                     dims + [sx[c] for c in only_x] + [1] * len(only_y))
        yt = reshape(transpose(y, [ty.index(c) for c in batch + only_y]),
                     dims + [1] * len(only_x) + [sy[c] for c in only_y])
        return multiply(xt, yt), "".join(batch + only_x + only_y)
    m = int(np.prod([sx[c] for c in only_x], dtype=np.int64))
    k = int(np.prod([sx[c] for c in summed], dtype=np.int64))
    n = int(np.prod([sy[c] for c in only_y], dtype=np.int64))
    xt = reshape(transpose(x, [tx.index(c) for c in batch + only_x + summed]), dims + [m, k])
    yt = reshape(transpose(y, [ty.index(c) for c in batch + summed + only_y]), dims + [k, n])
    product = matmul(xt, yt)
    return reshape(product, dims + [sx[c] for c in only_x] + [sy[c] for c in only_y]), "".join(batch + only_x + only_y)
