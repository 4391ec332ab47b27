"""float32 x ** 3 is (x * x) * x, as torch computes it (jitgrad/ops/arithmetic.py, `power`): torch's bits,
the documented bound (under 2 ulp of the exact cube, measured with exact rational arithmetic), numpy's
special values, float32 gradients against torch, and no libm pow call left in the kernel."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

import jitgrad as jg

BOUND_ULP = 2.0


def _sweep_values() -> np.ndarray:
    """float32 values whose cube is a normal float32: random mantissas over the whole usable exponent range,
    plus powers of two and their neighbours."""
    rng = np.random.default_rng(3)
    x = np.ldexp(rng.uniform(1.0, 2.0, 20000), rng.integers(-41, 42, 20000)) * rng.choice([-1.0, 1.0], 20000)
    twos = np.ldexp(1.0, np.arange(-41, 42))
    x = np.concatenate([x, twos]).astype(np.float32)
    return np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(0))])


def test_cube_is_torchs_and_within_the_documented_bound() -> None:
    x = _sweep_values()
    got = jg.trace(lambda v: v ** 3)(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (torch.from_numpy(x) ** 3).numpy())
    approx = np.abs(got.astype(np.float64) - x.astype(np.float64) ** 3) / np.spacing(np.abs(got)).astype(np.float64)
    worst = np.argsort(approx)[-50:]  # float64 is within 2^-29 ulp here; the worst ones are measured exactly
    errors = [float(abs(Fraction(float(got[i])) - Fraction(float(x[i])) ** 3)
                    / Fraction(float(np.spacing(np.abs(got[i]))))) for i in worst]
    assert 1.0 < max(errors) < BOUND_ULP
    assert np.max(np.abs(got.astype(np.float64) - x ** 3) / np.spacing(np.abs(x ** 3))) <= 2.0  # numpy's powf


def test_special_values_as_numpy() -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-20, -1e-20, 3.4e38, -3.4e38, 1e13,
                  1e-13, 1.0, -1.0], np.float32)
    with np.errstate(all="ignore"):
        expected = x ** 3
        got = jg.trace(lambda v: v ** 3)(x)
    np.testing.assert_array_equal(got, expected)
    assert np.array_equal(np.signbit(got), np.signbit(expected))


def test_gradient_stays_float32_and_matches_torch() -> None:
    x = np.random.default_rng(4).standard_normal(257).astype(np.float32)
    f = jg.trace(lambda v: np.sum(0.5 * v * (1 + np.tanh(0.79788456 * (v + 0.044715 * v ** 3)))))
    value, grad = f.value_and_grad(x)
    t = torch.tensor(x, requires_grad=True)
    ref = torch.sum(0.5 * t * (1 + torch.tanh(0.79788456 * (t + 0.044715 * t ** 3))))
    ref.backward()
    assert grad.dtype == np.float32 and np.asarray(value).dtype == np.float32
    np.testing.assert_allclose(value, ref.item(), rtol=1e-5)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=2e-5, atol=1e-6)


def test_kernel_multiplies_instead_of_calling_pow() -> None:
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    text = jg.trace(lambda v: np.sum(v ** 3)).explain(x)  # every program's IR and kernel sources
    assert "pow" not in text and " ** " not in text
    assert " ** " in jg.trace(lambda v: np.sum(v ** 3)).explain(x.astype(np.float64))  # float64: numpy's pow
