"""Call overhead (issues 17 and 36): value-and-grad of one small function taking ten parameter arrays,
called with a dict of ten arrays, with ten positional arrays, and with a registered dataclass of ten
fields; and W4 (bench/workloads.py's W1 chain with three positional arrays, as the README's table runs
it); all interleaved round-robin in one process, beside `jax.jit(jax.value_and_grad(...))` of W4 and of
the dict form when JAX is installed (bench/jax_peer.py's twins: the same text on jax.numpy, inputs
placed on JAX's CPU device once; each JAX call waits for its result).

    python bench/pytree_overhead.py [--rounds N] [--calls N] [--size N] [--no-jax]

At N=16 the kernels take a microsecond or two, so the medians are the per-call work: checking the
arguments against the signature seen before (shapes, dtypes, structure, static values, captured
arrays), allocating the outputs, calling the kernel and building the result in the argument's
structure. Printed per form: median and 99th percentile (microseconds), the ratio to the ten
positional arrays' median, and JAX's median and jitgrad/JAX where JAX runs the same form.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib
import statistics
import sys
import time

import numpy as np

import jitgrad as jg

BENCH = pathlib.Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

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


def sample(call, samples: list[float], calls: int = 1) -> None:
    """Time `calls` calls in a row; their mean."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    samples.append((time.perf_counter() - start) / calls)


def jax_forms(w4_inputs: tuple, params: dict) -> dict[str, object]:
    """JAX's value-and-grad of W4 and of the dict form (bench/jax_peer.py's twins), or {} without JAX."""
    if importlib.util.find_spec("jax") is None:
        return {}
    import jax
    import jax_peer

    w4 = jax_peer.jax_value_and_grad(jax_peer.workload_text().w1_jitgrad, (0, 1, 2), jax_peer.w4_extra())
    on_dict = jax_peer.jax_value_and_grad(as_dict, 0)
    return {"W4, 3 positional arrays": jax_peer.jax_call(w4, tuple(jax.device_put(a) for a in w4_inputs)),
            "dict of 10 arrays": jax_peer.jax_call(on_dict, (jax.device_put(params),))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--calls", type=int, default=10, help="calls per sample (default 10): a sample right after "
                        "another library's call would otherwise carry its wake-ups (JAX's threads)")
    parser.add_argument("--no-jax", action="store_true", help="jitgrad only, even where JAX is installed")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(args.size).astype(np.float32) for _ in range(N_LEAVES)]
    w4_inputs = tuple(rng.standard_normal(args.size).astype(np.float32) for _ in range(3))
    params = dict(zip(NAMES, arrays))
    obj = Params(*arrays)
    f_pos, f_dict, f_dc = jg.trace(positional), jg.trace(as_dict), jg.trace(as_dataclass)
    f_w4 = jg.trace(lambda w, x, b: np.sum(jg.sigmoid(w * x + b) * np.exp(-x * x) + np.tanh(x) * w))  # W4's text
    forms = {
        "W4, 3 positional arrays": lambda: f_w4.value_and_grad(*w4_inputs, argnums=(0, 1, 2)),
        "10 positional arrays": lambda: f_pos.value_and_grad(*arrays, argnums=tuple(range(len(arrays)))),
        "dict of 10 arrays": lambda: f_dict.value_and_grad(params),
        "dataclass of 10 fields": lambda: f_dc.value_and_grad(obj),
    }
    reference = forms["10 positional arrays"]()[1]
    for name, call in list(forms.items())[1:]:  # warm up (compile), and check the forms agree
        grads = jg.tree_leaves(call()[1])
        assert len(grads) == N_LEAVES and all(np.allclose(a, b) for a, b in zip(grads, reference)), name
    peers = {} if args.no_jax else jax_forms(w4_inputs, params)
    for name, call in peers.items():  # warm up (compile), and check JAX agrees
        ours, theirs = jg.tree_leaves(forms[name]()), jg.tree_leaves(call())
        assert all(np.allclose(a, np.asarray(b), rtol=1e-4, atol=1e-6) for a, b in zip(ours, theirs)), name
    runs = {**forms, **{f"{name} (JAX)": call for name, call in peers.items()}}
    for _ in range(3):  # past the first calls: quick kernels promoted, background compiles done
        for call in forms.values():
            call()
    from jitgrad.kernels.build import compiler
    compiler.wait_for_background_compiles()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    order, shuffle = list(runs.items()), np.random.default_rng(36).permutation
    for _ in range(args.rounds):
        for k in shuffle(len(order)):  # a new order each round: load, and what ran before, hit all forms alike
            name, call = order[k]
            sample(call, samples[name], args.calls)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    base = medians["10 positional arrays"]
    print(f"value_and_grad, float32 leaves of {args.size} elements, {args.rounds} interleaved rounds of "
          f"{args.calls} calls per form (microseconds per call)")
    print(f"{'form':<24} {'median us':>10} {'p99 us':>8} {'/positional':>12} {'JAX us':>8} {'/JAX':>6}")
    for name in forms:
        times = sorted(samples[name])
        med, p99 = medians[name], times[int(0.99 * (len(times) - 1))]
        jax_med = medians.get(f"{name} (JAX)")
        peer = f" {jax_med * 1e6:>8.1f} {med / jax_med:>6.2f}" if jax_med else ""
        print(f"{name:<24} {med * 1e6:>10.1f} {p99 * 1e6:>8.1f} {med / base:>12.2f}{peer}")
    if not peers and not args.no_jax:
        print("(JAX is not installed: no JAX column; python -m pip install -e '.[jax]')")


if __name__ == "__main__":
    main()
