"""The numpy.linalg functions jitgrad refuses (complex results, values that decide a shape, products to write
with @), each raising UnsupportedError that says why and what to write instead."""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from jitgrad.tracing.dispatch import implements
from jitgrad.errors import UnsupportedError
from jitgrad.tracing.tracer import where_text


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
