"""jitgrad's training steps beside a busy neighbour, many in a row (issue 33: p99 at most 3x the median).

    python bench/busy_steps.py [--steps 1000] [--models transformer,lstm,conv] [--sizes small,medium] [--quiet]

One process, torch imported first as users write it (`bench/variants.py`). For each bench model and size
(`bench/models.py`): jitgrad's value-and-grad is warmed past its first calls and background compiles, then
`--steps` consecutive steps run while a child process spins on one core (`--quiet`: without it). Printed per
row: median, 99th percentile and largest step in ms, and p99/median. bench/run.py's busy rows interleave
eager PyTorch and stop each row after a few seconds; this is the long uninterrupted run the target speaks of.
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are unset for this process, as bench/run.py does (they slow numpy's BLAS).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import variants

variants.unset_openblas_hints()
variants.import_first(variants.requested_order())

import numpy as np  # noqa: E402

import jitgrad as jg  # noqa: E402
import models  # noqa: E402
import workloads as wl  # noqa: E402

TARGET = 3.0  # issue 33: p99 at most this many medians beside one busy core


def steps_of(model: models.Model, size_name: str, steps: int, busy: bool) -> list[float]:
    """Seconds of each of `steps` consecutive value-and-grad steps, after warming, beside a busy core if `busy`."""
    inputs = model.make_inputs(model.size(size_name), np.random.default_rng(0))
    f = jg.trace(model.jitgrad_fn)

    def step() -> None:
        f.value_and_grad(*inputs, argnums=model.wrt)

    models.warm(step, calls=40)
    times = []
    with variants.busy_neighbour(busy):
        time.sleep(0.2)  # the neighbour on its core before the first step
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--models", default="transformer,lstm,conv")
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quiet", action="store_true", help="no busy neighbour")
    args = parser.parse_args(argv)
    wl.configure_threads(args.threads)
    busy = not args.quiet
    print(f"{variants.observed_order()}, {'beside one busy core' if busy else 'quiet'}, {args.steps} steps per row")
    print("| model | size | median ms | p99 ms | max ms | p99/median |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name in args.models.split(","):
        model = models.MODELS[name]
        for size_name in args.sizes.split(","):
            times = steps_of(model, size_name, args.steps, busy)
            median, p99 = statistics.median(times), float(np.percentile(times, 99))
            worst = max(worst, p99 / median)
            print(f"| {name} | {model.size_label(model.size(size_name))} | {median * 1e3:.3f} | {p99 * 1e3:.3f} | "
                  f"{max(times) * 1e3:.1f} | {p99 / median:.2f} |", flush=True)
    print(f"largest p99/median {worst:.2f} (target at most {TARGET:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
