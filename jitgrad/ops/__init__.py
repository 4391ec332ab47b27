"""jitgrad's ops with numpy semantics: broadcasting, dtype promotion, axis handling.

Each function works on tracers (recording IR through `bind`) and, outside a trace, on numpy
arrays (evaluating the numpy reference). Composite ops (sigmoid, softmax, logsumexp...) are
written from primitives, so they fuse and differentiate with no rule of their own.

The ops are grouped by kind in the modules of this package; everything public is re-exported here.
"""
from .core import (  # noqa: F401
    aval_of, broadcast_shapes, broadcast_to, check_computable, compare, convert, elementwise, normalize_axes,
    result_type)
from .elementwise import (  # noqa: F401
    absolute, add, arccos, arcsin, arcsinh, arctan, arctan2, arctanh, astype, ceil, clip, cos, cosh, divide,
    equal, erf, exp, expm1, floor, fmax, fmin, greater, greater_equal, isfinite, isnan, less, less_equal, log,
    log1p, logical_and, logical_not, logical_or, logical_xor, maximum, minimum, multiply, negative, not_equal,
    power, reciprocal, rint, round, sign, sin, sinh, sqrt, square, stop_gradient, subtract, tan, tanh, where)
from .shapes import (  # noqa: F401
    array_split, concatenate, expand_dims, flip, hstack, moveaxis, pad, pad_region, ravel, reshape,
    slice_region, split, squeeze, stack, swap_last, swapaxes, tile, transpose, vstack)
from .reductions import (  # noqa: F401
    argmax, argmin, log_softmax, logsumexp, max, mean, min, norm, prod, reduce, softmax, std, sum, var)
from .activations import gelu, relu, sigmoid, softplus  # noqa: F401
from .indexing import gather, getitem, one_hot, repeat, scatter_add, take, take_along_axis  # noqa: F401
from .linalg import dot, einsum, inner, matmul, matmul_nd, outer, tensordot  # noqa: F401
from .constants import full_like, ones_like, zeros_like  # noqa: F401
