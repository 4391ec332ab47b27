"""Calls spread over the cores or kept on one (issue 33): what `CallSpread` chose for each bench model's
value-and-grad step, against both ways forced, in fresh processes.

    python bench/call_spread.py [--models conv:medium,transformer:small,...] [--processes N] [--rounds N]

Each (model, size) runs in `--processes` fresh child processes, torch imported first as users write it
(`bench/variants.py`). A child calls the step until its background compiles are done and `CallSpread` has chosen
(`kernels/cpu/variants.py`), then times, round-robin with the starting one rotating: the step as chosen ('auto'),
every call spread (each kernel's own variant, the BLAS helper for split products) and every call on one core
(serial kernels, a split product's parts in turn). Printed per child: the choice, the timings it was made from,
and the three medians in ms. The results are the same bits whichever way a call ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_MODELS = "conv:small,conv:medium,transformer:small,transformer:medium,lstm:small,lstm:medium"


def child(name: str, size: str, rounds: int) -> dict:
    """One process's measurement of one model (run in a fresh child)."""
    import variants  # bench/variants.py: imports torch first unless told otherwise

    variants.import_first(variants.requested_order())
    import numpy as np

    import jitgrad as jg
    import models
    from jitgrad.kernels.build import compiler
    from jitgrad.kernels.cpu.variants import ONE_CORE, SPREAD

    model = models.MODELS[name]
    inputs = model.make_inputs(model.size(size), np.random.default_rng(0))
    traced = jg.trace(model.jitgrad_fn)

    def step() -> None:
        traced.value_and_grad(*inputs, argnums=model.wrt)

    step()
    compiler.wait_for_background_compiles()
    (executable,) = [e for key, e in next(iter(traced.plans.plans.values())).executables.items()
                     if key[0] == "joint"]
    chooser = executable.spread.chooser
    for _ in range(200):
        if chooser.choice is not None or not executable.spread.active:
            break
        step()
    chosen = chooser.choice
    made_from = {way: statistics.median(t) * 1e3 for way, t in chooser.timings.items() if t}
    ways = {"auto": chosen, "spread": SPREAD, "one core": ONE_CORE}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for r in range(rounds):
        order = list(ways)[r % 3:] + list(ways)[:r % 3]
        for way in order:
            chooser.choice, chooser.calls_since_choice = ways[way], 0
            start = time.perf_counter()
            step()
            times[way].append(time.perf_counter() - start)
    return {"model": f"{name} {size}", "chose": chosen, "made from": made_from,
            "ms": {way: statistics.median(t) * 1e3 for way, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help="model:size pairs, comma-separated")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per model")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, size = args.child.split(":")
        print(json.dumps(child(name, size, args.rounds)))
        return
    env = {**os.environ, "JITGRAD_FIRST_CALL": "compiled"}
    print(f"{'model':20} {'chose':9} {'made from (spread / one core)':30} {'auto':>7} {'spread':>7} {'one core':>8}")
    for pair in args.models.split(","):
        for _ in range(args.processes):
            out = subprocess.run([sys.executable, __file__, "--child", pair, "--rounds", str(args.rounds)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            made = " / ".join(f"{row['made from'].get(w, float('nan')):.2f}" for w in ("spread", "one_core"))
            ms = row["ms"]
            print(f"{row['model']:20} {str(row['chose']):9} {made:30} {ms['auto']:7.2f} {ms['spread']:7.2f} "
                  f"{ms['one core']:8.2f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
