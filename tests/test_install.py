"""What the README says about installing holds: the declared dependency floors run, an older numpy is refused
at import with what to do, and `import jitgrad` works in a clone's root where the clone's jitgrad/
comes first on sys.path (its kernels/ lives beside it)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMOKE = """
import numpy as np, jitgrad as jg
f = jg.trace(lambda w, x: np.sum(np.tanh(w * x) + np.exp(-x)) + np.concatenate([w, x]).mean())
w, x = np.ones(5), np.linspace(0, 1, 5)
value, (gw, gx) = f.value_and_grad(w, x, argnums=(0, 1))
assert np.isclose(value, np.sum(np.tanh(w * x) + np.exp(-x)) + np.concatenate([w, x]).mean())
assert np.allclose(gw, x * (1 - np.tanh(w * x) ** 2) + 0.1)
import numba
print(np.__version__, numba.__version__, jg.kernels.__name__)
"""


def floor(package: str) -> str:
    """The oldest version of `package` that pyproject.toml declares."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(rf'"{package}>=([0-9.]+)"', text).group(1)


def test_an_older_numpy_is_refused_at_import_with_what_to_do(tmp_path) -> None:
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '2.2.6'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    run = subprocess.run([sys.executable, "-c", "import jitgrad"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode != 0
    assert "jitgrad needs numpy 2.4 or newer (numpy 2.2.6 is installed" in run.stderr
    assert "pip install -U 'numpy>=2.4'" in run.stderr


def test_the_package_version_is_pyprojects() -> None:
    """The cache keys on `jitgrad.__version__` (`jitgrad.cache.version_tag`): it must change with the release."""
    import jitgrad

    assert re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1) == jitgrad.__version__


def test_the_numpy_floor_of_pyproject_is_the_one_import_checks() -> None:
    assert floor("numpy") == "2.4"
    assert "(2, 4)" in (ROOT / "jitgrad" / "__init__.py").read_text()


@pytest.mark.slow
def test_the_declared_floors_run(tmp_path) -> None:
    """numpy, numba, llvmlite and optree at pyproject's floors (.0 releases) in a venv that takes everything
    else from this one, on this Python (3.11, the declared floor in CI)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    pins = {name: floor(name) + ".0" for name in ("numpy", "numba", "llvmlite", "optree")}
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              *[f"{name}=={version}" for name, version in pins.items()]],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JITGRAD_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([str(python), "-c", SMOKE], env=env, capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [pins["numpy"], pins["numba"], "jitgrad.kernels"]


def test_import_in_the_clone_root_without_an_install(tmp_path) -> None:
    """`python -S` skips site-packages' .pth files (an editable install's finder among them): the clone's
    jitgrad/ is found from the working directory and its kernels/ from beside it."""
    site_packages = sysconfig.get_paths()["purelib"]
    env = dict(os.environ, PYTHONPATH=site_packages, JITGRAD_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-S", "-c", SMOKE], env=env, capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[2] == "jitgrad.kernels"
    check = subprocess.run([sys.executable, "-S", "-c", "import jitgrad; print(jitgrad.__file__, jitgrad.kernels.__file__)"],
                           env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert check.stdout.split() == [str(ROOT / "jitgrad" / "__init__.py"), str(ROOT / "kernels" / "__init__.py")]
