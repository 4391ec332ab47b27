"""A slow first call reports which function it compiles and kernel k of n (jitgrad.progress), and
`Traced.cache_info()` counts plan hits and misses per function and kernel builds and disk loads per process:
fresh processes on a shared temporary cache directory, cold then warm."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.build import progress
from jitgrad.kernels.build import compiler

# Two kernels with a matmul (a host step) between them; small arrays, so only the serial variants compile.
CHILD = r"""
import json, logging
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler

records = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.name == "jitgrad.progress":
            records.append(record.getMessage())
logging.getLogger("jitgrad").addHandler(Keep())
logging.getLogger("jitgrad").setLevel(logging.INFO)

def two_kernels(x, w):
    return np.cos((np.sin(x) * 3.0) @ w) * 2.0

f = jg.trace(two_kernels)
w = np.ones((3, 5))
f(np.ones((4, 3)), w)
first = f.cache_info()
f(np.ones((4, 3)), w)
repeat = f.cache_info()
f(np.ones((6, 3)), w)  # another length of the same ranks: a new plan, no new kernel
other_shape = f.cache_info()
g = jg.trace(two_kernels)  # another traced function: its own plans, the process's kernels
g(np.ones((4, 3)), w)
print(json.dumps({"records": records, "first": first, "repeat": repeat, "other_shape": other_shape,
                  "g": g.cache_info(), "f": f.cache_info(), "stats": compiler.stats()}))
"""


def run_child(tmp_path, cache_dir, **env) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    full_env = dict(os.environ, JITGRAD_CACHE_DIR=str(cache_dir), JITGRAD_PROGRESS_AFTER="0", **env)
    for name in ("JITGRAD_LOG", "JITGRAD_CACHE"):
        full_env.pop(name, None)
    run = subprocess.run([sys.executable, str(script)], env=full_env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_cold_process_reports_progress_and_counts_builds_then_a_warm_one_loads(tmp_path) -> None:
    cold = run_child(tmp_path, tmp_path / "cache")
    # progress: the function by qualified name and file:line, kernel k of n, then the end
    line = CHILD.splitlines().index("def two_kernels(x, w):") + 1
    assert any("two_kernels (" in r and f"child.py:{line})" in r and "kernel 2 of 2" in r for r in cold["records"]), \
        cold["records"]
    assert cold["records"][-1].startswith("compiled call of two_kernels") and "2 built" in cold["records"][-1]
    assert len(cold["records"]) == 2  # the other plans' first calls built nothing: they report nothing
    # per function: the first call misses (traces), the same signature hits, a new shape misses again
    assert (cold["first"]["hits"], cold["first"]["misses"], cold["first"]["entries"]) == (0, 1, 1)
    assert (cold["repeat"]["hits"], cold["repeat"]["misses"], cold["repeat"]["entries"]) == (1, 1, 1)
    assert (cold["other_shape"]["hits"], cold["other_shape"]["misses"], cold["other_shape"]["entries"]) == (1, 2, 2)
    assert (cold["g"]["hits"], cold["g"]["misses"], cold["g"]["entries"]) == (0, 1, 1)  # g's own counters
    # per process: two kernel sources, built once each (new lengths and another function reuse them)
    assert cold["first"]["kernels"] == cold["f"]["kernels"] == cold["g"]["kernels"] == 2
    assert cold["first"]["compiles"] == cold["f"]["compiles"] == cold["g"]["compiles"] == 2
    assert cold["f"]["disk_loads"] == 0 and cold["stats"]["builds"] == 2 and cold["stats"]["disk_writes"] == 2

    warm = run_child(tmp_path, tmp_path / "cache")
    assert warm["records"] == []  # nothing compiled: nothing to report
    assert warm["f"]["compiles"] == 0 and warm["f"]["disk_loads"] == 2 == warm["g"]["disk_loads"]
    assert warm["f"]["kernels"] == 2 and (warm["f"]["hits"], warm["f"]["misses"]) == (1, 2)


def test_progress_is_off_with_the_environment_variable(tmp_path) -> None:
    off = run_child(tmp_path, tmp_path / "cache", JITGRAD_PROGRESS="0")
    assert off["records"] == [] and off["f"]["compiles"] == 2


class _Terminal:
    """A stand-in stderr that is a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


@pytest.fixture
def builds(monkeypatch) -> list[int]:
    """This thread's build count as the test sets it."""
    count = [0]
    monkeypatch.setattr(compiler, "thread_builds", lambda: count[0])
    monkeypatch.delenv("JITGRAD_LOG", raising=False)
    monkeypatch.delenv("JITGRAD_PROGRESS", raising=False)
    return count


def test_on_a_terminal_progress_is_one_updating_line(monkeypatch, builds) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("JITGRAD_PROGRESS_AFTER", "0")
    report = progress.first_call("call of loss (train.py:3)", 3)
    report.kernel(1)
    assert terminal.text == ""  # nothing built yet
    builds[0] += 1
    report.kernel(2)
    builds[0] += 1
    report.kernel(3)
    report.end(completed=True)
    lines = terminal.text.split("\r")[1:]
    assert lines[0].startswith("jitgrad: compiling call of loss (train.py:3): kernel 2 of 3, ")
    assert lines[1].startswith("jitgrad: compiling call of loss (train.py:3): kernel 3 of 3, ")
    assert lines[2].startswith("jitgrad: compiled call of loss (train.py:3): 3 kernels (2 built) in ")
    assert terminal.text.count("\n") == 1 and terminal.text.endswith("\n")


def test_a_narrow_terminal_shortens_the_function_never_the_counts(monkeypatch, builds) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("JITGRAD_PROGRESS_AFTER", "0")
    monkeypatch.setenv("COLUMNS", "80")
    label = "call of make_step.<locals>.train_step (docs/examples/train_lm.py:123)"
    report = progress.first_call(label, 57)
    builds[0] += 1
    report.building(3)
    report.kernel(1)
    lines = [line.removesuffix("\x1b[K") for line in terminal.text.split("\r")[1:]]
    assert all(len(line) <= 79 for line in lines), lines
    assert lines[0].startswith("jitgrad: compiling call of make_step") and "…: 3 of 57 kernels ready, " in lines[0]
    assert "…: kernel 1 of 57, " in lines[1] and lines[1].endswith(" s")
    monkeypatch.setenv("COLUMNS", "200")
    report.kernel(2)
    assert terminal.text.split("\r")[-1].startswith(f"jitgrad: compiling {label}: kernel 2 of 57, ")


def test_fast_first_calls_and_switched_off_progress_say_nothing(monkeypatch, builds, caplog) -> None:
    monkeypatch.setenv("JITGRAD_PROGRESS_AFTER", "60")
    with caplog.at_level("INFO", logger="jitgrad.progress"):
        report = progress.first_call("call of f", 2)
        builds[0] += 2
        report.kernel(2)
        report.end(completed=True)
    assert caplog.records == []
    monkeypatch.setenv("JITGRAD_PROGRESS", "0")
    assert progress.first_call("call of f", 2) is None


def test_a_failed_first_call_logs_no_completion(monkeypatch, builds, caplog) -> None:
    monkeypatch.setenv("JITGRAD_PROGRESS_AFTER", "0")
    with caplog.at_level("INFO", logger="jitgrad.progress"):
        report = progress.first_call("call of f", 2)
        builds[0] += 1
        report.kernel(2)
        report.end(completed=False)
    assert [r.getMessage()[:32] for r in caplog.records] == ["compiling call of f: kernel 2 of"]


def test_progress_names_the_function_by_qualified_name_and_definition() -> None:
    def inner(x):
        return x

    text = progress.describe(inner)
    assert text.startswith("test_progress_names_the_function_by_qualified_name_and_definition.<locals>.inner (")
    assert text.endswith(f"test_progress.py:{inner.__code__.co_firstlineno})")
    assert jg.trace(inner).plans.label == text
    assert progress.describe(np.add) == "add"  # no Python code: its name only
