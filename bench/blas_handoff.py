"""jitgrad's step with split products' parts handed over through Python locks and without the GIL
(jitgrad/ops/blas_handoff.py), blocks alternating in one process.

    python bench/blas_handoff.py [--size small|medium] [--models lstm,transformer,conv] [--blocks N] [--rounds N]
                                 [--beside-torch] [--busy]

One process, torch imported first. Each model's step is called until the process has built the handoff (it does
so after blas_threads.HANDOFF_AFTER split products), then blocks of `rounds` calls alternate between the Python
handover and the handoff (`blas_threads.HANDOFF`, read at each product), each block's first call untimed.
`--beside-torch` runs eager PyTorch's step before each of jitgrad's calls (torch's OpenMP workers then spin
beside them); `--busy` runs everything beside a process spinning on one core. Printed per model: median (p99) ms
with the Python handover -> with the handoff, and handoff / Python. A model whose products do not split at this
size (the small conv net) is reported as such. OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are unset, as bench/run.py does.
"""
from __future__ import annotations

import argparse
import sys
import time

import variants

variants.unset_openblas_hints()
variants.import_first("torch-first")

import numpy as np  # noqa: E402

import models  # noqa: E402
import run as runner  # noqa: E402
import workloads as wl  # noqa: E402
from jitgrad.ops import blas_threads  # noqa: E402

BUILD_SECONDS = 60.0  # at most this long calling a step before its process has built the handoff


def measure(model: models.Model, size: str, blocks: int, rounds: int,
            beside_torch: bool) -> dict[tuple[str, str], list[float]] | None:
    """Seconds per call keyed (handover, "jitgrad"), or None where the step splits no product."""
    inputs = model.make_inputs(model.size(size), np.random.default_rng(0))
    step = wl.Jitgrad().prepare(model, wl.VALUE_AND_GRAD, inputs)
    torch_step = wl.TorchEager().prepare(model, wl.VALUE_AND_GRAD, inputs) if beside_torch else (lambda: None)
    splits = blas_threads._helper.splits
    step()
    if blas_threads._helper.splits == splits:
        return None
    deadline = time.monotonic() + BUILD_SECONDS
    while blas_threads._helper.handoff is None and time.monotonic() < deadline:
        step()
    if blas_threads._helper.handoff is None:
        raise SystemExit("the handoff was not built (JITGRAD_BLAS_HANDOFF=0, or numpy's BLAS has no ILP64 gemm)")
    runner.settle_jitgrad({"jitgrad": step})
    samples: dict[tuple[str, str], list[float]] = {(k, "jitgrad"): [] for k in ("python", "handoff")}
    try:
        for block in range(2 * blocks):
            kind = ("python", "handoff")[block % 2 if block % 4 < 2 else 1 - block % 2]  # ABBA order
            blas_threads.HANDOFF = kind == "handoff"
            torch_step()
            step()
            for _ in range(rounds):
                torch_step()
                start = time.perf_counter()
                step()
                samples[(kind, "jitgrad")].append(time.perf_counter() - start)
    finally:
        blas_threads.HANDOFF = True
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="medium", choices=("small", "medium"))
    parser.add_argument("--models", default="lstm,transformer,conv",
                        help="comma-separated: " + ", ".join(models.MODELS))
    parser.add_argument("--blocks", type=int, default=8, help="blocks of each handover")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beside-torch", action="store_true", help="eager PyTorch's step before each call")
    parser.add_argument("--busy", action="store_true", help="beside a process spinning on one core")
    args = parser.parse_args()
    chosen = models.chosen_models(parser, args.models)
    if not blas_threads.HANDOFF:
        parser.error("JITGRAD_BLAS_HANDOFF=0 is set: there is no handoff to compare")
    wl.configure_threads(2)
    print(f"torch first, {args.size} models, {args.blocks} blocks of {args.rounds} calls each way"
          f"{', eager torch before each call' if args.beside_torch else ''}"
          f"{', beside a busy process' if args.busy else ''}; median (p99) ms python -> handoff")
    with variants.busy_neighbour(args.busy):
        for name in chosen:
            samples = measure(models.MODELS[name], args.size, args.blocks, args.rounds, args.beside_torch)
            if samples is None:
                print(f"{name:12s} splits no product at this size", flush=True)
                continue
            print(models.two_states_row(name, samples, ("python", "handoff"), first_over_second=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
