"""Every ```python block in the README and docs/ runs (blocks of one page share a namespace)."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_code_blocks_run(page: pathlib.Path) -> None:
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for block in BLOCK.findall(page.read_text()):
        exec(compile(block, str(page), "exec"), namespace)
