"""Real numerical functions written in plain numpy, traced end to end: values and gradients match
torch autograd to 1e-5 relative in float64."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import jitgrad as jg

RTOL = 1e-5


def assert_matches_torch(fn, torch_fn, args: list[np.ndarray], wrt: list[int]) -> None:
    """value_and_grad of the traced `fn` against torch autograd of `torch_fn` on the same arguments."""
    value, grads = jg.trace(fn).value_and_grad(*args, argnums=tuple(wrt))
    tensors = [torch.tensor(a, requires_grad=k in wrt) for k, a in enumerate(args)]
    expected = torch_fn(*tensors)
    expected.backward()
    np.testing.assert_allclose(value, expected.item(), rtol=RTOL)
    for k, g in zip(wrt, grads):
        want = tensors[k].grad.numpy()
        assert g.shape == want.shape and g.dtype == np.float64
        np.testing.assert_allclose(g, want, rtol=RTOL, atol=1e-12 * np.abs(want).max())


def mlp_loss(x, labels, w1, b1, w2, b2, w3, b3):
    h = np.maximum(x @ w1 + b1, 0.0)
    h = np.tanh(h @ w2 + b2)
    logits = h @ w3 + b3
    log_probs = logits - jg.logsumexp(logits, axis=1, keepdims=True)
    return -np.mean(log_probs[np.arange(x.shape[0]), labels])


def mlp_loss_torch(x, labels, w1, b1, w2, b2, w3, b3):
    h = torch.tanh(torch.relu(x @ w1 + b1) @ w2 + b2)
    return F.cross_entropy(h @ w3 + b3, labels)


def test_mlp_softmax_cross_entropy_on_integer_labels(rng):
    b, d, hidden, classes = 8, 5, 7, 4
    args = [rng.standard_normal((b, d)), rng.integers(0, classes, b)]
    for fan_in, fan_out in [(d, hidden), (hidden, hidden), (hidden, classes)]:
        args += [rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in), rng.standard_normal(fan_out) * 0.1]
    assert_matches_torch(mlp_loss, mlp_loss_torch, args, wrt=[0, 2, 3, 4, 5, 6, 7])


def test_mlp_labels_may_be_a_constant(rng):
    x, labels = rng.standard_normal((4, 3)), np.array([2, 0, 0, 1])
    w = rng.standard_normal((3, 3))

    def loss(x, w):
        logits = x @ w
        return -np.sum(jg.log_softmax(logits, axis=-1)[np.arange(4), labels])

    assert_matches_torch(loss, lambda x, w: F.cross_entropy(x @ w, torch.tensor(labels), reduction="sum"),
                         [x, w], wrt=[0, 1])


def layer_norm(x, gamma, beta, w):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + 1e-5) * gamma + beta
    return np.sum(y * w)


def test_layer_norm(rng):
    x, w = rng.standard_normal((4, 6)) * 3 + 1, rng.standard_normal((4, 6))
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    assert_matches_torch(layer_norm,
                         lambda x, g, b, w: torch.sum(F.layer_norm(x, (6,), g, b, eps=1e-5) * w),
                         [x, gamma, beta, w], wrt=[0, 1, 2])


def attention(q, k, v, w):
    d = q.shape[-1]
    scores = jg.softmax(q @ k.T / np.sqrt(d), axis=-1)
    return np.sum((scores @ v) * w)


def test_attention(rng):
    q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    w = rng.standard_normal((5, 3))
    assert_matches_torch(attention,
                         lambda q, k, v, w: torch.sum(torch.softmax(q @ k.T / math.sqrt(4), -1) @ v * w),
                         [q, k, v, w], wrt=[0, 1, 2])


def mixture_log_likelihood(x, logits, mu, log_sigma):
    """log-likelihood of 1-D data under a Gaussian mixture: logsumexp over components."""
    log_weights = jg.log_softmax(logits)
    z = (x[:, None] - mu[None, :]) / np.exp(log_sigma)
    log_normal = -0.5 * z ** 2 - log_sigma - 0.5 * np.log(2 * np.pi)
    return np.sum(jg.logsumexp(log_weights + log_normal, axis=1))


def mixture_log_likelihood_torch(x, logits, mu, log_sigma):
    log_weights = torch.log_softmax(logits, 0)
    z = (x[:, None] - mu[None, :]) / torch.exp(log_sigma)
    log_normal = -0.5 * z ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)
    return torch.sum(torch.logsumexp(log_weights + log_normal, 1))


def test_gaussian_mixture_log_likelihood_with_logsumexp(rng):
    x = np.concatenate([rng.normal(-2, 0.5, 6), rng.normal(1, 1.0, 6)])
    args = [x, rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3) * 0.3]
    assert_matches_torch(mixture_log_likelihood, mixture_log_likelihood_torch, args, wrt=[0, 1, 2, 3])


def huber(pred, target, delta=1.0):
    r = np.abs(pred - target)
    return np.mean(np.where(r <= delta, 0.5 * r ** 2, delta * (r - 0.5 * delta)))


@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_huber_loss_with_where(rng, delta):
    pred, target = rng.standard_normal(10) * 2, rng.standard_normal(10)
    assert_matches_torch(lambda p, t: huber(p, t, delta), lambda p, t: F.huber_loss(p, t, delta=delta),
                         [pred, target], wrt=[0, 1])
