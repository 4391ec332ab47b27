"""`f.ir`/`f.explain` (text and Graphviz DOT) and `python -m jitgrad explain`: what they show agrees
with what actually runs (saved bytes, kernel counts)."""
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jitgrad as jg
from jitgrad import __main__ as cli
from jitgrad.front.explain import example_arrays


def loss(w, x, b):
    y = w * x + b
    return np.sum(np.exp(y) * np.tanh(x))


def _args(n=64):
    rng = np.random.default_rng(0)
    return tuple(rng.random(n).astype(np.float32) for _ in range(3))


def _section(text: str, title: str) -> str:
    return text.split(title, 1)[1].split("\n\n", 1)[0]


def test_text_shows_both_irs_saved_values_with_bytes_and_every_kernel() -> None:
    f = jg.trace(loss)
    args = _args()
    text = f.explain(*args)
    for title in ("# traced forward", "# optimised forward", "# optimised backward"):
        assert title in text
    assert "# MulBackward" in _section(text, "# optimised backward") and "ExpBackward" in text
    _, ctx = f.forward(*args)
    saved = _section(text, "# saved for backward:")
    assert saved.startswith(f" {len(ctx.residuals)} value(s), {ctx.saved_bytes} bytes")
    rows = saved.splitlines()[1:]
    assert len(rows) == len(ctx.residuals)
    assert [int(re.search(r" (\d+) B ", r).group(1)) for r in rows] == [r.nbytes for r in ctx.residuals]
    assert any("input x" in r for r in rows)
    counts = f.kernel_counts(*args)
    for mode in ("call", "value_and_grad", "forward", "backward"):
        assert f"# {mode}: {counts[mode]} kernel(s)" in text
        assert len(re.findall(rf"# {mode} kernel \d+ source\ndef kernel_\d+\(", text)) == counts[mode]
    assert f.ir(*args) in text


def test_nothing_differentiable_shows_only_the_call() -> None:
    f = jg.trace(lambda k: k * 2 + 1)
    text = f.explain(np.arange(5))
    assert "# call: 1 kernel(s)" in text
    assert "backward" not in text and "saved for backward" not in text
    assert "subgraph cluster_b" not in f.explain(np.arange(5), format="dot")


def test_dot_is_a_well_formed_graph_of_forward_backward_kernels_and_residuals() -> None:
    f = jg.trace(loss)
    args = _args()
    dot = f.explain(*args, format="dot")
    assert dot.startswith('digraph "loss" {') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    declared = set(re.findall(r"^\s*(\w+) \[label=", dot, re.M))
    edges = re.findall(r"^\s*(\w+) -> (\w+)", dot, re.M)
    assert edges and all(a in declared and b in declared for a, b in edges)
    _, ctx = f.forward(*args)
    dashed = re.findall(r'-> (\w+) \[style=dashed, label="(\d+) B"\]', dot)
    assert [int(b) for _, b in dashed] == [r.nbytes for r in ctx.residuals]
    counts = f.kernel_counts(*args)
    assert len(re.findall(r"subgraph cluster_f_kernel\d+ ", dot)) == counts["forward"]
    assert len(re.findall(r"subgraph cluster_b_kernel\d+ ", dot)) == counts["backward"]
    assert "MulBackward\\nmul" in dot and "grad w" in dot


def test_unknown_format_is_an_input_error() -> None:
    with pytest.raises(jg.InputError, match="format must be 'text' or 'dot'"):
        jg.trace(loss).explain(*_args(), format="svg")


def test_shape_specs() -> None:
    arrays = example_arrays("f32[1000], f64[4,8],i64[],bool[2]")
    assert [(a.shape, a.dtype) for a in arrays] == [((1000,), np.float32), ((4, 8), np.float64),
                                                    ((), np.int64), ((2,), np.bool_)]
    assert example_arrays("float32[3]")[0].dtype == np.float32
    for bad in ("f32", "f32[3]x", "q7[3]"):
        with pytest.raises(jg.InputError, match="--shapes"):
            example_arrays(bad)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "explain_target.py").write_text(textwrap.dedent("""
        import numpy as np
        import jitgrad as jg

        def loss(w, x):
            return np.sum(np.exp(w * x))

        traced = jg.trace(loss)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_cli_explains_plain_and_traced_functions(user_module, capfd) -> None:
    assert cli.main(["explain", "explain_target:loss", "--shapes", "f32[100],f32[100]"]) == 0
    text = capfd.readouterr().out
    assert "{ lambda a:float32[100] b:float32[100] ." in text and "MulBackward" in text
    assert "# saved for backward:" in text and "def kernel_0(" in text
    assert cli.main(["explain", "explain_target:traced", "--shapes", "f64[3],f64[3]", "--format", "dot"]) == 0
    assert capfd.readouterr().out.startswith('digraph "loss" {')
    assert cli.main(["explain", "explain_target:nothing", "--shapes", "f32[3]"]) == 2
    assert "has no attribute 'nothing'" in capfd.readouterr().err
    assert cli.main(["explain", "no_such_module_here:f", "--shapes", "f32[3]"]) == 2


def test_python_dash_m_jitgrad_explain(user_module) -> None:
    command = [sys.executable, "-m", "jitgrad", "explain", "explain_target:loss", "--shapes", "f32[8],f32[8]"]
    run = subprocess.run(command, cwd=user_module, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "# optimised backward" in run.stdout and "# backward kernel 0 source" in run.stdout
