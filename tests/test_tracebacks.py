"""A jitgrad error reaches the user with jitgrad's own frames dropped from its traceback (all of them with
JITGRAD_TRACEBACK=full), and its message says what to do: use numpy's functions rather than math's or
float(), a static argument for Python ints, a jg or numpy equivalent or computing the value outside."""
import math
import operator
import os
import textwrap
import traceback

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.kernels.build import compiler

INTERNAL = tuple(os.path.join(os.path.dirname(os.path.abspath(m.__file__)), "") for m in (jg, compiler))
X3, X4 = np.ones(3), np.ones(4)


def _add(a, b):
    return a + b


@jg.trace
def broken(a, b):
    return np.sum(_add(a, b))


def jitgrad_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename).startswith(INTERNAL)]


def test_a_user_error_keeps_the_users_frames_and_drops_jitgrads(monkeypatch) -> None:
    monkeypatch.delenv("JITGRAD_TRACEBACK", raising=False)
    with pytest.raises(jg.ShapeError) as info:
        broken(X3, X4)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.name for f in frames if f.filename == __file__][-2:] == ["broken", "_add"]  # down to the raising line
    assert frames[-1].line == "return a + b"
    assert len(jitgrad_frames(info.value)) <= 1  # the entry point that re-raised it


def test_jitgrad_traceback_full_keeps_every_frame(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_TRACEBACK", "full")
    with pytest.raises(jg.ShapeError) as info:
        broken(X3, X4)
    assert len(jitgrad_frames(info.value)) >= 4  # tracing, dispatch, the op, the plan cache
    assert traceback.extract_tb(info.value.__traceback__)[-1].filename.startswith(INTERNAL)  # the raise itself


ENTRY_POINTS = [
    ("value_and_grad", lambda: broken.value_and_grad(X3, X4)),
    ("Traced.grad", lambda: broken.grad(X3, X4)),
    ("forward", lambda: broken.forward(X3, X4)),
    ("vjp", lambda: broken.vjp(X3, X4)),
    ("plan", lambda: broken.plan(X3, X4)),
    ("explain", lambda: broken.explain(X3, X4)),
    ("jg.grad", lambda: jg.grad(lambda a: np.sum(_add(a, X4)))(X3)),
    ("jg.value_and_grad", lambda: jg.value_and_grad(lambda a: np.sum(_add(a, X4)))(X3)),
    ("jg.vjp", lambda: jg.vjp(lambda a: _add(a, X4), X3)),
    ("jg.<op> outside a trace", lambda: jg.sum(X3, axis=3)),
    ("jg.gelu outside a trace", lambda: jg.gelu(np.ones(3, complex))),
    ("a backward without a context", lambda: broken.backward(None)),
    ("a pullback's cotangent", lambda: jg.trace(lambda a: a * 2.0).vjp(X3)[1](X4)),
    ("jg.gradcheck", lambda: jg.gradcheck(lambda a: _add(a, X4), (X3,))),
]


@pytest.mark.parametrize("call", [c[1] for c in ENTRY_POINTS], ids=[c[0] for c in ENTRY_POINTS])
def test_every_entry_point_filters(call, monkeypatch) -> None:
    monkeypatch.delenv("JITGRAD_TRACEBACK", raising=False)
    with pytest.raises(jg.JitgradError) as info:
        call()
    assert len(jitgrad_frames(info.value)) <= 1, traceback.format_tb(info.value.__traceback__)


def test_raise_from_stays_linked_and_the_cause_is_filtered_too(monkeypatch) -> None:
    monkeypatch.delenv("JITGRAD_TRACEBACK", raising=False)
    with pytest.raises(jg.InputError, match="pytree of 3 scalars") as info:
        broken([1.0, 2.0, 3.0], X3)  # a list is a pytree: np.sum of it fails, re-raised with a hint
    cause = info.value.__cause__
    assert isinstance(cause, jg.JitgradError) and info.value.__suppress_context__
    assert len(jitgrad_frames(info.value)) <= 1 and jitgrad_frames(cause) == []


def _misspelt(a):
    return np.tahn(a)  # np.tanh misspelt: numpy's AttributeError


def _reshaped(a):
    return np.sum(np.ones(3).reshape(2, 2) * a)  # numpy's ValueError, on a constant


def _own(a):
    raise KeyError("the user's own")


USER_ERRORS = [
    ("np.tahn, a call", lambda: jg.trace(_misspelt)(X3), AttributeError, "return np.tahn(a)"),
    ("np.tahn, Traced.grad", lambda: jg.trace(_misspelt).grad(X3), AttributeError, "return np.tahn(a)"),
    ("np.tahn, jg.grad", lambda: jg.grad(_misspelt)(X3), AttributeError, "return np.tahn(a)"),
    ("numpy's ValueError, value_and_grad", lambda: jg.trace(_reshaped).value_and_grad(X3), ValueError,
     "return np.sum(np.ones(3).reshape(2, 2) * a)"),
    ("numpy's ValueError, jg.vjp", lambda: jg.vjp(_reshaped, X3), ValueError,
     "return np.sum(np.ones(3).reshape(2, 2) * a)"),
    ("the user's own raise", lambda: jg.trace(_own)(X3), KeyError, 'raise KeyError("the user\'s own")'),
]


@pytest.mark.parametrize("call, error, line", [c[1:] for c in USER_ERRORS], ids=[c[0] for c in USER_ERRORS])
def test_a_numpy_error_in_the_traced_function_loses_jitgrads_frames(call, error, line, monkeypatch) -> None:
    monkeypatch.delenv("JITGRAD_TRACEBACK", raising=False)
    with pytest.raises(error) as info:
        call()
    frames = traceback.extract_tb(info.value.__traceback__)
    assert len(jitgrad_frames(info.value)) <= 1, traceback.format_tb(info.value.__traceback__)  # the entry point
    mine = [f for f in frames if f.filename == __file__]
    assert mine[-1].line.startswith(line)  # the user's line is there, below the caller's
    assert "JITGRAD_TRACEBACK=full" in "".join(traceback.format_exception(info.value))  # the note says how


def test_a_numpy_error_keeps_every_frame_with_jitgrad_traceback_full(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_TRACEBACK", "full")
    with pytest.raises(AttributeError) as info:
        jg.trace(_misspelt)(X3)
    assert len(jitgrad_frames(info.value)) >= 4  # the call, the plan cache, tracing
    assert not getattr(info.value, "__notes__", None)


def test_an_error_raised_in_jitgrads_own_code_or_a_library_it_called_passes_untouched(monkeypatch) -> None:
    monkeypatch.delenv("JITGRAD_TRACEBACK", raising=False)
    monkeypatch.setattr(jg.Traced, "_call", operator.truediv)  # jitgrad's own frame raises: a jitgrad bug
    with pytest.raises(TypeError) as info:
        jg.trace(lambda a: a * 2)(X3)
    assert jitgrad_frames(info.value)[-1].name == "__call__" and not getattr(info.value, "__notes__", None)
    monkeypatch.undo()
    with pytest.raises(TypeError) as info:
        jg.trace(textwrap.dedent)(X3)  # the first frame below jitgrad's is the standard library's
    assert len(jitgrad_frames(info.value)) >= 4


def test_math_functions_and_float_say_use_numpy() -> None:
    with pytest.raises(jg.ConcretizationError, match=r"math\.exp needs a concrete value.*use np\.exp") as info:
        jg.trace(lambda a: math.exp(a[0]) * a)(X3)
    assert "control flow" not in str(info.value) and "math.exp(a[0])" in str(info.value)
    with pytest.raises(jg.ConcretizationError, match=r"float\(\) needs a concrete value.*numpy's functions"):
        jg.trace(lambda a: float(a[0]) * a)(X3)
    with pytest.raises(jg.ConcretizationError, match=r"int\(\) needs.*numpy's functions"):
        jg.trace(lambda a: int(a[0]) * a)(X3)
    with pytest.raises(jg.ConcretizationError, match=r"\.item\(\) needs.*pass it in as an argument"):
        jg.trace(lambda a: a[0].item() * a)(X3)
    with pytest.raises(jg.ConcretizationError, match=r"index or size.*Python ints.*static_argnums"):
        jg.trace(lambda a, n: a * len(range(n)))(X3, np.int64(2))
    with pytest.raises(jg.ConcretizationError, match=r"bool\(\).*control flow.*np\.where"):
        jg.trace(lambda a: a if a[0] > 0 else -a)(X3)


def test_an_unsupported_function_says_what_to_do() -> None:
    with pytest.raises(jg.UnsupportedError) as info:
        jg.trace(lambda a: np.convolve(a, a))(X3)
    message = str(info.value)
    assert "numpy.convolve" in message and "float64[3], float64[3]" in message
    assert "`python -m jitgrad ops convolve`" in message
    assert "compute this value outside the traced function and pass it in" in message
    with pytest.raises(jg.UnsupportedError, match=r"numpy\.searchsorted .*Write np\.sum\(a < v\[\.\.\., None\]"):
        jg.trace(lambda a: np.searchsorted(a, a))(X3)


def test_a_scipy_ufunc_is_named_as_such_and_gets_its_jg_equivalent() -> None:
    special = pytest.importorskip("scipy.special")
    with pytest.raises(jg.UnsupportedError, match=r"the ufunc expit is not supported.*jg\.sigmoid\(x\)"):
        jg.trace(lambda a: special.expit(a))(X3)
