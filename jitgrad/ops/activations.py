"""Activation functions written from primitives, so they fuse and differentiate with no rule of their own."""
from __future__ import annotations

import math

from ..dispatch import export
from .core import ArrayLike
from .elementwise import absolute, add, exp, greater, log1p, maximum, multiply, negative, tanh, where


@export
def relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0) with gradient 0 at x == 0, as torch.relu."""
    return where(greater(x, 0), x, 0.0)


@export
def softplus(x: ArrayLike) -> ArrayLike:
    """log(1 + exp(x)), stable for large |x|."""
    return add(log1p(exp(negative(absolute(x)))), maximum(x, 0.0))


@export
def gelu(x: ArrayLike) -> ArrayLike:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    inner = multiply(math.sqrt(2.0 / math.pi), add(x, multiply(0.044715, multiply(x, multiply(x, x)))))
    return multiply(multiply(0.5, x), add(1.0, tanh(inner)))
