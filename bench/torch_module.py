"""A torch module's activation + normalisation block replaced by one jitgrad autograd Function, timed
alone and in a full training step against the same module in eager PyTorch.

    python bench/torch_module.py [--block NAME] [--batch 256] [--features 1024] [--repeats 30] [--threads N]

The model is Linear -> block -> Linear -> cross-entropy, trained by SGD. Two blocks:

- silu_rmsnorm: SiLU then RMSNorm written with torch ops, as model code often writes it; eager
  PyTorch runs each op as its own kernel, forward and backward;
- gelu_layernorm: nn.GELU(approximate="tanh") then nn.LayerNorm, which PyTorch runs as two
  native kernels each way (the hard case for jitgrad).

The jitgrad variant swaps only the block for `jg.torch.autograd_function(...)` of the same math in
numpy (one fused forward kernel, fused backward kernels). Both models start from the same
weights; the script checks they compute the same loss and gradients, then times the block's
forward+backward and the full step (zero_grad, forward, backward, SGD step), interleaving the
variants so load from elsewhere hits both alike. It prints medians and the ratio eager / jitgrad
(above 1: jitgrad is faster). Compilation is excluded (warm-up calls).
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numba
import numpy as np
import torch

import jitgrad as jg

EPS = 1e-5


def silu_rms_norm(x, weight):
    """RMSNorm(SiLU(x)) over the last axis, scaled by `weight`."""
    h = x * jg.sigmoid(x)
    return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + EPS) * weight


def silu_rms_norm_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.silu(x)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight


def gelu_layer_norm(x, weight, bias):
    """LayerNorm(GELU(x)) over the last axis, as torch's GELU(approximate="tanh") and LayerNorm compute it."""
    h = jg.gelu(x)
    centred = h - np.mean(h, axis=-1, keepdims=True)
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(variance + EPS) * weight + bias


def gelu_layer_norm_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.gelu(x, approximate="tanh")
    return torch.nn.functional.layer_norm(h, h.shape[-1:], weight, bias, EPS)


@dataclass(frozen=True)
class Block:
    """The same block twice: numpy code for jitgrad and torch code for eager PyTorch, with its parameters."""

    jitgrad: Callable
    eager: Callable[..., torch.Tensor]
    params: Callable[[int], list[torch.Tensor]]  # initial parameters for a feature count


BLOCKS = {
    "silu_rmsnorm": Block(silu_rms_norm, silu_rms_norm_torch, lambda d: [torch.empty(d).uniform_(0.5, 1.5)]),
    "gelu_layernorm": Block(gelu_layer_norm, gelu_layer_norm_torch,
                            lambda d: [torch.empty(d).uniform_(0.5, 1.5), torch.empty(d).uniform_(-0.5, 0.5)]),
}
FUNCTIONS = {name: jg.torch.autograd_function(b.jitgrad) for name, b in BLOCKS.items()}


class BlockModule(torch.nn.Module):
    """A block's parameters and the function applying it: eager torch code or a jitgrad Function."""

    def __init__(self, apply: Callable[..., torch.Tensor], params: list[torch.Tensor]):
        super().__init__()
        self.apply_block = apply
        self.params = torch.nn.ParameterList(params)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_block(x, *self.params)


@dataclass
class Setup:
    eager: torch.nn.Module
    jitgrad: torch.nn.Module
    x: torch.Tensor
    labels: torch.Tensor


def setup(block: str, batch: int, features: int, classes: int, seed: int = 0) -> Setup:
    """Linear -> block -> Linear twice with equal weights, the block eager in one and jitgrad's in the
    other, and a batch of inputs and labels."""
    torch.manual_seed(seed)
    spec = BLOCKS[block]
    eager = torch.nn.Sequential(torch.nn.Linear(features, features), BlockModule(spec.eager, spec.params(features)),
                                torch.nn.Linear(features, classes))
    jitgrad = copy.deepcopy(eager)
    jitgrad[1].apply_block = FUNCTIONS[block].apply
    return Setup(eager, jitgrad, torch.randn(batch, features), torch.randint(0, classes, (batch,)))


def check_agreement(s: Setup, rtol: float = 1e-4) -> float:
    """Loss and every parameter gradient of one step agree; returns the largest relative gradient error."""
    losses, grads = [], []
    for net in (s.eager, s.jitgrad):
        net.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(s.x), s.labels)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in net.parameters()])
    if not np.isclose(losses[0], losses[1], rtol=rtol):
        raise AssertionError(f"losses differ: eager {losses[0]} jitgrad {losses[1]}")
    worst = max(float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(a)) for a, b in zip(*grads))
    if worst > rtol:
        raise AssertionError(f"gradients differ by {worst:.2e} (normwise relative)")
    return worst


def interleaved_medians(candidates: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds per call of each candidate, timed round-robin after `warmup` untimed calls."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def block_pass(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        block.zero_grad()
        block(x).backward(grad)
    return run


def step_pass(net: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)

    def run() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), labels).backward()
        optimizer.step()
    return run


def measure(block: str, batch: int, features: int, classes: int, repeats: int,
            warmup: int = 3) -> dict[str, dict[str, float]]:
    """Medians (seconds) of the block's forward+backward and of a full training step, per variant."""
    s = setup(block, batch, features, classes)
    check_agreement(s)
    hidden = s.eager[0](s.x).detach().requires_grad_()
    grad = torch.randn_like(hidden)
    blocks = {"eager": block_pass(s.eager[1], hidden, grad), "jitgrad": block_pass(s.jitgrad[1], hidden, grad)}
    steps = {"eager": step_pass(s.eager, s.x, s.labels), "jitgrad": step_pass(s.jitgrad, s.x, s.labels)}
    return {"block forward+backward": interleaved_medians(blocks, repeats, warmup),
            "full training step": interleaved_medians(steps, repeats, warmup)}


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", choices=[*BLOCKS, "all"], default="all")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, help="threads for both torch and numba (default: each its own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)

    print(f"machine: {platform.machine()} {platform.processor()}, {os.cpu_count()} CPU(s); "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), numba {numba.__version__} "
          f"({numba.get_num_threads()} threads)")
    print(f"model Linear-block-Linear on float32[{args.batch},{args.features}], {args.classes} classes, SGD; "
          f"medians of {args.repeats}")
    print(f"{'':40s} {'eager torch':>12s} {'jitgrad':>12s} {'eager/jitgrad':>14s}")
    results = {}
    for block in BLOCKS if args.block == "all" else [args.block]:
        results[block] = measure(block, args.batch, args.features, args.classes, args.repeats)
        for what, r in results[block].items():
            print(f"{block + ' ' + what:40s} {r['eager'] * 1e3:9.3f} ms {r['jitgrad'] * 1e3:9.3f} ms "
                  f"{r['eager'] / r['jitgrad']:13.2f}x", flush=True)
    return results


if __name__ == "__main__":
    main()
