"""Activation functions written from primitives, so they fuse and differentiate with no rule of their own."""
from __future__ import annotations

import math

import numpy as np

from .. import primitives as P
from .core import ArrayLike, elementwise
from .elementwise import absolute, add, exp, greater, log1p, maximum, multiply, negative, tanh, where


def sigmoid(x: ArrayLike) -> ArrayLike:
    """1 / (1 + exp(-x)), a primitive: stable for large |x|, gradient out * (1 - out) everywhere."""
    return elementwise(P.logistic_p, np.exp, x)


def relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0) with gradient 0 at x == 0, as torch.relu."""
    return where(greater(x, 0), x, 0.0)


def softplus(x: ArrayLike) -> ArrayLike:
    """log(1 + exp(x)), stable for large |x|."""
    return add(log1p(exp(negative(absolute(x)))), maximum(x, 0.0))


def gelu(x: ArrayLike) -> ArrayLike:
    """GELU, tanh approximation (torch's approximate='tanh')."""
    inner = multiply(math.sqrt(2.0 / math.pi), add(x, multiply(0.044715, multiply(x, multiply(x, x)))))
    return multiply(multiply(0.5, x), add(1.0, tanh(inner)))
