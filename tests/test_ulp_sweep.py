"""Every composed or own-implemented elementwise op against numpy, in ulps, over special and extreme values
(signed zeros, subnormals, the largest finite, infinities, NaN, the overflow and underflow edges of the
exp-like functions, integers, halves) and a seeded random sample over wide ranges, float32 and float64.

A NaN against a number, an infinity against a finite value (or the other infinity) or a zero of the other
sign is a failure; NaN against NaN and equal infinities are 0 ulp. The bounds are docs/ops.md's table.
Ops numpy lacks (sigmoid, softplus, erf) are compared with their formula in a wider type, rounded once.
One traced function per dtype and arity computes every op, so the file compiles four kernels."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from test_vecmath import _ordinal, neighbours

import jitgrad as jg

DTYPES = [np.float32, np.float64]
# On AVX-512 CPUs numpy 2.x runs Intel's SVML loops for most transcendental functions: within 4 ulp of
# libm's, which jitgrad's lowerings call (docs/ops.md).
NUMPY_SVML = bool(np._core._multiarray_umath.__cpu_features__.get("AVX512_SKX"))
MISMATCH = np.iinfo(np.int64).max

UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sqrt": np.sqrt, "cbrt": np.cbrt, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "arcsin": np.arcsin, "arccos": np.arccos, "arctan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "arcsinh": np.arcsinh, "arccosh": np.arccosh, "arctanh": np.arctanh, "sinc": np.sinc,
    "deg2rad": np.deg2rad, "rad2deg": np.rad2deg, "reciprocal": np.reciprocal, "square": np.square,
    "x**0.5": lambda a: a ** 0.5, "x**-0.5": lambda a: a ** -0.5, "x**-1": lambda a: a ** -1,
    "x**-1.0": lambda a: a ** -1.0, "x**2.0": lambda a: a ** 2.0, "x**3": lambda a: a ** 3,
    "x**3.0": lambda a: a ** 3.0, "x**7": lambda a: a ** 7, "x**-2": lambda a: a ** -2,
    "x**1.3": lambda a: a ** 1.3, "x**0.0": lambda a: a ** 0.0, "float_power(x, 2.5)": lambda a: np.float_power(a, 2.5),
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "x**y": np.power, "logaddexp": np.logaddexp, "logaddexp2": np.logaddexp2, "hypot": np.hypot,
    "arctan2": np.arctan2,
}


def _logistic(a: Any) -> Any:
    return np.where(a >= 0, 1 / (1 + np.exp(-np.abs(a))), np.exp(-np.abs(a)) / (1 + np.exp(-np.abs(a))))


# jitgrad-only ops: jitgrad's function and the formula numpy evaluates in the wider type.
WIDE: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "sigmoid": (jg.sigmoid, _logistic),
    "softplus": (jg.softplus, lambda a: np.logaddexp(0, a)),
    "erf": (jg.erf, np.vectorize(math.erf, otypes=[np.float64])),
}

# Largest error in ulps against numpy (float32, float64), as docs/ops.md states it. 0: numpy's bits.
BOUNDS: dict[str, tuple[int, int]] = {
    "exp": (2, 1), "exp2": (1, 1), "expm1": (2, 2), "log": (3, 1), "log2": (1, 1), "log10": (2, 1),
    "log1p": (1, 1), "sqrt": (0, 0), "cbrt": (1, 0), "sin": (1, 0), "cos": (1, 0), "tan": (0, 0),
    "arcsin": (0, 0), "arccos": (0, 0), "arctan": (0, 0), "sinh": (0, 0), "cosh": (0, 0), "tanh": (2, 3),
    "arcsinh": (0, 0), "arccosh": (0, 0), "arctanh": (0, 0), "sinc": (2, 0), "deg2rad": (0, 0),
    "rad2deg": (0, 0), "reciprocal": (0, 0), "square": (0, 0), "x**0.5": (0, 0), "x**-0.5": (0, 0),
    "x**-1": (0, 0), "x**-1.0": (0, 0), "x**2.0": (0, 0), "x**3": (1, 0), "x**3.0": (1, 0), "x**7": (0, 0),
    "x**-2": (0, 0), "x**1.3": (0, 0), "x**0.0": (0, 0), "float_power(x, 2.5)": (0, 0),
    "x**y": (0, 0), "logaddexp": (0, 0), "logaddexp2": (0, 0), "hypot": (0, 0), "arctan2": (0, 0),
    "sigmoid": (2, 2), "softplus": (2, 2), "erf": (1, 0),
}
# numpy's own exact loops (and its power loop's scalar fast paths): no SVML allowance.
EXACT = {"sqrt", "deg2rad", "rad2deg", "reciprocal", "square", "x**0.5", "x**-1", "x**-1.0", "x**2.0", "x**0.0"}


def edges(dtype: Any) -> list[float]:
    """The thresholds of the exp-like functions: overflow, the smallest denormal result, rounding to 0,
    the smallest normal result; and where tanh saturates and log, log1p, arccosh, arctanh hit their poles."""
    f = np.finfo(dtype)
    ln = [math.log(float(v)) for v in (f.max, f.smallest_subnormal, f.tiny)]
    two = [f.maxexp, f.minexp, f.minexp - f.nmant, f.minexp - f.nmant - 1]
    return ln + [-v for v in ln] + [ln[0] + math.log(2)] + two + [9.0, 19.0, 1.0, -1.0, 0.0]


def special_values(dtype: Any) -> np.ndarray:
    """Signed zeros, infinities, NaN, subnormals, the normal extremes and a few ordinary values."""
    f = np.finfo(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, f.smallest_subnormal, -f.smallest_subnormal,
                     3 * f.smallest_subnormal, f.tiny, -f.tiny, 0.75 * f.tiny, f.max, -f.max, f.eps, -f.eps,
                     1.0, -1.0, 0.5, -0.5, 2.0, -3.0, math.pi, 1e-30, 1e30, -1e30], dtype)


def quiet(x: np.ndarray) -> np.ndarray:
    """x with its signalling NaNs made quiet: numpy's own loops disagree on them (np.power(snan, 0.0) is 1 with
    a scalar exponent, NaN with an array of zeros)."""
    itype = np.int32 if x.dtype == np.float32 else np.int64
    quiet_bit = itype(1) << itype(np.finfo(x.dtype).nmant - 1)
    return np.where(np.isnan(x), (x.view(itype) | quiet_bit).view(x.dtype), x)


def sweep_values(dtype: Any) -> np.ndarray:
    """Special values, each edge's 64 neighbours, integers, halves and a seeded random sample."""
    f = np.finfo(dtype)
    near = np.concatenate([neighbours(e, 64, dtype) for e in edges(dtype)])
    whole = np.arange(-1100, 1101).astype(dtype)
    rng = np.random.default_rng(20261204)
    itype = np.int32 if dtype == np.float32 else np.int64
    magnitude = np.exp2(rng.uniform(f.minexp - f.nmant, f.maxexp, 20_000)).astype(dtype)
    sample = [magnitude * rng.choice(np.array([-1, 1], dtype), 20_000), rng.uniform(-1, 1, 10_000),
              rng.uniform(-30, 30, 10_000), rng.uniform(-1100, 1100, 10_000),
              quiet(rng.integers(np.iinfo(itype).min, np.iinfo(itype).max, 10_000, dtype=itype).view(dtype))]
    return np.concatenate([special_values(dtype), near, whole, whole + dtype(0.5)] + [s.astype(dtype) for s in sample])


def sweep_pairs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of the special values, the sweep against a shuffled copy, near ties and moderate powers."""
    x, special = sweep_values(dtype), special_values(dtype)
    rng = np.random.default_rng(7)
    ordinary = rng.uniform(-40, 40, 10_000).astype(dtype)
    base, exponent = rng.uniform(0, 10, 10_000).astype(dtype), rng.uniform(-40, 40, 10_000).astype(dtype)
    near = ordinary * (1 + rng.uniform(-1e-3, 1e-3, 10_000)).astype(dtype)
    return (np.concatenate([np.repeat(special, special.size), x, ordinary, base]),
            np.concatenate([np.tile(special, special.size), rng.permutation(x), near, exponent]))


def ulp_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise ulps between got and want; MISMATCH where one is NaN, infinite or a zero and the other
    is not the same (NaN against NaN and equal infinities are 0), except that a zero against a subnormal of
    its sign counts the ulps between them: numpy's AVX-512 loops flush some results to zero that round to the
    smallest subnormal (exp2(-149.99998) in float32 is 2^-149 correctly rounded, 0.0 in numpy's SVML loop)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    nan = np.isnan(got) | np.isnan(want)
    smallest_normal = np.finfo(got.dtype).smallest_normal
    subnormal_step = (((got == 0) & (np.abs(want) < smallest_normal))
                      | ((want == 0) & (np.abs(got) < smallest_normal))) & (np.signbit(got) == np.signbit(want))
    special = nan | np.isinf(got) | np.isinf(want) | (((got == 0) | (want == 0)) & ~subnormal_step)
    same = (np.isnan(got) & np.isnan(want)) | ((got == want) & (np.signbit(got) == np.signbit(want)))
    with np.errstate(invalid="ignore"):
        err = np.abs(_ordinal(got) - _ordinal(want))
    return np.where(special & ~same, MISMATCH, np.where(nan, 0, err))


def failures(name: str, dtype: Any, args: tuple[np.ndarray, ...], got: np.ndarray, want: np.ndarray) -> list[str]:
    """The worst element of `name` if it is outside its bound (with SVML's allowance), else nothing."""
    err = ulp_errors(got, want)
    bound = BOUNDS[name][DTYPES.index(dtype)] + (4 if NUMPY_SVML and name not in EXACT else 0)
    i = int(np.argmax(err))
    if err[i] <= bound:
        return []
    shown = "mismatch" if err[i] == MISMATCH else f"{err[i]} ulp"
    operands = ", ".join(repr(a[i]) for a in args)
    return [f"{name}({operands}) = {got[i]!r}, numpy {want[i]!r}: {shown} (bound {bound})"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_unary_ops_within_their_bounds(dtype: Any) -> None:
    x = sweep_values(dtype)
    wide = np.float64 if dtype == np.float32 else np.longdouble
    got = jg.trace(lambda a: ({k: f(a) for k, f in UNARY.items()}, {k: f(a) for k, (f, _) in WIDE.items()}))(x)
    found = []
    for name, f in UNARY.items():
        found += failures(name, dtype, (x,), got[0][name], f(x))
    for name, (_, formula) in WIDE.items():
        found += failures(name, dtype, (x,), got[1][name], formula(x.astype(wide)).astype(dtype))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_binary_ops_within_their_bounds(dtype: Any) -> None:
    x, y = sweep_pairs(dtype)
    got = jg.trace(lambda a, b: {k: f(a, b) for k, f in BINARY.items()})(x, y)
    found = []
    for name, f in BINARY.items():
        found += failures(name, dtype, (x, y), got[name], f(x, y))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp2_of_integers_is_exact(dtype: Any) -> None:
    """2**k for every integer k from below the denormals to past overflow, exactly: the smallest denormal,
    0 from half of it down, inf from 2**maxexp up; float32 stays float32; integer arrays give float64."""
    k = np.arange(-1200, 1201)
    f = jg.trace(np.exp2)
    got = f(k.astype(dtype))
    assert got.dtype == dtype
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, np.ldexp(np.ones(k.size, dtype), k))
        np.testing.assert_array_equal(f(k), np.ldexp(1.0, k))
