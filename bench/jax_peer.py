"""JAX as a benchmark peer (issue 36): the same numpy model text through jitgrad and through `jax.jit`.

    python bench/jax_peer.py [--models transformer,lstm,conv] [--sizes small,medium] [--rounds N]
                             [--no-cold] [--no-overhead] [--markdown]

Needs JAX (`python -m pip install -e '.[jax]'`); without it, prints a note and exits 0. Never imports torch:
bench/models.py and bench/workloads.py import it at the top, so the definitions this script needs (the
models and their helpers, their sizes and inputs; W4's function and inputs; the error measure) are read
from those files' source and executed here (`definitions`), the rest of them left out.

The JAX twin of a function is the function itself with its module's `np` rebound to `jax.numpy`
(`jax_twin`): its code object in a copy of the module's globals where `np` is `jax.numpy` and every
function of that module (layer_norm, softmax, gelu, sigmoid, conv_relu_pool, ...) is rebound the same
way, so the helpers it calls run on jax.numpy too. The three models run under jax.numpy as written (no
in-place updates, no np.add.at). Two substitutions, both in `jax_twin`'s `extra`: W4's text calls
`jg.sigmoid`, which becomes `jax.nn.sigmoid`; and JAX, without x64, takes the conv net's int64 labels as
int32.

Three parts, printed as tables:

(a) steady state: each model at each size, value-and-grad with respect to the weights (`model.wrt`),
    `jg.trace(fn).value_and_grad(*inputs, argnums=wrt)` beside
    `jax.jit(jax.value_and_grad(twin, argnums=wrt))` on the same float32 inputs (placed on JAX's CPU
    device once, as a JAX user keeps them; each JAX call ends in `jax.block_until_ready`). Both warmed,
    jitgrad's background compiles waited for, the two checked against each other (value and gradients,
    normwise relative error <= 1e-4), then one call per sample, interleaved round-robin (bench/run.py's
    helpers): median and p99 ms.
(b) cold first calls: each model at its small size, and the README's ten-line example (N = 1e6), in a fresh
    process per library and case with empty caches (jitgrad: new JITGRAD_CACHE_DIR and NUMBA_CACHE_DIR;
    JAX: its persistent compilation cache disabled): the library's import time, the first call's seconds
    (JAX's includes starting its CPU backend), the second call's, and jitgrad's wait for the compiles
    it left to the background. Each JITGRAD_FIRST_CALL mode (numpy, the default, and compiled) when jitgrad has
    `jitgrad.kernels.cpu.first_call`. Then warm first calls (b'): per case and library, a process fills disk
    caches in a folder of its own (jitgrad's programs and kernels, after its background compiles; JAX's
    persistent compilation cache, every compile stored), and a second fresh process's first call is timed.
(c) call overhead: W4 (value-and-grad of W1's elementwise chain at N = 16, three positional arrays) and the
    dict of ten arrays of bench/pytree_overhead.py, microseconds per call, median and p99.

A cold child is this file run as `python bench/jax_peer.py --child jitgrad|jax --case transformer|lstm|conv|readme
[--size small]`; it prints one JSON line.
"""
from __future__ import annotations

import __future__
import argparse
import ast
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, Callable, Iterable

BENCH = pathlib.Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import run as runner  # the standard library only at import (bench/run.py imports torch inside functions)

TOLERANCE = 1e-4          # normwise relative error between jitgrad and JAX (float32)
MODEL_ROUNDS = 100        # per-call samples per candidate and row, as bench/models.py
MODEL_ROW_SECONDS = 5.0   # at most this long per candidate and row
OVERHEAD_ROUNDS = 5000
OVERHEAD_ROW_SECONDS = 2.0
W4_SIZE = 16
README_SIZE = 1_000_000
CHILD_TIMEOUT_S = 600
# the README's ten-line example, its `loss` as written there
README_LOSS = '''
def loss(w, x, b):
    y = w * x + b                       # plain numpy code traces unchanged
    return np.sum(np.exp(y) * 2 + np.tanh(x))
'''
# modules a definition read from the bench files may import here (torch and bench/'s own modules may not)
IMPORTABLE = {"math", "numpy", "dataclasses", "typing", "jitgrad", "abc"}


# ---------------------------------------------------------------- definitions without torch

def definitions(path: pathlib.Path, roots: Iterable[str], module_name: str) -> types.ModuleType:
    """A module holding `roots` as `path` defines them, and the module-level definitions they use, found by
    following the names their source loads; imports of other modules than IMPORTABLE's (torch, F) are bound
    to None. Executed in source order, with the file's `from __future__ import annotations`."""
    tree = ast.parse(path.read_text(), str(path))
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                defined[(alias.asname or alias.name).split(".")[0]] = node
    wanted, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        node = defined.get(name)
        if node is None or id(node) in wanted:
            continue
        wanted.add(id(node))
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            todo.extend(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module  # dataclasses look their module up
    body = []
    for node in tree.body:
        if id(node) not in wanted:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
            if top not in IMPORTABLE:
                for alias in node.names:
                    setattr(module, (alias.asname or alias.name).split(".")[0], None)
                continue
        body.append(node)
    code = compile(ast.Module(body, []), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, module.__dict__)
    return module


def model_text() -> types.ModuleType:
    """bench/models.py's MODELS (each model's numpy function, helpers, sizes and inputs), without torch."""
    return definitions(BENCH / "models.py", ["MODELS"], "jitgrad_bench_models_text")


def workload_text() -> types.ModuleType:
    """bench/workloads.py's W4 function and inputs and its error measure, without torch."""
    return definitions(BENCH / "workloads.py", ["w1_jitgrad", "vectors", "Result", "relative_error"],
                       "jitgrad_bench_workloads_text")


# ---------------------------------------------------------------- JAX twins

def jax_twin(fn: Callable[..., Any], extra: dict[str, Any] | None = None) -> Callable[..., Any]:
    """`fn` with `np` rebound to jax.numpy in a copy of its globals, where every function defined in the same
    module is rebound the same way (so the helpers it calls, and theirs, use jax.numpy); `extra` replaces
    other globals (W4's `jg`)."""
    import jax.numpy as jnp

    home = fn.__globals__
    twin_globals = {**home, "np": jnp, **(extra or {})}
    for name, value in home.items():
        if isinstance(value, types.FunctionType) and value.__globals__ is home:
            twin_globals[name] = types.FunctionType(value.__code__, twin_globals, value.__name__,
                                                    value.__defaults__, value.__closure__)
            twin_globals[name].__kwdefaults__ = value.__kwdefaults__
    return types.FunctionType(fn.__code__, twin_globals, fn.__name__, fn.__defaults__, fn.__closure__)


def w4_extra() -> dict[str, Any]:
    """W4's text calls jg.sigmoid; its JAX twin calls jax.nn.sigmoid."""
    import jax

    return {"jg": types.SimpleNamespace(sigmoid=jax.nn.sigmoid)}


def jax_value_and_grad(fn: Callable[..., Any], wrt: Any, extra: dict[str, Any] | None = None) -> Callable[..., Any]:
    import jax

    return jax.jit(jax.value_and_grad(jax_twin(fn, extra), argnums=wrt))


def jax_call(compiled: Callable[..., Any], args: tuple[Any, ...], kwargs: dict | None = None) -> Callable[[], Any]:
    """A zero-argument call of a jitted function that waits for its results (JAX dispatches asynchronously)."""
    import jax

    kwargs = kwargs or {}
    return lambda: jax.block_until_ready(compiled(*args, **kwargs))


def as_numpy(out: Any, texts: types.ModuleType) -> Any:
    """A (value, grads) pair of either library as bench/workloads.py's Result of numpy arrays."""
    import numpy as np
    import jitgrad as jg

    value, grads = out
    return texts.Result(np.asarray(value), tuple(np.asarray(g) for g in jg.tree_leaves(grads)))


# ---------------------------------------------------------------- (a) steady state, (c) overhead

def interleaved(runs: dict[str, Callable[[], Any]], rounds: int, row_seconds: float) -> dict[str, runner.Cell]:
    """Warm both (jitgrad's background compiles waited for), then one call per sample, round-robin."""
    cells = {name: runner.Cell() for name in runs}
    runner.settle_jitgrad(runs)
    runner.time_round_robin(runs, cells, rounds, sample_seconds=0.0, row_seconds=row_seconds)
    return cells


def p99(cell: runner.Cell) -> float:
    import numpy as np

    return float(np.percentile(cell.samples, 99))


def steady_rows(model_names: list[str], size_names: list[str], rounds: int) -> list[list[str]]:
    """Per model and size: jitgrad's and JAX's median and p99 ms, their ratio, the error between them."""
    import numpy as np
    import jax
    import jitgrad as jg

    texts, work = model_text(), workload_text()
    rows = []
    for name in model_names:
        model = texts.MODELS[name]
        for size_name in size_names:
            s = model.size(size_name)
            inputs = model.make_inputs(s, np.random.default_rng(0))
            traced = jg.trace(model.jitgrad_fn)
            jit_run = lambda: traced.value_and_grad(*inputs, argnums=model.wrt)  # noqa: E731
            mine = as_numpy(jit_run(), work)
            placed = tuple(jax.device_put(a) for a in inputs)
            jax_run = jax_call(jax_value_and_grad(model.jitgrad_fn, model.wrt), placed)
            theirs = as_numpy(jax_run(), work)
            error = work.relative_error(mine, theirs)
            if not error <= TOLERANCE:
                raise AssertionError(f"{name} {s.label}: jitgrad and JAX differ by {error:.2e} (normwise relative)")
            cells = interleaved({"jitgrad": jit_run, "jax": jax_run}, rounds, MODEL_ROW_SECONDS)
            mj, mx = cells["jitgrad"].median_ms, cells["jax"].median_ms
            rows.append([name, s.label, f"{mj:.3f}", f"{p99(cells['jitgrad']) * 1e3:.3f}", f"{mx:.3f}",
                         f"{p99(cells['jax']) * 1e3:.3f}", f"{mj / mx:.2f}", f"{error:.1e}",
                         f"{len(cells['jitgrad'].samples)}"])
            print(f"  {name} {s.label}: jitgrad {mj:.3f} ms, JAX {mx:.3f} ms", file=sys.stderr)
    return rows


STEADY_HEADER = ["model", "size", "jitgrad ms", "p99", "JAX ms", "p99", "jitgrad/JAX", "error", "rounds"]


def overhead_rows(rounds: int, size: int = W4_SIZE) -> list[list[str]]:
    """W4 with three positional arrays, and the dict of ten arrays of bench/pytree_overhead.py: microseconds."""
    import numpy as np
    import jax
    import jitgrad as jg
    import pytree_overhead as trees

    work = workload_text()
    w4 = work.vectors(size, np.random.default_rng(0))
    arrays = [np.random.default_rng(i).standard_normal(size).astype(np.float32) for i in range(trees.N_LEAVES)]
    params = dict(zip(trees.NAMES, arrays))
    w4_traced, dict_traced = jg.trace(work.w1_jitgrad), jg.trace(trees.as_dict)
    w4_jax = jax_value_and_grad(work.w1_jitgrad, (0, 1, 2), w4_extra())
    dict_jax = jax_value_and_grad(trees.as_dict, 0)
    placed_w4 = tuple(jax.device_put(a) for a in w4)
    placed_params = jax.device_put(params)
    forms = {
        "W4, 3 positional arrays": {
            "jitgrad": lambda: w4_traced.value_and_grad(*w4, argnums=(0, 1, 2)),
            "jax": jax_call(w4_jax, placed_w4),
            "jax, numpy inputs": jax_call(w4_jax, w4),
        },
        "dict of 10 arrays": {
            "jitgrad": lambda: dict_traced.value_and_grad(params),
            "jax": jax_call(dict_jax, (placed_params,)),
        },
    }
    rows = []
    for form, runs in forms.items():
        results = {name: as_numpy(run(), work) for name, run in runs.items()}
        error = max(work.relative_error(r, results["jax"]) for r in results.values())
        if not error <= TOLERANCE:
            raise AssertionError(f"{form}: the candidates differ by {error:.2e} (normwise relative)")
        cells = interleaved(runs, rounds, OVERHEAD_ROW_SECONDS)
        for name, cell in cells.items():
            rows.append([form, name, f"{cell.median_ms * 1e3:.1f}", f"{p99(cell) * 1e6:.1f}",
                         f"{cell.median_ms / cells['jax'].median_ms:.2f}", f"{len(cell.samples)}"])
    return rows


OVERHEAD_HEADER = ["call (N=16, value_and_grad)", "library", "µs per call", "p99 µs", "/JAX", "rounds"]


# ---------------------------------------------------------------- (b) cold first calls

def child(library: str, case: str, size_name: str) -> dict[str, Any]:
    """In a fresh process: import the library (timed), then the first and second value-and-grad of `case`."""
    import numpy as np

    start = time.perf_counter()
    if library == "jitgrad":
        import jitgrad as jg
        from jitgrad.kernels.build import compiler
    else:
        import jax
        import jax.numpy  # noqa: F401
    imported = time.perf_counter() - start
    if case == "readme":
        namespace = {"np": np}
        exec(README_LOSS, namespace)
        fn, wrt = namespace["loss"], (0, 1, 2)
        rng = np.random.default_rng(0)
        inputs = tuple(rng.random(README_SIZE, dtype=np.float32) for _ in range(3))
    else:
        model = model_text().MODELS[case]
        fn, wrt = model.jitgrad_fn, model.wrt
        inputs = model.make_inputs(model.size(size_name), np.random.default_rng(0))
    if library == "jitgrad":
        traced = jg.trace(fn)
        call = lambda: traced.value_and_grad(*inputs, argnums=wrt)  # noqa: E731
    else:
        call = jax_call(jax_value_and_grad(fn, wrt), inputs)  # numpy inputs: the first call moves them too
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    call()
    t2 = time.perf_counter()
    background = 0.0
    if library == "jitgrad":
        compiler.wait_for_background_compiles()
        background = time.perf_counter() - t2
    return {"import_s": imported, "first_s": t1 - t0, "second_s": t2 - t1, "background_s": background}


def first_call_modes() -> list[str | None]:
    """JITGRAD_FIRST_CALL's modes when jitgrad has them (jitgrad.kernels.cpu.first_call), else only the default."""
    return ["numpy", "compiled"] if importlib.util.find_spec("jitgrad.kernels.cpu.first_call") is not None else [None]


def run_child(library: str, case: str, size_name: str, mode: str | None, folder: str | None = None) -> dict[str, Any]:
    """A child with empty caches (jitgrad: new cache folders; JAX: its persistent compilation cache off), or, given
    `folder`, with the caches kept there (JAX's persistent cache on, every compile stored): a first child fills
    them, the next starts warm."""
    own = folder is None
    folder = tempfile.mkdtemp(prefix="jitgrad-jax-peer-") if own else folder
    try:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JITGRAD_", "NUMBA_CACHE_DIR", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
        env.update(JITGRAD_CACHE_DIR=os.path.join(folder, "jitgrad"), NUMBA_CACHE_DIR=os.path.join(folder, "numba"),
                   JAX_ENABLE_COMPILATION_CACHE="false" if own else "true", JAX_PLATFORMS="cpu")
        if not own:
            env.update(JAX_COMPILATION_CACHE_DIR=os.path.join(folder, "jax"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        if mode is not None:
            env["JITGRAD_FIRST_CALL"] = mode
        proc = subprocess.run([sys.executable, __file__, "--child", library, "--case", case, "--size", size_name],
                              env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"{library} {case} child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def cold_rows(model_names: list[str], size_name: str = "small") -> list[list[str]]:
    """Per case, jitgrad (in each first-call mode) and JAX, alternating, one fresh process each."""
    texts = model_text()
    cases = [(n, texts.MODELS[n].size(size_name).label) for n in model_names] + [("readme", "N=1e6")]
    rows = []
    for case, label in cases:
        found = {}
        for mode in first_call_modes():
            found["jitgrad" + (f" ({mode})" if mode else "")] = run_child("jitgrad", case, size_name, mode)
            if "jax" not in found:
                found["jax"] = run_child("jax", case, size_name, None)
        for name, r in found.items():
            rows.append([case, label, name, f"{r['import_s']:.2f}", f"{r['first_s']:.2f}", f"{r['second_s']:.3f}",
                         f"{r['background_s']:.2f}" if name != "jax" else "-"])
            print(f"  cold {case} {name}: first {r['first_s']:.2f} s", file=sys.stderr)
    return rows


COLD_HEADER = ["case", "size", "library", "import s", "first call s", "second call s", "background wait s"]


def warm_rows(model_names: list[str], size_name: str = "small") -> list[list[str]]:
    """Per case and library (jitgrad in its default mode), a fresh process on caches that a first process filled
    (jitgrad's kernels and programs, JAX's persistent compilation cache): that second process's first call."""
    texts = model_text()
    cases = [(n, texts.MODELS[n].size(size_name).label) for n in model_names] + [("readme", "N=1e6")]
    rows = []
    for case, label in cases:
        for library in ("jitgrad", "jax"):
            folder = tempfile.mkdtemp(prefix="jitgrad-jax-peer-warm-")
            try:
                run_child(library, case, size_name, None, folder)
                r = run_child(library, case, size_name, None, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            rows.append([case, label, library, f"{r['import_s']:.2f}", f"{r['first_s']:.3f}", f"{r['second_s']:.4f}"])
            print(f"  warm {case} {library}: first {r['first_s']:.3f} s", file=sys.stderr)
    return rows


WARM_HEADER = ["case", "size", "library", "import s", "first call s", "second call s"]


# ---------------------------------------------------------------- main

def machine() -> str:
    import numpy as np
    import numba
    import jax
    import jitgrad

    load = os.getloadavg()
    return (f"{runner.cpu_model()}, {os.cpu_count()} cores; load average at start {load[0]:.2f} {load[1]:.2f} "
            f"{load[2]:.2f}; Python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__} "
            f"({numba.get_num_threads()} threads), jitgrad {jitgrad.__version__}, jax {jax.__version__} "
            f"({jax.devices()[0].platform}); torch imported: {'torch' in sys.modules}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="transformer,lstm,conv")
    parser.add_argument("--sizes", default="small,medium", help="small, medium or tiny (steady state)")
    parser.add_argument("--rounds", type=int, default=MODEL_ROUNDS, help="steady-state samples per candidate")
    parser.add_argument("--overhead-rounds", type=int, default=OVERHEAD_ROUNDS)
    parser.add_argument("--no-steady", action="store_true")
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--no-overhead", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--child", choices=["jitgrad", "jax"], help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="small", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.case, args.size)))
        return 0
    if importlib.util.find_spec("jax") is None:
        print("bench/jax_peer.py: JAX is not installed (python -m pip install -e '.[jax]'); nothing to compare.")
        return 0
    show = runner.markdown_table if args.markdown else runner.plain_table
    started = time.perf_counter()
    print(machine())
    models = [m for m in args.models.split(",") if m]
    if not args.no_steady:
        rows = steady_rows(models, [s for s in args.sizes.split(",") if s], args.rounds)
        print("\n(a) steady state, value_and_grad w.r.t. the weights, float32, interleaved round-robin")
        print(show(STEADY_HEADER, rows))
    if not args.no_cold:
        rows = cold_rows(models)
        print("\n(b) cold first calls: a fresh process per library and case, empty caches")
        print(show(COLD_HEADER, rows))
        rows = warm_rows(models)
        print("\n(b') warm first calls: a fresh process per library and case, on the disk caches a process filled "
              "before it (jitgrad's programs and kernels; JAX's persistent compilation cache)")
        print(show(WARM_HEADER, rows))
    if not args.no_overhead:
        rows = overhead_rows(args.overhead_rounds)
        print("\n(c) call overhead, interleaved round-robin, one call per sample")
        print(show(OVERHEAD_HEADER, rows))
    print(f"\n{time.perf_counter() - started:.0f} s; torch imported: {'torch' in sys.modules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
