"""The disk cache of compiled programs (jitgrad.runtime.programs) and the warm start it gives with the kernel cache:
a fresh process on a warm directory derives no program, builds no kernel, compiles no kernel source and returns the
cold process's bits; anything that changes the traced graph or the recipe is another key; damaged, forged or
switched-off entries change nothing but the time. Each case runs in fresh interpreters sharing one cache folder."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import jitgrad as jg
from jitgrad import cache
from jitgrad.ir.graph import Aval, Graph, Var
from jitgrad.runtime import graph_keys, programs

# A tanh-RNN with gates split from one product, unrolled over T = 3, value-and-grad, call and forward/backward;
# JG_SCALE is a constant of the graph, JG_ARGNUMS the arguments differentiated. The child prints a digest of
# every result's bytes, the counters, how many kernel sources it compiled with Python's `compile` (its module
# code not loaded from disk) and wrote from loop nests (not stored with a loaded program), whether its kernels' libraries were loaded without their bitcode yet still link,
# and the error against float64 numpy.
CHILD = r"""
import hashlib, json, os, sys
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler, entries
from jitgrad.runtime import programs

from jitgrad.kernels.cpu import codegen
compiled_sources = []
entries.compile = lambda source, filename, mode: (compiled_sources.append(filename), compile(source, filename, mode))[1]
written = []  # kernel sources written from loop nests (a loaded program's come with it)
generate = codegen.module_source
codegen.module_source = lambda kernel: (written.append(1), generate(kernel))[1]
SCALE = float(os.environ.get("JG_SCALE", "0.5"))
ARGNUMS = tuple(int(a) for a in os.environ.get("JG_ARGNUMS", "1,2,3").split(","))

def rnn(xs, wx, wh, b):
    h = np.zeros((xs.shape[1], wh.shape[0]), np.float32)
    for t in range(xs.shape[0]):
        i, g = np.split(xs[t] @ wx + h @ wh + b, 2, axis=1)
        h = 1 / (1 + np.exp(-i)) * np.tanh(g) + h * SCALE
    return np.mean(h * h)

class Double(jg.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0

def with_function(xs, wx, wh, b):
    return np.sum(Double.apply(xs) * np.sum(wx))

rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 5), (5, 12), (6, 12), (12,))]
fn = with_function if os.environ.get("JG_FUNCTION") else rnn
f = jg.trace(fn)
value, grads = f.value_and_grad(*args, argnums=ARGNUMS)
outs = [value, *grads, f(*args)]
if not os.environ.get("JG_FUNCTION"):
    forward, ctx = f.forward(*args)
    outs += [forward, *[g for g in f.backward(ctx, np.float32(1.0)) if g is not None]]
compiler.wait_for_background_compiles()
libraries = [fn.overloads[sig].library for c in compiler._modules.values() for name in ("serial_kernel",)
             for fn in [c.functions[name]] for sig in fn.signatures]
loaded = [lib for lib in libraries if isinstance(lib, entries.LoadedLibrary)]
linkable = all(entries.defined_symbols(lib._get_module_for_linking()) for lib in loaded)
args64 = [a.astype(np.float64) for a in args]
error = abs(float(fn(*args64)) / float(value) - 1)
print(json.dumps({"digest": hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest(),
                  "stats": compiler.stats(), "programs": programs.stats(), "compiled_sources": len(compiled_sources),
                  "written_sources": len(written),
                  "loaded_libraries": len(loaded), "linkable": linkable, "error": error}))
"""


def run_child(folder, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAD_", "JG_"))}
    environ.update({"JITGRAD_CACHE_DIR": str(folder), "NUMBA_CACHE_DIR": str(folder / "numba"),
                    "JITGRAD_COMPILE_HELPER": "0", "JITGRAD_FIRST_CALL": "compiled"}, **env)  # bits from call 1
    proc = subprocess.run([sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] < 1e-5, result
    return result


def program_files(folder):
    return sorted((folder / cache.version_tag()).glob(cache.PROGRAM_PREFIX + "*.jgp"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    folder = tmp_path_factory.mktemp("programs")
    return folder, run_child(folder)


def test_a_cold_process_derives_and_stores_each_program(cold) -> None:
    folder, result = cold
    assert result["programs"]["program_misses"] == result["programs"]["program_writes"] == 3  # vg, call, split
    assert result["programs"]["program_hits"] == 0 and len(program_files(folder)) == 3
    assert result["stats"]["builds"] > 0 and result["compiled_sources"] == result["stats"]["sources"]


def test_a_warm_process_derives_builds_and_compiles_nothing_and_gives_the_same_bits(cold) -> None:
    folder, first = cold
    warm = run_child(folder)
    assert warm["programs"] == {**warm["programs"], "program_hits": 3, "program_misses": 0, "program_writes": 0}
    assert warm["stats"]["builds"] == 0 and warm["stats"]["disk_hits"] > 0 and warm["stats"]["disk_rejected"] == 0
    assert warm["compiled_sources"] == 0  # every kernel module's code came from the disk cache
    assert first["written_sources"] > 0 and warm["written_sources"] == 0  # each source came with its program
    assert warm["loaded_libraries"] > 0 and warm["linkable"]  # loaded without parsing bitcode, which links on demand
    assert warm["digest"] == first["digest"]


def test_another_constant_or_argnums_is_another_program(cold) -> None:
    folder, first = cold
    scaled = run_child(folder, JG_SCALE="0.25")
    assert scaled["programs"]["program_misses"] == 3 and scaled["programs"]["program_hits"] == 0
    assert scaled["digest"] != first["digest"]
    fewer = run_child(folder, JG_ARGNUMS="1,2")
    assert fewer["programs"]["program_hits"] == 2 and fewer["programs"]["program_misses"] == 1  # vg only: call, split


def test_the_cache_switched_off_gives_the_same_bits_and_stores_nothing(cold, tmp_path) -> None:
    folder, first = cold
    before = program_files(folder)
    off = run_child(folder, JITGRAD_PROGRAM_CACHE="0")
    assert off["programs"] == {k: 0 for k in off["programs"]} and program_files(folder) == before
    assert off["digest"] == first["digest"]


def test_damaged_entries_are_refused_derived_again_and_rewritten(cold, tmp_path) -> None:
    folder, first = cold
    for path in program_files(folder):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    result = run_child(folder)
    assert result["programs"]["program_rejected"] == 3 and result["programs"]["program_writes"] == 3
    assert result["digest"] == first["digest"]
    assert run_child(folder)["programs"]["program_hits"] == 3


class _Forged:
    """Unpickles as a call of os.system, which the restricted unpickler must refuse to construct."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_an_entry_that_would_run_code_is_refused_not_run(cold, tmp_path) -> None:
    folder, first = cold
    marker = tmp_path / "ran"
    for path in program_files(folder):
        data = path.read_bytes()[4 + 32:]
        key = data[4:4 + int.from_bytes(data[:4], "big")].decode()
        cache.write_entry(str(path), key, pickle.dumps(_Forged(marker)))  # whole and keyed: only its content is bad
    result = run_child(folder)
    assert not marker.exists()
    assert result["programs"]["program_rejected"] == 3 and result["digest"] == first["digest"]


def test_a_graph_holding_a_custom_function_is_not_stored(tmp_path) -> None:
    result = run_child(tmp_path, JG_FUNCTION="1")
    assert result["programs"]["program_undescribed"] == 2 and result["programs"]["program_writes"] == 0
    assert program_files(tmp_path) == []


def _traced_text(fn, *args):
    f = jg.trace(fn)
    return f.plan(*args).text


def test_the_text_is_the_same_for_two_traces_and_differs_with_anything_in_the_graph() -> None:
    x = np.ones((2, 3), np.float32)

    def scaled(a, s=0.5):
        return np.sum(np.exp(a) * s)

    base = _traced_text(scaled, x)
    assert base is not None and _traced_text(scaled, x) == base
    assert _traced_text(lambda a: scaled(a, 0.25), x) != _traced_text(lambda a: scaled(a, 0.5), x)  # a literal
    assert _traced_text(scaled, np.ones((3, 2), np.float32)) != base  # a shape
    assert _traced_text(scaled, x.astype(np.float64)) != base  # a dtype
    assert _traced_text(lambda a: np.sum(a, axis=0), x) != _traced_text(lambda a: np.sum(a, axis=1), x)  # a param


def test_parameters_are_told_apart_by_type_and_what_is_not_plain_data_has_no_text() -> None:
    assert graph_keys._param(1) != graph_keys._param(1.0) != graph_keys._param(True)
    assert graph_keys._param((1, 2)) != graph_keys._param([1, 2])
    assert graph_keys._param(np.float32(1)) != graph_keys._param(np.float64(1))
    with pytest.raises(graph_keys.Undescribed):
        graph_keys._param(lambda: 0)


def test_a_program_holding_something_else_than_the_ir_is_not_pickled() -> None:
    class Other:
        pass

    with pytest.raises(graph_keys.Undescribed):
        programs._Pickler(__import__("io").BytesIO()).dump({"step": Other()})


def test_values_written_once_per_text_are_still_told_apart_by_type_and_sign() -> None:
    """describe writes equal avals and tuple parameters once per graph; values that are equal but of other types
    (1 and True, 1 and np.int64(1)) or signs (0.0 and -0.0) keep their own text."""
    x = np.ones((1, 2), np.float32)
    graph = jg.trace(lambda a: np.reshape(a, (2, 1))).plan(x).graph
    eqn = next(e for e in graph.eqns if e.params.get("shape") == (2, 1))
    shapes = [(1, 2), (True, 2), (1.0, 2), (0.0,), (-0.0,), (1, 2)]
    avals = [Aval(s, np.dtype(np.float32)) for s in [(1, 2), (np.int64(1), 2), (1, 2)]]
    a = graph.inputs[0]
    eqns = [dataclasses.replace(eqn, inputs=(a,), params={"shape": s}, outs=(Var(avals[i % 3]),))
            for i, s in enumerate(shapes)]
    text = graph_keys.describe(Graph(graph.inputs, eqns, [eqns[-1].outs[0]], graph.input_names))
    for s in shapes:
        assert repr(("shape", graph_keys._param(s))) in text
    assert "((np.int64(1), 2), '<f4', False)" in text and "((1, 2), '<f4', False)" in text
    assert text == graph_keys.describe(Graph(graph.inputs, eqns, [eqns[-1].outs[0]], graph.input_names))


def test_the_code_digest_changes_with_any_file(tmp_path, monkeypatch) -> None:
    """code_digest keys on each file's path, size, inode and time: an edit of another size, a rewrite at another
    time (the same size) or a file replaced by another (a new inode) is another digest; unchanged files, the same."""
    sources = tmp_path / "code"
    sources.mkdir()
    files = [sources / "a.py", sources / "b.py"]
    for i, f in enumerate(files):
        f.write_text(f"x = {i}\n")
        os.utime(f, ns=(10**18, 10**18))
    monkeypatch.setattr(graph_keys, "_code_files", lambda: [(str(f), f.name) for f in files])

    def fresh_digest() -> str:
        graph_keys.code_digest.cache_clear()
        return graph_keys.code_digest()

    try:
        first = fresh_digest()
        assert fresh_digest() == first
        files[1].write_text("x = 12\n")  # another size
        os.utime(files[1], ns=(10**18, 10**18))
        digests = {first, fresh_digest()}
        files[1].write_text("x = 7\n")  # the first size, another time
        digests.add(fresh_digest())
        replacement = sources / "b.new"
        replacement.write_text("x = 7\n")
        before = os.stat(files[1])
        os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(replacement, files[1])  # the same size and time, another inode
        digests.add(fresh_digest())
        assert len(digests) == 4
    finally:
        graph_keys.code_digest.cache_clear()
