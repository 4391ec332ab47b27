"""What the CPU lowering does for speed keeps numbers right: block sums, vectorised max/min, carried values."""
import re

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.passes import fusion, simplify
from jitgrad.kernels.cpu import codegen as cpu
from numba import types

from jitgrad.kernels.cpu.reductions import LANES, block_sum

LANE_COUNTS = {np.dtype(np.float32): LANES[types.float32], np.dtype(np.float64): LANES[types.float64]}


def _block_sum_reference(values: np.ndarray) -> np.floating:
    """block_sum's order written out: lane k adds elements k, k + LANES, ...; lanes fold in halves."""
    scalar = values.dtype.type
    lanes = [scalar(0)] * LANE_COUNTS[values.dtype]
    for j, v in enumerate(values):
        lanes[j % len(lanes)] = scalar(lanes[j % len(lanes)] + v)
    while len(lanes) > 1:
        half = len(lanes) // 2
        lanes = [scalar(lanes[i] + lanes[i + half]) for i in range(half)]
    return lanes[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [0, 1, 15, 31, 33, 63, 64, 65, 200, cpu.BLOCK])
def test_block_sum_has_one_fixed_order(m, dtype) -> None:
    rng = np.random.default_rng(m)
    values = (rng.standard_normal(cpu.BLOCK) * 10.0 ** rng.uniform(-4, 4, cpu.BLOCK)).astype(dtype)
    got = block_sum(values.copy(), m)
    assert got == _block_sum_reference(values[:m])
    tolerance = 1e-6 if dtype == np.float32 else 1e-14
    assert abs(float(got) - values[:m].astype(np.float64).sum()) <= tolerance * np.abs(values[:m]).sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_sum_special_values(dtype) -> None:
    buf = np.zeros(cpu.BLOCK, dtype)
    buf[:3] = [1.0, np.inf, 2.0]
    assert block_sum(buf.copy(), 3) == np.inf
    buf[5] = -np.inf
    assert np.isnan(block_sum(buf.copy(), 6))
    buf[:] = 1.0
    buf[100] = np.nan
    assert np.isnan(block_sum(buf.copy(), cpu.BLOCK))
    assert cpu.BLOCK % LANE_COUNTS[np.dtype(dtype)] == 0  # a full block needs no padding beyond the buffer


@pytest.mark.parametrize("shape, axis", [((300_001,), None), ((700, 900), 1), ((40, 30, 500), (0, 2))])
def test_float64_sums_give_the_same_bits_in_both_variants(shape, axis) -> None:
    """The serial and the parallel kernel associate a float64 sum alike, so the timing chooser switching
    between them never changes a result (and neither does the call mode)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    f = jg.trace(lambda a: np.sum(np.sin(a) * a, axis=axis))
    program = fusion.schedule(simplify.optimize(f.plan(x).graph))
    (kernel,) = program.kernels
    from jitgrad.kernels.build import compiler
    compiled = compiler.load(cpu.module_source(kernel), {"parallel_kernel": {"parallel": True}, "serial_kernel": {}})
    results = []
    for variant in ("serial_kernel", "parallel_kernel"):
        out = np.empty(kernel.outputs[0].aval.shape)
        compiled.call(variant, cpu.kernel_arguments(kernel, [x], [out], cpu.scalar_arguments(kernel)))
        results.append(out)
    assert np.array_equal(results[0], results[1])
    calls = [np.asarray(f(x)) for _ in range(60)]
    assert all(np.array_equal(c, calls[0]) for c in calls)
    np.testing.assert_allclose(calls[0].reshape(results[0].shape), results[0], rtol=0, atol=0)
    np.testing.assert_allclose(results[0].reshape(np.shape(calls[0])), np.sum(np.sin(x) * x, axis=axis), rtol=1e-12)


@pytest.mark.parametrize("n", [1_000, 300_001])
def test_float32_sums_agree_across_kernels_and_variants(n) -> None:
    """The call, value-and-grad and both kernel variants sum the same terms in the same order."""
    rng = np.random.default_rng(n)
    w, x, b = (rng.standard_normal(n).astype(np.float32) for _ in range(3))

    def loss(w, x, b):
        return np.sum(jg.sigmoid(w * x + b) * np.exp(-x * x) + np.tanh(x) * w)

    f = jg.trace(loss)
    values = {float(f(w, x, b)) for _ in range(4)} | {float(f.value_and_grad(w, x, b)[0]) for _ in range(4)}
    assert len(values) == 1
    exact = np.sum(1 / (1 + np.exp(-(w.astype(np.float64) * x + b))) * np.exp(-x.astype(np.float64) ** 2)
                   + np.tanh(x.astype(np.float64)) * w)
    assert abs(values.pop() - exact) <= 2e-7 * abs(exact) + 1e-6


@pytest.mark.parametrize("reduce", [np.max, np.min])
@pytest.mark.parametrize("shape,axis", [((37, 1000), 1), ((200_000,), None), ((3, 5), 1)])
def test_max_and_min_match_numpy_with_nan_and_signed_zeros(reduce, shape, axis) -> None:
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    f = jg.trace(lambda a: reduce(a, axis=axis))
    np.testing.assert_array_equal(f(x), reduce(x, axis=axis))
    x.reshape(-1)[rng.integers(0, x.size, 3)] = np.nan
    np.testing.assert_array_equal(f(x), reduce(x, axis=axis))
    zeros = np.where(rng.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
    got, want = f(zeros), reduce(zeros, axis=axis)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _kernel_source(fn, *args) -> str:
    (kernel,) = fusion.schedule(simplify.optimize(jg.trace(fn).plan(*args).graph)).kernels
    return cpu.generate(kernel, "kernel", parallel=False)


def test_loads_use_unsigned_indices_so_loops_vectorise() -> None:
    """numba wraps signed negative indices; unsigned copies of the loop variables keep loads contiguous."""
    source = _kernel_source(lambda a, b: np.sum(np.exp(a) * b), np.ones(10, np.float32), np.ones(10, np.float32))
    loads = re.findall(r"= a\d\[([^\]]*)\]", source)
    assert loads and all(index.startswith("u") for index in loads)


def test_cross_entropy_gradient_reuses_the_exp_of_the_forward_pass() -> None:
    logits = np.random.default_rng(0).standard_normal((8, 50)).astype(np.float32)
    labels = np.arange(8) % 50

    def cross_entropy(z, y):
        return np.mean(jg.logsumexp(z, 1) - z[np.arange(z.shape[0]), y])

    f = jg.trace(cross_entropy)
    text = f.explain(logits, labels).split("# value_and_grad kernel 0 source")[1]
    kernel = text.split("# value_and_grad kernel 1 source")[0].split("# saved")[0]
    assert kernel.count("vexp(") == 1  # computed once, carried to the gradient pass through scratch
    assert re.search(r"s0\[u1\] = t\d+", kernel) and re.search(r"t\d+ = s0\[u1\]", kernel)

    t = torch.tensor(logits, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(t, torch.tensor(labels))
    ref.backward()
    value, grad = f.value_and_grad(logits, labels, argnums=0)
    np.testing.assert_allclose(value, ref.item(), rtol=1e-6)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_softmax_computes_exp_once_per_element() -> None:
    x = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    source = _kernel_source(lambda a: jg.softmax(a, axis=1), x)
    assert source.count("vexp(") == 1
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(jg.trace(lambda a: jg.softmax(a, axis=1))(x), e / e.sum(1, keepdims=True), rtol=2e-6)


def test_blocked_sums_and_carries_over_two_reduced_axes() -> None:
    """Rows of 40 x 300 (blocks of 256 along the last axis, then a tail), a carried exp, and a full
    reduction over two axes: against torch in float64."""
    x = np.random.default_rng(2).standard_normal((3, 40, 300)).astype(np.float32)

    def lse(a):
        return np.sum(jg.logsumexp(a, axis=(1, 2)) * np.array([1.0, 2.0, 3.0], np.float32))

    f = jg.trace(lse)
    value, grad = f.value_and_grad(x)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ref = (torch.logsumexp(t, dim=(1, 2)) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum()
    ref.backward()
    np.testing.assert_allclose(value, ref.item(), rtol=1e-6)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=2e-6, atol=1e-12)
    soft = jg.trace(lambda a: jg.softmax(a, axis=(1, 2)))(x)
    np.testing.assert_allclose(soft, torch.softmax(t.detach().reshape(3, -1), 1).reshape(3, 40, 300).numpy(),
                               rtol=2e-6, atol=1e-12)
    total = jg.trace(lambda a: np.sum(a * a, axis=(0, 2)))(x)
    np.testing.assert_allclose(total, (x.astype(np.float64) ** 2).sum(axis=(0, 2)), rtol=1e-6)
    assert float(jg.trace(lambda a: np.sum(a))(x)) == pytest.approx(x.astype(np.float64).sum(), rel=1e-6, abs=1e-3)


def _both_variants(kernel, arrays):
    from jitgrad.kernels.build import compiler
    compiled = compiler.load(cpu.module_source(kernel), {"parallel_kernel": {"parallel": True}, "serial_kernel": {}})
    results = []
    for variant in ("serial_kernel", "parallel_kernel"):
        outs = [np.empty(o.aval.shape, o.aval.dtype) for o in kernel.outputs]
        compiled.call(variant, cpu.kernel_arguments(kernel, arrays, outs, cpu.scalar_arguments(kernel)))
        results.append(outs)
    return results


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axis", [((8, 70, 600), (0, 1)), ((513, 257), 0), ((4, 6, 5, 9), (0, 1))])
def test_column_sums_are_column_kernels_with_the_row_kernels_bits(shape, axis, dtype, monkeypatch) -> None:
    """A sum over outer axes with the last axis kept (a bias gradient) walks rows in order and vectorises
    over columns, adding the same terms in the same order as the row kernel (BLOCK-row blocks in
    block_sum's lanes and tree, blocks folded in float64): the same bits in both variants and as the
    row kernel, which the test forces by switching column kernels off."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(dtype)

    def body(a):
        return np.sum(np.sin(a) * a, axis=axis), a * 2.0

    program = fusion.schedule(simplify.optimize(jg.trace(body).plan(x).graph))
    (kernel,) = program.kernels
    assert cpu.is_column_kernel(kernel)
    serial, parallel = _both_variants(kernel, [x])
    assert all(np.array_equal(s, p) for s, p in zip(serial, parallel))
    monkeypatch.setattr(cpu, "is_column_kernel", lambda k: False)
    (rows_serial, _) = _both_variants(kernel, [x])
    assert all(np.array_equal(s, r) for s, r in zip(serial, rows_serial))
    exact = np.sum(np.sin(x.astype(np.float64)) * x, axis=axis)
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    scale = np.sum(np.abs(x.astype(np.float64) * np.sin(x)), axis=axis)
    assert np.all(np.abs(serial[0].reshape(exact.shape) - exact) <= tolerance * scale + 1e-30)
    np.testing.assert_array_equal(serial[1], x * 2.0)


def test_row_sums_and_pooled_reductions_stay_row_kernels() -> None:
    x = np.ones((4, 6, 8), np.float32)
    for fn in (lambda a: np.sum(a, axis=2), lambda a: np.sum(a, axis=1), lambda a: np.max(a, axis=0)):
        program = fusion.schedule(simplify.optimize(jg.trace(fn).plan(x).graph))
        assert not any(cpu.is_column_kernel(k) for k in program.kernels)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_counts_add_without_blocks_and_give_the_blocked_sums_bits(dtype, monkeypatch) -> None:
    """A sum of bools cast to floats (max's gradient counts the ties of a 2x2 max-pool) is exact in any
    order: it adds straight into its float64 accumulator, no block scratch, and gives the bits the
    blocked sum gives (forced here by treating it as an ordinary sum) and numpy's count."""
    rng = np.random.default_rng(12)
    x = np.round(rng.standard_normal((3, 4, 2, 5, 2, 7)), 1).astype(dtype)  # rounded: ties occur

    def pooled_ties(a):
        peak = np.max(a, axis=(2, 4), keepdims=True)
        return np.sum((a == peak).astype(dtype), axis=(2, 4)), np.sum(a > 0, axis=(0, 1, 2, 3, 4), dtype=dtype)

    program = fusion.schedule(simplify.optimize(jg.trace(pooled_ties).plan(x).graph))
    kernels = list(program.kernels)
    counts = [r for k in kernels for st in k.stages for r in st.reductions if r.counts]
    assert len(counts) == 2 and not any(cpu.is_blocked(r) for r in counts)
    assert all("block_sum" not in cpu.module_source(k) for k in kernels)
    results = [_both_variants(k, [x]) for k in kernels]
    monkeypatch.setattr(cpu, "is_blocked", lambda r: r.prim.reduction.blocked and r.dtype.kind == "f")
    monkeypatch.setattr(cpu, "order_dependent", lambda r: r.prim.reduction.order_dependent and r.dtype.kind == "f")
    assert any("block_sum" in cpu.module_source(k) for k in kernels)
    for k, (serial, parallel) in zip(kernels, results):
        (blocked, _) = _both_variants(k, [x])
        assert all(np.array_equal(s, p) and np.array_equal(s, b) for s, p, b in zip(serial, parallel, blocked))
    got = jg.trace(pooled_ties)(x)
    want = pooled_ties(x)
    assert got[0].dtype == dtype and np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert got[0].max() > 1  # the test has ties


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pooling_maxima_are_lane_kernels_with_the_row_kernels_bits(dtype, monkeypatch) -> None:
    """A 2x2 max-pool of (B, H, 2, W, 2, C) with the tie count its gradient needs: reductions exact in any
    order over middle axes with the channels kept last run as a lane kernel (one accumulator per channel,
    channels innermost). Signed zeros (all-zero windows after a ReLU, all -0.0 ones), NaN, inf and ties
    come out as numpy's, in both variants and as the row kernel, which the test forces by switching lane
    kernels off. The lane kernel keeps each column's last zero term instead of rescanning a zero result (numpy's
    order gives the last zero's sign: windows of -0.0 then +0.0, and +0.0 then -0.0)."""
    rng = np.random.default_rng(5)
    x = np.maximum(rng.standard_normal((3, 8, 2, 8, 2, 9)), 0).astype(dtype)
    x[0, :4] = 0.0
    x[1, 1, :, 2, :, 3] = -0.0
    x[1, 4], x[1, 5] = 0.0, 0.0
    x[1, 4, 0, :, 0, :] = -0.0
    x[1, 5, 1, :, 1, :] = -0.0
    x[1, 2, 0, 3, 1, 4] = np.nan
    x[2, 0, 1, 0, 0, 5] = np.inf
    x[2, 3, :, 3, :, :] = 1.5

    def pool(a):
        m = np.max(a, axis=(2, 4), keepdims=True)
        return m, np.sum((a == m).astype(a.dtype), axis=(2, 4))

    program = fusion.schedule(simplify.optimize(jg.trace(pool).plan(x).graph))
    (kernel,) = program.kernels
    assert cpu.is_lane_kernel(kernel) and not cpu.is_column_kernel(kernel)
    lanes = cpu.generate(kernel, "k")
    assert "_v[u5]" in lanes and "_z[u5]" in lanes and "== 0:" not in lanes, lanes  # no rescan
    serial, parallel = _both_variants(kernel, [x])
    assert all(np.array_equal(s, p, equal_nan=True) for s, p in zip(serial, parallel))
    monkeypatch.setattr(cpu, "is_lane_kernel", lambda k: False)
    assert "_v[u5]" not in cpu.generate(kernel, "k") and "== 0:" in cpu.generate(kernel, "k")
    (rows_serial, _) = _both_variants(kernel, [x])
    assert all(np.array_equal(s, r, equal_nan=True) for s, r in zip(serial, rows_serial))
    with np.errstate(invalid="ignore"):
        expected_max, expected_count = pool(x)
    got_max = serial[0].reshape(expected_max.shape)
    np.testing.assert_array_equal(got_max, expected_max)
    assert np.array_equal(np.signbit(got_max), np.signbit(expected_max))
    np.testing.assert_array_equal(serial[1].reshape(expected_count.shape), expected_count)


def test_lane_kernels_leave_float_sums_to_row_and_column_kernels() -> None:
    x = np.ones((4, 6, 8), np.float32)
    for fn in (lambda a: np.sum(a, axis=1), lambda a: np.max(a, axis=2), lambda a: np.sum(a, axis=(0, 1))):
        program = fusion.schedule(simplify.optimize(jg.trace(fn).plan(x).graph))
        assert not any(cpu.is_lane_kernel(k) for k in program.kernels)
    program = fusion.schedule(simplify.optimize(jg.trace(lambda a: np.max(a, axis=1)).plan(x).graph))
    assert [cpu.is_lane_kernel(k) for k in program.kernels] == [True]


def test_many_constants_come_as_one_array_per_dtype_and_keep_numpys_bits() -> None:
    """Two or more scalar constants reach a kernel as one array per dtype (`codegen.scalar_groups`): float32 stays
    float32, every value reaches its place, and other values of the constants reuse the compiled kernel."""
    def make(scale: float):
        def f(x, k):
            return (x * np.float32(scale) + np.float32(2.5)) * (k + 7) - np.float32(scale / 3)
        return jg.trace(f)

    rng = np.random.default_rng(7)
    x, k = rng.standard_normal(40).astype(np.float32), np.arange(40, dtype=np.int64)
    first = make(1.75)
    np.testing.assert_array_equal(first(x, k), (x * np.float32(1.75) + np.float32(2.5)) * (k + 7)
                                  - np.float32(1.75 / 3))
    (source,) = first.plan(x, k).executables["call"].sources
    assert "def serial_kernel(n0, a0, a1, cs0, cs1, cs2, o0):" in source  # float32, int64, float64 constants
    assert all(f"{c} = {group}" in source for c, group in [("c0", "cs0[0]"), ("c1", "cs0[1]"), ("c2", "cs1[0]")])
    compiles = first.cache_info()["compiles"]
    second = make(-0.5)
    np.testing.assert_array_equal(second(x, k), (x * np.float32(-0.5) + np.float32(2.5)) * (k + 7)
                                  - np.float32(-0.5 / 3))
    assert second.cache_info()["compiles"] == compiles
