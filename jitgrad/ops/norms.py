"""numpy.linalg.norm for every ord numpy accepts: vector p-norms and the matrix norms, from reductions and
(ord=±2, 'nuc') the singular values, with numpy's numbers and no gradient at a zero vector or matrix."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from jitgrad.tracing.dispatch import implements
from jitgrad.errors import ArgumentError
from jitgrad.tracing.tracer import bind, where_text
from jitgrad.ops.core import ArrayLike, aval_of, convert, normalize_axes
from jitgrad.ops.arithmetic import absolute, multiply, power
from jitgrad.ops.comparisons import equal, not_equal, where
from jitgrad.ops.shapes import moveaxis, reshape
from jitgrad.ops.reductions import _sqrt_zero_grad, max, min, sum
from jitgrad.ops.lapack import _site
from jitgrad.ops.factorizations import svdvals_p


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
