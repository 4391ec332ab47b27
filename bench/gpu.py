"""The CUDA benchmark, for a machine with a GPU: runs the CUDA tests on the real device, then times
the benchmark workloads with jitgrad (device="cuda") against eager PyTorch on CUDA.

    python bench/gpu.py [--no-tests] [--quick] [--markdown PATH]

Made for a GPU machine that has numba, numba-cuda, PyTorch and CuPy but reaches no package registry:
install jitgrad there with `pip install --no-deps --no-build-isolation -e .`. The tests run in a
subprocess with only tests/cuda's conftest (so hypothesis is not needed), covering the simulator
suite on real hardware (both matmul backends when CuPy is present) and the sm_90 PTX test. Rows
are timed until a 4.5-minute budget is spent (later rows are listed as skipped), so the whole run
stays under 5 minutes. Ratios are eager PyTorch time / jitgrad time: above 1, jitgrad is faster.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 270.0  # everything (tests included) stops starting new work after this
TEST_TIMEOUT_S = 150
SAMPLE_S = 0.05  # one timed sample repeats a call for about this long
SAMPLES = 5


def run_tests() -> str:
    """tests/cuda and the PTX test on the real GPU; returns pytest's summary line (raises on failure)."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return "skipped: pytest is not installed"
    command = [sys.executable, "-m", "pytest", "tests/cuda", "tests/test_cuda_ptx.py", "-q", "-p", "no:cacheprovider",
               "--confcutdir", "tests/cuda"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
    lines = (run.stdout + run.stderr).strip().splitlines()
    if run.returncode != 0:
        print("\n".join(lines[-60:]))
        raise SystemExit(f"CUDA tests failed (exit {run.returncode})")
    return lines[-1] if lines else "no output"


def synchronize() -> None:
    from numba import cuda
    import torch
    cuda.synchronize()
    torch.cuda.synchronize()


def time_call(fn: Callable[[], Any]) -> float:
    """Median ms per call over SAMPLES samples, each repeating `fn` for about SAMPLE_S seconds."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    once = max(time.perf_counter() - start, 1e-6)
    repeats = max(1, int(SAMPLE_S / once))
    samples = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        synchronize()
        samples.append((time.perf_counter() - start) / repeats * 1e3)
    return statistics.median(samples)


def jitgrad_call(workload: Any, mode: str, inputs: Sequence[Any]) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """The jitgrad CUDA callable on device copies of `inputs`, and how to bring its output to the host."""
    from numba import cuda
    import jitgrad as jg
    from workloads import FORWARD, Result
    fn = jg.trace(workload.jitgrad_fn, device="cuda")
    args = [cuda.to_device(a) for a in inputs]
    if mode == FORWARD:
        return (lambda: fn(*args)), (lambda out: Result(out.copy_to_host(), ()))
    return ((lambda: fn.value_and_grad(*args, argnums=workload.wrt)),
            (lambda out: Result(out[0].copy_to_host(), tuple(g.copy_to_host() for g in out[1]))))


def torch_call(workload: Any, mode: str, inputs: Sequence[Any]) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """Eager PyTorch on CUDA: forward under no_grad, value-and-grad by torch.autograd.grad."""
    import torch
    from workloads import FORWARD, Result
    tensors = [torch.from_numpy(a).cuda() for a in inputs]
    if mode == FORWARD:
        def forward() -> Any:
            with torch.no_grad():
                return workload.torch_fn(*tensors)
        return forward, (lambda out: Result(out.cpu().numpy(), ()))
    leaves = [tensors[i].requires_grad_(True) for i in workload.wrt]

    def value_and_grad() -> Any:
        loss = workload.torch_fn(*tensors)
        return loss.detach(), torch.autograd.grad(loss, leaves)
    return value_and_grad, (lambda out: Result(out[0].cpu().numpy(), tuple(g.cpu().numpy() for g in out[1])))


def bench_rows(quick: bool, deadline: float) -> list[list[str]]:
    import numpy as np
    from workloads import WORKLOADS, relative_error
    rows = []
    for workload in WORKLOADS.values():
        for size in workload.quick_sizes if quick else workload.sizes:
            for mode in workload.modes:
                label = [workload.name, workload.size_label(size), mode]
                if time.perf_counter() > deadline:
                    rows.append(label + ["skipped (time budget)"] + [""] * 4)
                    continue
                inputs = workload.make_inputs(size, np.random.default_rng(size))
                ours, ours_result = jitgrad_call(workload, mode, inputs)
                theirs, theirs_result = torch_call(workload, mode, inputs)
                start = time.perf_counter()
                out = ours()
                synchronize()
                first = time.perf_counter() - start
                error = relative_error(ours_result(out), theirs_result(theirs()))
                ours_ms, theirs_ms = time_call(ours), time_call(theirs)
                rows.append(label + [f"{ours_ms:.3f}", f"{theirs_ms:.3f}", f"{theirs_ms / ours_ms:.2f}",
                                     f"{first:.2f}", f"{error:.1e}"])
                print(" | ".join(rows[-1]), flush=True)
    return rows


def markdown(rows: list[list[str]], header: list[str]) -> str:
    head = ["workload", "size", "mode", "jitgrad CUDA ms", "eager torch CUDA ms", "torch/jitgrad",
            "jitgrad first call s", "rel. error vs torch"]
    lines = [f"- {h}" for h in header] + ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-tests", action="store_true", help="only time the workloads")
    parser.add_argument("--quick", action="store_true", help="the workloads' quick sizes only")
    parser.add_argument("--markdown", help="also write the table to this file")
    options = parser.parse_args()
    start = time.perf_counter()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise SystemExit("bench/gpu.py times the real GPU: unset NUMBA_ENABLE_CUDASIM")
    from numba import cuda
    if not cuda.is_available():
        raise SystemExit(f"bench/gpu.py needs a CUDA GPU: {cuda.cuda_error()}")
    import numba
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py compares with PyTorch on CUDA, and this torch has no CUDA")
    sys.path.insert(0, str(ROOT / "bench"))
    from jitgrad.kernels.cuda import executor as runtime_cuda
    device = cuda.get_current_device()
    header = [f"GPU: {device.name.decode() if isinstance(device.name, bytes) else device.name}, compute capability "
              f"{device.compute_capability}", f"numba {numba.__version__}, torch {torch.__version__}, "
              f"matmul backend: {runtime_cuda.matmul_backend()}"]
    if not options.no_tests:
        summary = run_tests()
        header.append(f"CUDA tests on this GPU: {summary}")
        print(header[-1], flush=True)
    table = markdown(bench_rows(options.quick, start + BUDGET_S), header)
    print(table)
    if options.markdown:
        Path(options.markdown).write_text(table)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
