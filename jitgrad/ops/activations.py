"""Activation functions written from primitives, so they fuse and differentiate with no rule of their own."""
from __future__ import annotations

import math

from jitgrad.tracing.dispatch import export
from jitgrad.ops.core import ArrayLike
from jitgrad.ops.arithmetic import absolute, add, multiply, negative
from jitgrad.ops.comparisons import less_equal, maximum, where
from jitgrad.ops.transcendental import exp, log1p, tanh


@export
def relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0) (NaN stays NaN), gradient 0 where x <= 0 and 1 elsewhere, NaN included, as torch.relu."""
    return where(less_equal(x, 0), 0.0, x)


@export
def softplus(x: ArrayLike) -> ArrayLike:
    """log(1 + exp(x)), stable for large |x|."""
    return add(log1p(exp(negative(absolute(x)))), maximum(x, 0.0))


@export
def gelu(x: ArrayLike) -> ArrayLike:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    inner = multiply(math.sqrt(2.0 / math.pi), add(x, multiply(0.044715, multiply(x, multiply(x, x)))))
    return multiply(multiply(0.5, x), add(1.0, tanh(inner)))
