"""Transformations (issue 37): per-example gradients with `jg.vmap(jg.grad(loss))`, and `jg.jvp` of W1.

    python bench/transforms.py [--rounds N] [--jvp-rounds N] [--batch B] [--n N] [--floors] [--split-ab]

(a) Per-example gradients of an MLP (784 -> 256 -> 10, tanh, softmax cross-entropy, float32, B = 256):
    `jg.vmap(jg.grad(loss), in_axes=(None, 0, 0))` (one program), a Python loop of B calls of `jg.grad(loss)`
    (the same compiled program per call), and `torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))`.
    With --floors, the same round-robin also times what bounds them: the loop's two parts (its B grad calls;
    np.stack of their first-weight gradients) and numpy writing the first-weight gradients' bytes (B x 784 x 256
    float32: fresh memory filled, and a copy into memory already mapped), printed with GB/s. With --split-ab,
    vmap(grad) and the loop also run with jitgrad's split products off (`blas_threads.SPLIT = False` around the
    call: products above SMALL_PRODUCT on numpy's OpenBLAS threads, the rule before the split), in the same
    round-robin.
(b) W1 (`bench/workloads.py`) at N = 1e6: `jg.jvp` against W1's forward alone under `jg.trace` (target: at
    most 1.3x), round-robin between the two only; (c) the same beside torch's forward and `torch.func.jvp` of the
    torch formula, all four round-robin (torch's calls leave its OpenMP threads busy for a while after they
    return, which slows the jitgrad call that follows one: compare (b) and (c)).

One process, torch imported first as users write it (`bench/variants.py`). Every candidate is called until its
compiles are done (jitgrad's background compiles waited for), then the candidates of a section run round-robin,
the starting one rotating per round, so load from elsewhere hits all of them alike. Printed: median ms per call,
the ratios, and the largest normwise relative difference of each candidate's result from the first one's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import variants

variants.import_first(variants.requested_order())

import numpy as np  # noqa: E402
import torch  # noqa: E402

import jitgrad as jg  # noqa: E402
import workloads as wl  # noqa: E402

SIZES = (784, 256, 10)


# ---------------------------------------------------------------- (a) per-example gradients of an MLP

def mlp_loss(params: dict, x: np.ndarray, y: Any) -> Any:
    """One example: x of shape (784,), y an int label."""
    h = np.tanh(x @ params["w1"] + params["b1"])
    return -jg.log_softmax(h @ params["w2"] + params["b2"])[y]


def mlp_loss_torch(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x @ params["w1"] + params["b1"])
    return -torch.log_softmax(h @ params["w2"] + params["b2"], dim=-1).gather(0, y[None])[0]  # [y] would call .item()


def mlp_inputs(batch: int, rng: np.random.Generator) -> tuple[dict, np.ndarray, np.ndarray]:
    d, h, c = SIZES
    params = {"w1": rng.standard_normal((d, h), dtype=wl.DTYPE) / np.float32(np.sqrt(d)),
              "b1": rng.standard_normal(h, dtype=wl.DTYPE) * np.float32(0.1),
              "w2": rng.standard_normal((h, c), dtype=wl.DTYPE) / np.float32(np.sqrt(h)),
              "b2": np.zeros(c, wl.DTYPE)}
    return params, rng.standard_normal((batch, d), dtype=wl.DTYPE), rng.integers(0, c, batch)


def per_example_candidates(params: dict, xs: np.ndarray, ys: np.ndarray) -> dict[str, Callable[[], dict]]:
    """Each candidate: a call giving the per-example gradients as a dict of numpy arrays of shape (B, ...)."""
    vmapped = jg.vmap(jg.grad(mlp_loss), in_axes=(None, 0, 0))
    single = jg.grad(mlp_loss)
    tparams = {k: torch.from_numpy(v) for k, v in params.items()}
    txs, tys = torch.from_numpy(xs), torch.from_numpy(ys)
    tvmapped = torch.func.vmap(torch.func.grad(mlp_loss_torch), in_dims=(None, 0, 0))

    def loop() -> dict:
        grads = [single(params, xs[i], ys[i]) for i in range(len(xs))]
        return {k: np.stack([g[k] for g in grads]) for k in params}

    def torch_func() -> dict:
        return {k: v.numpy() for k, v in tvmapped(tparams, txs, tys).items()}

    return {"vmap(grad)": lambda: vmapped(params, xs, ys), "loop of grad": loop, "torch.func": torch_func}


def floor_candidates(params: dict, xs: np.ndarray, ys: np.ndarray) -> dict[str, Callable[[], Any]]:
    """What bounds (a): the loop's calls and its stack apart, and numpy writing the first weight's gradients' bytes."""
    single = jg.grad(mlp_loss)
    w1s = [single(params, xs[i], ys[i])["w1"] for i in range(len(xs))]
    shape = (len(xs),) + params["w1"].shape
    kept, source = np.empty(shape, wl.DTYPE), np.ones(shape, wl.DTYPE)
    return {"loop: grad calls only": lambda: [single(params, xs[i], ys[i]) for i in range(len(xs))],
            "loop: np.stack of w1 grads": lambda: np.stack(w1s),
            "numpy: fill fresh w1-grad bytes": lambda: np.empty(shape, wl.DTYPE).fill(0),
            "numpy: copy w1-grad bytes, mapped": lambda: np.copyto(kept, source)}


def unsplit_candidates(runs: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
    """vmap(grad) and the loop with `blas_threads.SPLIT` False during the call (where the module has it)."""
    from jitgrad.ops import blas_threads

    def unsplit(run: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            saved = blas_threads.SPLIT
            blas_threads.SPLIT = False
            try:
                return run()
            finally:
                blas_threads.SPLIT = saved
        return call

    if not hasattr(blas_threads, "SPLIT"):
        print("--split-ab: this jitgrad has no split products (blas_threads.SPLIT); skipped")
        return {}
    return {f"{name}, unsplit products": unsplit(runs[name]) for name in ("vmap(grad)", "loop of grad")}


def floors(ms: dict[str, float], nbytes: int) -> None:
    for name in ("vmap(grad)", "torch.func", "numpy: fill fresh w1-grad bytes", "numpy: copy w1-grad bytes, mapped"):
        print(f"{name}: {nbytes / 1e6:.0f} MB written in {ms[name]:.3g} ms = {nbytes / 1e6 / ms[name]:.2f} GB/s")


# ---------------------------------------------------------------- (b) jvp of W1

def jvp_candidates(n: int, rng: np.random.Generator) -> dict[str, Callable[[], Any]]:
    primals = wl.vectors(n, rng)
    tangents = wl.vectors(n, rng)
    forward = jg.trace(wl.w1_jitgrad)
    tprimals, ttangents = tuple(map(torch.from_numpy, primals)), tuple(map(torch.from_numpy, tangents))

    def torch_jvp() -> tuple:
        with torch.no_grad():
            out, tangent = torch.func.jvp(wl.w1_torch, tprimals, ttangents)
        return out.numpy(), tangent.numpy()

    def torch_forward() -> Any:
        with torch.no_grad():
            return wl.w1_torch(*tprimals).numpy()

    return {"jg forward": lambda: forward(*primals), "jg.jvp": lambda: jg.jvp(wl.w1_jitgrad, primals, tangents),
            "torch forward": torch_forward, "torch.func.jvp": torch_jvp}


# ---------------------------------------------------------------- timing

def settle(runs: dict[str, Callable[[], Any]], calls: int = 6) -> dict[str, float]:
    """Call each candidate until its compiles are done; the first call's seconds (trace + compile)."""
    from jitgrad.kernels.cpu import executor as runtime
    from jitgrad.kernels.build import compiler

    first = {}
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        first[name] = time.perf_counter() - start
        for _ in range(max(calls, runtime.PROMOTE_AT_CALL)):
            run()
    compiler.wait_for_background_compiles()
    for run in runs.values():
        run()
    return first


def round_robin(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runs[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def difference(a: Any, b: Any) -> float:
    """Largest normwise relative difference over the leaves of two results (dicts or tuples of arrays)."""
    la = [a[k] for k in sorted(a)] if isinstance(a, dict) else list(a) if isinstance(a, tuple) else [a]
    lb = [b[k] for k in sorted(b)] if isinstance(b, dict) else list(b) if isinstance(b, tuple) else [b]
    return max(float(np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                     / max(np.linalg.norm(np.asarray(y, np.float64)), 1e-30)) for x, y in zip(la, lb))


def report(title: str, runs: dict[str, Callable[[], Any]], rounds: int, ratios: list[tuple[str, str]],
           reference: str, tolerance: float) -> dict[str, float]:
    first = settle(runs)
    results = {name: run() for name, run in runs.items()}
    samples = round_robin(runs, rounds)
    ms = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
    print(f"\n{title}: {rounds} rounds, median ms per call (first call s)")
    print("| candidate | ms | first s | check |")
    print("|---|---|---|---|")
    ok = True
    for name in runs:
        if name.startswith(("loop:", "numpy:")):
            print(f"| {name} | {ms[name]:.3g} | {first[name]:.2f} | floor |")
            continue
        err = difference(results[name], results[reference]) if name != reference else 0.0
        ok &= err <= tolerance
        check = "reference" if name == reference else f"{'ok' if err <= tolerance else 'DIFFERS'} ({err:.0e})"
        print(f"| {name} | {ms[name]:.3g} | {first[name]:.2f} | {check} |")
    for slower, faster in ratios:
        print(f"{slower} / {faster} = {ms[slower] / ms[faster]:.2f}")
    if not ok:
        print(f"results differ beyond {tolerance}")
    return ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the per-example section")
    parser.add_argument("--jvp-rounds", type=int, default=100, help="rounds of the jvp section")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n", type=int, default=10 ** 6, help="W1's length in the jvp section")
    parser.add_argument("--floors", action="store_true", help="time (a)'s floors in its round-robin too")
    parser.add_argument("--split-ab", action="store_true", help="(a) also with jitgrad's split products off")
    args = parser.parse_args()
    print(f"{variants.observed_order()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    params, xs, ys = mlp_inputs(args.batch, np.random.default_rng(0))
    runs = per_example_candidates(params, xs, ys)
    ratios = [("loop of grad", "vmap(grad)"), ("torch.func", "vmap(grad)")]
    if args.split_ab:
        unsplit = unsplit_candidates(runs)
        runs.update(unsplit)
        if unsplit:
            ratios += [("loop of grad, unsplit products", "vmap(grad), unsplit products"),
                       ("torch.func", "vmap(grad), unsplit products")]
    if args.floors:
        runs.update(floor_candidates(params, xs, ys))
    ms = report(f"(a) per-example gradients, MLP {'-'.join(map(str, SIZES))}, B={args.batch}, float32",
                runs, args.rounds, ratios, "torch.func", 1e-4)
    if args.floors:
        floors(ms, args.batch * SIZES[0] * SIZES[1] * np.dtype(wl.DTYPE).itemsize)
    runs = jvp_candidates(args.n, np.random.default_rng(1))
    report(f"(b) jvp of W1 at {wl.length_label(args.n)}, float32, jitgrad alone",
           {k: runs[k] for k in ("jg forward", "jg.jvp")}, args.jvp_rounds, [("jg.jvp", "jg forward")], "jg.jvp", 1e-4)
    report(f"(c) jvp of W1 at {wl.length_label(args.n)}, float32, beside torch", runs, args.jvp_rounds,
           [("jg.jvp", "jg forward"), ("torch.func.jvp", "jg.jvp"), ("torch.func.jvp", "torch forward")],
           "torch.func.jvp", 1e-4)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
