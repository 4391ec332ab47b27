"""Arrays from other CUDA libraries go in without copies and results view back without copies
(real GPU only: the simulator has no `__cuda_array_interface__`; bench/gpu.py runs these)."""
import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.cuda import executor as runtime_cuda


def loss(w, x, b):
    return np.sum(np.exp(w * x + b) * 2 + np.tanh(x))


def _gpu_module(name: str):
    module = pytest.importorskip(name)
    if runtime_cuda.is_simulator():
        pytest.skip(f"{name} arrays need a real GPU")
    return module


def _pointer(device_array) -> int:
    return device_array.__cuda_array_interface__["data"][0]


def test_torch_cuda_tensors_in_and_tensor_views_out(rng, device_stats) -> None:
    torch = _gpu_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    arrays = [rng.random(300, dtype=np.float32) for _ in range(3)]
    before = device_stats()["host_to_device_copies"]
    value, grads = jg.trace(loss, device="cuda").value_and_grad(*(torch.from_numpy(a).cuda() for a in arrays), argnums=(0, 1, 2))
    assert device_stats()["host_to_device_copies"] == before
    want_value, want_grads = jg.trace(loss).value_and_grad(*arrays, argnums=(0, 1, 2))
    np.testing.assert_allclose(value.copy_to_host(), want_value, rtol=2e-5)
    view = torch.as_tensor(grads[0], device="cuda")
    assert view.data_ptr() == _pointer(grads[0])
    np.testing.assert_allclose(view.cpu().numpy(), want_grads[0], rtol=2e-5, atol=1e-6)


def test_cupy_arrays_in_and_cupy_views_out(rng, device_stats) -> None:
    cupy = _gpu_module("cupy")
    arrays = [rng.random(300, dtype=np.float32) for _ in range(3)]
    before = device_stats()["host_to_device_copies"]
    out = jg.trace(lambda w, x, b: np.exp(w * x) + b, device="cuda")(*(cupy.asarray(a) for a in arrays))
    assert device_stats()["host_to_device_copies"] == before
    view = cupy.asarray(out)
    assert view.data.ptr == _pointer(out)
    np.testing.assert_allclose(cupy.asnumpy(view), np.exp(arrays[0] * arrays[1]) + arrays[2], rtol=2e-5)


def test_torch_cpu_tensors_are_copied_like_numpy_and_results_stay_device_arrays(rng, device_stats) -> None:
    torch = pytest.importorskip("torch")
    x = rng.random(40, dtype=np.float32)
    before = device_stats()["host_to_device_copies"]
    out = jg.trace(lambda x: np.tanh(x) * 2, device="cuda")(torch.from_numpy(x))
    assert device_stats()["host_to_device_copies"] == before + 1
    assert getattr(out, "__cuda_ndarray__", False)
    np.testing.assert_allclose(out.copy_to_host(), np.tanh(x) * 2, rtol=2e-5)
