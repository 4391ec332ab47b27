"""User mistakes raise a jitgrad error at trace time naming the op, the shapes involved and the
user's source line: never a numba typing error, never a wrong result."""
from __future__ import annotations

import os

import numpy as np
import pytest

import jitgrad as jg
from jitgrad.errors import ArgumentError, JitgradError, ShapeError, TraceError, UnsupportedError

X = np.ones((3, 4))
Y = np.ones((5,))
I = np.array([0, 1])

# (id, function, arguments, error type, text the message must contain)
CASES = [
    ("unsupported function", lambda x: np.searchsorted(x[0], x[1]), [X], UnsupportedError,
     ["numpy.searchsorted", "float64[4]"]),
    ("unsupported ufunc", lambda x: np.spacing(x), [X], UnsupportedError, ["numpy.spacing"]),
    ("unsupported method", lambda x: x.tofile("x.bin"), [X], AttributeError, ["tofile"]),
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
    ("pad mode", lambda x: np.pad(x, 1, mode="mean"), [X], UnsupportedError, ["pad", "mean"]),
    ("pad width", lambda x: np.pad(x, ((1, 2, 3),)), [X], ShapeError, ["pad", "(3, 4)"]),
    ("tile", lambda x: np.tile(x, -1), [X], ShapeError, ["tile", "-1"]),
    ("repeat", lambda x: np.repeat(x, [1, 2], axis=1), [X], ShapeError, ["repeat", "(3, 4)"]),
    ("norm ord", lambda x: np.linalg.norm(x, ord=3), [X], ArgumentError, ["norm", "order 3", "matrices"]),
    ("complex eigenvalues", lambda x: np.linalg.eig(x[:, :3]), [X], UnsupportedError, ["eig", "complex", "eigh"]),
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
    # sorting, scans and differences (jitgrad/ops/sorting.py, scans.py)
    ("in-place sort", lambda x: x.sort(), [X], AttributeError, ["sort", "in-place", "np.sort(x)"]),
    ("in-place partition", lambda x: x.partition(1), [X], AttributeError, ["partition", "in-place"]),
    ("sort kind", lambda x: np.sort(x, kind="bogus"), [X], UnsupportedError, ["sort", "bogus"]),
    ("sort kind and stable", lambda x: np.sort(x, kind="stable", stable=True), [X], TraceError, ["sort", "stable"]),
    ("sort axes", lambda x: np.sort(x, axis=(0, 1)), [X], TraceError, ["sort", "axis"]),
    ("sort axis", lambda x: np.argsort(x, axis=2), [X], ShapeError, ["argsort", "axis 2", "(3, 4)"]),
    ("kth out of range", lambda x: np.partition(x, 4), [X], ShapeError, ["partition", "kth=4", "(3, 4)"]),
    ("kth float", lambda x: np.argpartition(x, 1.5), [X], TraceError, ["argpartition", "kth"]),
    ("kth traced", lambda x, i: np.partition(x, i), [X, I], UnsupportedError, ["partition", "kth", "traced"]),
    ("partition kind", lambda x: np.partition(x, 1, kind="heapsort"), [X], UnsupportedError, ["partition", "kind"]),
    ("quantile traced q", lambda x, q: np.quantile(x, q), [X, X[0]], UnsupportedError, ["quantile", "constant"]),
    ("quantile range", lambda x: np.quantile(x, 1.5), [X], ShapeError, ["quantile", "[0, 1]"]),
    ("percentile range", lambda x: np.percentile(x, [50, 150]), [X], ShapeError, ["percentile", "[0, 100]"]),
    ("quantile method", lambda x: np.quantile(x, 0.5, method="cubic"), [X], UnsupportedError, ["quantile", "cubic"]),
    ("quantile weights", lambda x: np.quantile(x, 0.5, method="inverted_cdf", weights=X), [X], UnsupportedError,
     ["quantile", "weights"]),
    ("quantile empty", lambda x: np.quantile(x[:0], 0.5, axis=0), [X], ShapeError, ["quantile", "empty", "(0, 4)"]),
    ("cumsum axes", lambda x: np.cumsum(x, axis=(0, 1)), [X], TraceError, ["cumsum", "axis"]),
    ("cumsum axis", lambda x: x.cumsum(axis=2), [X], ShapeError, ["cumsum", "axis 2", "(3, 4)"]),
    ("accumulate axes", lambda x: np.add.accumulate(x, axis=None), [X], ShapeError, ["add.accumulate", "axes"]),
    ("accumulate scalar", lambda x: np.multiply.accumulate(x[0, 0]), [X], TraceError, ["multiply.accumulate"]),
    ("diff order", lambda x: np.diff(x, n=-1), [X], ShapeError, ["diff", "-1", "(3, 4)"]),
    ("diff 0-d", lambda x: np.diff(x[0, 0]), [X], ShapeError, ["diff", "one dimensional"]),
    ("diff prepend", lambda x: np.diff(x, prepend=np.ones((2, 1))), [X], ShapeError, ["diff", "prepend", "(2, 1)"]),
    ("ediff1d cast", lambda i: np.ediff1d(i, to_begin=2.5), [I], TraceError, ["ediff1d", "to_begin", "same_kind"]),
    ("ediff1d bools", lambda x: np.ediff1d(x > 0), [X], TraceError, ["ediff1d", "bool"]),
    ("gradient traced coordinates", lambda x, c: np.gradient(x, c, axis=1), [X, X[0]], UnsupportedError,
     ["gradient", "coordinates", "traced"]),
    ("gradient too small", lambda x: np.gradient(x[:1], axis=0), [X], ShapeError, ["gradient", "too small"]),
    ("gradient edge order", lambda x: np.gradient(x, edge_order=3), [X], UnsupportedError, ["gradient", "edge_order"]),
    ("gradient spacings", lambda x: np.gradient(x, 1.0, 2.0, 3.0), [X], TraceError, ["gradient", "3 spacings"]),
    ("gradient coordinates", lambda x: np.gradient(x, np.ones(5), axis=1), [X], ShapeError, ["gradient", "(5,)"]),
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
