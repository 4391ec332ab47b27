"""The CUDA backend's tests run under numba's CUDA simulator, in a process of their own: the
simulator must be switched on before numba is first imported, and this process has imported the
real target. Also: without a GPU or the simulator, device="cuda" says what is missing."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

import jitgrad as jg

ROOT = Path(__file__).resolve().parent.parent


def test_cuda_suite_passes_under_the_simulator() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    summary = re.search(r"(\d+) passed", run.stdout)
    assert summary and int(summary.group(1)) >= 30 and " failed" not in run.stdout, tail


def test_without_gpu_or_simulator_cuda_is_a_clear_error() -> None:
    if cuda.is_available():
        pytest.skip("this machine has a usable CUDA GPU")
    with pytest.raises(jg.UnsupportedError, match="needs a CUDA GPU.*NUMBA_ENABLE_CUDASIM=1"):
        jg.trace(lambda x: x + 1, device="cuda")
    with pytest.raises(jg.UnsupportedError, match="'cpu' and 'cuda'"):
        jg.trace(lambda x: x + 1, device="tpu")
    assert jg.trace(lambda x: x + 1)(np.float32(1)) == 2
