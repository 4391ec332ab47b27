"""A transposed weight that many matrix products read is copied contiguous once per call (`jitgrad.kernels.cpu.blas_operands`):
an unrolled RNN's backward reads Wh.T once per step. Asserted on the plan (which view is copied) and on numbers
(torch's gradients)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.kernels.cpu import blas_operands

RNG = np.random.default_rng(11)


def rnn_loss(x, wh):
    h = np.zeros((x.shape[1], wh.shape[0]), np.float32)
    for t in range(x.shape[0]):
        h = np.tanh(x[t] + h @ wh)
    return np.mean(h * h)


@pytest.mark.parametrize("steps", [3, blas_operands.MIN_READERS + 2])
def test_a_transposed_weight_read_by_many_products_is_copied_once(steps) -> None:
    x = RNG.standard_normal((steps, 4, 6)).astype(np.float32)
    wh = (RNG.standard_normal((6, 6)) * 0.5).astype(np.float32)
    f = jg.trace(rnn_loss)
    plan = f.plan(x, wh)
    executable = plan.value_and_grad(plan.differentiable([1]))
    # The backward's dh @ wh.T reads the transpose once per step but the last (h starts at zero).
    assert len(executable.copied) == (1 if steps - 1 >= blas_operands.MIN_READERS else 0)
    for copied in executable.copied:
        assert copied.aval.shape == (6, 6)
    value, (grad,) = f.value_and_grad(x, wh, argnums=(1,))
    xt, wt = torch.tensor(x), torch.tensor(wh, requires_grad=True)
    h = torch.zeros(4, 6)
    for t in range(steps):
        h = torch.tanh(xt[t] + h @ wt)
    loss = (h * h).mean()
    loss.backward()
    np.testing.assert_allclose(value, loss.item(), rtol=1e-5)
    np.testing.assert_allclose(grad, wt.grad.numpy(), rtol=1e-4, atol=1e-6)
