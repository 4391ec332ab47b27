"""Rematerialisation (`jitgrad.passes.remat`): values a forward kernel wrote only for the backward to read
(GELU's tanh, softmax's exp, LayerNorm's centred input) are recomputed by the backward kernels. Asserted
on structure (what each kernel writes, the simulated peak of live intermediates, the kernel count) and
on numbers: the same bits as the program without recomputation, and torch's gradients."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.passes import fusion, simplify, recipes, remat
from jitgrad.passes.loops import LoopKernel

C = math.sqrt(2 / math.pi)


def mlp_loss(x, w1, b1, w2):
    h = x @ w1 + b1
    g = 0.5 * h * (1 + np.tanh(C * (h + 0.044715 * h ** 3)))
    return np.mean((g @ w2) ** 2)


def attention_loss(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / 8.0
    p = np.exp(s - np.max(s, axis=-1, keepdims=True))
    p = p / np.sum(p, axis=-1, keepdims=True)
    return np.mean((p @ v) ** 2)


def layer_norm_loss(x, w):
    mu = np.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    y = xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + 1e-5)
    return np.mean((y @ w) ** 2)


def _inputs(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"mlp": [(64, 32), (32, 128), (128,), (128, 32)], "attention": [(2, 32, 16)] * 3,
              "layer_norm": [(64, 48), (48, 48)]}[name]
    return [rng.standard_normal(s).astype(np.float32) * 0.5 for s in shapes]


LOSSES = {"mlp": mlp_loss, "attention": attention_loss, "layer_norm": layer_norm_loss}


def _programs(fn, inputs):
    """The value-and-grad program as scheduled, and the same graph grouped without recomputation."""
    plan = jg.trace(fn).plan(*inputs)
    graph = recipes.value_and_grad_graph(plan.graph, plan.differentiable(list(range(len(inputs)))))
    optimised = simplify.optimize(graph)
    return fusion.schedule(optimised), fusion._grouped(optimised, frozenset())


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_backward_recomputes_instead_of_reading_forward_values(name: str) -> None:
    chosen, plain = _programs(LOSSES[name], _inputs(name))
    assert chosen is not plain
    assert len(chosen.kernels) <= len(plain.kernels)
    assert remat.peak_bytes(chosen) < remat.peak_bytes(plain)
    written = sum(o.aval.nbytes for k in chosen.kernels for o in k.outputs)
    assert written < sum(o.aval.nbytes for k in plain.kernels for o in k.outputs)


def test_gelu_forward_kernel_writes_only_its_output() -> None:
    chosen, plain = _programs(mlp_loss, _inputs("mlp"))

    def gelu_kernel(program):
        (k,) = [s for s in program.steps if isinstance(s, LoopKernel) and any(e.prim.name == "tanh" for e in s.eqns)
                and s.domain == (64, 128) and not s.reduce_axes]
        return k
    assert len(gelu_kernel(plain).outputs) > 1  # h, tanh(...) and more kept for the backward
    assert len(gelu_kernel(chosen).outputs) == 1  # only the activation the next matmul reads


def test_copies_are_computed_where_they_are_read_never_written() -> None:
    chosen, plain = _programs(attention_loss, _inputs("attention"))
    copies = {o for e in chosen.graph.eqns for o in e.outs} - {o for e in plain.graph.eqns for o in e.outs}
    assert copies  # the scheduled graph holds recomputing copies (softmax's exp and probabilities)
    in_kernels = {o for k in chosen.kernels for e in k.eqns for o in e.outs}
    assert copies <= in_kernels
    assert not copies & {o for k in chosen.kernels for o in k.outputs}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_same_bits_as_without_recomputation_and_torchs_gradients(name: str, monkeypatch) -> None:
    inputs = _inputs(name)
    argnums = tuple(range(len(inputs)))
    value, grads = jg.trace(LOSSES[name]).value_and_grad(*inputs, argnums=argnums)
    monkeypatch.setattr(remat, "recompute_plan", lambda graph, program: None)
    plain_value, plain_grads = jg.trace(LOSSES[name]).value_and_grad(*inputs, argnums=argnums)
    assert value == plain_value
    for g, p in zip(grads, plain_grads):
        np.testing.assert_array_equal(g, p)
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    torch_fns = {"mlp": lambda x, w1, b1, w2: torch.mean(
                     (torch.nn.functional.gelu(x @ w1 + b1, approximate="tanh") @ w2) ** 2),
                 "attention": lambda q, k, v: torch.mean((torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v) ** 2),
                 "layer_norm": lambda x, w: torch.mean((torch.nn.functional.layer_norm(x, (48,), eps=1e-5) @ w) ** 2)}
    ref = torch_fns[name](*ts)
    ref.backward()
    np.testing.assert_allclose(value, ref.item(), rtol=2e-5)
    for g, t in zip(grads, ts):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-6 * float(np.abs(t.grad.numpy()).max()))


def test_peak_bytes_counts_live_intermediates() -> None:
    x = np.ones((100, 10), np.float32)
    program = jg.trace(lambda a: np.sum(np.exp(a) @ np.ones((10, 10), np.float32))).plan(x).call().program
    peak = remat.peak_bytes(program)
    assert peak >= 100 * 10 * 4  # exp(a) is alive when the matmul writes its output
    assert peak <= 3 * 100 * 10 * 4
