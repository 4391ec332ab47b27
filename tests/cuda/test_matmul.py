"""matmul on the device: the tiled shared-memory kernel (and cuBLAS through CuPy where available)."""
import numpy as np
import pytest
from numba import cuda

import jitgrad as jg
from jitgrad.kernels.cuda import executor as runtime_cuda


def backends() -> list[str]:
    return ["tiled"] + ([] if runtime_cuda.is_simulator() or not runtime_cuda.cupy_available() else ["cublas"])


@pytest.fixture(params=backends())
def backend(request, monkeypatch) -> str:
    monkeypatch.setenv("JITGRAD_CUDA_MATMUL", request.param)
    return request.param


def test_matmul_two_d_with_partial_tiles(check, rng, backend) -> None:
    a, b = rng.standard_normal((9, 20), dtype=np.float32), rng.standard_normal((20, 5), dtype=np.float32)
    check(lambda a, b: a @ b, a, b)
    check(lambda a, b: np.tanh(a @ b) + 1, a.astype(np.float64), b.astype(np.float64))


def test_batched_matmul(check, rng, backend) -> None:
    a, b = rng.standard_normal((2, 3, 7), dtype=np.float32), rng.standard_normal((2, 7, 4), dtype=np.float32)
    assert check(lambda a, b: a @ b, a, b).shape == (2, 3, 4)


def test_strided_device_input_is_made_contiguous_first(rng, backend) -> None:
    a, b = rng.standard_normal((6, 4), dtype=np.float32), rng.standard_normal((6, 3), dtype=np.float32)
    transposed = cuda.to_device(a).T  # a non-contiguous view of device memory
    out = jg.trace(lambda p, q: p @ q, device="cuda")(transposed, cuda.to_device(b))
    np.testing.assert_allclose(out.copy_to_host(), a.T @ b, rtol=2e-5, atol=1e-6)


def test_unknown_matmul_backend_is_a_jitgrad_error(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_CUDA_MATMUL", "magic")
    with pytest.raises(jg.UnsupportedError, match="JITGRAD_CUDA_MATMUL"):
        jg.trace(lambda a, b: a @ b, device="cuda")(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
