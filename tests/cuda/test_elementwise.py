"""Elementwise kernels on the device: one grid-stride loop, broadcasting by index arithmetic."""
import numpy as np
import pytest
from numba import cuda

import jitgrad as jg
from jitgrad.passes import fusion, simplify
from jitgrad.kernels.cuda import codegen as kc


def test_chain_float32_is_one_kernel_and_agrees(check, rng) -> None:
    x, y = rng.standard_normal(200, dtype=np.float32), rng.random(200, dtype=np.float32)
    fn = lambda x, y: np.exp(x) * y - np.tanh(x) / (y + 1) + np.sqrt(y) * np.sin(x)  # noqa: E731
    check(fn, x, y)
    assert jg.trace(fn, device="cuda").kernel_counts(x, y)["call"] == 1


def test_float64_and_integer_dtypes(check, rng) -> None:
    check(lambda x: np.log1p(x * x) + np.arctan(x), rng.standard_normal(70))
    check(lambda i, j: i * j + i - (j > 3), np.arange(40, dtype=np.int64), np.arange(40, dtype=np.int64) % 7)


def test_broadcasting_reads_by_index_without_materialising(check, rng) -> None:
    col, row = rng.random((6, 1), dtype=np.float32), rng.random(5, dtype=np.float32)
    out = check(lambda c, r, s: (c + r) * s + (np.reshape(r, (5, 1)) * c.T).T, col, row, np.float32(2.5))
    assert out.shape == (6, 5)
    matrix = rng.random((3, 4), dtype=np.float32)
    check(lambda m, v: m.T * v + 1.0, matrix, rng.random(3, dtype=np.float32))


def test_grid_stride_loop_covers_more_points_than_threads(check, rng, monkeypatch) -> None:
    monkeypatch.setattr(kc, "MAX_BLOCKS", 1)
    x = rng.standard_normal(600, dtype=np.float32)
    fn = lambda x: x * 3 + np.abs(x)  # noqa: E731
    (kernel,) = fusion.schedule(simplify.optimize(jg.trace(fn).plan(x).graph)).kernels
    assert kc.launches(kernel) == [kc.Launch("kernel", 1, kc.THREADS)]  # 600 points, 256 threads
    check(fn, x)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator evaluates exp(inf) & co with numpy
def test_special_values_follow_numpy(check) -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -3.5, 2.5], np.float32)
    check(lambda x: np.exp(x) + np.tanh(x) + jg.sigmoid(x), x)
    check(lambda x: np.sign(x) * np.floor(x) + np.rint(x), x)
    check(lambda x: np.where(np.isnan(x), 0.0, np.maximum(x, 1.0)), x)


def test_scalars_and_zero_d_results(check) -> None:
    same, out = check(lambda a, b: (a, a * b + 1.0), np.float32(3.0), 2.0, on_device=False)
    assert same.shape == () and out.shape == ()


def test_device_inputs_are_not_copied_and_host_inputs_are_copied_once(rng, device_stats) -> None:
    f = jg.trace(lambda x, y: x * y + 1, device="cuda")
    x, y = rng.random(50, dtype=np.float32), rng.random(50, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    f(dx, dy)
    before = device_stats()["host_to_device_copies"]
    out = f(dx, dy)
    assert device_stats()["host_to_device_copies"] == before
    f(x, y)
    assert device_stats()["host_to_device_copies"] == before + 2
    np.testing.assert_array_equal(out.copy_to_host(), x * y + 1)


def test_outputs_never_alias_inputs(rng) -> None:
    f = jg.trace(lambda x, y: (x, x, y * 2), device="cuda")
    x = cuda.to_device(rng.random(8, dtype=np.float32))
    a, b, _ = f(x, x)
    a[0] = 5.0
    assert b.copy_to_host()[0] != 5.0 and x.copy_to_host()[0] != 5.0


def test_device_array_on_a_cpu_function_is_a_jitgrad_error() -> None:
    with pytest.raises(jg.InputError, match="CUDA device array; trace with device='cuda'"):
        jg.trace(lambda x: x + 1)(cuda.to_device(np.ones(3, np.float32)))
