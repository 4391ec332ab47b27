"""Call overhead of pytree arguments (issue 17): value-and-grad of one small function taking ten
parameter arrays, called with a dict of ten arrays, with ten positional arrays, and with a
registered dataclass of ten fields, interleaved round-robin in one process.

    python bench/pytree_overhead.py [--rounds N] [--size N]

At N=16 the kernels take microseconds, so the medians are jitgrad's per-call work: binding,
flattening, plan lookup and rebuilding gradients in the argument's structure. Printed per form:
median and 99th percentile (microseconds) and the ratio to the positional call's median.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

import jitgrad as jg

N_LEAVES = 10
NAMES = [f"w{i}" for i in range(N_LEAVES)]


def loss_of(ws: list) -> np.ndarray:
    total = 0.0
    for i, w in enumerate(ws):
        total = total + np.sum(np.tanh(w) * (i + 1))
    return total


def positional(*ws: np.ndarray) -> np.ndarray:
    return loss_of(list(ws))


def as_dict(params: dict) -> np.ndarray:
    return loss_of([params[n] for n in NAMES])


Params = jg.register_dataclass(dataclasses.make_dataclass("Params", NAMES))


def as_dataclass(params: "Params") -> np.ndarray:
    return loss_of([getattr(params, n) for n in NAMES])


def sample(call, samples: list[float]) -> None:
    start = time.perf_counter()
    call()
    samples.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--size", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(args.size).astype(np.float32) for _ in range(N_LEAVES)]
    params = dict(zip(NAMES, arrays))
    obj = Params(*arrays)
    f_pos, f_dict, f_dc = jg.trace(positional), jg.trace(as_dict), jg.trace(as_dataclass)
    forms = {
        "10 positional arrays": lambda: f_pos.value_and_grad(*arrays, argnums=tuple(range(len(arrays)))),
        "dict of 10 arrays": lambda: f_dict.value_and_grad(params),
        "dataclass of 10 fields": lambda: f_dc.value_and_grad(obj),
    }
    reference = forms["10 positional arrays"]()[1]
    for name, call in forms.items():  # warm up (compile), and check the forms agree
        grads = jg.tree_leaves(call()[1])
        assert len(grads) == N_LEAVES and all(np.allclose(a, b) for a, b in zip(grads, reference)), name
    samples: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):
        for name, call in forms.items():
            sample(call, samples[name])
    base = statistics.median(samples["10 positional arrays"])
    print(f"value_and_grad, {N_LEAVES} float32 leaves of {args.size} elements, {args.rounds} interleaved rounds")
    print(f"{'form':<24} {'median us':>10} {'p99 us':>8} {'/positional':>12}")
    for name, times in samples.items():
        times.sort()
        med, p99 = statistics.median(times), times[int(0.99 * (len(times) - 1))]
        print(f"{name:<24} {med * 1e6:>10.1f} {p99 * 1e6:>8.1f} {med / base:>12.2f}")


if __name__ == "__main__":
    main()
