"""The benchmark runner: jitgrad against eager PyTorch, torch.compile and numpy by hand.

    python bench/run.py [--quick] [--workload W1,W2] [--repeats N] [--no-compile] [--markdown PATH]
                        [--models transformer,lstm,conv,rnn,mlp] [--no-models] [--no-workloads]
                        [--import-order torch-first|jitgrad-first] [--busy] [--no-other-modes]

All candidates run in one process with the same threads, interleaved round-robin (the order
rotates every round) so load from elsewhere hits them alike; numpy by hand is timed in rounds of its
own after them, since its products leave OpenBLAS's threads spinning for about 0.1 s (`TIMED_APART`). Each row reports median ms per
call, ratios to jitgrad (above 1: jitgrad is faster), the time of the first call of jitgrad and
torch.compile (trace + compile, excluded from the medians), and a check of every candidate's
value and gradients against eager PyTorch. Then the model section (bench/models.py): a transformer
block, an LSTM and a conv net, with 99th percentiles, cold starts in fresh processes and the memory of
one step, and two structural measurements (an unrolled RNN's trace-to-fuse time, 1000 MLP steps).

The process imports torch before jitgrad, as users write it (`--import-order torch-first`, the
default), or jitgrad first (`jitgrad-first`); its child processes import them in the same order. jitgrad
changes nothing in torch's OpenMP runtime in either order (jitgrad.runtime.threads). The model rows run on a quiet
machine, or with `--busy` beside a `python -c` loop spinning on one core (bench/variants.py). Unless
`--no-other-modes`, each model's small row is also measured in the other three modes (import order
x busy), with as many rounds: the other load in this process, the other import order in a child
process. So the default `python bench/run.py` runs W1-W4 and the model section torch-first on a quiet
machine, plus the small model rows torch-first busy, jitgrad-first quiet and jitgrad-first busy.

Compile times are cold by default: jitgrad gets a fresh kernel cache directory and inductor's
caches are disabled; `--warm-caches` uses the persistent caches instead. This module sets those
environment variables, and unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (see `--keep-openblas-env`),
before numpy or torch is imported, so those (and the workloads) are imported inside the functions
that run after it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import variants

SAMPLE_SECONDS = 0.05      # one timed sample runs a candidate this long (several calls when they are short)
ROW_SECONDS = 2.5          # at most this long per candidate per row, so large sizes get fewer repeats
MIN_REPEATS = 3
# Timed in rounds of their own, after the others: numpy's products wake OpenBLAS's threads, which then spin for about
# 0.1 s (OpenBLAS's THREAD_TIMEOUT, 2^28 cycles) on the cores the next candidate needs. Measured on W2 at B = 1024,
# torch first: with numpy in the round robin, jitgrad 20.2 ms, eager 18.2, torch.compile 29.3; without it, 12.2,
# 15.9 and 16.0 (docs/benchmarks.md, "numpy's OpenBLAS threads").
TIMED_APART = ("numpy",)
TOLERANCE = 1e-4           # normwise relative error allowed against eager PyTorch (float32)
MARKDOWN_BEGIN = "<!-- bench/run.py table: begin -->"
MARKDOWN_END = "<!-- bench/run.py table: end -->"


@dataclass
class Cell:
    """One candidate in one row: its median ms per call, first-call seconds, check error, or why it failed."""

    median_ms: float | None = None
    first_call_s: float | None = None
    error: float | None = None
    worst_output: str = ""
    failure: str | None = None
    samples: list[float] = field(default_factory=list)


@dataclass
class Row:
    workload: str
    size: str
    mode: str
    repeats: int
    cells: dict[str, Cell]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes and 3 repeats: a smoke test")
    parser.add_argument("--workload", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="round-robin rounds per row (default 15, 3 with --quick; fewer for long calls)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table and machine as markdown")
    parser.add_argument("--threads", type=int, default=2, help="threads for every candidate (default 2)")
    parser.add_argument("--warm-caches", action="store_true",
                        help="use jitgrad's and inductor's persistent caches (first-call times are then warm)")
    parser.add_argument("--keep-openblas-env", action="store_true",
                        help=f"keep {' and '.join(variants.OPENBLAS_HINTS)} if set (they slow numpy's BLAS)")
    parser.add_argument("--models", default="",
                        help="comma-separated parts of the model section (bench/models.py): transformer, lstm, "
                             "conv, rnn (trace-to-fuse time of an unrolled RNN), mlp (1000 steps beside torch); "
                             "default: all")
    parser.add_argument("--no-models", action="store_true", help="skip the model section")
    parser.add_argument("--no-workloads", action="store_true", help="skip the W1-W4 workloads (models only)")
    parser.add_argument("--import-order", choices=variants.IMPORT_ORDERS, default=variants.IMPORT_ORDERS[0],
                        help="import torch or jitgrad first in this process and its children (default torch-first, "
                             "as users write it)")
    parser.add_argument("--busy", action="store_true",
                        help="run the model rows beside a process spinning on one core (a busy neighbour)")
    parser.add_argument("--no-other-modes", action="store_true",
                        help="skip the small model rows in the other import order and the other load")
    return parser.parse_args(argv)


def prepare_environment(args: argparse.Namespace) -> list[str]:
    """Set the process environment before numpy/torch load; returns notes saying what was done.
    Without --warm-caches, JITGRAD_CACHE_DIR is a fresh temporary directory that `main` removes."""
    notes = []
    os.environ[variants.IMPORT_ORDER_ENV] = args.import_order
    hints = {k: os.environ[k] for k in variants.OPENBLAS_HINTS if k in os.environ}
    if not hints:
        notes.append(f"{' and '.join(variants.OPENBLAS_HINTS)}: not set")
    elif args.keep_openblas_env:
        notes.append("kept " + ", ".join(f"{k}={v}" for k, v in hints.items()))
    else:
        variants.unset_openblas_hints()
        notes.append("unset for this process: " + ", ".join(f"{k}={v}" for k, v in hints.items()))
    if args.warm_caches:
        notes.append("caches: persistent (jitgrad kernel cache, inductor caches) — first calls may be warm")
    else:
        os.environ["JITGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="jitgrad-bench-")
        os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
        notes.append("caches: cold (a fresh temporary JITGRAD_CACHE_DIR, TORCHINDUCTOR_FORCE_DISABLE_CACHES=1)")
    return notes


# ---------------------------------------------------------------------- timing

def per_call_estimate(run: Callable[[], Any]) -> float:
    """Seconds per call, from a batch of calls lasting at least 10 ms."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            run()
        elapsed = time.perf_counter() - start
        if elapsed >= 0.01:
            return elapsed / number
        number *= 10


def timed_sample(run: Callable[[], Any], number: int) -> float:
    """Seconds per call over `number` calls, garbage collection paused (as timeit does)."""
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            run()
        return (time.perf_counter() - start) / number
    finally:
        gc.enable()


def first_calls(workload: Any, size: int, mode: str, inputs: Any, candidates: list[Any],
                cells: dict[str, Cell]) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """Prepare each candidate and time its first (tracing, compiling) call; a candidate that raises
    is recorded as unsupported, not fatal. Returns the callables to time and the results to check."""
    runs, results = {}, {}
    for c in candidates:
        try:
            start = time.perf_counter()
            run = c.prepare(workload, mode, inputs)
            out = run()
            cells[c.name].first_call_s = time.perf_counter() - start
            results[c.name] = c.result(mode, out)
        except Exception as exc:
            cells[c.name].failure = f"unsupported: {type(exc).__name__}"
            message = str(exc).splitlines()[0] if str(exc) else ""
            print(f"  {c.name} on {workload.name} {workload.size_label(size)} {mode}: {type(exc).__name__}: {message}",
                  file=sys.stderr)
            continue
        runs[c.name] = run
    return runs, results


def settle_jitgrad(runs: dict[str, Callable[[], Any]]) -> float:
    """jitgrad's first call leaves compiles to the background: the full-level code of its quick kernels once they
    run again (`jitgrad.kernels.cpu.executor.PROMOTE_AT_CALL`), and parallel variants. Run it that often more (once
    more than that: a first call that ran on numpy, `jitgrad.kernels.cpu.first_call`, ran no kernel), then wait for
    them, so the timing sees the code it keeps; the seconds waited. Then the calls that time each large kernel's
    variants and then whole calls spread against on one core (`jitgrad.kernels.cpu.variants`), untimed, as a
    user's first steps: the timed rounds see the choices a run keeps."""
    from jitgrad.kernels.cpu import executor as runtime
    from jitgrad.kernels.cpu.variants import VariantChooser
    from jitgrad.kernels.build import compiler

    run = runs.get("jitgrad")
    for _ in range(runtime.PROMOTE_AT_CALL if run is not None else 0):
        run()
    start = time.perf_counter()
    compiler.wait_for_background_compiles()
    waited = time.perf_counter() - start
    for _ in range(4 * (VariantChooser.TRIALS + 1) if run is not None else 0):  # a streak of each, kernels then calls
        run()
    return waited


def check_against_eager(workload: Any, mode: str, results: dict[str, Any], cells: dict[str, Cell]) -> None:
    """Record each candidate's largest error against eager PyTorch and which output it is in."""
    import workloads as wl

    reference = results.get("eager")
    if reference is None:
        return
    expected = 1 + (len(workload.wrt) if mode == wl.VALUE_AND_GRAD else 0)
    for name, result in results.items():
        if name == "eager":
            continue
        errors = wl.output_errors(result, reference)
        worst = max(range(len(errors)), key=errors.__getitem__)
        cells[name].error = errors[worst]
        if len(errors) != expected:
            cells[name].worst_output = "number of outputs"
        else:
            cells[name].worst_output = "value" if worst == 0 else f"grad of arg {workload.wrt[worst - 1]}"


def time_round_robin(runs: dict[str, Callable[[], Any]], cells: dict[str, Cell], max_repeats: int,
                     sample_seconds: float = SAMPLE_SECONDS, row_seconds: float = ROW_SECONDS) -> int:
    """Median seconds per call of each callable, sampled in rounds whose order rotates; returns the rounds.
    Each sample lasts about `sample_seconds` (0: one call per sample); long calls get fewer rounds, so a
    candidate's samples take about `row_seconds` at most (at least MIN_REPEATS rounds)."""
    numbers = {}
    longest = 0.0
    for name, run in runs.items():
        run()
        estimate = per_call_estimate(run)
        numbers[name] = max(1, round(sample_seconds / estimate))
        longest = max(longest, numbers[name] * estimate)
    repeats = min(max_repeats, max(MIN_REPEATS, int(row_seconds / longest))) if longest else 0
    order = list(runs)
    for r in range(repeats):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            cells[name].samples.append(timed_sample(runs[name], numbers[name]))
    for name in runs:
        cells[name].median_ms = statistics.median(cells[name].samples) * 1e3
    return repeats


def measure_row(workload: Any, size: int, mode: str, candidates: list[Any], max_repeats: int) -> Row:
    """One (workload, size, mode): first calls, checks against eager PyTorch, interleaved timing."""
    import numpy as np

    gc.collect()
    inputs = workload.make_inputs(size, np.random.default_rng(0))
    cells = {c.name: Cell() for c in candidates}
    runs, results = first_calls(workload, size, mode, inputs, candidates, cells)
    check_against_eager(workload, mode, results, cells)
    del results
    settle_jitgrad(runs)
    apart = {name: runs.pop(name) for name in TIMED_APART if name in runs}
    repeats = time_round_robin(runs, cells, max_repeats)
    if apart:
        time_round_robin(apart, cells, max_repeats)
    return Row(workload.name, workload.size_label(size), mode, repeats, cells)


# ---------------------------------------------------------------------- report

def format_ms(value: float | None) -> str:
    if value is None:
        return "-"
    for limit, digits in ((0.1, 4), (1, 3), (10, 2), (100, 1)):
        if value < limit:
            return f"{value:.{digits}f}"
    return f"{value:.0f}"


def format_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ratio(row: Row, name: str) -> str:
    mine, theirs = row.cells.get("jitgrad"), row.cells.get(name)
    if mine is None or theirs is None or mine.median_ms is None or theirs.median_ms is None:
        return "-"
    return f"{theirs.median_ms / mine.median_ms:.2f}"


def check_mark(row: Row) -> str:
    """'ok' when every checked candidate is within TOLERANCE of eager PyTorch, else who is off and by how much."""
    if row.cells.get("eager") is None or row.cells["eager"].failure:
        return "no reference"
    bad = [f"{n} {c.error:.1e} ({c.worst_output})" for n, c in row.cells.items()
           if c.error is not None and not c.error <= TOLERANCE]
    worst = max((c.error for c in row.cells.values() if c.error is not None), default=0.0)
    return "MISMATCH " + ", ".join(bad) if bad else f"ok ({worst:.0e})"


def table(rows: list[Row], names: list[str]) -> tuple[list[str], list[list[str]]]:
    header = ["workload", "size", "mode", "reps"]
    for n in names:
        header.append(f"{n} ms")
        if n in ("jitgrad", "compile"):
            header.append(f"{n} 1st s")
    header += [f"{n}/jitgrad" for n in names if n != "jitgrad"] + ["check"]
    body = []
    for row in rows:
        line = [row.workload, row.size, "fwd" if row.mode == "forward" else "vg", str(row.repeats)]
        for n in names:
            cell = row.cells[n]
            line.append(cell.failure or format_ms(cell.median_ms))
            if n in ("jitgrad", "compile"):
                line.append("-" if cell.failure else format_seconds(cell.first_call_s))
        line += [ratio(row, n) for n in names if n != "jitgrad"] + [check_mark(row)]
        body.append(line)
    return header, body


def plain_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(notes: list[str], threads: int, load_at_start: tuple[float, float, float]) -> list[str]:
    """The machine and library set-up the numbers were measured with."""
    import llvmlite
    import numba
    import numpy as np
    import torch

    import jitgrad
    import workloads as wl

    try:
        layer = numba.threading_layer()
    except ValueError:
        layer = "not started"
    aten = [line.split(":", 1)[1].strip() for line in torch.__config__.parallel_info().splitlines()
            if line.startswith("ATen parallel backend")]
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"CPU: {cpu_model()}, {os.cpu_count()} cores ({affinity} usable); load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load_at_start)} at start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "at end",
        f"python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, "
        f"llvmlite {llvmlite.__version__}, torch {torch.__version__}, jitgrad {jitgrad.__version__}",
        f"threads: {threads} per candidate; numba threading layer {layer} ({numba.get_num_threads()} threads); "
        f"torch {torch.get_num_threads()} threads, ATen backend {aten[0] if aten else '?'}",
        f"import order: {variants.observed_order()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
        f"JITGRAD_OPENMP_SPIN={os.environ.get('JITGRAD_OPENMP_SPIN', '(unset: keep)')}",
        "OpenBLAS loaded (numpy's, and scipy's if imported): " + ("; ".join(wl.openblas_info()) or "none"),
        "OPENBLAS_* hints: " + notes[0],
        *notes[1:],
    ]


def write_markdown(path: str, text: str) -> None:
    """Write `text` to `path`, or between the BEGIN/END markers if `path` has them (keeping the prose)."""
    block = f"{MARKDOWN_BEGIN}\n{text}\n{MARKDOWN_END}"
    old = ""
    if os.path.exists(path):
        with open(path) as fh:
            old = fh.read()
    if MARKDOWN_BEGIN in old and MARKDOWN_END in old:
        head, rest = old.split(MARKDOWN_BEGIN, 1)
        block = head + block + rest.split(MARKDOWN_END, 1)[1]
    with open(path, "w") as fh:
        fh.write(block if block.endswith("\n") else block + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = prepare_environment(args)
    try:
        return run_benchmark(args, argv, notes)
    finally:
        if not args.warm_caches:
            shutil.rmtree(os.environ["JITGRAD_CACHE_DIR"], ignore_errors=True)


def run_benchmark(args: argparse.Namespace, argv: list[str] | None, notes: list[str]) -> int:
    """Measure the chosen workloads, print the table and machine, and write the markdown if asked."""
    load_at_start = os.getloadavg()
    variants.import_first(args.import_order)
    import models
    import workloads as wl

    wl.configure_threads(args.threads)
    chosen = [w.strip() for w in args.workload.split(",") if w.strip()] or list(wl.WORKLOADS)
    unknown = [w for w in chosen if w not in wl.WORKLOADS]
    if unknown:
        print(f"unknown workload(s) {unknown}; choose from {list(wl.WORKLOADS)}", file=sys.stderr)
        return 2
    parts = [] if args.no_models else [p.strip() for p in args.models.split(",") if p.strip()] or list(models.PARTS)
    unknown = [p for p in parts if p not in models.PARTS]
    if unknown:
        print(f"unknown model part(s) {unknown}; choose from {list(models.PARTS)}", file=sys.stderr)
        return 2
    if args.no_workloads:
        chosen = []
    repeats = args.repeats or (3 if args.quick else 15)
    candidates = wl.candidates(with_compile=not args.no_compile)
    names = [c.name for c in candidates]
    started = time.perf_counter()
    rows = []
    for name in chosen:
        workload = wl.WORKLOADS[name]
        for size in workload.quick_sizes if args.quick else workload.sizes:
            for mode in workload.modes:
                row = measure_row(workload, size, mode, candidates, repeats)
                rows.append(row)
                print(f"{row.workload} {row.size} {row.mode}: " + ", ".join(
                    f"{n} {c.failure or format_ms(c.median_ms) + ' ms'}" for n, c in row.cells.items())
                    + f"  [{check_mark(row)}]", flush=True)
    section = (models.run_section(parts, args.quick, args.repeats, args.threads, not args.no_compile, args.busy,
                                  not args.no_other_modes) if parts else None)
    elapsed = time.perf_counter() - started
    header, body = table(rows, names)
    command = " ".join(["python bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    info = machine(notes, args.threads, load_at_start)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    legend = (f"median ms per call; X/jitgrad = X's time over jitgrad's (above 1: jitgrad faster); "
              f"'1st s' = first call (trace + compile), not in the medians; check = largest normwise relative "
              f"error of value and gradients against eager PyTorch (tolerance {TOLERANCE:g}); fwd = forward, "
              f"vg = value-and-grad; jitgrad, eager and compile interleaved, numpy timed after them in rounds of its "
              f"own (its products leave OpenBLAS's threads spinning ~0.1 s)")
    print()
    if rows:
        print(plain_table(header, body))
        print()
        print(legend)
    if section is not None:
        print()
        print("\n".join(models.render(section, plain_table, args.threads)))
    for line in info:
        print(line)
    print(f"command: {command}; {when}; total {elapsed:.0f} s")
    if args.markdown:
        workload_lines = [f"- {w.name}: `{w.formula}`" for w in (wl.WORKLOADS[n] for n in chosen)]
        workload_part = ([markdown_table(header, body), "", legend + ".", "", "Workloads (float32):",
                          *workload_lines, ""] if rows else [])
        model_part = (["Models (bench/models.py):", "", *models.render(section, markdown_table, args.threads), ""]
                      if section is not None else [])
        text = "\n".join([f"Command: `{command}` — {when}, {elapsed:.0f} s in all.", "", *workload_part,
                          *model_part, "Machine:", *[f"- {line}" for line in info]])
        write_markdown(args.markdown, text)
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
