"""Real models (issue 14): a transformer block, an LSTM and a conv net, as a user writes them.

Each model is plain numpy (weights as positional array arguments, differentiated by jitgrad) and the
same math in PyTorch, run eagerly and through torch.compile; float32, value-and-grad with respect to
every weight. `run_section` (called by bench/run.py) measures, per model and size:

- median and 99th-percentile ms per call, one call per sample, interleaved round-robin with
  bench/run.py's helpers, and each candidate's loss and gradients checked against eager PyTorch;
  and, at the small size, the same row in the other modes (bench/variants.py): beside a busy
  neighbour process, and in a child process that imports torch and jitgrad the other way round;
- the cold first call of jitgrad and of torch.compile, each in a fresh process with empty caches;
- the memory of one training step for jitgrad and eager PyTorch, in a fresh process;

and two structural measurements: the time jitgrad takes before numba compiles anything (trace,
differentiate, optimise, fuse) for a tanh-RNN unrolled T = 20/100/200, and 1000 consecutive steps
of a B = 256 MLP layer in a process that also uses torch (median, p99 and their ratio).

The measurements that need a fresh process run this file as a child:

    python bench/models.py --child cold-jitgrad --model transformer --sizes small

which prints one JSON line; it imports torch and jitgrad in the order JITGRAD_BENCH_IMPORT_ORDER
names (torch-first if unset). bench/ must be importable (`workloads`, `run`, `variants`): it is on
sys.path of run.py and of the child as the scripts' folder; tests insert it.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import run as runner
import variants

variants.import_first(variants.requested_order())  # torch or jitgrad before anything imports them

import numpy as np
import workloads as wl
import jitgrad as jg
import torch
import torch.nn.functional as F
from jitgrad import cache
from jitgrad.passes import fusion, simplify
from jitgrad.passes.autodiff import joint_vjp_graph, with_unit_cotangent
from jitgrad.kernels.build import collector, compiler

DTYPE = np.float32
HEADS = 4
LN_EPS = 1e-5
GELU_C = math.sqrt(2 / math.pi)
CLASSES = 10
MODEL_ROUNDS = 100         # per-call samples per candidate and row (default run)
QUICK_ROUNDS = 10
MODEL_ROW_SECONDS = 5.0    # at most this long per candidate and row, so the medium sizes get fewer rounds
RNN_STEPS = (20, 100, 200)
RNN_SIZE = {"B": 32, "I": 16, "H": 64}
MLP_BATCH = 256
MLP_STEPS = 1000
QUICK_MLP_STEPS = 200
BLAS_CHECK_SHAPE = (64, 512, 512)  # numpy GEMM timed at the start and end of the section


@dataclass(frozen=True)
class Size:
    """One size of a model: a name (small, medium, tiny), a label for the tables and the dimensions."""

    name: str
    label: str
    dims: tuple[tuple[str, int], ...]

    def __getitem__(self, key: str) -> int:
        return dict(self.dims)[key]


def size(name: str, label: str = "", **dims: int) -> Size:
    """A Size; the label defaults to the dimensions ("T20 B32 I16 H64")."""
    return Size(name, label or " ".join(f"{k}{v}" for k, v in dims.items()), tuple(dims.items()))


def transformer_size(name: str, batch: int, steps: int, dim: int) -> Size:
    return size(name, f"B{batch} T{steps} D{dim} H{HEADS}", B=batch, T=steps, D=dim)


def conv_size(name: str, batch: int, side: int, c1: int, c2: int) -> Size:
    return size(name, f"B{batch} 3→{c1}→{c2} ch {side}×{side}", B=batch, S=side, C1=c1, C2=c2)


def normal(rng: np.random.Generator, shape: Sequence[int], scale: float = 1.0) -> np.ndarray:
    """float32 N(0, scale^2) samples."""
    return rng.standard_normal(tuple(shape), dtype=DTYPE) * np.float32(scale)


# ---------------------------------------------------------------- transformer block

def layer_norm(x, gain, bias):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + LN_EPS) * gain + bias


def softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gelu(x):
    """GELU, tanh approximation."""
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


def transformer_numpy(x, ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2):
    """Pre-LN block: causal multi-head self-attention and a GELU MLP, each with a residual; mean(out^2)."""
    batch, steps, dim = x.shape
    head = dim // HEADS
    h = layer_norm(x, ln1_g, ln1_b)
    q, k, v = ((h @ w).reshape(batch, steps, HEADS, head).transpose(0, 2, 1, 3) for w in (wq, wk, wv))
    scores = q @ k.transpose(0, 1, 3, 2) * (1 / math.sqrt(head))
    scores = np.where(np.triu(np.ones((steps, steps), bool), 1), -np.inf, scores)
    y = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, steps, dim)
    x = x + y @ wo
    x = x + gelu(layer_norm(x, ln2_g, ln2_b) @ w1 + b1) @ w2 + b2
    return np.mean(x * x)


def transformer_torch(x, ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2):
    batch, steps, dim = x.shape
    head = dim // HEADS
    h = F.layer_norm(x, (dim,), ln1_g, ln1_b, LN_EPS)
    q, k, v = ((h @ w).view(batch, steps, HEADS, head).transpose(1, 2) for w in (wq, wk, wv))
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(head))
    mask = torch.ones(steps, steps, dtype=torch.bool).triu(1)
    attention = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    y = (attention @ v).transpose(1, 2).reshape(batch, steps, dim)
    x = x + y @ wo
    x = x + F.gelu(F.layer_norm(x, (dim,), ln2_g, ln2_b, LN_EPS) @ w1 + b1, approximate="tanh") @ w2 + b2
    return torch.mean(x * x)


def transformer_inputs(s: Size, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x (B, T, D), then the weights: LayerNorm gains/biases, Wq Wk Wv Wo (D, D), MLP (D, 4D), (4D, D)."""
    b, t, d = s["B"], s["T"], s["D"]
    proj = [normal(rng, (d, d), d ** -0.5) for _ in range(4)]
    return (normal(rng, (b, t, d)), 1 + normal(rng, (d,), 0.1), normal(rng, (d,), 0.1), *proj,
            1 + normal(rng, (d,), 0.1), normal(rng, (d,), 0.1),
            normal(rng, (d, 4 * d), d ** -0.5), normal(rng, (4 * d,), 0.1),
            normal(rng, (4 * d, d), (4 * d) ** -0.5), normal(rng, (d,), 0.1))


# ---------------------------------------------------------------- LSTM

def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def lstm_numpy(xs, wx, wh, b):
    """An LSTM unrolled by a Python loop over xs (T, B, I); gates i, f, g, o; mean(h_T^2)."""
    steps, batch, _ = xs.shape
    hidden = wh.shape[0]
    h = np.zeros((batch, hidden), DTYPE)
    c = np.zeros((batch, hidden), DTYPE)
    for t in range(steps):
        i, f, g, o = np.split(xs[t] @ wx + h @ wh + b, 4, axis=1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
    return np.mean(h * h)


def lstm_torch(xs, wx, wh, b):
    steps, batch, _ = xs.shape
    hidden = wh.shape[0]
    h = torch.zeros(batch, hidden)
    c = torch.zeros(batch, hidden)
    for t in range(steps):
        i, f, g, o = (xs[t] @ wx + h @ wh + b).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
    return torch.mean(h * h)


def lstm_inputs(s: Size, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """xs (T, B, I), then Wx (I, 4H), Wh (H, 4H), b (4H,)."""
    t, b, i, h = s["T"], s["B"], s["I"], s["H"]
    return normal(rng, (t, b, i)), normal(rng, (i, 4 * h), i ** -0.5), normal(rng, (h, 4 * h), h ** -0.5), \
        normal(rng, (4 * h,), 0.1)


# ---------------------------------------------------------------- conv net

def conv_relu_pool(x, kernel, bias):
    """3x3 'same' convolution by im2col (nine shifted views stacked, one matmul), ReLU, 2x2 max-pool; NHWC."""
    batch, height, width, channels = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    patches = np.stack([padded[:, i:i + height, j:j + width, :] for i in range(3) for j in range(3)], axis=3)
    y = patches.reshape(batch * height * width, 9 * channels) @ kernel.reshape(9 * channels, -1) + bias
    return np.maximum(y, 0).reshape(batch, height // 2, 2, width // 2, 2, -1).max(axis=(2, 4))


def convnet_numpy(images, labels, k1, b1, k2, b2, w, b):
    """Two conv blocks, a linear layer, softmax cross-entropy against int labels."""
    h = conv_relu_pool(conv_relu_pool(images, k1, b1), k2, b2)
    logits = h.reshape(h.shape[0], -1) @ w + b
    peak = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - peak).sum(axis=1)) + peak[:, 0]
    return np.mean(lse - logits[np.arange(logits.shape[0]), labels])


def convnet_torch(images, labels, k1, b1, k2, b2, w, b):
    """The same arrays: NHWC images are channels-last NCHW views, HWIO kernels permuted to OIHW."""
    x = images.permute(0, 3, 1, 2)
    for kernel, bias in ((k1, b1), (k2, b2)):
        x = F.max_pool2d(F.relu(F.conv2d(x, kernel.permute(3, 2, 0, 1), bias, padding=1)), 2)
    logits = x.permute(0, 2, 3, 1).flatten(1) @ w + b
    return F.cross_entropy(logits, labels)


def convnet_inputs(s: Size, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """images (B, S, S, 3), int64 labels (B,), then kernels (3, 3, Cin, Cout) with biases, linear (S/4 S/4 C2, 10)."""
    b, side, c1, c2 = s["B"], s["S"], s["C1"], s["C2"]
    features = (side // 4) ** 2 * c2
    return (normal(rng, (b, side, side, 3)), rng.integers(0, CLASSES, b, dtype=np.int64),
            normal(rng, (3, 3, 3, c1), 27 ** -0.5), normal(rng, (c1,), 0.1),
            normal(rng, (3, 3, c1, c2), (9 * c1) ** -0.5), normal(rng, (c2,), 0.1),
            normal(rng, (features, CLASSES), features ** -0.5), normal(rng, (CLASSES,), 0.1))


# ---------------------------------------------------------------- the models

@dataclass(frozen=True)
class Model:
    """One model for every candidate; shaped like a bench/workloads.py Workload where the candidates
    and run.py's helpers read it (name, wrt, jitgrad_fn, torch_fn, make_inputs, size_label)."""

    name: str
    title: str
    sizes: tuple[Size, ...]  # small, medium
    tiny: Size               # for the smoke test
    wrt: tuple[int, ...]
    make_inputs: Callable[[Size, np.random.Generator], tuple[np.ndarray, ...]]
    jitgrad_fn: Callable[..., Any]
    torch_fn: Callable[..., Any]

    def size_label(self, s: Size) -> str:
        return s.label

    def size(self, name: str) -> Size:
        return next(s for s in self.sizes + (self.tiny,) if s.name == name)


MODELS: dict[str, Model] = {m.name: m for m in [
    Model("transformer", "transformer block (pre-LN, causal 4-head attention, GELU MLP)",
          (transformer_size("small", 4, 64, 128), transformer_size("medium", 8, 128, 256)),
          transformer_size("tiny", 2, 8, 16),
          tuple(range(1, 13)), transformer_inputs, transformer_numpy, transformer_torch),
    Model("lstm", "LSTM unrolled by a Python loop, loss on the last hidden state",
          (size("small", T=20, B=32, I=16, H=64), size("medium", T=20, B=64, I=128, H=256)),
          size("tiny", T=3, B=4, I=5, H=6), (1, 2, 3), lstm_inputs, lstm_numpy, lstm_torch),
    Model("conv", "conv net: 2 x (3x3 conv by im2col, ReLU, 2x2 max-pool) + linear + cross-entropy",
          (conv_size("small", 16, 16, 8, 16), conv_size("medium", 32, 32, 16, 32)), conv_size("tiny", 2, 8, 4, 4),
          (2, 3, 4, 5, 6, 7), convnet_inputs, convnet_numpy, convnet_torch),
]}
PARTS = (*MODELS, "rnn", "mlp")  # what --models may choose


def candidates(with_compile: bool) -> list[wl.Candidate]:
    """jitgrad, eager PyTorch (the reference) and torch.compile; no numpy-by-hand for the models."""
    return [c for c in wl.candidates(with_compile) if c.name != "numpy"]


def chosen_models(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The models a comma-separated --models names, or the parser's usage error naming those that are none."""
    chosen = [m for m in text.split(",") if m]
    unknown = [m for m in chosen if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    return chosen


def two_states_row(label: str, samples: dict[tuple[str, str], list[float]], states: tuple[str, str],
                   first_over_second: bool) -> str:
    """A model's row from seconds per call keyed (state, candidate): per candidate `name median (p99) -> median
    (p99) xR` in ms, the first state's then the second's, R the ratio of the medians, first / second or second /
    first (bench/openmp_spin.py, bench/beside.py)."""
    cells = []
    for name in dict.fromkeys(n for _, n in samples):
        ms = [float(np.median(samples[(s, name)])) * 1e3 for s in states]
        p99 = [float(np.percentile(samples[(s, name)], 99)) * 1e3 for s in states]
        ratio = ms[0] / ms[1] if first_over_second else ms[1] / ms[0]
        cells.append(f"{name} {ms[0]:.3f} ({p99[0]:.2f}) -> {ms[1]:.3f} ({p99[1]:.2f}) x{ratio:.2f}")
    return f"{label:12s} " + " | ".join(cells)


# ---------------------------------------------------------------- interleaved timing

@dataclass
class TimingRow:
    """One model and size: run.py's cells (median, first call, check) and each candidate's p99."""

    model: str
    size: str
    mode: str  # variants.mode_label: the process's import order, and whether a busy neighbour ran
    rounds: int
    cells: dict[str, Any]
    p99_ms: dict[str, float]
    background_s: float  # the wait after the first calls for jitgrad's background compiles, before any timing

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> TimingRow:
        """The row `dataclasses.asdict` gave (a child's JSON)."""
        return cls(**{**found, "cells": {n: runner.Cell(**c) for n, c in found["cells"].items()}})


def measure_model(model: Model, s: Size, cands: list[wl.Candidate], rounds: int, busy: bool = False) -> TimingRow:
    """First calls, checks against eager PyTorch, then per-call samples interleaved round-robin; all of it
    beside a busy neighbour (`variants.busy_neighbour`) if `busy`."""
    gc.collect()
    inputs = model.make_inputs(s, np.random.default_rng(0))
    cells = {c.name: runner.Cell() for c in cands}
    with variants.busy_neighbour(busy) as neighbour:
        runs, results = runner.first_calls(model, s, wl.VALUE_AND_GRAD, inputs, cands, cells)
        runner.check_against_eager(model, wl.VALUE_AND_GRAD, results, cells)
        del results
        background = runner.settle_jitgrad(runs)  # quick kernels' full-level code, parallel variants: timed apart
        done = runner.time_round_robin(runs, cells, rounds, sample_seconds=0.0, row_seconds=MODEL_ROW_SECONDS)
        if neighbour is not None and neighbour.poll() is not None:
            raise RuntimeError(f"the busy neighbour of {model.name} {s.label} stopped (rc {neighbour.returncode})")
    p99 = {n: float(np.percentile(c.samples, 99)) * 1e3 for n, c in cells.items() if c.samples}
    mode = variants.mode_label(variants.observed_order(), busy)
    return TimingRow(model.name, s.label, mode, done, cells, p99, background)


# ---------------------------------------------------------------- before numba: trace -> fuse

def pipeline_stages(fn: Callable[..., Any], inputs: Sequence[np.ndarray], wrt: Sequence[int]) -> dict[str, float]:
    """Seconds of each stage jitgrad runs before numba compiles, built as `Traced.value_and_grad` builds
    its program (trace, joint VJP with unit cotangent, simplify.optimize, fusion.schedule, with the garbage
    collector paused as there), and the sizes."""
    traced = jg.trace(fn)
    with collector.pause:  # as `Plan.built` and the trace pause it around these stages
        t0 = time.perf_counter()
        plan = traced.plan(*inputs)
        t1 = time.perf_counter()
        joint = with_unit_cotangent(joint_vjp_graph(plan.graph, plan.differentiable(list(wrt))),
                                    len(plan.graph.inputs))
        t2 = time.perf_counter()
        optimised = simplify.optimize(joint)
        t3 = time.perf_counter()
        program = fusion.schedule(optimised)
        t4 = time.perf_counter()
    t5 = time.perf_counter()  # after the collector's closing youngest-generation pass
    kernels = len(program.kernels)
    return {"trace_s": t1 - t0, "autodiff_s": t2 - t1, "optimize_s": t3 - t2, "fusion_s": t4 - t3,
            "total_s": t5 - t0, "traced_eqns": len(plan.graph.eqns), "joint_eqns": len(joint.eqns),
            "optimized_eqns": len(optimised.eqns), "kernels": kernels, "host_steps": len(program.steps) - kernels}


def rnn_numpy(xs, wx, wh, b):
    """tanh-RNN unrolled by a Python loop: h = tanh(x_t @ Wx + h @ Wh + b); mean(h_T^2)."""
    h = np.zeros((xs.shape[1], wh.shape[0]), DTYPE)
    for t in range(xs.shape[0]):
        h = np.tanh(xs[t] @ wx + h @ wh + b)
    return np.mean(h * h)


def rnn_inputs(steps: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    b, i, h = RNN_SIZE["B"], RNN_SIZE["I"], RNN_SIZE["H"]
    return normal(rng, (steps, b, i)), normal(rng, (i, h), i ** -0.5), normal(rng, (h, h), h ** -0.5), \
        normal(rng, (h,), 0.1)


def rnn_pipeline(steps: Sequence[int]) -> list[dict[str, float]]:
    """`pipeline_stages` of the tanh-RNN at each T (value-and-grad wrt Wx, Wh, b)."""
    found = []
    for t in steps:
        stages = pipeline_stages(rnn_numpy, rnn_inputs(t, np.random.default_rng(0)), (1, 2, 3))
        found.append({"T": t, **stages})
        print(f"tanh-RNN T={t}: trace→fuse {stages['total_s']:.2f} s", flush=True)
    return found


def set_openblas_threads(n: int) -> None:
    """Threads of every loaded OpenBLAS (numpy's among them), as `workloads.configure_threads` sets them."""
    for lib in wl._openblas_libraries():
        setter = wl._openblas_symbol(lib, "set_num_threads")
        if setter is not None:
            setter(ctypes.c_int(n))


def blas_check(threads: int, seconds: float = 0.5) -> dict[int, float]:
    """Median ms of numpy's float32 (64, 512) @ (512, 512) with `threads` OpenBLAS threads and with one. On a
    loaded machine a multi-threaded call can wait a scheduler slice for its second thread, which is then
    most of every jitgrad row (its matmuls run on numpy's BLAS); this says whether that happened."""
    rng = np.random.default_rng(0)
    a, b = normal(rng, BLAS_CHECK_SHAPE[:2]), normal(rng, BLAS_CHECK_SHAPE[1:])
    found = {}
    for n in dict.fromkeys((threads, 1)):
        set_openblas_threads(n)
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        found[n] = float(np.median(times)) * 1e3
    set_openblas_threads(threads)
    return found


# ---------------------------------------------------------------- fresh-process measurements

def vm_kib(field_name: str) -> int:
    """VmRSS / VmHWM of this process from /proc/self/status, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def release_free_memory() -> None:
    """Return every free page of glibc's heaps to the OS (malloc_trim), so that memory a later call
    reuses from the allocator's free lists is counted when it is touched again."""
    ctypes.CDLL(None).malloc_trim(0)


def resident_kib() -> int:
    """Resident memory after a full collection and `release_free_memory`, in KiB."""
    gc.collect()
    release_free_memory()
    return vm_kib("VmRSS")


def step_memory(run: Callable[[], Any]) -> int:
    """Bytes by which resident memory peaks above its level before one call of `run` (results kept to
    the end of the call). Resets the high-water mark through /proc/self/clear_refs (Linux >= 4.0)."""
    before = resident_kib()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    out = run()
    peak = vm_kib("VmHWM")
    del out
    return (peak - before) * 1024


def warm(run: Callable[[], Any], calls: int = 10) -> None:
    """Calls past every first-call effect: compiles, jitgrad's serial/parallel choice, buffer pools."""
    for _ in range(calls):
        run()
    compiler.wait_for_background_compiles()
    for _ in range(calls):
        run()


def child_cold_jitgrad(model: Model, s: Size) -> dict[str, Any]:
    """First value-and-grad in this process (the caller gives it empty caches: it runs on numpy while the
    kernels compile, `jitgrad.kernels.cpu.first_call`), the second right after it (it waits for those compiles and runs
    them), then what it compiled, the wait for background (parallel) compiles, and the stages before numba
    timed on their own."""
    inputs = model.make_inputs(s, np.random.default_rng(0))
    f = jg.trace(model.jitgrad_fn)
    start = time.perf_counter()
    f.value_and_grad(*inputs, argnums=model.wrt)
    first = time.perf_counter() - start
    f.value_and_grad(*inputs, argnums=model.wrt)
    second = time.perf_counter() - start - first
    compiler.wait_for_background_compiles()
    background = time.perf_counter() - start - first - second
    stats = compiler.stats()
    return {"first_call_s": first, "second_call_s": second, "background_s": background, "sources": stats["sources"],
            "numba_compiles": stats["numba_compiles"], "pipeline": pipeline_stages(model.jitgrad_fn, inputs, model.wrt)}


def child_cold_compile(model: Model, s: Size) -> dict[str, Any]:
    """First torch.compile value-and-grad in this process (the caller disables inductor's caches)."""
    inputs = model.make_inputs(s, np.random.default_rng(0))
    start = time.perf_counter()
    wl.TorchCompile().prepare(model, wl.VALUE_AND_GRAD, inputs)()
    return {"first_call_s": time.perf_counter() - start}


def jitgrad_memory(model: Model, inputs: Sequence[np.ndarray]) -> tuple[int, int]:
    """(peak of one warm jitgrad step above the resident memory before it, the bytes jitgrad holds between
    steps: what `jg.clear_caches` releases, i.e. plans and the pooled buffers the next call reuses)."""
    run = wl.Jitgrad().prepare(model, wl.VALUE_AND_GRAD, inputs)
    warm(run)
    transient = step_memory(run)
    before = resident_kib()
    jg.clear_caches()
    return transient, (before - resident_kib()) * 1024


def child_memory(model: Model, sizes: Sequence[Size]) -> dict[str, Any]:
    """Per size: `jitgrad_memory`, and the peak of one warm eager PyTorch step above the level before it."""
    found = {}
    for s in sizes:
        inputs = model.make_inputs(s, np.random.default_rng(0))
        transient, held = jitgrad_memory(model, inputs)
        eager = wl.TorchEager().prepare(model, wl.VALUE_AND_GRAD, inputs)
        warm(eager, 3)
        found[s.name] = {"jitgrad_transient": transient, "jitgrad_held": held, "eager": step_memory(eager)}
    return found


def child_mlp_steps(steps: int) -> dict[str, Any]:
    """`steps` consecutive jitgrad value-and-grad calls of W2 at B = 256, timed one by one (gc paused), in a
    process that set torch's threads and ran one eager torch step of the same layer just before."""
    workload = wl.WORKLOADS["W2"]
    inputs = workload.make_inputs(MLP_BATCH, np.random.default_rng(0))
    run = wl.Jitgrad().prepare(workload, wl.VALUE_AND_GRAD, inputs)
    warm(run)
    wl.TorchEager().prepare(workload, wl.VALUE_AND_GRAD, inputs)()
    times = []
    gc.disable()
    try:
        for _ in range(steps):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    ms = np.array(times) * 1e3
    median = float(np.median(ms))
    return {"steps": steps, "median_ms": median, "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "slow_steps": int(np.sum(ms > 2 * median))}


def child_timing(chosen: Sequence[Model], size_name: str, rounds: int, with_compile: bool) -> dict[str, Any]:
    """`measure_model` of each model at one size, quiet and then beside a busy neighbour, as JSON rows."""
    cands = candidates(with_compile)
    rows = [measure_model(m, m.size(size_name), cands, rounds, busy) for m in chosen for busy in (False, True)]
    return {"rows": [dataclasses.asdict(row) for row in rows]}


def run_child(kind: str, extra: Sequence[str], threads: int, env: dict[str, str]) -> dict[str, Any]:
    """Run `python bench/models.py --child kind ...` in a fresh process; its JSON, or {"error": ...}. The child
    imports torch and jitgrad in this process's order unless `env` sets variants.IMPORT_ORDER_ENV."""
    command = [sys.executable, os.path.abspath(__file__), "--child", kind, "--threads", str(threads), *extra]
    env = {variants.IMPORT_ORDER_ENV: variants.requested_order(), **env}
    proc = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"  child {kind} {' '.join(extra)} failed (rc {proc.returncode}): {tail[0]}", file=sys.stderr)
        return {"error": f"failed (rc {proc.returncode})"}
    found = json.loads(lines[-1])
    imported = found.pop("import_order")
    if imported != env[variants.IMPORT_ORDER_ENV]:
        raise RuntimeError(f"child {kind} imported {imported}, not {env[variants.IMPORT_ORDER_ENV]}")
    return found


@dataclass
class ColdStart:
    """Cold first calls of one model at its small size, each in a fresh process with empty caches."""

    jitgrad: dict[str, Any]
    compile: dict[str, Any] | None


def cold_start(model: Model, s: Size, threads: int, with_compile: bool) -> ColdStart:
    """jitgrad with empty kernel caches (the kernels it compiled are then copied into this process's cache,
    so the interleaved rows start warm), torch.compile with inductor's caches disabled and emptied."""
    folder = tempfile.mkdtemp(prefix="jitgrad-cold-")
    try:
        kernels = os.path.join(folder, "jitgrad")
        jit = run_child("cold-jitgrad", ["--model", model.name, "--sizes", s.name], threads,
                        {"JITGRAD_CACHE_DIR": kernels, "NUMBA_CACHE_DIR": os.path.join(folder, "numba")})
        if os.path.isdir(kernels) and cache.enabled():
            shutil.copytree(kernels, cache.base_dir(), dirs_exist_ok=True)
        comp = None
        if with_compile:
            comp = run_child("cold-compile", ["--model", model.name, "--sizes", s.name], threads,
                             {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
                              "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")})
        return ColdStart(jit, comp)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def memory(model: Model, sizes: Sequence[Size], threads: int) -> dict[str, Any]:
    """`child_memory` in a fresh process (no other model's kernels, buffers or heap in it)."""
    return run_child("memory", ["--model", model.name, "--sizes", ",".join(s.name for s in sizes)], threads, {})


# ---------------------------------------------------------------- the section

@dataclass
class ModelResults:
    """Everything the model section measured, ready to print."""

    timing: list[TimingRow] = field(default_factory=list)
    cold: dict[str, tuple[str, ColdStart]] = field(default_factory=dict)  # model -> (size label, cold)
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)        # model -> child_memory's result
    rnn: list[dict[str, float]] = field(default_factory=list)
    mlp: dict[str, Any] | None = None
    blas: list[dict[int, float]] = field(default_factory=list)  # blas_check at the start and at the end
    names: list[str] = field(default_factory=list)
    seconds: float = 0.0


def print_row(row: TimingRow) -> None:
    """A progress line: each candidate's median and p99."""
    print(f"{row.model} {row.size} [{row.mode}]: " + ", ".join(
        f"{n} {c.failure or f'{c.median_ms:.3g} ms (p99 {row.p99_ms[n]:.3g})'}" for n, c in row.cells.items()),
        flush=True)


def other_order_rows(names: Sequence[str], rounds: int, threads: int, with_compile: bool) -> list[TimingRow]:
    """The small rows of the models `names`, quiet and beside a busy neighbour, measured by a child process
    that imports torch and jitgrad in the other order than this one."""
    other = next(o for o in variants.IMPORT_ORDERS if o != variants.requested_order())
    extra = ["--model", ",".join(names), "--sizes", "small", "--rounds", str(rounds)]
    found = run_child("timing", extra + ([] if with_compile else ["--no-compile"]), threads,
                      {variants.IMPORT_ORDER_ENV: other})
    rows = [TimingRow.from_json(row) for row in found.get("rows", [])]
    for row in rows:
        print_row(row)
    return rows


def run_section(parts: Sequence[str], quick: bool, rounds: int | None, threads: int, with_compile: bool,
                busy: bool = False, other_modes: bool = True) -> ModelResults:
    """Measure the chosen parts (models, "rnn", "mlp"); quick: small sizes, QUICK_ROUNDS, T = 20 only. The model
    rows run beside a busy neighbour if `busy`; `other_modes` adds each model's small row in the other three
    modes: in this process with the other load, and in a child importing torch and jitgrad the other way round."""
    started = time.perf_counter()
    cands = candidates(with_compile)
    results = ModelResults(names=[c.name for c in cands])
    rounds = rounds or (QUICK_ROUNDS if quick else MODEL_ROUNDS)
    results.blas.append(blas_check(threads))
    chosen = [p for p in parts if p in MODELS]
    for name in chosen:
        model = MODELS[name]
        sizes = model.sizes[:1] if quick else model.sizes
        results.cold[name] = (sizes[0].label, cold_start(model, sizes[0], threads, with_compile))
        loads = [(s, busy) for s in sizes] + ([(sizes[0], not busy)] if other_modes else [])
        for s, busy_now in loads:
            results.timing.append(measure_model(model, s, cands, rounds, busy_now))
            print_row(results.timing[-1])
        results.memory[name] = memory(model, sizes, threads)
    if other_modes and chosen:
        results.timing += other_order_rows(chosen, rounds, threads, with_compile)
    if "rnn" in parts:
        results.rnn = rnn_pipeline(RNN_STEPS[:1] if quick else RNN_STEPS)
    if "mlp" in parts:
        results.mlp = run_child("mlp-steps", ["--steps", str(QUICK_MLP_STEPS if quick else MLP_STEPS)], threads, {})
    results.blas.append(blas_check(threads))
    results.seconds = time.perf_counter() - started
    return results


# ---------------------------------------------------------------- report

def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2 ** 20:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def timing_table(results: ModelResults) -> tuple[list[str], list[list[str]]]:
    """Medians, p99s, in-process first calls, ratios to jitgrad and the check, one line per model, size and mode."""
    names = results.names
    header = ["model", "size", "mode", "reps"]
    for n in names:
        header += [f"{n} ms", f"{n} p99"] + ([f"{n} 1st s"] if n != "eager" else [])
        header += ["jitgrad background s"] if n == "jitgrad" else []
    header += [f"{n}/jitgrad" for n in names if n != "jitgrad"] + ["check"]
    body = []
    for row in sorted(results.timing, key=lambda r: list(MODELS).index(r.model)):
        line = [row.model, row.size, row.mode, str(row.rounds)]
        for n in names:
            cell = row.cells[n]
            line += [cell.failure or runner.format_ms(cell.median_ms), runner.format_ms(row.p99_ms.get(n))]
            if n != "eager":
                line.append("-" if cell.failure else runner.format_seconds(cell.first_call_s))
            if n == "jitgrad":
                line.append(runner.format_seconds(row.background_s))
        mine = row.cells["jitgrad"].median_ms
        line += [_ratio(row.cells[n].median_ms, mine) for n in names if n != "jitgrad"]
        line.append(runner.check_mark(runner.Row(row.model, row.size, wl.VALUE_AND_GRAD, row.rounds, row.cells)))
        body.append(line)
    return header, body


def cold_memory_table(results: ModelResults) -> tuple[list[str], list[list[str]]]:
    """Cold first calls (small size) and the memory of one step, one line per model and size."""
    header = ["model", "size", "jitgrad cold 1st s", "of which trace→fuse s", "jitgrad 2nd s", "background s",
              "kernels run",
              "kernel sources", "compile cold 1st s", "jitgrad step MB (held + peak)", "eager step MB",
              "jitgrad/eager memory"]
    body = []
    for name, per_size in results.memory.items():
        label, cold = results.cold[name]
        for s in MODELS[name].sizes:
            if s.name not in per_size and s.label != label:
                continue  # not measured (--quick)
            cold_cells = _cold_cells(cold) if s.label == label else ["-"] * 7
            body.append([name, s.label, *cold_cells, *_memory_cells(per_size.get(s.name), per_size.get("error"))])
    return header, body


def _memory_cells(mem: dict[str, Any] | None, error: str | None) -> list[str]:
    if mem is None:
        return [error or "-", "-", "-"]
    held, peak = mem["jitgrad_held"], mem["jitgrad_transient"]
    return [f"{_mb(held + peak)} ({_mb(held)} + {_mb(peak)})", _mb(mem["eager"]), _ratio(held + peak, mem["eager"])]


def _cold_cells(cold: ColdStart) -> list[str]:
    jit, comp = cold.jitgrad, cold.compile
    if "error" in jit:
        cells = [jit["error"]] + ["-"] * 5
    else:
        cells = [f"{jit['first_call_s']:.2f}", f"{jit['pipeline']['total_s']:.2f}", f"{jit['second_call_s']:.2f}",
                 f"{jit['background_s']:.2f}",
                 str(jit["pipeline"]["kernels"]), str(jit["sources"])]
    if comp is None:
        return cells + ["-"]
    return cells + [comp.get("error") or f"{comp['first_call_s']:.2f}"]


def rnn_table(results: ModelResults) -> tuple[list[str], list[list[str]]]:
    header = ["T", "traced eqns", "joint eqns", "optimised eqns", "kernels", "host steps", "trace s", "autodiff s",
              "optimize s", "fusion s", "trace→fuse s"]
    keys = ["traced_eqns", "joint_eqns", "optimized_eqns", "kernels", "host_steps"]
    body = [[str(r["T"])] + [str(r[k]) for k in keys]
            + [f"{r[k]:.2f}" for k in ("trace_s", "autodiff_s", "optimize_s", "fusion_s", "total_s")]
            for r in results.rnn]
    return header, body


def mlp_line(results: ModelResults, threads: int) -> str:
    m = results.mlp
    if m is None:
        return ""
    if "error" in m:
        return f"B = {MLP_BATCH} MLP steps: {m['error']}"
    return (f"{m['steps']} consecutive value-and-grad steps of W2 at B = {MLP_BATCH} after one torch step "
            f"(torch.set_num_threads({threads})): median {m['median_ms']:.3f} ms, p99 {m['p99_ms']:.3f} ms, "
            f"p99/median {m['p99_ms'] / m['median_ms']:.2f}, max {m['max_ms']:.2f} ms, "
            f"{m['slow_steps']} steps over 2× the median")


def blas_line(results: ModelResults, threads: int) -> str:
    m, k, n = BLAS_CHECK_SHAPE
    checks = [" / ".join(f"{ms:.2f} ms ({t} thread{'s' if t > 1 else ''})" for t, ms in found.items())
              for found in results.blas]
    return (f"numpy BLAS check, float32 ({m}, {k}) @ ({k}, {n}), median: {checks[0]} at the start of the model "
            f"section, {checks[-1]} at its end (jitgrad's matmuls run on numpy's OpenBLAS with {threads} threads)")


def render(results: ModelResults, table: Callable[[list[str], list[list[str]]], str], threads: int) -> list[str]:
    """The section as lines, each table drawn by `table` (run.py's plain_table or markdown_table)."""
    lines = []
    if results.timing:
        lines += [table(*timing_table(results)), "",
                  "median and 99th-percentile ms per call (one call per sample); '1st s' = first call in this "
                  "process (small: kernels from the cold child's cache; medium: a new size of the same traced "
                  "function); 'jitgrad background s' = the wait, after one more jitgrad call, for the background "
                  "compiles the first calls left (the full-level code of quick kernels that ran again, parallel "
                  "variants a new size may need), before the timed rounds; while they "
                  "compile, jitgrad's calls share the cores and the GIL with the compiler and run several times "
                  "slower; X/jitgrad = X's median over jitgrad's; check against eager PyTorch as above; mode = "
                  "which of torch and jitgrad the process imported first (torch-first as users write it; "
                  "jitgrad-first rows come from a child process of this run, with its own first calls) and, with "
                  "', busy', a `python -c` loop spinning on one core beside the whole row.", "",
                  "Models (float32, value-and-grad wrt every weight):",
                  *[f"- {m.name}: {m.title}" for m in MODELS.values() if m.name in {r.model for r in results.timing}],
                  ""]
    if results.memory:
        lines += [table(*cold_memory_table(results)), "",
                  "cold 1st s: a fresh process with empty caches (jitgrad: JITGRAD_CACHE_DIR and NUMBA_CACHE_DIR; "
                  "torch.compile: inductor caches disabled and emptied), import excluded; trace→fuse: the same "
                  "process's trace + autodiff + optimize + fusion, timed again after the first call; background: "
                  "the wait after the first call for parallel variants compiling in the background; step MB: "
                  "in a fresh process, after warm-up, the peak resident memory (VmHWM) of one step above the "
                  "resident memory before it (free heap pages returned to the OS first by malloc_trim), plus for "
                  "jitgrad what it holds between steps (plans and the buffers the next call reuses: the memory "
                  "`jg.clear_caches()` releases).", ""]
    if results.rnn:
        lines += [f"tanh-RNN `h = tanh(x_t @ Wx + h @ Wh + b)` (B{RNN_SIZE['B']} I{RNN_SIZE['I']} H{RNN_SIZE['H']}), "
                  "value-and-grad wrt Wx, Wh, b: jitgrad's stages before numba compiles", "",
                  table(*rnn_table(results)), ""]
    if results.mlp is not None:
        lines += [mlp_line(results, threads), ""]
    if results.blas:
        lines += [blas_line(results, threads), ""]
    lines.append(f"model section: {results.seconds:.0f} s")
    return lines


# ---------------------------------------------------------------- child entry point

def child_main(argv: list[str] | None = None) -> int:
    """One fresh-process measurement (see the module docstring); prints its JSON on the last line."""
    parser = argparse.ArgumentParser(description="a fresh-process measurement of bench/models.py")
    parser.add_argument("--child", required=True,
                        choices=("cold-jitgrad", "cold-compile", "memory", "mlp-steps", "timing"))
    parser.add_argument("--model", default="", help="a model name (timing: comma-separated names)")
    parser.add_argument("--sizes", default="small", help="comma-separated size names (timing: one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=MLP_STEPS)
    parser.add_argument("--rounds", type=int, default=MODEL_ROUNDS)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)
    wl.configure_threads(args.threads)
    chosen = [MODELS[n] for n in args.model.split(",") if n]
    model = chosen[0] if chosen else None
    sizes = [model.size(n) for n in args.sizes.split(",")] if model else []
    if args.child == "cold-jitgrad":
        out = child_cold_jitgrad(model, sizes[0])
    elif args.child == "cold-compile":
        out = child_cold_compile(model, sizes[0])
    elif args.child == "memory":
        out = child_memory(model, sizes)
    elif args.child == "timing":
        out = child_timing(chosen, args.sizes, args.rounds, not args.no_compile)
    else:
        out = child_mlp_steps(args.steps)
    print(json.dumps({**out, "import_order": variants.observed_order()}))
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
