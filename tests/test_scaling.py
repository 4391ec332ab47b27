"""What makes real models cheap to compile: fused groups of one structure share compiled code, the
fusion scheduler's work grows about linearly with an unrolled loop's length (a structural count, not a
timing), matrix products with a weight matrix are single GEMMs, and float32 gradients stay float32."""
from __future__ import annotations

import numpy as np

import jitgrad as jg
from jitgrad.passes import fusion, recipes
from jitgrad.front.explain import shared_kernels
from jitgrad.ir.graph import Graph
from jitgrad.ir.primitive import Kind

H, I, B = 8, 4, 3


def rnn(xs, wx, wh, b):
    h = np.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
    for t in range(xs.shape[0]):
        h = np.tanh(xs[t] @ wx + h @ wh + b)
    return np.mean(h * h)


def rnn_program(steps: int) -> fusion.Program:
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((steps, B, I)).astype(np.float32), rng.standard_normal((I, H)).astype(np.float32),
            rng.standard_normal((H, H)).astype(np.float32), np.zeros(H, np.float32))
    plan = jg.trace(rnn).plan(*args)
    return fusion.schedule(recipes.value_and_grad_graph(plan.graph, plan.differentiable([1, 2, 3])))


def test_every_step_of_an_unrolled_loop_shares_compiled_kernels() -> None:
    """Four times the steps, four times the kernels run, and at most one more compiled (the last chunk of a
    long gradient sum may have a length of its own)."""
    short, long = rnn_program(40), rnn_program(160)
    assert len(long.kernels) > 3 * len(short.kernels)
    assert len(shared_kernels(long)) <= len(shared_kernels(short)) + 1
    assert len(shared_kernels(long)) <= len(long.kernels) // 20


def test_the_scheduler_grows_about_linearly_with_the_loop() -> None:
    work = {steps: rnn_program(steps).fusion_work for steps in (25, 50, 100)}
    assert work[50] < 2.4 * work[25] and work[100] < 2.4 * work[50], work


def test_a_sum_over_many_steps_splits_into_kernels_of_one_shape() -> None:
    """The gradient of a weight used at every step is a sum of one term per step; fused kernels read at
    most fusion.MAX_INPUTS arrays, so a long loop gives several kernels of the same structure."""
    program = rnn_program(60)
    assert max(len(k.inputs) for k in program.kernels) <= fusion.MAX_INPUTS


def matmul_steps(graph: Graph) -> list:
    program = fusion.schedule(graph)
    return [s.eqn for s in program.steps if isinstance(s, fusion.HostStep) and s.eqn.prim.name == "matmul"]


def test_a_batch_times_a_weight_matrix_is_one_gemm_and_so_is_its_gradient() -> None:
    x, w = np.ones((4, 5, 6), np.float32), np.ones((6, 7), np.float32)
    plan = jg.trace(lambda x, w: np.sum(np.tanh(x @ w))).plan(x, w)
    products = matmul_steps(recipes.value_and_grad_graph(plan.graph, [0, 1]))
    assert products and all(len(e.inputs[0].aval.shape) == 2 and len(e.inputs[1].aval.shape) == 2 for e in products)
    _, (gx, gw) = jg.trace(lambda x, w: np.sum(np.tanh(x @ w))).value_and_grad(x, w, argnums=(0, 1))
    np.testing.assert_allclose(gw, np.einsum("btk,btn->kn", x, 1 - np.tanh(x @ w) ** 2), rtol=1e-5)


def test_explain_says_which_kernels_share_compiled_code() -> None:
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((12, B, I)).astype(np.float32), rng.standard_normal((I, H)).astype(np.float32),
            rng.standard_normal((H, H)).astype(np.float32), np.zeros(H, np.float32))
    text = jg.trace(rnn).explain(*args)
    assert "share one compiled kernel" in text and "distinct compiled kernel(s)" in text


def test_views_are_recomputed_not_saved() -> None:
    """A (4, 1) mean broadcast to (4, 8) is saved as the mean, not as its broadcast."""
    f = jg.trace(lambda x, y: np.sum(np.sin(x) * np.tanh(y).mean(axis=1, keepdims=True)))
    plan = f.plan(np.ones((4, 8)), np.ones((4, 8)))
    split = recipes.split_graphs(plan.graph, [0, 1])
    saved = split.forward.outputs[split.n_outputs:]
    producers = split.forward.producers()
    assert all(s not in producers or producers[s].prim.kind is not Kind.VIEW for s in saved)
    assert any(s.aval.shape == (4, 1) for s in saved)  # the mean itself
