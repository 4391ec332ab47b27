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

from .api import Context, Traced, grad, trace, value_and_grad, vjp  # noqa: E402
from .errors import (ConcretizationError, FunctionError, GradcheckError, InputError, JitgradError,  # noqa: E402
                     ShapeError, TraceError, UnsupportedError)
from .ops import (absolute, add, arccos, arcsin, arcsinh, arctan, arctan2, arctanh, astype, broadcast_to,  # noqa: E402
                  ceil, clip, cos, cosh, divide, dot, equal, exp, expand_dims, expm1, floor, gelu, greater,
                  greater_equal, isfinite, isnan, less, less_equal, log, log1p, log_softmax, logical_and,
                  logical_not, logical_or, logsumexp, matmul, max, maximum, mean, min, minimum, multiply,
                  negative, not_equal, outer, power, ravel, reciprocal, relu, reshape, rint, sigmoid, sign, sin,
                  sinh, softmax, softplus, sqrt, square, squeeze, std, stop_gradient, subtract, sum, swapaxes,
                  tan, tanh, transpose, var, where)
from .tracing import no_grad  # noqa: E402

abs = absolute
__version__ = "0.1.0"
