"""Data-parallel W2 on a Dask LocalCluster (`jg.distributed`) against the single-process value-and-grad.

    python -m pip install -e '.[bench,distributed]'
    python bench/data_parallel.py [--batch 16384] [--small 64] [--repeats 15] [--cores 2]

W2 of bench/workloads.py: sum(tanh(x @ W + b) ** 2), W 512x512, float32, gradients of W and b. For a
LocalCluster of 1 worker (all cores to its numba and BLAS threads) and of 2 workers (half each), the
batch is placed once with `jg.distributed.shard` (one shard per worker, not timed) and each round times
one distributed step and one single-process `jg.value_and_grad` call with all cores, alternately, so
load from elsewhere hits both alike. Printed: median ms per step and rows/s at the large batch, and at
the small batch the per-step overhead of the distribution (distributed minus single-process median);
then the best (minimum) times, which load from other processes inflates least, and for scale Dask's own
round trip of one empty task on the same cluster.
Every distributed result is checked against the single-process one. Workers use jitgrad's usual
kernel cache, so a second run of this script compiles nothing.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import variants

variants.unset_openblas_hints()  # before numpy loads its BLAS, here and in the workers (they inherit the environment)

import numpy as np  # noqa: E402
from dask.distributed import Client, LocalCluster, wait  # noqa: E402

import jitgrad as jg  # noqa: E402
TOLERANCE = 1e-4  # normwise relative error allowed against the single-process result (float32)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16384, help="rows of the large batch (default 16384)")
    parser.add_argument("--small", type=int, default=64, help="rows of the small batch (default 64)")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds per row (default 15)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="cores to share out (default all)")
    return parser.parse_args(argv)


def load_workloads() -> Any:
    """bench/workloads.py (imports torch: only this process loads it, the workers never do)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.py")
    spec = importlib.util.spec_from_file_location("jitgrad_bench_workloads", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def w2(x, weight, bias):
    """W2 (workloads.w2_jitgrad), defined in this script so that Dask sends it to workers by value."""
    return np.sum(np.tanh(x @ weight + bias) ** 2)


def seconds(call: Callable[[], Any]) -> float:
    """Wall time of one call."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def relative_error(got: tuple[Any, Any], want: tuple[Any, Any]) -> float:
    """The largest normwise relative error over the value and the gradients."""
    pairs = [(got[0], want[0])] + list(zip(got[1], want[1]))
    return max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) / float(np.max(np.abs(np.float64(b))))
               for a, b in pairs)


def worker_env(threads: int) -> dict[str, str]:
    """Each worker's numba, OpenMP and BLAS threads (Dask's nanny sets the BLAS ones to 1 otherwise)."""
    return {name: str(threads) for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                            "MKL_NUM_THREADS")}


def measure(workers: int, args: argparse.Namespace, inputs: dict[int, tuple]) -> list[dict[str, Any]]:
    """Rows for one cluster size: per batch, distributed and single-process medians and the check."""
    local = jg.value_and_grad(w2, argnums=(1, 2))
    rows = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env=worker_env(max(1, args.cores // workers))) as cluster, Client(cluster) as client:
        step = jg.distributed.value_and_grad(w2, client, argnums=(1, 2), batch_argnums=0, reduce="sum")
        round_trip = statistics.median(seconds(lambda: client.submit(int, pure=False).result())
                                       for _ in range(args.repeats))
        for batch, (x, weight, bias) in inputs.items():
            [placed] = jg.distributed.shard(client, x, shards=workers)
            wait(placed)
            error = relative_error(step(placed, weight, bias), local(x, weight, bias))  # also compiles
            dist, single = [], []
            for _ in range(args.repeats):
                dist.append(seconds(lambda: step(placed, weight, bias)))
                single.append(seconds(lambda: local(x, weight, bias)))
            rows.append({"workers": workers, "batch": batch, "dist_ms": 1e3 * statistics.median(dist),
                         "single_ms": 1e3 * statistics.median(single), "dist_best_ms": 1e3 * min(dist),
                         "single_best_ms": 1e3 * min(single), "error": error, "round_trip_ms": 1e3 * round_trip})
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, param_bytes: int) -> None:
    print(f"\nW2 value-and-grad (W, b), float32, 512 features; {args.repeats} rounds; {args.cores} cores; "
          f"{datetime.date.today()}; {platform.processor() or platform.machine()}; load {os.getloadavg()[0]:.1f}")
    print(f"{'workers':>7} {'batch':>6} {'dist ms':>9} {'single ms':>9} {'dist rows/s':>12} {'single rows/s':>13} "
          f"{'single/dist':>11} {'overhead ms':>11} {'best: dist':>10} {'single':>8} {'overhead':>8} {'rel err':>8}")
    for r in rows:
        print(f"{r['workers']:>7} {r['batch']:>6} {r['dist_ms']:>9.2f} {r['single_ms']:>9.2f} "
              f"{r['batch'] / r['dist_ms'] * 1e3:>12.0f} {r['batch'] / r['single_ms'] * 1e3:>13.0f} "
              f"{r['single_ms'] / r['dist_ms']:>11.2f} {r['dist_ms'] - r['single_ms']:>11.2f} "
              f"{r['dist_best_ms']:>10.2f} {r['single_best_ms']:>8.2f} {r['dist_best_ms'] - r['single_best_ms']:>8.2f} "
              f"{r['error']:>8.1e}")
    for workers in sorted({r["workers"] for r in rows}):
        trip = next(r["round_trip_ms"] for r in rows if r["workers"] == workers)
        print(f"{workers} worker(s): Dask's own round trip of one empty task (client.submit(int).result()): "
              f"{trip:.2f} ms")
    print(f"parameters (and so each gradient partial): {param_bytes} bytes")
    bad = [r for r in rows if not r["error"] <= TOLERANCE]
    if bad:
        raise SystemExit(f"distributed results differ from the single-process ones: {bad}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Sending large graph")  # shard() sends each batch once, on purpose
    wl = load_workloads()
    wl.configure_threads(args.cores)
    rng = np.random.default_rng(0)
    inputs = {batch: wl.mlp_inputs(batch, rng) for batch in (args.batch, args.small)}
    same = relative_error(jg.value_and_grad(w2, argnums=(1, 2))(*inputs[args.small]),
                          jg.value_and_grad(wl.w2_jitgrad, argnums=(1, 2))(*inputs[args.small]))
    assert same == 0, f"w2 is not workloads.w2_jitgrad ({same})"
    saved_env = dict(os.environ)  # Dask's nannies write their pre-spawn variables into this process's environment
    rows = []
    for workers in (1, 2):
        rows += measure(workers, args, inputs)
        os.environ.clear()
        os.environ.update(saved_env)
    _, weight, bias = inputs[args.batch]
    report(rows, args, weight.nbytes + bias.nbytes)


if __name__ == "__main__":
    main()
