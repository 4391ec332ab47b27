"""Every ```python block in the README and docs/ runs (blocks of one page share a namespace, in order, so a
page's first block may hold the imports the others use). Blocks fenced ```python cuda run in a process of
their own under numba's CUDA simulator (it must be on before numba is first imported, and this process has
imported the real target); ```python cluster blocks need a real Dask cluster and are only compiled."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "examples" / "README.md"]
BLOCK = re.compile(r"```python( \w+)?\n(.*?)```", re.S)


def blocks(page: pathlib.Path, kind: str = "") -> list[str]:
    """The page's ```python blocks of `kind` ("" plain, "cuda", "cluster"), each padded with blank lines
    so that its line numbers (in tracebacks and jitgrad's messages) are the page's."""
    text = page.read_text()
    return ["\n" * text.count("\n", 0, m.start(2)) + m.group(2)
            for m in BLOCK.finditer(text) if (m.group(1) or "").strip() == kind]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_code_blocks_run(page: pathlib.Path) -> None:
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for block in blocks(page):
        exec(compile(block, str(page), "exec"), namespace)
    for block in blocks(page, "cluster"):
        compile(block, str(page), "exec")


CUDA_PAGES = [p for p in PAGES if blocks(p, "cuda")]


@pytest.mark.parametrize("page", CUDA_PAGES, ids=[str(p.relative_to(ROOT)) for p in CUDA_PAGES])
def test_cuda_code_blocks_run_under_the_simulator(page: pathlib.Path) -> None:
    source = "\n".join(f"exec(compile({block!r}, {str(page)!r}, 'exec'))" for block in blocks(page, "cuda"))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", source], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]


def test_the_cuda_page_has_simulated_blocks() -> None:
    assert ROOT / "docs" / "cuda.md" in CUDA_PAGES
