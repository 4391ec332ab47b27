"""Start-up cost: a value-and-grad in a fresh process, compiled from nothing versus loaded from a
warm disk cache; the core example's `loss` (issue 2) or the W1 workload (issue 8).

    python bench/startup.py [--repeats N] [--size N] [--formula loss|W1]

Each sample is a new Python process (subprocess). Cold: empty JITGRAD_CACHE_DIR and
NUMBA_CACHE_DIR (numba's cache for jitgrad's helper functions), as on a machine that never ran
jitgrad. Warm: the directories a cold run just filled. Both with JITGRAD_FIRST_CALL=compiled, so that the
first call compiles or loads its kernels (by default a cold first call runs on numpy; bench/jax_peer.py
times that). Printed per kind (median of the samples):
the process's wall time from spawn to exit, `import jitgrad`, and the first value-and-grad call
(trace, plan, compile or load, run), with the second call for scale, and the wait at the end for
the parallel kernels compiling (or loading) in the background meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import time
start = time.perf_counter()
import json
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler
imported = time.perf_counter()

FORMULAS = {
    "loss": lambda w, x, b: np.sum(np.exp(w * x + b) * 2 + np.tanh(x)),
    "W1": lambda w, x, b: np.sum(jg.sigmoid(w * x + b) * np.exp(-x * x) + np.tanh(x) * w),
}
loss = jg.trace(FORMULAS["FORMULA"])

rng = np.random.default_rng(0)
w, x, b = (rng.random(SIZE).astype(np.float32) for _ in range(3))
t0 = time.perf_counter()
loss.value_and_grad(w, x, b, argnums=(0, 1, 2))
t1 = time.perf_counter()
loss.value_and_grad(w, x, b, argnums=(0, 1, 2))
t2 = time.perf_counter()
compiler.wait_for_background_compiles()
t3 = time.perf_counter()
print(json.dumps({"import_s": imported - start, "first_call_s": t1 - t0, "second_call_s": t2 - t1,
                  "background_s": t3 - t2, "stats": compiler.stats()}))
"""


def run_process(folder: str, size: int, formula: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITGRAD_")}
    env.update(JITGRAD_CACHE_DIR=os.path.join(folder, "jitgrad"), NUMBA_CACHE_DIR=os.path.join(folder, "numba"),
               JITGRAD_FIRST_CALL="compiled")  # compiling against loading (a cold default first call runs numpy)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD.replace("SIZE", str(size)).replace("FORMULA", formula)], env=env, capture_output=True,
                          text=True, timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def median(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="processes per kind (default 3)")
    parser.add_argument("--size", type=int, default=1_000_000, help="elements per argument (default 1e6)")
    parser.add_argument("--formula", choices=("loss", "W1"), default="loss",
                        help="issue 2's loss (default) or issue 8's W1 formula")
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.repeats):
        folder = tempfile.mkdtemp(prefix="jitgrad-startup-")
        try:
            cold.append(run_process(folder, args.size, args.formula))
            warm.append(run_process(folder, args.size, args.formula))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    for name, samples in (("cold", cold), ("warm", warm)):
        if name == "cold":
            assert all(s["stats"]["builds"] > 0 and s["stats"]["disk_hits"] == 0 for s in samples)
        else:
            assert all(s["stats"]["builds"] == 0 and s["stats"]["disk_hits"] > 0 for s in samples)
    print(f"{args.formula} value-and-grad, {args.size} float32 elements per argument, median of {args.repeats} "
          f"fresh processes each")
    print(f"{'':6} {'process':>9} {'import':>9} {'1st call':>9} {'2nd call':>9} {'bg wait':>9}  "
          f"kernels built / loaded")
    for name, samples in (("cold", cold), ("warm", warm)):
        stats = samples[0]["stats"]
        print(f"{name:6} {median(samples, 'process_s'):8.3f}s {median(samples, 'import_s'):8.3f}s "
              f"{median(samples, 'first_call_s'):8.3f}s {median(samples, 'second_call_s'):8.3f}s "
              f"{median(samples, 'background_s'):8.3f}s  {stats['builds']} / {stats['disk_hits']}")
    first = median(warm, "first_call_s") / median(cold, "first_call_s")
    whole = median(warm, "process_s") / median(cold, "process_s")
    print(f"warm / cold: first call {first:.3f}, whole process {whole:.3f}")


if __name__ == "__main__":
    main()
