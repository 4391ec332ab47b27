"""Products batched across an unrolled loop (`jitgrad.passes.products`): products of one shared matrix whose other
operands do not depend on each other's results run as one product, sliced for their readers. Asserted on the
programs' products (how many, of which shapes) and on numbers against the unbatched program, torch autograd and
the numpy reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.ir.interpreter import evaluate
from jitgrad.passes import fusion, products, recipes
from jitgrad.passes.loops import HostStep

RNG = np.random.default_rng(7)
T, B, I, H = 5, 3, 4, 6


def lstm(xs, wx, wh, b):
    """The bench's LSTM (bench/models.py), as users write it: a Python loop over the time steps."""
    h = np.zeros((xs.shape[1], wh.shape[0]), np.float32)
    c = np.zeros_like(h)
    for t in range(xs.shape[0]):
        i, f, g, o = np.split(xs[t] @ wx + h @ wh + b, 4, axis=1)
        c = 1 / (1 + np.exp(-f)) * c + 1 / (1 + np.exp(-i)) * np.tanh(g)
        h = 1 / (1 + np.exp(-o)) * np.tanh(c)
    return np.mean(h * h)


def lstm_torch(xs, wx, wh, b):
    h = torch.zeros(xs.shape[1], wh.shape[0])
    c = torch.zeros_like(h)
    for t in range(xs.shape[0]):
        i, f, g, o = (xs[t] @ wx + h @ wh + b).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
    return torch.mean(h * h)


def _lstm_inputs() -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(np.float32) * 0.5 for s in [(T, B, I), (I, 4 * H), (H, 4 * H), (4 * H,)]]


def _products(graph) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The operand shapes of each host matmul step of `graph`'s program, in program order."""
    program = fusion.schedule(graph)
    return [(s.eqn.inputs[0].aval.shape, s.eqn.inputs[1].aval.shape) for s in program.steps
            if isinstance(s, HostStep) and s.eqn.prim.name == "matmul"]


def _vg_graph(fn, inputs, wrt):
    return recipes.value_and_grad_graph(jg.trace(fn).plan(*inputs).graph, wrt)


def test_an_lstm_runs_its_input_products_as_one_and_its_weight_gradients_per_step_as_one() -> None:
    graph = _vg_graph(lstm, _lstm_inputs(), (1, 2, 3))
    found = _products(graph)
    # forward: the T input products x_t @ Wx as one (T*B, I) @ (I, 4H); h_t @ Wh stays per step (each reads the
    # previous step's result). Backward: per step dz_t @ Wh^T (none for h_0, a constant), and x_t^T dz_t with
    # h_t^T dz_t (the two weight gradients' terms) as one product of their operands stacked by rows.
    assert found.count(((T * B, I), (I, 4 * H))) == 1
    assert found.count(((B, H), (H, 4 * H))) == T
    assert found.count(((B, 4 * H), (4 * H, H))) == T - 1
    assert found.count(((I + H, B), (B, 4 * H))) == T
    assert len(found) == 1 + T + (T - 1) + T
    assert len(_products_without_batching(graph)) == T + T + (T - 1) + 2 * T


def _products_without_batching(graph):
    original = products.batch_products
    products.batch_products = lambda g: g
    try:
        return _products(graph)
    finally:
        products.batch_products = original


def test_the_batched_lstm_matches_torch_and_the_unbatched_program() -> None:
    inputs = _lstm_inputs()
    value, grads = jg.trace(lstm).value_and_grad(*inputs, argnums=(1, 2, 3))
    tin = [torch.from_numpy(a) for a in inputs]
    for t in tin[1:]:
        t.requires_grad_(True)
    loss = lstm_torch(*tin)
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-5)
    for g, t in zip(grads, tin[1:]):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-6)
    graph = _vg_graph(lstm, inputs, (1, 2, 3))
    batched = products.batch_products(graph)
    assert len(batched.eqns) != len(graph.eqns)
    for x, y in zip(evaluate(batched, inputs), evaluate(graph, inputs)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def attention_projections(x, wq, wk, wv):
    """Three projections of one x: products sharing their left operand."""
    return np.sum(np.tanh(x @ wq)) + np.sum(x @ wk) * np.sum((x @ wv) ** 2)


def test_products_sharing_their_left_operand_become_one_sliced_by_columns() -> None:
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in [(8, 5), (5, 4), (5, 3), (5, 2)]]
    f = jg.trace(attention_projections)
    graph = f.plan(*inputs).graph
    assert _products(products.batch_products(graph)) == [((8, 5), (5, 9))]
    expected = attention_projections(*inputs)
    assert f(*inputs) == pytest.approx(expected, rel=1e-5)
    tin = [torch.from_numpy(a).requires_grad_(True) for a in inputs]
    x, wq, wk, wv = tin
    (torch.sum(torch.tanh(x @ wq)) + torch.sum(x @ wk) * torch.sum((x @ wv) ** 2)).backward()
    for g, t in zip(f.grad(*inputs, argnums=(0, 1, 2, 3)), tin):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-5)


def recurrence(h, w):
    """Each product reads the previous one's result: nothing to batch."""
    for _ in range(4):
        h = np.tanh(h @ w)
    return np.sum(h)


def test_products_that_read_each_others_results_keep_their_places() -> None:
    inputs = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal((4, 4)).astype(np.float32)]
    graph = jg.trace(recurrence).plan(*inputs).graph
    assert products.batch_products(graph) is graph
    assert _products(graph) == [((3, 4), (4, 4))] * 4


def test_no_batch_past_the_byte_limit(monkeypatch) -> None:
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in [(8, 5), (5, 4), (5, 3), (5, 2)]]
    graph = jg.trace(attention_projections).plan(*inputs).graph
    monkeypatch.setattr(products, "MAX_BATCHED_BYTES", 8 * (4 + 3) * 4)  # the first two results' bytes
    assert _products(products.batch_products(graph)) == [((8, 5), (5, 7)), ((8, 5), (5, 2))]


def test_float64_products_batch_too() -> None:
    x, a, b = RNG.standard_normal((6, 5)), RNG.standard_normal((5, 4)), RNG.standard_normal((5, 3))
    f = jg.trace(lambda x, a, b: np.sum(np.sin(x @ a)) + np.sum(x @ b))
    assert _products(products.batch_products(f.plan(x, a, b).graph)) == [((6, 5), (5, 7))]
    assert f(x, a, b) == pytest.approx(np.sum(np.sin(x @ a)) + np.sum(x @ b), rel=1e-12)


def crossed(a1, b1, w, v):
    """Two groups, each batchable alone (a1 @ w with a2 @ w, b1 @ v with b2 @ v), that together make a cycle:
    a2 reads b1 @ v, b2 reads a1 @ w."""
    p, q = a1 @ w, b1 @ v
    return np.sum(np.tanh(q) @ w) + np.sum(np.tanh(p) @ v) + np.sum(p) + np.sum(q)


def test_groups_that_together_make_a_cycle_leave_the_graph_as_it_is() -> None:
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in [(2, 3), (2, 4), (3, 4), (4, 3)]]
    f = jg.trace(crossed)
    graph = f.plan(*inputs).graph
    groups = products._groups(graph, 1, set())
    assert len(groups) == 2 and all(len(products._independent(graph.eqns, g, 1)) == 2 for g in groups)
    assert products.batch_products(graph) is graph
    assert f(*inputs) == pytest.approx(crossed(*inputs), rel=1e-5)
