"""User mistakes raise a jitgrad error at trace time naming the op, the shapes involved and the
user's source line: never a numba typing error, never a wrong result."""
from __future__ import annotations

import os

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.errors import JitgradError, ShapeError, TraceError, UnsupportedError

X = np.ones((3, 4))
Y = np.ones((5,))
I = np.array([0, 1])

# (id, function, arguments, error type, text the message must contain)
CASES = [
    ("unsupported function", lambda x: np.sort(x), [X], UnsupportedError, ["numpy.sort", "float64[3,4]"]),
    ("unsupported ufunc", lambda x: np.cbrt(x), [X], UnsupportedError, ["numpy.cbrt"]),
    ("unsupported method", lambda x: x.cumsum(), [X], AttributeError, ["cumsum"]),
    ("bitwise on ints", lambda i: np.bitwise_and(i, 1), [I], UnsupportedError, ["bitwise_and", "int64[2]"]),
    ("broadcast", lambda x, y: x + y, [X, Y], ShapeError, ["add", "(3, 4)", "(5,)"]),
    ("where broadcast", lambda x, y: np.where(x > 0, x, y), [X, Y], ShapeError, ["where", "(3, 4)", "(5,)"]),
    ("matmul", lambda x, y: x @ y, [X, Y], ShapeError, ["matmul", "(3, 4)", "(5,)"]),
    ("einsum", lambda x: np.einsum("ij,jk->ik", x, x), [X], ShapeError, ["einsum", "(3, 4)"]),
    ("tensordot", lambda x: np.tensordot(x, x, axes=([0], [0, 1])), [X], ShapeError, ["tensordot", "(3, 4)"]),
    ("sum axis", lambda x: np.sum(x, axis=2), [X], ShapeError, ["sum", "axis 2", "(3, 4)"]),
    ("mean axis", lambda x: x.mean(axis=(0, -3)), [X], ShapeError, ["mean", "axis -3", "(3, 4)"]),
    ("prod axis", lambda x: np.prod(x, axis=5), [X], ShapeError, ["prod", "axis 5", "(3, 4)"]),
    ("argmax axis", lambda x: np.argmax(x, axis=-3), [X], ShapeError, ["argmax", "(3, 4)"]),
    ("max empty", lambda x: np.max(x[:0], axis=0), [X], ShapeError, ["max", "(0, 4)"]),
    ("softmax axis", lambda x: jg.softmax(x, axis=2), [X], ShapeError, ["softmax", "axis 2", "(3, 4)"]),
    ("transpose axes", lambda x: np.transpose(x, (0, 2)), [X], ShapeError, ["transpose", "(3, 4)"]),
    ("transpose repeated", lambda x: np.transpose(x, (0, 0)), [X], ShapeError, ["transpose", "(3, 4)"]),
    ("swapaxes", lambda x: np.swapaxes(x, 0, 3), [X], ShapeError, ["swapaxes", "(3, 4)"]),
    ("moveaxis", lambda x: np.moveaxis(x, 0, 5), [X], ShapeError, ["moveaxis", "(3, 4)"]),
    ("expand_dims", lambda x: np.expand_dims(x, 4), [X], ShapeError, ["expand_dims", "axis 4"]),
    ("squeeze", lambda x: np.squeeze(x, 0), [X], ShapeError, ["squeeze", "(3, 4)"]),
    ("reshape", lambda x: x.reshape(5, -1), [X], ShapeError, ["reshape", "(3, 4)", "(5, -1)"]),
    ("broadcast_to", lambda x: np.broadcast_to(x, (4, 3)), [X], ShapeError, ["broadcast_to", "(3, 4)", "(4, 3)"]),
    ("concatenate", lambda x, y: np.concatenate([x, y]), [X, Y], ShapeError, ["concatenate", "(3, 4)", "(5,)"]),
    ("concatenate axis", lambda x: np.concatenate([x, x], axis=2), [X], ShapeError, ["concatenate", "axis 2"]),
    ("stack", lambda x: np.stack([x, x.T]), [X], ShapeError, ["stack", "(3, 4)", "(4, 3)"]),
    ("split", lambda x: np.split(x, 3, axis=1), [X], ShapeError, ["split", "(3, 4)", "3 equal"]),
    ("pad mode", lambda x: np.pad(x, 1, mode="reflect"), [X], UnsupportedError, ["pad", "reflect"]),
    ("pad width", lambda x: np.pad(x, ((1, 2, 3),)), [X], ShapeError, ["pad", "(3, 4)"]),
    ("tile", lambda x: np.tile(x, -1), [X], ShapeError, ["tile", "-1"]),
    ("repeat", lambda x: np.repeat(x, [1, 2], axis=1), [X], ShapeError, ["repeat", "(3, 4)"]),
    ("norm ord", lambda x: np.linalg.norm(x, ord=2), [X], UnsupportedError, ["norm", "ord=2", "(3, 4)"]),
    ("index out of range", lambda x: x[:, 4], [X], ShapeError, ["index 4", "axis 1", "(3, 4)"]),
    ("index array out of range", lambda x: x[np.array([0, -4])], [X], ShapeError, ["index -4", "axis 0", "(3, 4)"]),
    ("too many indices", lambda x: x[0, 0, 0], [X], ShapeError, ["too many indices", "(3, 4)"]),
    ("two ellipses", lambda x: x[..., ...], [X], ShapeError, ["ellipsis"]),
    ("index arrays broadcast", lambda x: x[np.array([0, 1]), np.array([0, 1, 2])], [X], ShapeError,
     ["indexing arrays", "(2,)", "(3,)"]),
    ("traced mask", lambda x: x[x > 0], [X], UnsupportedError, ["boolean mask", "(3, 4)", "np.where"]),
    ("mask shape", lambda x: x[np.array([True, False])], [X], ShapeError, ["boolean index", "(2,)", "(3, 4)"]),
    ("float index", lambda x: x[np.array([0.5])], [X], TraceError, ["integer", "(3, 4)"]),
    ("traced float index", lambda x, y: x[y], [X, Y], TraceError, ["integer", "float64[5]"]),
    ("traced slice bound", lambda x, i: x[i[0]:], [X, I], TraceError, ["traced"]),
    ("take axis", lambda x: np.take(x, [0], axis=2), [X], ShapeError, ["take", "axis 2", "(3, 4)"]),
    ("take_along_axis ndim", lambda x: np.take_along_axis(x, np.array([0]), axis=0), [X], ShapeError,
     ["take_along_axis", "(1,)", "(3, 4)"]),
    ("item assignment", lambda x: x.__setitem__(0, 1.0), [X], UnsupportedError, ["immutable", "(3, 4)"]),
    ("one-argument where", lambda x: np.where(x), [X], UnsupportedError, ["np.where(cond, a, b)"]),
    ("traced repeats", lambda x, i: np.repeat(x, i, axis=0), [X, I], UnsupportedError, ["repeat", "data-dependent"]),
]


@pytest.mark.parametrize("fn, args, error, texts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistakes_raise_at_trace_time_naming_op_shapes_and_line(fn, args, error, texts):
    traced = jg.trace(fn)
    with pytest.raises(error) as info:
        traced.plan(*args)  # tracing only: nothing is compiled or run
    message = str(info.value)
    for text in texts:
        assert text in message, message
    if error is not AttributeError:
        assert isinstance(info.value, JitgradError)
    assert f"{os.path.basename(__file__)}:" in message, message
    assert "numba" not in message.lower()


def test_an_out_of_range_traced_index_is_an_index_error_at_run_time():
    f = jg.trace(lambda x, i: x[i])
    np.testing.assert_array_equal(f(X, np.array([-3, 2])), X[[-3, 2]])
    with pytest.raises(IndexError):
        f(X, np.array([3]))
