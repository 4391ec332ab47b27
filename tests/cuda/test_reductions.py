"""Reductions on the device: block tree reductions, rows mapped to blocks, two passes for full ones."""
import numpy as np
import pytest

import jitgrad as jg
from jitgrad.passes import fusion, simplify
from jitgrad.kernels.cuda import codegen as kc

REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min}


def only_kernel(fn, *args):
    (kernel,) = fusion.schedule(simplify.optimize(jg.trace(fn).plan(*args).graph)).kernels
    return kernel


@pytest.mark.parametrize("name", sorted(REDUCERS))
@pytest.mark.parametrize("axis, keepdims", [(None, False), (None, True), (0, False), (1, False), (1, True)])
def test_sum_max_min_over_all_and_each_axis(check, rng, name, axis, keepdims) -> None:
    x = rng.standard_normal((5, 12), dtype=np.float32)
    fn = lambda x: REDUCERS[name](x * 2, axis=axis, keepdims=keepdims)  # noqa: E731
    out = check(fn, x)
    assert out.shape == np.sum(x, axis=axis, keepdims=keepdims).shape
    assert kc.family(only_kernel(fn, x)) == ("full" if axis is None else "rows")


def test_full_reduction_combines_partials_of_several_blocks(check, rng) -> None:
    x = rng.standard_normal(700, dtype=np.float64)  # 3 blocks of 256 threads, then one finishing block
    fn = lambda x: np.sum(np.exp(x) - x)  # noqa: E731
    assert kc.partial_blocks(only_kernel(fn, x)) == 3
    check(fn, x)
    check(lambda x: np.max(x), x)


def test_multi_pass_kernels_softmax_rows_and_logsumexp_of_everything(check, rng) -> None:
    x = rng.standard_normal((4, 33), dtype=np.float32) * 4
    assert len(only_kernel(lambda x: jg.softmax(x, axis=1), x).stages) == 3
    check(lambda x: jg.softmax(x, axis=1), x)
    fn = lambda x: jg.logsumexp(x, axis=(0, 1)) * x  # noqa: E731  (max pass, sum pass, then x * lse)
    assert kc.family(only_kernel(lambda x: jg.logsumexp(x, axis=(0, 1)), x)) == "full"
    check(fn, x)


def test_rows_loop_when_there_are_more_rows_than_blocks(check, rng, monkeypatch) -> None:
    monkeypatch.setattr(kc, "MAX_BLOCKS", 2)
    x = rng.standard_normal((5, 12), dtype=np.float32)
    assert kc.launches(only_kernel(lambda x: np.sum(x, axis=1), x))[0].blocks == 2
    check(lambda x: np.sum(x, axis=1) + np.max(x, axis=1), x)


def test_integer_and_nan_reductions(check, rng) -> None:
    ints = rng.integers(-100, 100, (3, 20)).astype(np.int32)
    check(lambda i: np.max(i, axis=1), ints)
    check(lambda i: np.min(i.astype(np.int8)), ints)  # int8: the shared-memory tree on a GPU too
    check(lambda i: np.sum(i, axis=0), ints)
    x = rng.standard_normal(50, dtype=np.float32)
    x[17] = np.nan
    assert np.isnan(check(lambda x: np.max(x), x).copy_to_host())


def test_reduction_over_a_middle_axis_with_broadcast_input(check, rng) -> None:
    x = rng.standard_normal((3, 6, 2), dtype=np.float32)
    check(lambda x, b: np.sum(x * b, axis=1, keepdims=True) + b[0], x, rng.standard_normal(2, dtype=np.float32))
