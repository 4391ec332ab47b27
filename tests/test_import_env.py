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
