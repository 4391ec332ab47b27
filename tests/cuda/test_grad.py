"""Forward and backward programs on the device agree with the CPU backend; compiled code is reused."""
import numpy as np
from numba import cuda

import jitgrad as jg


def loss(w, x, b):
    return np.sum(np.exp(w * x + b) * 2 + np.tanh(x))


def mlp(x, weight, bias):
    return np.sum(np.tanh(x @ weight + bias) ** 2)


def wxb(n, rng):
    return tuple(rng.random(n, dtype=np.float32) for _ in range(3))


def test_loss_value_and_grad_is_one_fused_kernel_and_agrees(check, rng) -> None:
    value, grads = check(loss, *wxb(300, rng), grad=True)
    assert value.shape == () and len(grads) == 3
    assert jg.trace(loss, device="cuda").kernel_counts(*wxb(300, rng))["value_and_grad"] == 1


def test_mlp_layer_value_and_grad_agrees(check, rng) -> None:
    x = rng.standard_normal((8, 16), dtype=np.float32)
    weight = rng.standard_normal((16, 12), dtype=np.float32) / 4
    bias = rng.standard_normal(12, dtype=np.float32)
    check(mlp, x, weight, bias, grad=True)


def test_forward_backward_pair_and_device_cotangent(rng) -> None:
    w, x, b = wxb(64, rng)
    gpu, cpu = jg.trace(lambda w, x, b: np.exp(w * x) + b, device="cuda"), jg.trace(lambda w, x, b: np.exp(w * x) + b)
    out, ctx = gpu.forward(*(cuda.to_device(a) for a in (w, x, b)))
    want, want_ctx = cpu.forward(w, x, b)
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=2e-5)
    cotangent = rng.standard_normal(64, dtype=np.float32)
    for g, r in zip(gpu.backward(ctx, cuda.to_device(cotangent)), cpu.backward(want_ctx, cotangent)):
        np.testing.assert_allclose(g.copy_to_host(), r, rtol=2e-5, atol=1e-6)


def test_second_call_compiles_nothing_and_a_new_length_reuses_device_code(rng, device_stats) -> None:
    f = jg.trace(loss, device="cuda")
    f.value_and_grad(*wxb(40, rng))
    before = device_stats()
    f.value_and_grad(*wxb(40, rng))
    after = device_stats()
    assert (after["sources"], after["device_compiles"]) == (before["sources"], before["device_compiles"])
    f.value_and_grad(*wxb(90, rng))  # a new plan: same rank and dtypes, so the same source and signatures
    assert device_stats()["device_compiles"] == before["device_compiles"]
    assert f.cache_info()["entries"] == 2 and f.cache_info()["compiles"] == before["device_compiles"]
