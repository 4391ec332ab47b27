"""docs/cuda.md's examples run (they are fenced as ```python cuda: the main process's docs test,
which has no GPU and no simulator, leaves them to this suite)."""
import pathlib
import re

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "cuda.md"


def test_cuda_page_examples_run() -> None:
    blocks = re.findall(r"```python cuda\n(.*?)```", PAGE.read_text(), re.S)
    assert blocks
    namespace: dict = {"__name__": "docs_cuda"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    value, grads = namespace["value"], namespace["gw"]
    assert value.shape == () and grads.shape == (256,)
