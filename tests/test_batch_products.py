"""Products batched across an unrolled loop (`jitgrad.passes.products`): products of one shared matrix whose other
operands do not depend on each other's results run as one product, sliced for their readers, and runs of summed
products as one product of their operands concatenated. Asserted on the programs' products (how many, of which
shapes) and on numbers against the unbatched program, torch autograd and the numpy reference."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

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
    """The operand shapes of each host matmul step of `graph`'s program (batched by `fusion.schedule`), in order."""
    program = fusion.schedule(graph)
    return [(s.eqn.inputs[0].aval.shape, s.eqn.inputs[1].aval.shape) for s in program.steps
            if isinstance(s, HostStep) and s.eqn.prim.name == "matmul"]


def _vg_graph(fn, inputs, wrt):
    return recipes.value_and_grad_graph(jg.trace(fn).plan(*inputs).graph, wrt)


def test_an_lstm_runs_its_input_products_and_its_weight_gradients_as_one_each() -> None:
    graph = _vg_graph(lstm, _lstm_inputs(), (1, 2, 3))
    found = _products(graph)
    # forward: the T input products x_t @ Wx as one (T*B, I) @ (I, 4H); h_t @ Wh stays per step (each reads the
    # previous step's result). Backward: dz_t @ Wh^T per step (none for h_0, a constant); the weight gradients,
    # sum_t x_t^T dz_t and sum_t h_t^T dz_t, as one product of the x_t^T and h_t^T side by side (then stacked,
    # as the two sums share the dz_t stack) and the dz_t stacked.
    assert Counter(found) == {((T * B, I), (I, 4 * H)): 1, ((B, H), (H, 4 * H)): T, ((B, 4 * H), (4 * H, H)): T - 1,
                              ((I + H, T * B), (T * B, 4 * H)): 1}
    assert len(_products_without_batching(graph)) == T + T + (T - 1) + 2 * T
    # the x_t, stacked for the forward's product and (in the forward's order) for the gradient's, are xs viewed
    # as (T*B, I): no kernel copies them out of xs
    assert not any(graph.inputs[0] in k.inputs for k in fusion.schedule(graph).kernels)


def test_batches_and_runs_stop_at_the_byte_limit(monkeypatch) -> None:
    monkeypatch.setattr(products, "MAX_BATCHED_BYTES", 2 * B * 4 * H * 4)  # two steps of dz_t (or of x_t @ Wx)
    inputs = _lstm_inputs()
    found = _products(_vg_graph(lstm, inputs, (1, 2, 3)))
    # x_t @ Wx: batches of two, fewer than WIDE, so each its own product; the weight gradients summed in runs of
    # two steps, the fifth step's terms as they were; the two sums' runs not stacked (their result is too large).
    assert Counter(found) == {((B, I), (I, 4 * H)): T, ((B, H), (H, 4 * H)): T, ((B, 4 * H), (4 * H, H)): T - 1,
                              ((I, 2 * B), (2 * B, 4 * H)): 2, ((H, 2 * B), (2 * B, 4 * H)): 2,
                              ((I, B), (B, 4 * H)): 1, ((H, B), (B, 4 * H)): 1}
    value, grads = jg.trace(lstm).value_and_grad(*inputs, argnums=(1, 2, 3))
    monkeypatch.setattr(products, "batch", lambda g: g)
    jg.clear_caches()
    value0, grads0 = jg.trace(lstm).value_and_grad(*inputs, argnums=(1, 2, 3))
    assert value == value0
    for g, g0 in zip(grads, grads0):
        np.testing.assert_allclose(g, g0, rtol=1e-6, atol=1e-7)


def _products_without_batching(graph):
    original = products.batch
    products.batch = lambda g: g
    try:
        return _products(graph)
    finally:
        products.batch = original


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
    batched = products.batch(graph)
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
    assert _products(graph) == [((8, 5), (5, 9))]
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
    assert products.batch(graph) is graph
    assert _products(graph) == [((3, 4), (4, 4))] * 4


def test_no_batch_past_the_byte_limit(monkeypatch) -> None:
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in [(8, 5), (5, 4), (5, 3), (5, 2)]]
    graph = jg.trace(attention_projections).plan(*inputs).graph
    monkeypatch.setattr(products, "MAX_BATCHED_BYTES", 8 * (4 + 3 + 2) * 4 - 1)  # short of the three results' bytes
    assert _products(graph) == [((8, 5), (5, 4)), ((8, 5), (5, 3)), ((8, 5), (5, 2))]


def test_float64_products_batch_too() -> None:
    x, a, b, c = (RNG.standard_normal(s) for s in [(6, 5), (5, 4), (5, 3), (5, 2)])
    f = jg.trace(attention_projections)
    assert _products(f.plan(x, a, b, c).graph) == [((6, 5), (5, 9))]
    assert f(x, a, b, c) == pytest.approx(attention_projections(x, a, b, c), rel=1e-12)


def crossed(a1, b1, w, v):
    """Two groups, each batchable alone (a1 @ w with a2 @ w, b1 @ v with b2 @ v), that together make a cycle:
    a2 reads b1 @ v, b2 reads a1 @ w."""
    p, q = a1 @ w, b1 @ v
    return np.sum(np.tanh(q) @ w) + np.sum(np.tanh(p) @ v) + np.sum(p) + np.sum(q)


def test_groups_that_together_make_a_cycle_leave_the_graph_as_it_is() -> None:
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in [(2, 3), (2, 4), (3, 4), (4, 3)]]
    f = jg.trace(crossed)
    graph = f.plan(*inputs).graph
    groups = products._groups(graph, 1, set(), None)
    assert len(groups) == 2 and all([len(b) for b in products._batches(graph.eqns, g, 1)] == [2] for g in groups)
    assert products.batch_products(graph) is graph
    assert f(*inputs) == pytest.approx(crossed(*inputs), rel=1e-5)


def rnn(xs, wx, wh, v):
    """An Elman RNN whose loss reads every step's state (so the weights' gradients sum a term per step)."""
    h = np.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
    loss = 0.0
    for t in range(xs.shape[0]):
        h = np.tanh(xs[t] @ wx + h @ wh)
        loss = loss + np.sum((h @ v) ** 2)
    return loss


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2),
       st.sampled_from([np.float32, np.float64]))
def test_random_rnns_give_the_unbatched_numbers(steps, batch, features, hidden, wrt_from, dtype) -> None:
    """Any shape (a step of one, one row, one feature) and any choice of gradients: the batched graph evaluates to
    the unbatched one's numbers (the reference interpreter, no compile)."""
    rng = np.random.default_rng(steps * 1000 + batch * 100 + features * 10 + hidden)
    inputs = [rng.standard_normal(s).astype(dtype) * 0.5
              for s in [(steps, batch, features), (features, hidden), (hidden, hidden), (hidden, 2)]]
    graph = _vg_graph(rnn, inputs, tuple(range(wrt_from, 4)))
    batched = products.batch(graph)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for x, y in zip(evaluate(batched, inputs), evaluate(graph, inputs)):
        np.testing.assert_allclose(x, y, rtol=tolerance, atol=tolerance)
