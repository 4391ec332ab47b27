"""`import jitgrad` sets OMP_WAIT_POLICY=PASSIVE in the process's environment only where nobody set it first
(README's limits, docs/troubleshooting.md): fresh processes, with and without a value of their own."""
import os
import subprocess
import sys

import pytest

CHILD = "import os, jitgrad; print(os.environ['OMP_WAIT_POLICY'])"


def policy_after_import(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if value is not None:
        env["OMP_WAIT_POLICY"] = value
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_import_chooses_passive_waiting_when_unset() -> None:
    assert policy_after_import(None) == "PASSIVE"


@pytest.mark.parametrize("value", ["ACTIVE", "active", ""])
def test_an_explicit_value_is_respected(value) -> None:
    assert policy_after_import(value) == value


def import_warnings(first: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    second = "jitgrad" if first == "torch" else "torch"
    run = subprocess.run([sys.executable, "-W", "always", "-c", f"import {first}; import {second}"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stderr


@pytest.mark.parametrize("first, value", [("jitgrad", None), ("torch", None), ("torch", "PASSIVE"), ("torch", "ACTIVE")])
def test_no_warning_where_the_policy_was_chosen_or_jitgrad_came_first(first, value) -> None:
    assert "ThreadsWarning" not in import_warnings(first, value)


def test_an_openmp_runtime_jitgrad_cannot_quiet_gets_one_warning_saying_what_to_set() -> None:
    """Where torch came first with an OpenMP runtime other than GNU's (none was quieted), the warning says
    what to set before Python starts."""
    child = ("import warnings, torch; from jitgrad.runtime import threads\n"
             "with warnings.catch_warnings(record=True) as seen:\n"
             "    warnings.simplefilter('always'); threads.warn_if_torch_spins(False, [])\n"
             "print(len(seen), seen[0].category.__name__, 'OMP_WAIT_POLICY=PASSIVE' in str(seen[0].message))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    run = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["1", "ThreadsWarning", "True"]
