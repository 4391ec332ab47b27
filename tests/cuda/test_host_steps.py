"""Steps outside fused kernels on the device: views and reshapes as copy kernels or views, other host
primitives through the host (counted)."""
import numpy as np
from numba import cuda

import jitgrad as jg


def test_regrouping_reshape_and_view_outputs_are_fresh_arrays(check, rng) -> None:
    x = rng.standard_normal((3, 4), dtype=np.float32)
    check(lambda x: np.reshape(x, (6, 2)) * 2, x)
    dx = cuda.to_device(x)
    reshaped, transposed = jg.trace(lambda x: (np.reshape(x, (2, 6)), x.T), device="cuda")(dx)
    np.testing.assert_array_equal(reshaped.copy_to_host(), x.reshape(2, 6))
    np.testing.assert_array_equal(transposed.copy_to_host(), x.T)
    reshaped[0, 0] = 99.0
    assert dx.copy_to_host()[0, 0] == x[0, 0]


def test_primitives_without_a_device_kernel_run_on_the_host(check, rng, device_stats) -> None:
    before = device_stats()["host_round_trips"]
    check(lambda x: np.sum(np.sort(x) * np.arange(6.0, dtype=np.float32)), rng.standard_normal(6, dtype=np.float32),
          grad=True)
    assert device_stats()["host_round_trips"] > before


def test_slices_pads_and_concatenates_stay_on_the_device(check, rng, device_stats) -> None:
    """Kernels read through them (offsets, bounds tests); where an array is needed, a copy kernel makes it."""
    x, y = rng.standard_normal((4, 6), dtype=np.float32), rng.standard_normal((4, 2), dtype=np.float32)
    before = device_stats()["host_round_trips"]
    check(lambda x, y: np.sum(np.tanh(np.concatenate([x[:, ::-1], np.pad(y, ((0, 0), (1, 0)))], axis=1)) ** 2),
          x, y, grad=True)
    check(lambda x, y: (np.concatenate([x, y], axis=1), np.pad(x, 1)[1:, 2:], x[1:3, ::2]), x, y)
    assert device_stats()["host_round_trips"] == before
