"""`python -m jitgrad ops [NAME]`: what traces, the gradient convention, the keywords refused and, for an
unsupported op, what to write instead; and the unsupported-op errors that point to it."""
import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest

import jitgrad as jg
from jitgrad import opinfo
from jitgrad.__main__ import main
from jitgrad.ops.numpy_api import EQUIVALENTS


def ops(*names: str) -> tuple[int, str]:
    """main(["ops", *names]): its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["ops", *names])
    return code, out.getvalue()


def test_the_command_line_names_np_ptps_alternative() -> None:
    run = subprocess.run([sys.executable, "-m", "jitgrad", "ops", "ptp"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["numpy.ptp: not supported under tracing (jg.UnsupportedError when called on a "
                                       "traced array)", "  write instead: x.max(axis) - x.min(axis)"]


@pytest.mark.parametrize("name", ["ptp", "np.ptp", "numpy.ptp"])
def test_every_spelling_of_a_name_finds_it(name) -> None:
    assert ops(name)[1].startswith("numpy.ptp: not supported")


def test_a_supported_op_its_gradient_convention_and_refused_keywords() -> None:
    code, out = ops("np.maximum")
    assert code == 0 and out.startswith("numpy.maximum: supported under tracing")
    assert "gradient: ties split the gradient evenly" in out  # docs/ops.md's conventions row
    assert "out=None (traced arrays are immutable" in out and "where=True" in out
    code, out = ops("tanh")
    assert "numpy.tanh: supported" in out and "gradient: no special convention recorded" in out
    assert "float32: 2; float64: 3" in out  # its row of the ulp table
    out = ops("linalg.solve")[1]
    assert out.startswith("numpy.linalg.solve: supported") and "refused keywords: none" in out
    out = ops("np.linalg.norm")[1]
    assert "gradient: 0 at a zero vector or matrix" in out
    out = ops("sum")[1]
    assert "refused keywords (accepted only at numpy's default): out=None" in out and "where" not in out.split(
        "refused")[1].split("\n")[0]  # numpy.sum takes where=


def test_jitgrads_own_ops_methods_and_ufunc_methods() -> None:
    out = ops("jg.relu")[1]
    assert out.startswith("jg.relu: supported") and "gradient: 0 where x ≤ 0, 1 elsewhere" in out
    assert ops("gelu")[1].startswith("jg.gelu: supported")
    assert ops("add.reduce")[1].startswith("numpy.add.reduce: supported")
    assert ops("T")[1].startswith("ndarray.T: supported")
    out = ops("astype")[1]  # np.astype does not trace; the method does
    assert "numpy.astype: not supported" in out and "x.astype(...) is supported" in out


def test_scipy_names_and_unknown_names() -> None:
    assert "write instead: jg.sigmoid(x)" in ops("scipy.special.expit")[1]
    code, out = ops("np.tahn")
    assert code == 1 and "neither numpy nor jitgrad has" in out and "tanh" in out
    out = ops("convolve")[1]
    assert "numpy.convolve: not supported" in out and "compute it outside the traced function" in out


def test_without_a_name_it_lists_the_supported_ops() -> None:
    code, out = ops()
    names = out.split()
    assert code == 0 and {"np.tanh", "np.linalg.solve", "np.add.reduce", "jg.gelu", "x.reshape"} <= set(names)
    assert "np.ptp" not in names and f"{len(opinfo.supported_names())} supported ops" in out


def test_every_equivalent_belongs_to_an_unsupported_op() -> None:
    """EQUIVALENTS is keyed by the name the error looks up; an op that gains support must leave it."""
    for key in EQUIVALENTS:
        info = opinfo.describe(key if key not in jg.__all__ else f"scipy.special.{key}")  # jg.erf for scipy's erf
        assert info.exists and not info.supported and info.instead == EQUIVALENTS[key], key


X = np.array([[1.5, -2.0, np.nan, 4.0], [0.0, np.inf, -1.0, 2.0]])
FINITE = np.array([[1.5, -2.0, 0.5, 4.0], [0.0, 3.0, -1.0, 2.0]])
# The expressions EQUIVALENTS names, written out: each traces and gives numpy's result.
WRITTEN_OUT = [
    ("ptp", lambda x: x.max(1) - x.min(1), lambda x: np.ptp(x, 1), FINITE),
    ("nansum", lambda x: np.sum(np.where(np.isnan(x), 0, x), 1), lambda x: np.nansum(x, 1), X),
    ("nanmean", lambda x: np.sum(np.where(np.isnan(x), 0, x), 1) / np.sum(~np.isnan(x), 1),
     lambda x: np.nanmean(x, 1), X),
    ("nanmax", lambda x: np.max(np.where(np.isnan(x), -np.inf, x), 1), lambda x: np.nanmax(x, 1), X),
    ("nanmin", lambda x: np.min(np.where(np.isnan(x), np.inf, x), 1), lambda x: np.nanmin(x, 1), X),
    ("count_nonzero", lambda x: np.sum(x != 0, 1), lambda x: np.count_nonzero(x, 1), X),
    ("any", lambda x: np.sum(x != 0, 1) > 0, lambda x: np.any(x, 1), X),
    ("all", lambda x: np.sum(x == 0, 1) == 0, lambda x: np.all(x, 1), X),
    ("isinf", lambda x: np.abs(x) == np.inf, np.isinf, X),
    ("trunc", lambda x: np.where(x < 0, np.ceil(x), np.floor(x)), np.trunc, X),
    ("cumulative_sum", lambda x: np.cumsum(x, 1), lambda x: np.cumulative_sum(x, axis=1), FINITE),
    ("trapezoid", lambda y: np.sum((y[..., 1:] + y[..., :-1]) / 2 * np.diff(np.arange(4.0) ** 2), axis=-1),
     lambda y: np.trapezoid(y, np.arange(4.0) ** 2), FINITE),
    ("vdot", lambda x: np.sum(x * x), lambda x: np.vdot(x, x), FINITE),
    ("cov", lambda x: (x - x.mean(axis=1, keepdims=True)) @ (x - x.mean(axis=1, keepdims=True)).T / (x.shape[1] - 1),
     np.cov, FINITE),
    ("linalg.vector_norm", lambda x: np.linalg.norm(x, 3, 1), lambda x: np.linalg.vector_norm(x, axis=1, ord=3),
     FINITE),
    ("linalg.vecdot", lambda x: np.sum(x * x, axis=-1), lambda x: np.linalg.vecdot(x, x), FINITE),
    ("linalg.trace", lambda x: np.trace(x[:, :2], axis1=-2, axis2=-1), lambda x: np.linalg.trace(x[:, :2]), FINITE),
]


@pytest.mark.parametrize("instead, numpy_fn, x", [c[1:] for c in WRITTEN_OUT], ids=[c[0] for c in WRITTEN_OUT])
def test_the_equivalents_trace_and_agree_with_numpy(instead, numpy_fn, x) -> None:
    np.testing.assert_allclose(jg.trace(instead)(x), numpy_fn(x), rtol=1e-12)


def test_the_unsupported_op_error_names_the_alternative_and_the_command() -> None:
    with pytest.raises(jg.UnsupportedError) as info:
        jg.trace(lambda x: np.ptp(x, axis=0))(FINITE)
    message = str(info.value)
    assert "Write x.max(axis) - x.min(axis) instead: it traces" in message
    assert "`python -m jitgrad ops ptp`" in message and "docs/ops.md" not in message
    with pytest.raises(jg.UnsupportedError, match=r"Write np\.linalg\.norm\(x, ord, axis\) instead"):
        jg.trace(lambda x: np.linalg.vector_norm(x))(FINITE)
    with pytest.raises(jg.UnsupportedError, match=r"`python -m jitgrad ops numpy\.sum` lists what it refuses"):
        jg.trace(lambda x: np.sum(x, out=np.zeros(())))(FINITE)
