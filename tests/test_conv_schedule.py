"""The conv net's schedule (issue 33): a conv's bias and ReLU fuse with the 2x2 max-pool reading them through a
regrouping reshape (`simplify.sink_reshapes`), an im2col's patches are copied again before the weight gradient's
product instead of being kept through the backward (`remat.recopy`), and an im2col copy kernel tests which of the
nine shifts once per row of the padded axes (`kernels.cpu.emit.emit_unswitched`). Asserted on structure (kernels,
what they write, the simulated peak, the pool's bytes) and on numbers: the same bits as without each rewrite."""
from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.passes import fusion, simplify, recipes, remat
from jitgrad.passes.loops import HostStep, LoopKernel
from jitgrad.kernels.cpu import codegen as cpu_codegen

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
conv_relu_pool = importlib.import_module("models").conv_relu_pool  # the bench's conv block, as users write it

RNG = np.random.default_rng(0)


def convnet(images, k1, b1, k2, b2):
    return np.mean(conv_relu_pool(conv_relu_pool(images, k1, b1), k2, b2) ** 2)


def _inputs(batch: int, side: int, c1: int = 8, c2: int = 16) -> list[np.ndarray]:
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (RNG.standard_normal(shape) * scale).astype(np.float32)
    return [normal(batch, side, side, 3), normal(3, 3, 3, c1, scale=0.2), normal(c1, scale=0.1),
            normal(3, 3, c1, c2, scale=0.1), normal(c2, scale=0.1)]


def _value_and_grad(inputs):
    return jg.trace(convnet).value_and_grad(*inputs, argnums=(1, 2, 3, 4))


def _assert_same_bits(a, b) -> None:
    assert np.array_equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, y)


def _program(fn, inputs, wrt) -> tuple:
    plan = jg.trace(fn).plan(*inputs)
    return fusion.schedule(recipes.value_and_grad_graph(plan.graph, wrt))


def test_bias_and_relu_fuse_with_the_max_pool_through_the_reshape(monkeypatch) -> None:
    inputs = _inputs(2, 8)
    x, k1, b1 = inputs[:3]
    block = jg.trace(conv_relu_pool)
    kernels = block.plan(x, k1, b1).call().program.kernels
    reductions = [k for k in kernels if k.reduce_axes]
    assert len(reductions) == 1 and {e.prim.name for e in reductions[0].eqns} >= {"add", "maximum", "reduce_max"}
    assert not any(o.aval.shape == (2 * 8 * 8, 8) for k in kernels for o in k.outputs)  # ReLU's output not written
    np.testing.assert_array_equal(block(x, k1, b1), conv_relu_pool(x, k1, b1))
    fused = _value_and_grad(inputs)
    monkeypatch.setattr(simplify, "sink_reshapes", lambda graph: graph)
    plain = jg.trace(conv_relu_pool).plan(x, k1, b1).call().program.kernels
    assert len(plain) == len(kernels) + 1
    _assert_same_bits(fused, _value_and_grad(inputs))


def test_a_broadcast_that_the_reshape_regroups_stays_put() -> None:
    """A bias along the first axis of (N, C), viewed as (N/2, 2C): no broadcast of it in the new shape, so the
    reshape is left as it was."""
    x = RNG.standard_normal((8, 6)).astype(np.float32)
    b = RNG.standard_normal((8, 1)).astype(np.float32)
    fn = lambda x, b: np.maximum(x + b, 0).reshape(4, 12).max(axis=1)  # noqa: E731
    graph = simplify.optimize(jg.trace(fn).plan(x, b).graph)
    assert any(e.prim.name == "reshape" and e.inputs[0].aval.shape == (8, 6) for e in graph.eqns)
    np.testing.assert_array_equal(jg.trace(fn)(x, b), fn(x, b))


def test_patches_are_copied_again_for_the_weight_gradient(monkeypatch) -> None:
    inputs = _inputs(4, 16)
    monkeypatch.setattr(remat, "RECOPY_MIN_BYTES", 0)
    recopied = _program(convnet, inputs, [1, 2, 3, 4])
    copies = [k for k in recopied.kernels if not k.eqns and len(k.domain) == 5]  # the two im2cols, each twice
    assert sorted(k.domain for k in copies) == [(4, 8, 8, 9, 8)] * 2 + [(4, 16, 16, 9, 3)] * 2
    late = max(recopied.steps.index(k) for k in copies if k.domain == (4, 16, 16, 9, 3))
    reader = recopied.steps[late + 3]  # its reshape and transpose, then the weight gradient's product
    assert isinstance(reader, HostStep) and reader.eqn.prim.name == "matmul" and reader.eqn.out.aval.shape == (27, 8)
    assert all(isinstance(s, (LoopKernel, HostStep)) for s in recopied.steps)
    value_and_grad = _value_and_grad(inputs)
    monkeypatch.setattr(remat, "recopy", lambda program, regroup: program)
    kept = _program(convnet, inputs, [1, 2, 3, 4])
    assert len(kept.kernels) == len(recopied.kernels) - 2
    assert remat.peak_bytes(recopied) < remat.peak_bytes(kept)
    _assert_same_bits(value_and_grad, _value_and_grad(inputs))


def test_small_patches_are_kept() -> None:
    program = _program(convnet, _inputs(2, 8), [1, 2, 3, 4])
    assert len([k for k in program.kernels if not k.eqns and len(k.domain) == 5]) == 2


def test_peak_bytes_keeps_an_array_alive_while_a_host_view_of_it_is_read() -> None:
    """The patches' transpose, read by the weight gradient's product at the end, keeps the patches alive."""
    x = np.ones((64, 32), np.float32)
    w = np.ones((32, 8), np.float32)

    def fn(x, w):
        h = np.exp(x)
        y = np.tanh(h @ w)
        return np.sum(h.T @ y)

    program = jg.trace(fn).plan(x, w).call().program
    assert remat.peak_bytes(program) >= x.nbytes + 64 * 8 * 4  # exp(x) and tanh(h @ w) alive together


def _kernel_source(fn, *inputs, kernel: int = 0, mode: str = "call") -> str:
    """The serial kernel source `explain` shows for `fn`'s kernel number `kernel` (mode "call" or "joint")."""
    text = jg.trace(fn).explain(*inputs)
    source = text[text.index(f"# {mode} kernel {kernel} source"):]
    return source[:source.index("return 0")]


def test_im2col_tests_its_shift_once_per_row_of_the_padded_axes() -> None:
    """The shift is tested once per image and shift, the pad once per row; rows of 3 channels are written with
    their length (`emit.short_length`), rows of 16 with the length as an argument."""
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    patches = lambda x: np.stack([np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))[:, i:i + 6, j:j + 6]  # noqa: E731
                                  for i in range(3) for j in range(3)], axis=3) * 2.0
    source = _kernel_source(patches, x)
    assert source.index("for i3 in") < source.index("if i3 < p") < source.index("for i1 in"), source
    assert source.count("for i1 in range(n1):") == 9 and source.count("for i4 in range(3):") == 18, source
    np.testing.assert_array_equal(jg.trace(patches)(x), patches(x))
    wide = RNG.standard_normal((2, 6, 6, 16)).astype(np.float32)
    source = _kernel_source(patches, wide)
    assert source.count("for i4 in range(n4):") == 18 and "range(16)" not in source, source
    np.testing.assert_array_equal(jg.trace(patches)(wide), patches(wide))


def test_the_input_gradient_reads_the_images_interior_without_tests(monkeypatch) -> None:
    """The second conv's input gradient sums nine padded slices of the patches' gradient; the block of the image's
    rows and columns where all nine hold (the longest segment between their bounds on each axis) gets its own copy
    of the channel loop with no test in it (`split.main_block`), the border tests them as before: the same bits
    as the kernel testing nine bounds at every point."""
    inputs = _inputs(2, 8)
    program = _program(convnet, inputs, [1, 2, 3, 4])
    (col2im,) = [k for k in program.kernels if k.domain == (2, 6, 6, 8)]  # the padded 4x4 image's gradient
    source = cpu_codegen.generate(col2im, "k", parallel=False)
    interior = source[source.index("if p"):source.index("else:")]
    assert source.count("for i3 in range(n3):") == 2 and interior.count("if ") == 1, source
    assert interior.count(" = a0[") == 9 and " = c0" not in interior, source
    split = _value_and_grad(inputs)
    monkeypatch.setattr(cpu_codegen, "main_block", lambda body, axes, extents: None)
    assert cpu_codegen.generate(col2im, "k", parallel=False).count("for i3 in range(n3):") == 1
    _assert_same_bits(split, _value_and_grad(inputs))


def _pool_bytes(inputs) -> tuple[int, int]:
    """Bytes of the pooled buffers a warm value-and-grad keeps between calls, and its program's simulated peak."""
    f = jg.trace(convnet)
    for _ in range(2):
        f.value_and_grad(*inputs, argnums=(1, 2, 3, 4))
    (executable,) = [e for key, e in next(iter(f.plans.plans.values())).executables.items() if key[0] == "joint"]
    return executable.buffers.nbytes, remat.peak_bytes(executable.program)


def test_the_conv_nets_pool_holds_less(monkeypatch) -> None:
    """The bench's medium conv net (B32 3->16->32 32x32, here without its linear layer): 9.2 MB pooled (its
    arena packed to the values live at once) and a simulated peak of 9.2 MB, against 14.8 and 14.8 MB without
    the rewrites above."""
    inputs = _inputs(32, 32, 16, 32)
    pooled, peak = _pool_bytes(inputs)
    monkeypatch.setattr(simplify, "sink_reshapes", lambda graph: graph)
    monkeypatch.setattr(remat, "recopy", lambda program, regroup: program)
    plain_pooled, plain_peak = _pool_bytes(inputs)
    assert pooled <= 9_500_000 and pooled <= 0.8 * plain_pooled, (pooled, plain_pooled)
    assert peak <= 0.7 * plain_peak, (peak, plain_peak)
