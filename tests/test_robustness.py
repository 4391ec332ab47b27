"""Bad input gets a jitgrad error at the call (exact type, actionable message); awkward but valid input
(NaN/inf, empty, 0-d, strided, read-only) computes what numpy and torch compute; inputs are never
modified and outputs never alias inputs or each other; index arithmetic is 64-bit."""
import re

import numba
import numpy as np
import pytest
import torch

import jitgrad as jg
from jitgrad.passes import fusion, loops, simplify
from jitgrad.kernels.build import compiler
from jitgrad.kernels.cpu import codegen as cpu


@jg.trace
def product_sum(x, y):
    return np.sum(x * y)


@jg.trace
def double(x):
    return x * 2.0


X3 = np.ones(3, np.float32)
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")


def _control_flow(t):
    if t > 0:
        return t
    return -t


BAD_INPUTS = [
    ("too few arguments", lambda: product_sum(X3), jg.InputError,
     "product_sum: missing a required argument: 'y'"),
    ("too many arguments", lambda: product_sum(X3, X3, X3), jg.InputError,
     "product_sum: too many positional arguments"),
    ("a list of numbers", lambda: product_sum([1.0, 2.0, 3.0], X3), jg.InputError,
     "product_sum: argument 0 is a list of 3 numbers, which jitgrad takes as a pytree of 3 scalars (as JAX does), "
     "not as an array; pass np.asarray(...) if it is array data; tracing failed with it:\nConcretizationError"),
    ("None", lambda: product_sum(X3, None), jg.InputError,
     "product_sum: argument 1 is None, which jitgrad takes as a pytree without leaves (as JAX does); pass an array"),
    ("a set", lambda: product_sum({1.0}, X3), jg.InputError, "product_sum: argument 0 is a set; pass numpy arrays"),
    ("a string", lambda: product_sum("abc", X3), jg.InputError, "product_sum: argument 0 is a str; pass numpy arrays"),
    ("a Python complex", lambda: product_sum(1j, X3), jg.InputError, "product_sum: argument 0 is a complex;"),
    ("an int beyond int64", lambda: product_sum(2 ** 70, X3), jg.InputError,
     "product_sum: argument 0 is the Python int 1180591620717411303424, outside int64's range; pass it as a float"),
    ("object dtype", lambda: product_sum(np.array([1.0, None, 2.0]), X3), jg.InputError,
     "product_sum: argument 0 has dtype object; jitgrad accepts float32, float64, integer and bool arrays "
     "(complex, object, string and float16 are not supported)"),
    ("complex dtype", lambda: product_sum(np.ones(3, np.complex64), X3), jg.InputError,
     "product_sum: argument 0 has dtype complex64; jitgrad accepts float32, float64, integer and bool arrays"),
    ("string dtype", lambda: product_sum(np.array(["a", "b", "c"]), X3), jg.InputError,
     "product_sum: argument 0 has dtype <U1; jitgrad accepts"),
    ("float16 dtype", lambda: product_sum(X3, np.ones(3, np.float16)), jg.InputError,
     "product_sum: argument 1 has dtype float16; jitgrad accepts"),
    ("a masked array", lambda: double(np.ma.array([1.0, 2.0], mask=[0, 1])), jg.InputError,
     "double: argument 0 is a numpy MaskedArray, whose semantics (masks, matrix products) jitgrad does not follow; "
     "pass a plain array"),
    ("a numpy matrix", lambda: double(np.asmatrix(np.ones((1, 2)))), jg.InputError,
     "double: argument 0 is a numpy matrix, whose semantics"),
    ("shapes that do not broadcast", lambda: product_sum(np.ones(3), np.ones(4)), jg.ShapeError,
     "mul: operands of shapes (3,) and (4,) do not broadcast together\n  at <path>test_robustness.py:<line>: "
     "return np.sum(x * y)"),
    ("a cotangent of the wrong shape", lambda: double.backward(double.forward(X3)[1], np.ones(4, np.float32)),
     jg.InputError, "double.backward: cotangent 0 has shape (4,) but output 0 has shape (3,)"),
    ("a pullback cotangent of the wrong shape", lambda: double.vjp(X3)[1](np.ones((3, 1))), jg.InputError,
     "double.backward: cotangent 0 has shape (3, 1) but output 0 has shape (3,)"),
    ("too many cotangents", lambda: double.backward(double.forward(X3)[1], X3, X3), jg.InputError,
     "double.backward: expected 1 cotangent(s), one per output, got 2"),
    ("a complex cotangent", lambda: double.backward(double.forward(X3)[1], np.ones(3, complex)), jg.InputError,
     "double.backward: cotangent 0 is a ndarray of dtype complex128; pass a real array of output 0's shape (3,) "
     "(float32)"),
    ("a string cotangent", lambda: double.backward(double.forward(X3)[1], "abc"), jg.InputError,
     "double.backward: cotangent 0 is a str of dtype <U3"),
    ("grad of a non-scalar output", lambda: double.grad(X3), jg.InputError,
     "double.value_and_grad needs a function returning one float scalar, but it returns float32[3]; reduce it "
     "(e.g. np.sum), return (loss, aux) with has_aux=True, or use vjp/backward with a cotangent"),
    ("jg.grad of a non-scalar output", lambda: jg.grad(lambda t: t * 2.0)(X3), jg.InputError,
     "<lambda>.value_and_grad needs a function returning one float scalar"),
    ("argnums at an int array", lambda: product_sum.grad(np.arange(3), X3, argnums=0), jg.InputError,
     "product_sum: cannot differentiate with respect to argument 0, which is of dtype int64; only float32/float64 "
     "arrays and Python floats have gradients"),
    ("argnums out of range", lambda: product_sum.grad(X3, X3, argnums=2), jg.InputError,
     "product_sum: argnums 2 is out of range for 2 argument(s)"),
    ("an if on a tracer", lambda: jg.trace(_control_flow)(X3), jg.ConcretizationError,
     "bool() / an if or while statement needs a concrete value, but this is a traced bool[3] array whose numbers "
     "are not known while tracing. Python control flow cannot depend on traced values: use np.where(cond, a, b) "
     "to select values, or mark the argument as static with jg.trace(fn, static_argnums=...)\n"
     "  at <path>test_robustness.py:<line>: if t > 0:"),
    ("float() of a tracer", lambda: jg.trace(lambda t: np.ones(3) * float(t))(np.float64(1.0)),
     jg.ConcretizationError, "float() needs a concrete value, but this is a traced float64[] array"),
    ("a tracer as a loop bound", lambda: jg.trace(lambda t: sum(range(t)))(np.int64(3)), jg.ConcretizationError,
     "using a traced value as an index or size needs a concrete value, but this is a traced int64[] array"),
]


def _pattern(message: str) -> str:
    """The message as a regex: literal text, with <path> and <line> standing for the user's file and line."""
    return re.escape(message).replace("<path>", ".*").replace("<line>", r"\d+")


@pytest.mark.parametrize("case, call, error, message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_a_jitgrad_error(case, call, error, message) -> None:
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{case}: got {type(info.value).__name__}"
    assert re.match(_pattern(message), str(info.value), re.S), str(info.value)


def test_nan_and_inf_pass_through_as_ieee_says() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], np.float32)

    def forward(v):
        return (np.exp(v), np.log(v), v / 0.0, np.maximum(v, 0.0), np.sum(v), np.max(v), v * 0.0, np.tanh(v))

    with np.errstate(all="ignore"):
        expected = forward(x)
    for k, (got, want) in enumerate(zip(jg.trace(forward)(x), expected)):
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)  # NaN and +-inf positions must match exactly
        numbers = ~np.isnan(want)  # signed zeros too: maximum(-0.0, 0.0) is +0.0, as numpy's
        np.testing.assert_array_equal(np.signbit(got)[numbers], np.signbit(want)[numbers])

    def loss(v):
        return np.sum(np.exp(v) * 2.0 + v * v)

    t = torch.tensor(x, requires_grad=True)
    (torch.exp(t) * 2.0 + t * t).sum().backward()
    value, grad = jg.trace(loss).value_and_grad(x, argnums=0)
    assert np.isnan(value)
    np.testing.assert_array_equal(grad, t.grad.numpy())


def test_empty_arrays() -> None:
    f = jg.trace(lambda a, b: (np.sum(a * b, axis=0), a + b))
    summed, added = f(np.ones((0, 3)), np.ones((0, 3)))
    np.testing.assert_array_equal(summed, np.zeros(3))
    assert added.shape == (0, 3)
    value, (ga, gb) = jg.trace(lambda a, b: np.sum(a * b)).value_and_grad(np.ones((0, 3)), np.ones(3), argnums=(0, 1))
    assert value == 0.0 and ga.shape == (0, 3)
    np.testing.assert_array_equal(gb, np.zeros(3))
    no_identity = r"max: zero-size reduction over axes \(0,\) of shape \(0,\) has no identity"
    with pytest.raises(jg.ShapeError, match=no_identity):
        jg.trace(np.max)(np.ones(0))


def test_zero_dimensional_arrays() -> None:
    f = jg.trace(lambda a, b: np.sin(a) * b)
    a, b = np.array(0.5), np.float32(3.0)
    value, (ga, gb) = f.value_and_grad(a, b, argnums=(0, 1))
    assert value.shape == () and ga.shape == () and gb.shape == ()
    assert gb.dtype == np.float32
    np.testing.assert_allclose([value, ga, gb], [np.sin(0.5) * 3, np.cos(0.5) * 3, np.sin(0.5)], rtol=1e-6)


def test_non_contiguous_and_read_only_inputs() -> None:
    base = np.random.default_rng(0).standard_normal((6, 8))
    read_only = base.copy()
    read_only.setflags(write=False)
    f = jg.trace(lambda a, b: np.sum(np.exp(a) * b, axis=1))
    cases = {"transposed": (base[:, :6].T, base[:6, :6]), "strided": (base[::2, ::3], base[1::2, 1::3]),
             "read-only": (read_only, read_only), "negative stride": (base[::-1], base)}
    for name, (a, b) in cases.items():
        np.testing.assert_allclose(f(a, b), np.sum(np.exp(a) * b, axis=1), rtol=1e-12, err_msg=name)
        _, (ga, gb) = jg.trace(lambda a, b: np.sum(np.exp(a) * b)).value_and_grad(a, b, argnums=(0, 1))
        assert ga.shape == a.shape and gb.shape == b.shape
        np.testing.assert_allclose(ga, np.exp(a) * b, rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(gb, np.exp(a), rtol=1e-12, err_msg=name)


def test_inputs_are_never_modified() -> None:
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((4, 5)), rng.standard_normal(5).astype(np.float64)]
    kept = [a.copy() for a in args]
    f = jg.trace(lambda a, b: (np.tanh(a + b), np.sum(a * b)))
    f(*args)
    _, ctx = f.forward(*args)
    f.backward(ctx, np.ones((4, 5)), 1.0)
    jg.trace(lambda a, b: np.sum(np.tanh(a + b))).value_and_grad(*args, argnums=(0, 1))
    for a, k in zip(args, kept):
        np.testing.assert_array_equal(a, k)


def test_outputs_never_alias_inputs_or_each_other() -> None:
    x = np.arange(6.0).reshape(2, 3)
    functions = {"identity": lambda t: t, "pair": lambda t: (t, t), "reshape": lambda t: t.reshape(3, 2),
                 "transpose": lambda t: t.T, "dict": lambda t: {"a": t, "b": t * 1.0},
                 "two equal": lambda t: (t * 2, t * 2)}
    for name, fn in functions.items():
        out = jg.trace(fn)(x)
        outs = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, tuple) else [out]
        for i, o in enumerate(outs):
            assert o.flags.writeable, name
            assert not np.shares_memory(o, x), name
            for other in outs[i + 1:]:
                assert not np.shares_memory(o, other), name
    constant = jg.trace(lambda t: np.ones(3))
    first = constant(x)
    first[:] = 7.0  # writing into a returned constant must not change the next call's result
    np.testing.assert_array_equal(constant(x), np.ones(3))
    _, (ga, gb) = jg.trace(lambda a, b: np.sum(a + b)).value_and_grad(x, x.copy(), argnums=(0, 1))
    assert not np.shares_memory(ga, gb)


def _full_reduction_kernel() -> loops.LoopKernel:
    graph = jg.trace(lambda a: np.sum(a * a)).plan(np.ones(10)).graph
    (kernel,) = fusion.schedule(simplify.optimize(graph)).kernels
    return kernel


def test_index_arithmetic_is_64_bit() -> None:
    """Lengths reach kernels as int64 arguments, and the chunk bounds of a parallel full reduction (blocks
    of BLOCK terms, split into chunks) tile [0, n) without overflow for n = 2**40 (they would overflow only
    within BLOCK of 2**63 elements)."""
    kernel = _full_reduction_kernel()
    source = cpu.module_source(kernel)
    parallel = source.split("def serial_kernel")[0]
    rules = {name: re.search(rf"^ +{name} = (.+)$", parallel, re.M).group(1) for name in ("nb", "nc", "lo", "hi")}
    assert re.search(rf"for b0 in range\(lo, hi, {cpu.BLOCK}\):", parallel), parallel

    def chunks(n: int) -> list[tuple[int, int]]:
        scope = {"n0": np.int64(n), "max": max, "min": min}
        with np.errstate(over="raise"):
            scope["nb"] = eval(rules["nb"], scope)
            scope["nc"] = eval(rules["nc"], scope)
            return [(int(eval(rules["lo"], dict(scope, ch=np.int64(c)))),
                     int(eval(rules["hi"], dict(scope, ch=np.int64(c))))) for c in range(int(scope["nc"]))]

    n = 2 ** 40
    spans = chunks(n)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    with pytest.raises(FloatingPointError):
        chunks(2 ** 63 - 1)

    compiled = compiler.load(source, {"serial_kernel": {}})
    x = np.arange(10.0)
    out = np.empty(1)
    compiled.call("serial_kernel", cpu.kernel_arguments(kernel, [x], [out], cpu.scalar_arguments(kernel)))
    assert out[0] == np.sum(x * x)
    for signature in compiled.functions["serial_kernel"].signatures:
        assert signature[:len(kernel.domain)] == (numba.int64,) * len(kernel.domain)
