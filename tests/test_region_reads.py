"""Slices, pads and concatenates inside kernels: slices are views kernels read at offsets, pads and
concatenates are region reads (bounds tests, `loops.Branch`) instead of host steps. Asserted on numbers
(numpy's values, torch's gradients, the same bits as numpy for pure data movement) and on structure
(which host steps remain, what the generated source reads)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.passes import fusion, simplify, recipes
from jitgrad.kernels.build import compiler
from jitgrad.passes.loops import HostStep

RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 6)).astype(np.float32)
Y = RNG.standard_normal((5, 3)).astype(np.float32)


def _host_steps(fn, *inputs) -> list[str]:
    """The host steps of `fn`'s value-and-grad program, by primitive name."""
    plan = jg.trace(fn).plan(*inputs)
    graph = recipes.value_and_grad_graph(plan.graph, plan.differentiable(list(range(len(inputs)))))
    return [s.eqn.prim.name for s in fusion.schedule(simplify.optimize(graph)).steps if isinstance(s, HostStep)]


def im2col_loss(x, k):
    """A 3x3 'same' convolution as a user writes it: pad, nine shifted slices, concatenate, one matmul."""
    n, h, w, c = x.shape
    p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.concatenate([p[:, dy:dy + h, dx:dx + w, :].reshape(n, h, w, 1, c)
                           for dy in range(3) for dx in range(3)], axis=3)
    y = np.maximum(cols.reshape(n * h * w, 9 * c) @ k, 0.0)
    return np.mean(y * y)


@pytest.mark.parametrize("fn", [
    lambda x, y: np.tanh(np.concatenate([x, y], axis=1)) * 2.0,
    lambda x, y: np.exp(np.pad(x, ((1, 2), (0, 3)), constant_values=0.5)) - 1.0,
    lambda x, y: np.concatenate([x[:, ::-1], np.pad(y, ((0, 0), (2, 1)))[1:, :]], axis=0)[:, 1:5] + 1.0,
    lambda x, y: np.sum(np.concatenate([x[1:4, ::2], y[:3]], axis=1) ** 2, axis=1),
])
def test_values_match_numpy(fn) -> None:
    np.testing.assert_allclose(jg.trace(fn)(X, Y), fn(X, Y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda x, y: np.concatenate([x, y], axis=1) * 3.0,
    lambda x, y: np.pad(x, ((1, 0), (2, 2))),
    lambda x, y: (x[1:, ::-2], np.concatenate([y, x], axis=1)),
])
def test_pure_data_movement_has_numpy_bits(fn) -> None:
    got, want = jg.trace(fn)(X, Y), fn(X, Y)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert g.dtype == w.dtype and g.tobytes() == np.ascontiguousarray(w).tobytes()


def test_gradients_through_slices_pads_and_concatenates_match_torch() -> None:
    def loss(x, y):
        c = np.concatenate([np.pad(x, ((0, 0), (1, 1))), y[:, ::-1]], axis=1)
        return np.sum(np.tanh(c[1:, 2:]) * c[:-1, :-2])

    xt, yt = (torch.tensor(a, requires_grad=True) for a in (X, Y))
    c = torch.cat([torch.nn.functional.pad(xt, (1, 1)), torch.flip(yt, [1])], 1)
    (torch.tanh(c[1:, 2:]) * c[:-1, :-2]).sum().backward()
    value, (gx, gy) = jg.trace(loss).value_and_grad(X, Y, argnums=(0, 1))
    np.testing.assert_allclose(value, loss(X, Y), rtol=1e-5)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gy, yt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_im2col_gradient_reads_through_its_pads() -> None:
    """The convolution's input gradient sums nine padded slices: one kernel reads them all, with no pad,
    slice or reshape host step between the matmul and that kernel. The forward's patches, which the matmul
    needs as an array, are one copy kernel reading the unpadded input in place (no pad, slice, reshape or
    concatenate on the host for them either)."""
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    k = RNG.standard_normal((27, 4)).astype(np.float32)
    host = _host_steps(im2col_loss, x, k)
    assert "pad" not in host and "concatenate" not in host and host.count("slice") == 1, host  # the slice:
    # the input gradient cropped out of the padded one, returned
    xt, kt = (torch.tensor(a, requires_grad=True) for a in (x, k))
    yt = torch.relu(torch.nn.functional.conv2d(xt.permute(0, 3, 1, 2), kt.reshape(3, 3, 3, 4).permute(3, 2, 0, 1),
                                               padding=1).permute(0, 2, 3, 1).reshape(-1, 4))
    (yt * yt).mean().backward()
    value, (gx, gk) = jg.trace(im2col_loss).value_and_grad(x, k, argnums=(0, 1))
    np.testing.assert_allclose(value, (yt * yt).mean().item(), rtol=1e-5)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gk, kt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_copy_kernel_writes_a_region_read_of_many_views_numpy_the_rest() -> None:
    """A concatenate a host step needs as an array is a copy kernel where it replaces four host steps or more
    (the im2col's twenty), for an array of at most 1 MiB or one whose operand is chosen by outer positions only
    (the im2col's, of any size), and numpy's concatenate where it reads two arrays as they are (a compile is not
    worth one numpy call) or makes a larger one along its last axis. numpy's bits either way."""
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    k = RNG.standard_normal((27, 4)).astype(np.float32)
    im2col = jg.trace(lambda x, k: im2col_loss(x, k) * 1.0)
    two = jg.trace(lambda a, b: np.concatenate([a, b], axis=1).T @ a)
    assert im2col.kernel_counts(x, k)["call"] == 2  # the patches, then ReLU and the mean
    large = np.zeros((16, 32, 32, 3), np.float32)  # patches of 1.8 MB, shifts chosen on outer axes: a kernel too
    assert im2col.kernel_counts(large, k)["call"] == 2
    wide = RNG.standard_normal((512, 1024)).astype(np.float32)

    def shifted_columns(a):  # 9.8 MiB of five shifts side by side along the last axis
        return np.concatenate([np.pad(a, ((0, 0), (1, 1)))[:, i:i + 1000] for i in range(5)], axis=1)

    along_last = jg.trace(shifted_columns)
    assert along_last.kernel_counts(wide)["call"] == 0
    assert np.array_equal(along_last(wide), shifted_columns(wide))
    assert jg.trace(shifted_columns).kernel_counts(wide[:32])["call"] == 1  # 0.6 MiB: a copy kernel
    assert two.kernel_counts(X, Y)["call"] == 0 and "concatenate" in [
        s.eqn.prim.name for s in fusion.schedule(simplify.optimize(two.plan(X, Y).graph)).steps
        if isinstance(s, HostStep)]
    n, h, w, c = x.shape
    p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.concatenate([p[:, dy:dy + h, dx:dx + w, :].reshape(n, h, w, 1, c)
                           for dy in range(3) for dx in range(3)], axis=3)
    patches = jg.trace(lambda x: np.concatenate([np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))[
        :, dy:dy + h, dx:dx + w, :].reshape(n, h, w, 1, c) for dy in range(3) for dx in range(3)], axis=3) @ k[:c])
    assert patches.kernel_counts(x)["call"] == 1
    assert np.array_equal(patches(x), want @ k[:c])
    assert np.array_equal(two(X, Y), np.concatenate([X, Y], axis=1).T @ X)


def test_kernels_test_bounds_instead_of_reading_padded_arrays() -> None:
    f = jg.trace(lambda x: np.exp(np.pad(x, 1)) * 2.0)
    text = f.explain(X)
    assert "if p1 <= i0 < p2 and p1 <= i1 < p3:" in text and "(u0 - np.uint64(-p0))" in text, text
    assert "pad" not in _host_steps(lambda x: np.sum(np.exp(np.pad(x, 1))), X)


def test_interior_padding_stays_a_host_step() -> None:
    """The gradient of a strided slice pads with steps of 2: a host step, with torch's gradient."""
    host = _host_steps(lambda x: np.sum(np.tanh(x[:, ::2])), X)
    assert host == ["pad"], host
    xt = torch.tensor(X, requires_grad=True)
    torch.tanh(xt[:, ::2]).sum().backward()
    _, (g,) = jg.trace(lambda x: np.sum(np.tanh(x[:, ::2]))).value_and_grad(X, argnums=(0,))
    np.testing.assert_allclose(g, xt.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_kernels_reading_reshaped_slices_get_contiguous_arrays() -> None:
    """A regrouping reshape of a strided slice may be a strided view: kernels get it C-contiguous."""
    x = RNG.standard_normal((4, 6, 2)).astype(np.float32)
    assert not x[:, 1:3].reshape(4, 4).flags.c_contiguous  # numpy makes this reshape a strided view
    fn = lambda x: np.exp(x[:, 1:3].reshape(4, 4)) @ np.ones((4, 2), np.float32) + x[:, 1:3].reshape(4, 4)[:, :2]  # noqa: E731
    np.testing.assert_allclose(jg.trace(fn)(x), fn(x), rtol=1e-6)



def test_shapes_are_arguments_of_region_reads_so_one_kernel_serves_every_shape(monkeypatch) -> None:
    """A region read's bounds and offsets are the kernel's int64 arguments (`loops.Param`): the im2col of a
    second layer with other channels and sides, and a new batch size, reuse the first one's compiled kernels
    (equal values of a kind share one argument, so shapes where a pad's edge equals a multiple of the channels,
    side 6 with 3 channels, compile their own: avoided here; and so does each channel count under 8, whose
    patches' rows are written with their length, `kernels.cpu.emit.short_length`)."""
    monkeypatch.setenv("JITGRAD_QUICK_KERNELS", "0")  # counts new signatures: no background full-level code
    rng = np.random.default_rng(3)

    def conv(x, k):
        return np.sum(np.maximum(im2col_loss(x, k), 0.0))

    f = jg.trace(conv)
    x1, k1 = rng.standard_normal((2, 9, 9, 8)).astype(np.float32), rng.standard_normal((72, 4)).astype(np.float32)
    first = f.value_and_grad(x1, k1, argnums=(0, 1))
    before = compiler.stats()
    for n, side, c in [(3, 11, 9), (2, 16, 12), (2, 10, 8)]:
        x, k = rng.standard_normal((n, side, side, c)).astype(np.float32), rng.standard_normal((9 * c, 4)).astype(
            np.float32)
        value, (gx, gk) = f.value_and_grad(x, k, argnums=(0, 1))
        xt, kt = (torch.tensor(a, requires_grad=True) for a in (x, k))
        yt = torch.relu(torch.nn.functional.conv2d(xt.permute(0, 3, 1, 2), kt.reshape(3, 3, c, 4).permute(3, 2, 0, 1),
                                                   padding=1).permute(0, 2, 3, 1).reshape(-1, 4))
        torch.relu((yt * yt).mean()).backward()
        np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gk, kt.grad.numpy(), rtol=1e-4, atol=1e-6)
    after = compiler.stats()
    assert first[0] > 0 and after["sources"] == before["sources"] and after["signatures"] == before["signatures"]


def test_a_region_read_on_outer_axes_tests_its_cases_once_per_row() -> None:
    """An elementwise kernel whose one region read chooses by positions on outer axes loops over the last axis
    inside each case (`kernels.cpu.emit.emit_unswitched`), nested pads too: an im2col copies rows of channels.
    Two region reads side by side on both axes (a sum of pads) test every point; one choosing along the last
    axis splits that loop into segments (`kernels.cpu.split`). numpy's values either way."""
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    n, h, w, c = x.shape

    def patches(x):
        p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        return np.concatenate([p[:, dy:dy + h, dx:dx + w, :].reshape(n, h, w, 1, c)
                               for dy in range(3) for dx in range(3)], axis=3) * 2.0

    def source(fn, *inputs) -> str:
        text = jg.trace(fn).explain(*inputs)
        start = text.index("# call kernel 0 source")
        return text[start:text.index("return 0", start)]

    rows = source(patches, x)
    assert rows.count("for i4 in range(3):") == 18 and rows.index("if i3 < p") < rows.index("for i4 in"), rows
    assert np.array_equal(jg.trace(patches)(x), patches(x))
    side_by_side = lambda x: np.exp(np.pad(x, 1)) + np.pad(x, ((2, 0), (0, 2)))  # noqa: E731
    points = source(side_by_side, X)
    assert points.count("for i1 in range(n1):") == 1 and points.index("for i1 in") < points.index("if "), points
    along_last = lambda x: np.exp(np.pad(x, ((0, 0), (1, 2))))  # noqa: E731
    last = source(along_last, X)
    assert last.count("for i1 in range(") == 3 and "if " not in last, last
    for fn in (side_by_side, along_last):
        np.testing.assert_allclose(jg.trace(fn)(X), fn(X), rtol=1e-6)


@pytest.mark.parametrize("before, after", [((1, 1), (2, 0)), ((5, 0), (0, 5)), ((0, 0), (3, 1))])
def test_region_reads_side_by_side_on_middle_axes_resolve_their_longest_block(monkeypatch, before, after) -> None:
    """Pads and a concatenate side by side, bounded on the two middle axes only: the block of each axis' longest
    segment between their bounds (the interior, or a wide pad's fill where that is longer) runs a copy of the last
    axis' loop with every case resolved, the other points test theirs (`kernels.cpu.split.main_block`): the same
    bits as testing every point, and numpy's values."""
    x = RNG.standard_normal((2, 5, 6, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 3 + sum(before), 6 + sum(after), 4)).astype(np.float32)

    def fn(x, y):
        pads = ((0, 0), before, after, (0, 0))
        shifted = np.pad(x, ((0, 0), before[::-1], after[::-1], (0, 0)))
        stacked = np.concatenate([np.pad(x, ((0, 0), (0, 0), after, (0, 0)))[:, :2], y], axis=1)
        return np.exp(np.pad(x, pads)) + shifted * 2.0 + stacked

    text = jg.trace(fn).explain(x, y)
    source = text[text.index("# call kernel 0 source"):]
    source = source[:source.index("return 0")]
    test = source[source.index("if "):source.index(":", source.index("if "))]
    assert source.count("for i3 in range(n3):") == 2 and "i1" in test and "i2" in test, source
    block = jg.trace(fn)(x, y)
    np.testing.assert_allclose(block, fn(x, y), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr("jitgrad.kernels.cpu.codegen.main_block", lambda body, axes, extents: None)
    assert np.asarray(block).tobytes() == np.asarray(jg.trace(fn)(x, y)).tobytes()


@pytest.mark.parametrize("cut, start", [(5, 3), (3, 5), (4, 4), (2, 0), (7, 1)])
def test_region_reads_along_the_last_axis_split_its_loop(monkeypatch, cut, start) -> None:
    """Gradients of two slices along the last axis are region reads bounded on the innermost axis; with a bias
    gradient they form a column kernel (an LSTM's gate gradient). Its column loop is written once per segment
    between the bounds, each segment reading only its case (`kernels.cpu.split`): the same bits as the loop that
    tests every case at every point, whichever order the bounds come in (overlapping, apart, equal, from 0),
    and torch's gradients."""
    rng = np.random.default_rng(cut * 10 + start)
    x = rng.standard_normal((70, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def loss(x, b):
        z = x + b
        return np.sum(np.exp(z[:, :cut])) + np.sum(z[:, start:] ** 2)

    def source() -> str:
        text = jg.trace(loss).explain(x, b)
        column = text.index("_l = np.empty((64, 256)")
        return text[text.rindex("def kernel_", 0, column):text.index("return 0", column)]

    split = jg.trace(loss).value_and_grad(x, b, argnums=(0, 1))
    column_kernel = source()
    assert column_kernel.count("for i1 in range(max(tl1, ") >= 1 and "if " not in column_kernel, column_kernel
    monkeypatch.setattr("jitgrad.kernels.cpu.columns.split_points", lambda body, axis: None)
    tested = jg.trace(loss).value_and_grad(x, b, argnums=(0, 1))
    assert "if " in source()
    for got, want in zip([split[0], *split[1]], [tested[0], *tested[1]]):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    xt, bt = (torch.tensor(a, requires_grad=True) for a in (x, b))
    zt = xt + bt
    (torch.exp(zt[:, :cut]).sum() + (zt[:, start:] ** 2).sum()).backward()
    np.testing.assert_allclose(split[1][0], xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(split[1][1], bt.grad.numpy(), rtol=1e-4, atol=1e-4)
