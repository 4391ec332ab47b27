"""Each candidate's step alone and beside the others in one process (issue 33's target: jitgrad, eager PyTorch
and torch.compile each at most 1.15x their time alone when all three run in a torch-first process).

    python bench/beside.py [--size small|medium|tiny] [--models conv,lstm,transformer] [--blocks N] [--rounds N]
                           [--neighbour torch|memory|sleep] [--busy]

One process, torch imported first. Blocks alternate: in an "alone" block each candidate runs `rounds` calls in a
row; in a "beside" block the candidates take turns, call by call. Between blocks each candidate runs once untimed
(the first call after a switch). Comparing blocks of one process, instead of a process per case, keeps the
differences between fresh processes (memory placement, which cores the machine's other tenants use) out of the
ratio. `--neighbour` chooses what runs between jitgrad's calls in the beside blocks: `torch` (eager and
torch.compile, timed too), `memory` (a numpy sum over 64 MB, which evicts the last-level cache) or `sleep`
(2 ms idle). Printed per model: each candidate's median (p99) ms alone and beside, and beside / alone.
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are unset for this process, as bench/run.py does.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import variants

variants.unset_openblas_hints()
variants.import_first("torch-first")

import numpy as np  # noqa: E402

import models  # noqa: E402
import run as runner  # noqa: E402
import workloads as wl  # noqa: E402

NEIGHBOURS = ("torch", "memory", "sleep")
EVICTING_BYTES = 64 << 20  # larger than this machine's last-level cache (32 MiB)


def neighbour_runs(neighbour: str) -> dict[str, Callable[[], Any]]:
    """The stand-in neighbours: a sum that reads EVICTING_BYTES, or a 2 ms sleep."""
    if neighbour == "memory":
        block = np.ones(EVICTING_BYTES // 4, np.float32)
        return {"memory": lambda: float(block.sum())}
    return {"sleep": lambda: time.sleep(0.002)}


def measure(model: models.Model, size: str, neighbour: str, blocks: int,
            rounds: int) -> dict[tuple[str, str], list[float]]:
    """Per (block kind, candidate): seconds per call, from `blocks` pairs of alone and beside blocks."""
    inputs = model.make_inputs(model.size(size), np.random.default_rng(0))
    with_torch = neighbour == "torch"
    candidates = models.candidates(with_compile=True) if with_torch else [wl.Jitgrad()]
    runs = {c.name: c.prepare(model, wl.VALUE_AND_GRAD, inputs) for c in candidates}
    if not with_torch:
        runs.update(neighbour_runs(neighbour))
    for run in runs.values():
        for _ in range(10):
            run()
    runner.settle_jitgrad(runs)
    samples: dict[tuple[str, str], list[float]] = {(k, n): [] for k in ("alone", "beside") for n in runs}

    def timed(name: str, kind: str) -> None:
        start = time.perf_counter()
        runs[name]()
        samples[(kind, name)].append(time.perf_counter() - start)

    for _ in range(blocks):
        for name, run in runs.items():
            run()
            for _ in range(rounds):
                timed(name, "alone")
        for run in runs.values():
            run()
        for _ in range(rounds):
            for name in runs:
                timed(name, "beside")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("small", "medium", "tiny"))
    parser.add_argument("--models", default=",".join(models.MODELS), help="comma-separated: " + ", ".join(models.MODELS))
    parser.add_argument("--neighbour", default="torch", choices=NEIGHBOURS)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--busy", action="store_true", help="beside a process spinning on one core, too")
    args = parser.parse_args()
    chosen = models.chosen_models(parser, args.models)
    wl.configure_threads(2)
    print(f"torch first, {args.size} models, neighbour {args.neighbour}, {args.blocks} pairs of blocks of "
          f"{args.rounds} calls{', beside a busy process' if args.busy else ''}; median (p99) ms alone -> beside")
    with variants.busy_neighbour(args.busy):
        for name in chosen:
            samples = measure(models.MODELS[name], args.size, args.neighbour, args.blocks, args.rounds)
            print(models.two_states_row(name, samples, ("alone", "beside"), first_over_second=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
