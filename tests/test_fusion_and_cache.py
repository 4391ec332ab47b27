"""Fusion is real (kernel counts) and the plan cache reuses compiled code (counters)."""
import numpy as np

import jitgrad as jg
from jitgrad.kernels import compiler


def loss(w, x, b):
    y = w * x + b
    return np.sum(np.exp(y) * 2 + np.tanh(x))


def _wxb(n, dtype=np.float32):
    rng = np.random.default_rng(n)
    return tuple(rng.random(n).astype(dtype) for _ in range(3))


def test_loss_is_one_forward_kernel_and_one_joint_kernel() -> None:
    f = jg.trace(loss)
    counts = f.kernel_counts(*_wxb(100))
    assert counts["call"] == 1
    assert counts["value_and_grad"] == 1  # forward and all three gradients in one pass
    text = f.explain(*_wxb(100))
    assert "# call: 1 kernel(s)" in text and "# value_and_grad: 1 kernel(s)" in text
    assert "def kernel_0(" in text and "prange" in text


def test_softmax_row_chain_is_one_multi_pass_kernel() -> None:
    f = jg.trace(lambda x: jg.softmax(x, axis=1))
    assert f.kernel_counts(np.ones((4, 6)))["call"] == 1
    assert "3 pass(es)" in f.explain(np.ones((4, 6)))


def test_second_call_compiles_nothing_and_new_length_reuses_kernels() -> None:
    f = jg.trace(loss)
    f.value_and_grad(*_wxb(50))
    before = compiler.stats()
    f.value_and_grad(*_wxb(50))
    assert compiler.stats() == before
    assert f.cache_info()["hits"] >= 1
    f.value_and_grad(*_wxb(77))  # same rank and dtypes, new length: a new plan, no new numba code
    after = compiler.stats()
    assert after["numba_compiles"] == before["numba_compiles"]
    assert after["sources"] == before["sources"]
    assert f.cache_info()["entries"] == 2


def test_large_inputs_use_the_parallel_kernel_and_agree() -> None:
    f = jg.trace(loss)
    w, x, b = _wxb(200_000)
    value, grads = f.value_and_grad(w, x, b)
    e = np.exp(w.astype(np.float64) * x + b) * 2
    assert np.isclose(value, np.sum(e + np.tanh(x.astype(np.float64))), rtol=1e-6)
    np.testing.assert_allclose(grads[2], e, rtol=1e-5)


def test_float32_sum_is_accurate() -> None:
    x = np.full(1_000_003, 0.1, np.float32)
    total = jg.trace(np.sum)(x)
    assert total.dtype == np.float32
    assert abs(float(total) - 1_000_003 * float(np.float32(0.1))) / 1e5 < 1e-6
