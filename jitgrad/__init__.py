"""jitgrad: trace numpy functions, differentiate them symbolically, fuse and compile with numba.

    import jitgrad as jg

    @jg.trace
    def loss(w, x, b):
        return np.sum(np.exp(w * x + b))

    value, (gw, gx, gb) = loss.value_and_grad(w, x, b)
"""
import os as _os

# numba's OpenMP workers spin-wait by default; on a loaded machine that stalls every parallel
# kernel call by milliseconds. Passive waiting must be chosen before the OpenMP runtime starts.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .api import Context, Traced, clear_caches, grad, trace, value_and_grad, vjp  # noqa: E402
from .errors import (ConcretizationError, FunctionError, GradcheckError, InputError, JitgradError,  # noqa: E402
                     ShapeError, TraceError, UnsupportedError)
from .ops import (absolute, add, arccos, arcsin, arcsinh, arctan, arctan2, arctanh, argmax, argmin,  # noqa: E402
                  array_split, astype, broadcast_to, ceil, clip, concatenate, cos, cosh, divide, dot, einsum,
                  equal, erf, exp, expand_dims, expm1, flip, floor, full_like, gelu, greater, greater_equal,
                  hstack, inner, isfinite, isnan, less, less_equal, log, log1p, log_softmax, logical_and,
                  logical_not, logical_or, logsumexp, matmul, max, maximum, mean, min, minimum, moveaxis,
                  multiply, negative, norm, not_equal, one_hot, ones_like, outer, pad, power, prod, ravel, reciprocal,
                  relu, repeat, reshape, rint, round, sigmoid, sign, sin, sinh, softmax, softplus, split,
                  sqrt, square, squeeze, stack, std, stop_gradient, subtract, sum, swapaxes, take,
                  take_along_axis, tan, tanh, tensordot, tile, transpose, var, vstack, where, zeros_like)
from .tracing import no_grad  # noqa: E402
from .function import Function, FunctionCtx  # noqa: E402
from .gradcheck import gradcheck, gradgradcheck, jacobian  # noqa: E402

abs = absolute
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`jg.torch` (PyTorch interop) and `jg.distributed` (Dask) are imported on first use: importing jitgrad never
    imports torch or Dask."""
    if name == "torch":
        from . import torch_interop
        globals()["torch"] = torch_interop
        return torch_interop
    if name == "distributed":  # a submodule of the attribute's own name: `from . import` would recurse here
        import importlib
        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module 'jitgrad' has no attribute {name!r}")
