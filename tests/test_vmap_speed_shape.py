"""The shape of the compiled per-example-gradient program of the MLP of bench/transforms.py (issue 37's target:
`jg.vmap(jg.grad(loss), in_axes=(None, 0, 0))`, B = 256, 784 -> 256 -> 10, float32), asserted on counters
(kernels, host steps, products, bytes written), never on time: the program's cost is the bytes it writes, and
the per-example gradient of the first weight, B x 784 x 256 float32 (205 MB), is the floor (a loop of grad
calls writes the same bytes, then np.stack copies them). Only scheduled (traced, optimised, fused), nothing
is compiled or run at these sizes; a small batch checks the values against a loop of grads."""
from __future__ import annotations

import numpy as np

import jitgrad as jg
from jitgrad.passes import recipes
from jitgrad.passes.loops import HostStep, LoopKernel

B, D, H, C = 256, 784, 256, 10


def mlp_loss(params: dict, x, y):
    """bench/transforms.py's loss (that module imports torch): one example, x of shape (784,), y an int label."""
    h = np.tanh(x @ params["w1"] + params["b1"])
    return -jg.log_softmax(h @ params["w2"] + params["b2"])[y]


def mlp_inputs(batch: int, rng: np.random.Generator) -> tuple[dict, np.ndarray, np.ndarray]:
    params = {"w1": rng.standard_normal((D, H), dtype=np.float32) / np.float32(np.sqrt(D)),
              "b1": rng.standard_normal(H, dtype=np.float32) * np.float32(0.1),
              "w2": rng.standard_normal((H, C), dtype=np.float32) / np.float32(np.sqrt(H)),
              "b2": np.zeros(C, np.float32)}
    return params, rng.standard_normal((batch, D), dtype=np.float32), rng.integers(0, C, batch)


def _program(batch: int = B):
    params, xs, ys = mlp_inputs(batch, np.random.default_rng(0))
    per_example = jg.vmap(jg.grad(mlp_loss), in_axes=(None, 0, 0))
    graph = jg.trace(lambda p, x, y: per_example(p, x, y)).plan(params, xs, ys).graph
    return recipes.schedule(graph)


def _nbytes(v) -> int:
    return int(np.prod(v.aval.shape, dtype=np.int64)) * np.dtype(v.aval.dtype).itemsize


def _written(step) -> list:
    return list(step.outputs) if isinstance(step, LoopKernel) else list(step.eqn.outs)


def test_the_mlp_per_example_program_is_three_products_and_five_kernels() -> None:
    program = _program()
    kernels = [s for s in program.steps if isinstance(s, LoopKernel)]
    host = [s for s in program.steps if isinstance(s, HostStep)]
    products = [s.eqn for s in host if s.eqn.prim.name == "matmul"]
    # one example's gradient has three products (forward, two in the backward); batched, each is one larger
    # (B, K) x (K, N) product with K = 784, 256 or 10, never a batch of K = 1 products (the outer products)
    assert sorted((e.inputs[0].aval.shape, e.inputs[1].aval.shape) for e in products) == sorted(
        [((B, D), (D, H)), ((B, H), (H, C)), ((B, C), (C, H))])
    assert len(kernels) == 5
    # the other host steps are views and the label's scatter, none of them a copy of a large array
    assert len(host) <= 7 and all(_nbytes(o) <= B * H * 4 for s in host for o in s.eqn.outs)


def test_the_per_example_weight_gradients_are_elementwise_kernels_writing_only_the_floor() -> None:
    program = _program()
    outer = {(B, D, H): None, (B, H, C): None}
    for s in program.steps:
        if isinstance(s, LoopKernel) and s.domain in outer:
            outer[s.domain] = s
    for domain, k in outer.items():
        # x_i (x) delta_i: one pass, one multiply per element, nothing reduced, one array written
        assert k is not None, f"no kernel over {domain}"
        assert k.reduce_axes == () and [e.prim.name for e in k.eqns] == ["mul"] and len(k.outputs) == 1
        assert k.outputs[0] in program.graph.outputs  # returned as written: no copy, no transpose
    written = sum(_nbytes(v) for s in program.steps for v in _written(s))
    floor = 4 * B * (D * H + H + H * C + C)  # the four per-example gradients, float32
    assert floor <= written <= floor + 4 * B * 4 * H  # and a few (B, H) intermediates: 1 MB beside 206 MB


def test_the_same_program_at_a_small_batch_equals_a_loop_of_grads() -> None:
    params, xs, ys = mlp_inputs(5, np.random.default_rng(1))
    got = jg.vmap(jg.grad(mlp_loss), in_axes=(None, 0, 0))(params, xs, ys)
    loop = [jg.grad(mlp_loss)(params, xs[i], ys[i]) for i in range(5)]
    for k in params:
        want = np.stack([g[k] for g in loop])
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(want))))
