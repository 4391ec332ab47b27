"""jitgrad's small matrix products run on one OpenBLAS thread, by a rule on their shape alone
(jitgrad/ops/blas_threads.py): the same bits as numpy's product on one thread, whatever numpy's setting, and
numpy's setting put back after them, also when many threads multiply at once."""
import threading

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.ops import blas_threads

pytestmark = pytest.mark.skipif(blas_threads._one_thread.found is None, reason="numpy's BLAS is not OpenBLAS")


@pytest.fixture
def two_threads():
    setter, getter = blas_threads._one_thread.found
    before = getter()
    setter(2)
    yield setter, getter
    setter(before)


def products(dtype):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))
            for m, k, n in [(256, 128, 128), (333, 129, 257), (256, 128, 512)]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_small_product_has_the_bits_of_one_thread_whatever_numpys_setting(two_threads, dtype) -> None:
    setter, getter = two_threads
    for a, b in products(dtype):
        assert a.size * b.shape[1] <= blas_threads.SMALL_PRODUCT
        got = blas_threads.matmul(a, b)
        assert getter() == 2
        setter(1)
        want = np.matmul(a, b)
        setter(2)
        assert np.array_equal(got, want)


def test_a_large_product_keeps_numpys_setting(two_threads) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((1024, 256)).astype(np.float32), rng.standard_normal((256, 1024)).astype(np.float32)
    assert a.size * b.shape[1] > blas_threads.SMALL_PRODUCT
    assert np.array_equal(blas_threads.matmul(a, b), np.matmul(a, b))


def test_many_threads_multiplying_at_once_leave_the_setting_as_it_was(two_threads) -> None:
    _, getter = two_threads
    a, b = products(np.float32)[0]
    want = blas_threads.matmul(a, b)
    barrier, wrong = threading.Barrier(8), []

    def work() -> None:
        barrier.wait()
        for _ in range(50):
            out = np.empty_like(want)
            blas_threads.matmul(a, b, out=out)
            if not np.array_equal(out, want):
                wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and getter() == 2 and blas_threads._one_thread.depth == 0


def test_a_traced_product_leaves_numpys_setting_and_matches_numpy(two_threads) -> None:
    _, getter = two_threads
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 128)).astype(np.float32)
    value, grad = jg.trace(lambda w, x: np.sum(np.tanh(x @ w))).value_and_grad(w, x)
    assert getter() == 2
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64.T @ (1 - np.tanh(x64 @ w64) ** 2)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)


def test_multiply_adds_count_broadcast_batches() -> None:
    assert blas_threads.multiply_adds((4, 3), (3, 5)) == 60
    assert blas_threads.multiply_adds((4, 3), (7, 3, 5)) == 7 * 60
    assert blas_threads.multiply_adds((2, 1, 4, 3), (6, 3, 5)) == 12 * 60
