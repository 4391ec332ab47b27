"""CUDA backend tests, checked against the CPU backend. They run in their own process: under numba's
CUDA simulator (tests/test_cuda_sim.py sets NUMBA_ENABLE_CUDASIM=1 before numba is imported) or
on a real GPU (bench/gpu.py). Sizes stay small: a simulated block of 256 threads costs ~0.3 s."""
from typing import Any, Callable

import numpy as np
import pytest
from numba import cuda

import jitgrad as jg
from jitgrad.kernels.cuda import executor as runtime_cuda

if not runtime_cuda.is_simulator() and not cuda.is_available():
    pytest.exit("tests/cuda needs a CUDA GPU, or NUMBA_ENABLE_CUDASIM=1 set before numba is first imported "
                "(python -m pytest tests/test_cuda_sim.py runs them that way)", returncode=3)

# CUDA vs CPU backend. float32: libdevice vs numba's math differ by a few ulp per function and
# reductions add in another order (float32 sums accumulate in float64 on both); float64 likewise.
TOLERANCE = {np.dtype(np.float32): {"rtol": 2e-5, "atol": 1e-6},
             np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-12}}


def host(x: Any) -> np.ndarray:
    """A device result copied to the host (checking that it is a device array)."""
    assert getattr(x, "__cuda_ndarray__", False), f"expected a numba device array, got {type(x).__name__}"
    return x.copy_to_host()


def assert_close(got: Any, want: Any) -> None:
    got, want = host(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, **TOLERANCE[want.dtype])
    else:
        np.testing.assert_array_equal(got, want)


def agree(fn: Callable[..., Any], *args: Any, grad: bool = False, on_device: bool = True) -> Any:
    """Run `fn` (or its value-and-grad) with device="cuda" and on the CPU, assert they agree, return the
    CUDA result. Array arguments go in as device arrays unless `on_device` is False."""
    gpu, cpu = jg.trace(fn, device="cuda"), jg.trace(fn)
    dev_args = [cuda.to_device(a) if on_device and isinstance(a, np.ndarray) else a for a in args]
    if grad:
        every = tuple(range(len(args)))
        value, grads = gpu.value_and_grad(*dev_args, argnums=every)
        want_value, want_grads = cpu.value_and_grad(*args, argnums=every)
        assert_close(value, want_value)
        for g, w in zip(grads, want_grads):
            assert_close(g, w)
        return value, grads
    out = gpu(*dev_args)
    want = cpu(*args)
    if isinstance(want, tuple):
        for o, w in zip(out, want):
            assert_close(o, w)
    else:
        assert_close(out, want)
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    """Seeded data; defined here too so this suite runs with only its own conftest (bench/gpu.py)."""
    return np.random.default_rng(0)


@pytest.fixture
def check() -> Callable[..., Any]:
    return agree


@pytest.fixture
def device_stats() -> Callable[[], dict]:
    return runtime_cuda.stats
