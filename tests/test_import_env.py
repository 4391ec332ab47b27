"""`import jitgrad` leaves the process's OpenMP settings alone (docs/troubleshooting.md, "torch's OpenMP
threads"): it sets no OMP_WAIT_POLICY, whichever library came first, and refuses a JITGRAD_OPENMP_SPIN value it
does not know. Fresh processes, with and without values of their own."""
import os
import subprocess
import sys

import pytest

CHILD = "import os, jitgrad; print(os.environ.get('OMP_WAIT_POLICY', '(unset)'))"


def child_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "JITGRAD_OPENMP_SPIN")}
    return {**env, **values}


def policy_after_import(env: dict[str, str], first: str = "") -> str:
    run = subprocess.run([sys.executable, "-c", f"{first}{CHILD}"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


@pytest.mark.parametrize("first", ["", "import torch; "])
def test_import_sets_no_wait_policy(first) -> None:
    assert policy_after_import(child_env(), first) == "(unset)"


@pytest.mark.parametrize("value", ["ACTIVE", "PASSIVE", ""])
def test_a_value_of_the_users_is_kept(value) -> None:
    assert policy_after_import(child_env(OMP_WAIT_POLICY=value)) == value


def test_an_unknown_spin_choice_is_refused_saying_what_to_write() -> None:
    run = subprocess.run([sys.executable, "-c", "import jitgrad"], env=child_env(JITGRAD_OPENMP_SPIN="passive"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "JITGRAD_OPENMP_SPIN='passive'" in run.stderr and "JITGRAD_OPENMP_SPIN=throttle" in run.stderr
