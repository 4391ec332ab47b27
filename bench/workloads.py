"""The benchmark workloads (issues 2 and 8), each written once per candidate, and the candidates.

A workload has one formula per candidate: jitgrad (plain numpy code under `jg.trace`), PyTorch
(run eagerly, and through `torch.compile`), and numpy written by hand with its gradient derived
by hand. A candidate turns (workload, mode, inputs) into a zero-argument callable to time, and
turns that callable's output into a `Result` of numpy arrays to check against eager PyTorch.
All data is float32 (labels are int64).
"""
from __future__ import annotations

import abc
import ctypes
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

# bench/run.py and bench/models.py import torch or jitgrad before this module, in the order --import-order
# chose (bench/variants.py); imported alone (the tests), jitgrad comes first.
import jitgrad as jg
import torch

FORWARD = "forward"
VALUE_AND_GRAD = "value_and_grad"
DTYPE = np.float32
W2_FEATURES = 512
W3_CLASSES = 1000


@dataclass(frozen=True)
class Result:
    """What a call computed, as numpy: the scalar value and the gradients (empty for forward)."""

    value: np.ndarray
    grads: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Workload:
    """One benchmark formula written for every candidate, with its sizes, modes and inputs."""

    name: str
    formula: str
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]
    modes: tuple[str, ...]
    wrt: tuple[int, ...]
    make_inputs: Callable[[int, np.random.Generator], tuple[np.ndarray, ...]]
    size_label: Callable[[int], str]
    jitgrad_fn: Callable[..., Any]
    torch_fn: Callable[..., Any]
    numpy_forward: Callable[..., Any]
    numpy_value_and_grad: Callable[..., tuple[Any, tuple[np.ndarray, ...]]]


def length_label(n: int) -> str:
    """`N=1e6` for powers of ten, `N=16` otherwise."""
    exponent = round(math.log10(n)) if n > 0 else 0
    return f"N=1e{exponent}" if n >= 1000 and 10 ** exponent == n else f"N={n}"


def batch_label(b: int) -> str:
    return f"B={b}"


def vectors(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """w, x, b ~ N(0, 1)."""
    return tuple(rng.standard_normal(n, dtype=DTYPE) for _ in range(3))


def unit_vectors(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """w, x, b ~ U[0, 1), as in issue 2's example."""
    return tuple(rng.random(n, dtype=DTYPE) for _ in range(3))


# ---------------------------------------------------------------- W1: elementwise chain

def w1_jitgrad(w, x, b):
    return np.sum(jg.sigmoid(w * x + b) * np.exp(-x * x) + np.tanh(x) * w)


def w1_torch(w, x, b):
    return torch.sum(torch.sigmoid(w * x + b) * torch.exp(-x * x) + torch.tanh(x) * w)


def w1_numpy(w, x, b):
    s = 1 / (1 + np.exp(-(w * x + b)))
    return np.sum(s * np.exp(-x * x) + np.tanh(x) * w)


def w1_numpy_value_and_grad(w, x, b):
    s = 1 / (1 + np.exp(-(w * x + b)))
    e = np.exp(-x * x)
    t = np.tanh(x)
    se = s * e
    value = np.sum(se + t * w)
    gz = se * (1 - s)
    return value, (gz * x + t, gz * w - 2 * x * se + (1 - t * t) * w, gz)


# ---------------------------------------------------------------- I2: issue 2's loss

def i2_jitgrad(w, x, b):
    return np.sum(np.exp(w * x + b) * 2 + np.tanh(x))


def i2_torch(w, x, b):
    return torch.sum(torch.exp(w * x + b) * 2 + torch.tanh(x))


def i2_numpy(w, x, b):
    return np.sum(np.exp(w * x + b) * 2 + np.tanh(x))


def i2_numpy_value_and_grad(w, x, b):
    y2 = np.exp(w * x + b) * 2
    t = np.tanh(x)
    value = np.sum(y2 + t)
    return value, (y2 * x, y2 * w + (1 - t * t), y2)


# ---------------------------------------------------------------- W2: MLP layer

def mlp_inputs(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x = rng.standard_normal((batch, W2_FEATURES), dtype=DTYPE)
    weight = rng.standard_normal((W2_FEATURES, W2_FEATURES), dtype=DTYPE) / np.float32(math.sqrt(W2_FEATURES))
    bias = rng.standard_normal(W2_FEATURES, dtype=DTYPE) * np.float32(0.1)
    return x, weight, bias


def w2_jitgrad(x, weight, bias):
    return np.sum(np.tanh(x @ weight + bias) ** 2)


def w2_torch(x, weight, bias):
    return torch.sum(torch.tanh(x @ weight + bias) ** 2)


def w2_numpy(x, weight, bias):
    return np.sum(np.tanh(x @ weight + bias) ** 2)


def w2_numpy_value_and_grad(x, weight, bias):
    t = np.tanh(x @ weight + bias)
    value = np.sum(t * t)
    gz = 2 * t * (1 - t * t)
    return value, (gz @ weight.T, x.T @ gz, gz.sum(axis=0))


# ---------------------------------------------------------------- W3: softmax cross-entropy

def cross_entropy_inputs(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    logits = rng.standard_normal((batch, W3_CLASSES), dtype=DTYPE) * np.float32(3)
    labels = rng.integers(0, W3_CLASSES, batch, dtype=np.int64)
    return logits, labels


def w3_jitgrad(logits, labels):
    return np.mean(jg.logsumexp(logits, 1) - logits[np.arange(logits.shape[0]), labels])


def w3_torch(logits, labels):
    return torch.mean(torch.logsumexp(logits, 1) - logits[torch.arange(logits.shape[0]), labels])


def w3_numpy(logits, labels):
    peak = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - peak).sum(axis=1)) + peak[:, 0]
    return np.mean(lse - logits[np.arange(logits.shape[0]), labels])


def w3_numpy_value_and_grad(logits, labels):
    batch = logits.shape[0]
    rows = np.arange(batch)
    peak = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - peak)
    total = e.sum(axis=1, keepdims=True)
    value = np.mean(np.log(total[:, 0]) + peak[:, 0] - logits[rows, labels])
    grad = e / total
    grad[rows, labels] -= 1
    grad *= np.float32(1 / batch)
    return value, (grad,)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("W1", "sum(sigmoid(w*x+b) * exp(-x*x) + tanh(x)*w)", (10**3, 10**5, 10**6, 10**7), (10**3,),
             (FORWARD, VALUE_AND_GRAD), (0, 1, 2), vectors, length_label,
             w1_jitgrad, w1_torch, w1_numpy, w1_numpy_value_and_grad),
    Workload("I2", "sum(exp(w*x+b)*2 + tanh(x))  (issue 2)", (10**3, 10**5, 10**6, 10**7), (10**3,),
             (FORWARD, VALUE_AND_GRAD), (0, 1, 2), unit_vectors, length_label,
             i2_jitgrad, i2_torch, i2_numpy, i2_numpy_value_and_grad),
    Workload("W2", "sum(tanh(x @ W + b) ** 2), W 512x512", (64, 1024, 4096), (64,),
             (VALUE_AND_GRAD,), (0, 1, 2), mlp_inputs, batch_label,
             w2_jitgrad, w2_torch, w2_numpy, w2_numpy_value_and_grad),
    Workload("W3", "mean(logsumexp(logits, 1) - logits[arange(B), labels]), 1000 classes", (4096,), (256,),
             (VALUE_AND_GRAD,), (0,), cross_entropy_inputs, batch_label,
             w3_jitgrad, w3_torch, w3_numpy, w3_numpy_value_and_grad),
    Workload("W4", "W1 at N=16 (call overhead)", (16,), (16,),
             (FORWARD, VALUE_AND_GRAD), (0, 1, 2), vectors, length_label,
             w1_jitgrad, w1_torch, w1_numpy, w1_numpy_value_and_grad),
]}


# ---------------------------------------------------------------- candidates

class Candidate(abc.ABC):
    """A way of running workloads: `prepare` returns the callable to time (it may raise: the
    first call traces and compiles), `result` converts that callable's output for checking."""

    name = ""
    compiles = False  # whether the first call compiles (its time is reported separately)

    @abc.abstractmethod
    def prepare(self, workload: Workload, mode: str, inputs: Sequence[np.ndarray]) -> Callable[[], Any]:
        """The zero-argument callable that runs `workload` in `mode` on `inputs`."""

    @abc.abstractmethod
    def result(self, mode: str, out: Any) -> Result:
        """That callable's output as numpy arrays."""


def _numpy_result(mode: str, out: Any) -> Result:
    if mode == FORWARD:
        return Result(np.asarray(out), ())
    value, grads = out
    return Result(np.asarray(value), tuple(np.asarray(g) for g in grads))


class Jitgrad(Candidate):
    """`jg.trace` of the numpy formula; one traced function per workload, as a user would keep it."""

    name = "jitgrad"
    compiles = True

    def __init__(self) -> None:
        self._traced: dict[str, jg.Traced] = {}

    def prepare(self, workload: Workload, mode: str, inputs: Sequence[np.ndarray]) -> Callable[[], Any]:
        fn = self._traced.setdefault(workload.name, jg.trace(workload.jitgrad_fn))
        if mode == FORWARD:
            return lambda: fn(*inputs)
        return lambda: fn.value_and_grad(*inputs, argnums=workload.wrt)

    def result(self, mode: str, out: Any) -> Result:
        return _numpy_result(mode, out)


class NumpyByHand(Candidate):
    """numpy with the gradient derived by hand."""

    name = "numpy"

    def prepare(self, workload: Workload, mode: str, inputs: Sequence[np.ndarray]) -> Callable[[], Any]:
        fn = workload.numpy_forward if mode == FORWARD else workload.numpy_value_and_grad
        return lambda: fn(*inputs)

    def result(self, mode: str, out: Any) -> Result:
        return _numpy_result(mode, out)


class TorchEager(Candidate):
    """The torch formula as written: forward under `no_grad`, value-and-grad by `torch.autograd.grad`."""

    name = "eager"

    def _function(self, workload: Workload) -> Callable[..., Any]:
        return workload.torch_fn

    def prepare(self, workload: Workload, mode: str, inputs: Sequence[np.ndarray]) -> Callable[[], Any]:
        fn = self._function(workload)
        tensors = [torch.from_numpy(a) for a in inputs]
        if mode == FORWARD:
            def forward() -> Any:
                with torch.no_grad():
                    return fn(*tensors)
            return forward
        leaves = [tensors[i].requires_grad_(True) for i in workload.wrt]

        def value_and_grad() -> Any:
            loss = fn(*tensors)
            return loss.detach(), torch.autograd.grad(loss, leaves)
        return value_and_grad

    def result(self, mode: str, out: Any) -> Result:
        if mode == FORWARD:
            return Result(out.numpy(), ())
        value, grads = out
        return Result(value.numpy(), tuple(g.numpy() for g in grads))


class TorchCompile(TorchEager):
    """`torch.compile` (inductor, static shapes) of the torch formula; gradients through AOTAutograd's
    compiled backward. One compiled function per workload; each new shape or grad mode compiles a graph."""

    name = "compile"
    compiles = True

    def __init__(self) -> None:
        limits = ("recompile_limit", "cache_size_limit")
        for limit in limits:
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, 64)
                break
        self._compiled: dict[str, Callable[..., Any]] = {}

    def _function(self, workload: Workload) -> Callable[..., Any]:
        if workload.name not in self._compiled:
            self._compiled[workload.name] = torch.compile(workload.torch_fn, backend="inductor", dynamic=False)
        return self._compiled[workload.name]


def output_errors(result: Result, reference: Result) -> list[float]:
    """Normwise relative error max|a-r| / max|r| of the value, then of each gradient (inf on a shape mismatch)."""
    if len(result.grads) != len(reference.grads):
        return [math.inf]
    errors = []
    for got, want in [(result.value, reference.value)] + list(zip(result.grads, reference.grads)):
        got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got64.shape != want64.shape:
            errors.append(math.inf)
            continue
        scale = max(float(np.max(np.abs(want64))), np.finfo(np.float32).tiny)
        errors.append(float(np.max(np.abs(got64 - want64))) / scale)
    return errors


def relative_error(result: Result, reference: Result) -> float:
    """The largest normwise relative error over the value and the gradients."""
    return max(output_errors(result, reference))


# ---------------------------------------------------------------- threads

def _openblas_libraries() -> list[ctypes.CDLL]:
    """The OpenBLAS libraries loaded in this process (numpy's bundled one among them)."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "openblas" in os.path.basename(path).lower():
                paths.add(path)
    return [ctypes.CDLL(p) for p in sorted(paths)]


def _openblas_symbol(lib: ctypes.CDLL, stem: str) -> Any:
    """An OpenBLAS entry point under any of the prefixes/suffixes its builds use (scipy_..64_)."""
    for name in (f"openblas_{stem}", f"scipy_openblas_{stem}64_", f"openblas_{stem}64_", f"scipy_openblas_{stem}"):
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def openblas_info() -> list[str]:
    """For each loaded OpenBLAS: its file, the kernel it dispatches to (core name) and its threads."""
    lines = []
    for lib in _openblas_libraries():
        corename, threads = _openblas_symbol(lib, "get_corename"), _openblas_symbol(lib, "get_num_threads")
        core = "?"
        if corename is not None:
            corename.restype = ctypes.c_char_p
            core = corename().decode()
        lines.append(f"{os.path.basename(lib._name)}: core {core}, "
                     f"{threads() if threads is not None else '?'} threads")
    return lines


def configure_threads(n: int) -> None:
    """Give every candidate `n` threads: torch (ATen and inductor), numba, numpy's OpenBLAS."""
    torch.set_num_threads(n)
    import numba
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    for lib in _openblas_libraries():
        setter = _openblas_symbol(lib, "set_num_threads")
        if setter is not None:
            setter(ctypes.c_int(n))


def candidates(with_compile: bool = True) -> list[Candidate]:
    """The candidates in table order; eager PyTorch is the reference."""
    found: list[Candidate] = [Jitgrad(), TorchEager()]
    if with_compile:
        found.append(TorchCompile())
    found.append(NumpyByHand())
    return found
