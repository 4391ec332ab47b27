"""torch's OpenMP spin beside jitgrad (issue 33): the bench models' steps, torch imported first, with torch's
GNU OpenMP workers spinning as torch started them (what `import jitgrad` leaves) and with jitgrad's idle team
making libgomp throttle them (`jitgrad.runtime.threads.IdleTeam`, what JITGRAD_OPENMP_SPIN=throttle does).

    python bench/openmp_spin.py [--size small|medium] [--blocks N] [--rounds N] [--busy]

One process, torch imported first and JITGRAD_OPENMP_SPIN=keep, so that the team is parked and
released here: blocks alternate between the two states, and in every block jitgrad, eager PyTorch
and torch.compile run round-robin, so load from elsewhere hits all of them alike. Printed per model:
each candidate's median and 99th percentile ms per step in both states, and the ratio spinning /
quieted (above 1: the spin slowed that candidate). `--busy` runs it all beside a process spinning
on one core. OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are unset for this process, as bench/run.py does.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import variants

variants.unset_openblas_hints()
os.environ["JITGRAD_OPENMP_SPIN"] = "keep"
variants.import_first("torch-first")

import numpy as np  # noqa: E402

import models  # noqa: E402
import run as runner  # noqa: E402
import workloads as wl  # noqa: E402
from jitgrad.runtime import threads  # noqa: E402


def measure(model: models.Model, size: str, blocks: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Per (state, candidate): seconds per step, from `blocks` alternating blocks of `rounds` rounds."""
    inputs = model.make_inputs(model.size(size), np.random.default_rng(0))
    runs = {c.name: c.prepare(model, wl.VALUE_AND_GRAD, inputs) for c in models.candidates(with_compile=True)}
    for run in runs.values():
        for _ in range(10):
            run()
    runner.settle_jitgrad(runs)
    samples: dict[tuple[str, str], list[float]] = {(s, n): [] for s in ("spinning", "quieted") for n in runs}
    paths = threads.gnu_openmp_runtimes()
    for block in range(blocks):
        state = ("spinning", "quieted")[block % 2]
        teams = [threads.IdleTeam(p) for p in paths] if state == "quieted" else []
        for r in range(rounds):
            names = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
            for name in names:
                start = time.perf_counter()
                runs[name]()
                samples[(state, name)].append(time.perf_counter() - start)
        for team in teams:
            team.release()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("small", "medium"))
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--busy", action="store_true")
    args = parser.parse_args()
    if not threads.gnu_openmp_runtimes():
        print("no GNU OpenMP runtime in this process (torch without libgomp): nothing to compare")
        return 1
    print(f"torch first, {args.size} models, {args.blocks} alternating blocks of {args.rounds} rounds"
          f"{', beside a busy neighbour' if args.busy else ''}; median (p99) ms per step")
    with variants.busy_neighbour(args.busy):
        for model in models.MODELS.values():
            samples = measure(model, args.size, args.blocks, args.rounds)
            print(models.two_states_row(model.name, samples, ("spinning", "quieted"), first_over_second=True),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
