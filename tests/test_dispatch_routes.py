"""A binding maps numpy's arguments to its implementation by the call's shape (`Binding._route`, bound once per
shape): every shape routes each value where numpy's signature binds it, a call numpy's signature refuses raises
every time, and a value other than a refused argument's default raises whatever shape came first. Also: the
user's line of an equation made from code with a relative file name (`sources._decide_user_file`, not remembered), and
one record per user line and text (`sources.user_source`)."""
from __future__ import annotations

import linecache
from typing import Any

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.ir.graph import Aval
from jitgrad.tracing import sources
from jitgrad.tracing.tracer import Builder, building
from jitgrad.tracing.dispatch import Binding, _signature_of


def _keywords(a: Any, b: Any = 1, *, c: Any = None, **extra: Any) -> tuple:
    return a, b, c, extra


def _arrays(*arrays: Any, axis: int = 0) -> tuple:
    return arrays, axis


def _operand(a: Any) -> Any:
    return a


def test_each_call_shape_routes_values_where_the_signature_binds_them() -> None:
    binding = Binding("numpy.keywords", _signature_of("(a, /, b=1, *, c=NO_VALUE, **extra)"), _keywords)
    calls = [((5,), {}, (5, 1, None, {})), ((5, 6), {}, (5, 6, None, {})), ((5,), {"b": 6}, (5, 6, None, {})),
             ((5,), {"c": 7, "z": 8}, (5, 1, 7, {"z": 8})), ((5,), {"z": 8, "c": 7}, (5, 1, 7, {"z": 8})),
             ((9, 6), {"c": 7}, (9, 6, 7, {}))]
    for _ in range(2):  # the second round takes every route from the cache
        for args, kwargs, want in calls:
            assert binding(*args, **kwargs) == want
    assert binding(*(5,), **{"z": 8, "c": 7})[3] == {"z": 8}
    star = Binding("numpy.arrays", _signature_of("(*arrays, axis=0)"), _arrays)
    for _ in range(2):
        assert star(1, 2, 3) == ((1, 2, 3), 0)
        assert star(4, axis=1) == ((4,), 1)
        assert star() == ((), 0)


def test_a_call_the_signature_refuses_raises_every_time() -> None:
    binding = Binding("numpy.keywords", _signature_of("(a, /, b=1, *, c=NO_VALUE, **extra)"), _keywords)
    for _ in range(2):
        with pytest.raises(jg.TraceError, match="numpy.keywords"):
            binding(a=5)  # a positional-only operand passed by name
        with pytest.raises(jg.TraceError, match="numpy.keywords"):
            binding(1, 2, 3)
    assert binding(1, 2) == (1, 2, None, {})


def test_a_refused_argument_is_checked_on_every_call_of_a_shape() -> None:
    binding = Binding("numpy.operand", _signature_of("(a, /, order='C')"), _operand)
    for _ in range(2):
        assert binding(3, order="C") == 3
        with pytest.raises(jg.UnsupportedError, match="order"):
            binding(3, order="F")
        with pytest.raises(jg.UnsupportedError, match="order"):
            binding(3, "F")


def test_traced_numpy_calls_of_every_shape_give_numpys_results() -> None:
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)

    def f(x: Any) -> Any:
        return (np.sum(x, 0), np.sum(x, axis=0), np.sum(x, keepdims=True, axis=1), np.sum(x, 1, None, None, True),
                np.concatenate([x, x], 1), np.concatenate([x, x], axis=0))

    for got, want in zip(jg.trace(f)(x), f(x)):
        np.testing.assert_array_equal(got, want)


def test_a_relative_code_file_name_gives_the_users_line_and_is_not_remembered() -> None:
    namespace: dict[str, Any] = {"np": np}
    exec(compile("def f(x):\n    return np.sum(np.exp(x))\n", "relative_user_file.py", "exec"), namespace)
    builder = Builder()
    with building(builder):
        namespace["f"](builder.new_input(Aval((3,), np.dtype(np.float32), False)))
    assert builder.eqns
    assert {(e.source.filename, e.source.lineno) for e in builder.eqns} == {("relative_user_file.py", 2)}
    assert "relative_user_file.py" not in sources._user_files
    assert sources._user_files[__file__] == __file__  # an absolute one is decided once


def test_ops_from_one_line_share_its_record_and_an_edited_line_gets_a_new_one(tmp_path) -> None:
    """`user_source` keeps one record per file, line number and text: a changed text is a new record."""
    path = tmp_path / "edited_user_file.py"

    def recorded(body: str) -> list:
        path.write_text(f"def f(x):\n    {body}\n")
        linecache.checkcache(str(path))
        namespace: dict[str, Any] = {"np": np}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        builder = Builder()
        with building(builder):
            namespace["f"](builder.new_input(Aval((3,), np.dtype(np.float32), False)))
        return [e.source for e in builder.eqns]

    first = recorded("return np.exp(np.exp(x))")
    assert len(first) == 2 and first[0] is first[1] and first[0].line == "    return np.exp(np.exp(x))\n"
    edited = recorded("return np.tanh(np.tanh(x))")
    assert edited[0] is edited[1] and edited[0].line == "    return np.tanh(np.tanh(x))\n" != first[0].line
