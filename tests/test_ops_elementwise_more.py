"""fmod, floor division and divmod, hypot, logaddexp(2), copysign, ldexp, cbrt, arccosh, sinc, the degree/radian
conversions, heaviside, nan_to_num (and float_power, fmax, fmin): rows of the op table
(forward against numpy, gradients against torch and central differences, second derivatives by
gradgradcheck, hypothesis-drawn broadcast shapes, float32 and float64), then numpy's numbers bit for bit
over special values (signed zeros, infinities, NaN, subnormals, the extremes, negative operands) and
integer dtypes, the documented ulp bounds where numba's libm call and numpy's loop differ, the gradient
conventions, the operators, argument errors, the simulator's lowering and the CUDA integer lowerings."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jitgrad as jg
from test_ops import (EDGE_CASES, EdgeDraw, HypothesisDraw, S, Spec, binary, check, remainder_gen, specials, unary,
                      values)

ROOT = Path(__file__).resolve().parent.parent
# On AVX-512 CPUs numpy's arccosh, cbrt, sin (in sinc) and float64 power loops are SVML's, not the libm
# functions numba calls: there the two differ by a few ulp more (numpy validates its loops to 4 ulp).
NUMPY_SVML = bool(np._core._multiarray_umath.__cpu_features__.get("AVX512_SKX"))
INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)


# ---------------------------------------------------------------------- generators and torch oracles

def grid_gen(d, rng):
    """x on a half-integer grid away from 0, h anywhere: heaviside's gradient is 0 to both."""
    sx, sh = d.shapes(2)
    return [np.round(values(rng, sx, 0.2, 2, away=0.3)) + 0.5, values(rng, sh, -2, 2)], {}


def copysign_gen(d, rng):
    """Both operands away from 0 (where |x| has its kink and the sign of y its jump)."""
    sx, sy = d.shapes(2)
    return [values(rng, sx, 0, 2, away=0.2), values(rng, sy, 0, 2, away=0.2)], {}


def ldexp_gen(d, rng):
    sx, se = d.shapes(2)
    return [values(rng, sx, -2, 2), rng.integers(-3, 4, se)], {}


def nan_to_num_gen(d, rng):
    [x], _ = specials(d, rng)
    return [x], {"nan": d.choice([0.0, -1.5]), "posinf": d.choice([3.0, -0.5]), "neginf": d.choice([-4.0, 1e3])}


def t_divmod(x, y):
    return torch.floor_divide(x.detach(), y.detach()), torch.remainder(x, y)


def t_cbrt(x):
    return torch.sign(x) * torch.abs(x) ** (1 / 3)


def t_ldexp(x, e):
    """x * 2**e (torch.ldexp's gradient is 0 for negative integer exponents: it computes 2**e in integers)."""
    return x * torch.pow(2.0, e.to(x.dtype))


SPECS = [
    S("fmod", np.fmod, torch.fmod, remainder_gen),
    S("floor_divide", np.floor_divide, lambda x, y: torch.floor_divide(x.detach(), y.detach()), remainder_gen),
    S("floordiv_operator", lambda x, y: x // y, lambda x, y: torch.floor_divide(x.detach(), y.detach()),
      remainder_gen),
    S("divmod", np.divmod, t_divmod, remainder_gen),
    S("hypot", np.hypot, torch.hypot, binary(0.2, 2, away2=0.2)),
    S("logaddexp", np.logaddexp, torch.logaddexp, binary(-30, 30)),
    S("logaddexp2", np.logaddexp2, torch.logaddexp2, binary(-30, 30)),
    S("copysign", np.copysign, torch.copysign, copysign_gen),
    S("heaviside", np.heaviside, lambda x, h: torch.heaviside(x.detach(), h.detach()), grid_gen),
    S("ldexp", np.ldexp, t_ldexp, ldexp_gen),
    S("float_power", np.float_power, torch.float_power, binary(0.3, 2, -2, 2)),
    S("sinc", np.sinc, torch.sinc, unary(-3, 3)),
    S("deg2rad", np.deg2rad, torch.deg2rad, unary(-400, 400)),
    S("radians", np.radians, torch.deg2rad, unary(-400, 400)),
    S("rad2deg", np.rad2deg, torch.rad2deg),
    S("degrees", np.degrees, torch.rad2deg),
    S("arccosh", np.arccosh, torch.acosh, unary(1.2, 3)),
    S("cbrt", np.cbrt, t_cbrt, unary(0, 2, away=0.2)),
    S("nan_to_num", np.nan_to_num, torch.nan_to_num, nan_to_num_gen),
]
# kernel-compiling edge cases: the two that change the kernel (a 0-d float64 one, a strided float32 one)
EDGES = ["0-d", "strided"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", EDGES)
def test_op_edge_cases(spec: Spec, kind: str) -> None:
    check(spec, EdgeDraw(kind))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name in ("divmod", "nan_to_num")],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("kind", sorted(set(EDGE_CASES) - set(EDGES)))
def test_op_empty_and_transposed(spec: Spec, kind: str) -> None:
    check(spec, EdgeDraw(kind))


# The rows whose gradient is a VJP rule of this module (the others are composites of multiply, where and
# power, or remainder's rule, whose second derivatives tests/test_ops.py checks, or have none).
OWN_RULES = ["fmod", "hypot", "logaddexp", "logaddexp2", "copysign", "ldexp", "sinc", "arccosh", "cbrt"]


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name in OWN_RULES], ids=lambda s: s.name)
def test_op_second_derivatives(spec: Spec) -> None:
    """Every VJP rule here is differentiable again (jg.gradgradcheck, float64, the rank-2 edge case's values;
    an integer operand, ldexp's exponent, stays fixed)."""
    raw, params = spec.gen(EdgeDraw("transposed"), np.random.default_rng(1))
    args = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in raw]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert jg.gradgradcheck(lambda *xs: spec.fn(*xs, **params), args, atol=1e-5, rtol=1e-4)


def test_nan_to_num_second_derivative() -> None:
    """Through the selects that replace non-finite values (finite differences need finite inputs)."""
    x = values(np.random.default_rng(2), (3, 2), -2, 2)
    assert jg.gradgradcheck(lambda v: np.nan_to_num(v ** 3, posinf=3.0, neginf=-3.0), [x])


ALIASES = {"floordiv_operator", "radians", "degrees"}  # the same kernels as floor_divide, deg2rad, rad2deg


@pytest.mark.parametrize("spec", [s for s in SPECS if s.name not in ALIASES], ids=lambda s: s.name)
@settings(max_examples=2)
@given(data=st.data())
def test_op_random(spec: Spec, data: Any) -> None:
    check(spec, HypothesisDraw(data))


# ---------------------------------------------------------------------- numpy's numbers, bit for bit

def special_values(dtype: Any) -> np.ndarray:
    """±0, ±inf, NaN, the subnormal and normal extremes, whole and half values, negative operands."""
    f = np.finfo(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.5, 3.0, 7.0, -7.0, 0.1, 1.5,
                     100.0, 1e30, -1e30, f.tiny, -f.tiny, f.smallest_subnormal, -3 * f.smallest_subnormal, f.eps,
                     f.max, -f.max], dtype)


def bit_patterns(dtype: Any, n: int, seed: int) -> np.ndarray:
    """`n` floats of random bit patterns (every binade, sign, subnormals, NaNs and infinities alike)."""
    itype = np.int32 if dtype == np.float32 else np.int64
    info = np.iinfo(itype)
    return np.random.default_rng(seed).integers(info.min, info.max, n, dtype=itype).view(dtype)


def operand_pairs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of special values, then random bit patterns and ordinary values (near ties too)."""
    s = special_values(dtype)
    rng = np.random.default_rng(7)
    ordinary = rng.standard_normal(3000).astype(dtype) * dtype(10)
    near = ordinary * (1 + rng.standard_normal(3000).astype(dtype) * dtype(1e-3))
    x = np.concatenate([np.repeat(s, s.size), bit_patterns(dtype, 3000, 1), ordinary, ordinary * 3])
    y = np.concatenate([np.tile(s, s.size), bit_patterns(dtype, 3000, 2), near, ordinary])
    return x, y


def same_bits(got: Any, want: Any) -> np.ndarray:
    """Equal values with equal signs (so -0.0 is not 0.0); any NaN equals any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind != "f":
        return got == want
    return (np.isnan(got) & np.isnan(want)) | ((got == want) & (np.signbit(got) == np.signbit(want)))


def assert_same_bits(name: str, got: Any, want: Any, *inputs: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
    bad = ~same_bits(got, want)
    assert not bad.any(), f"{name}: {bad.sum()} differ, e.g. at {[x[bad][:3] for x in inputs]}: " \
                          f"{got[bad][:3]} (numpy: {want[bad][:3]})"


BINARY = {"fmod": np.fmod, "floor_divide": np.floor_divide, "remainder": np.remainder, "hypot": np.hypot,
          "logaddexp": np.logaddexp, "logaddexp2": np.logaddexp2, "copysign": np.copysign, "heaviside": np.heaviside,
          "float_power": np.float_power}
UNARY = {"deg2rad": np.deg2rad, "radians": np.radians, "rad2deg": np.rad2deg, "degrees": np.degrees,
         "nan_to_num": np.nan_to_num, "nan_to_num(nan=, posinf=, neginf=)":
             lambda x: np.nan_to_num(x, nan=-1.0, posinf=np.float64(1e300), neginf=2)}
def exact(ops: dict) -> dict:
    """The ops numpy computes with libm on this CPU (on AVX-512 ones its float_power is SVML's pow)."""
    return {k: f for k, f in ops.items() if not (NUMPY_SVML and k == "float_power")}


# numpy's fmax/fmin give a tie of -0.0 and +0.0 the second operand's sign in their vector loop but the
# first's in the scalar loop at an array's end: the sign of such a zero is compared only with the first.
TIES_UNSPECIFIED = {"fmax": np.fmax, "fmin": np.fmin}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_ops_match_numpy_bit_for_bit(dtype) -> None:
    x, y = operand_pairs(dtype)
    ops = {**exact(BINARY), **TIES_UNSPECIFIED, "divmod": lambda a, b: divmod(a, b)}
    got = jg.trace(lambda a, b: [f(a, b) for f in ops.values()])(x, y)
    for (name, f), g in zip(ops.items(), got):
        want = f(x, y)
        if name in TIES_UNSPECIFIED:
            np.testing.assert_array_equal(g == 0, want == 0, err_msg=name)
            g = np.where(g == 0, want, g)
        for part, (gp, wp) in enumerate(zip(g, want) if name == "divmod" else [(g, want)]):
            assert_same_bits(f"{name}[{part}]", gp, wp, x, y)
    unary = jg.trace(lambda a: [f(a) for f in UNARY.values()])(x)
    for (name, f), g in zip(UNARY.items(), unary):
        assert_same_bits(name, g, f(x), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ldexp_matches_numpy_bit_for_bit(dtype) -> None:
    """Every exponent integer type numpy takes, and exponents past int32, which numpy's loop clamps."""
    s = special_values(dtype)
    exponents = np.array([0, 1, -1, 3, -3, 127, -126, -149, -150, 1023, -1022, -1074, -1075, 2100, -2100,
                          2 ** 31, -2 ** 31 - 1, 2 ** 62, -2 ** 62])
    x, e = np.repeat(s, exponents.size), np.tile(exponents, s.size)
    etypes = (np.int64, np.int32, np.int8, np.uint8, np.uint32, np.bool_)
    exps = [e.astype(t) for t in etypes]
    wants = [np.ldexp(x, 5)] + [np.ldexp(x, k) for k in exps]
    got = jg.trace(lambda v, *es: [np.ldexp(v, 5)] + [np.ldexp(v, k) for k in es])(x, *exps)
    for name, g, w in zip(["int"] + [t.__name__ for t in etypes], got, wants):
        assert_same_bits(f"ldexp(., {name})", g, w, x)


def integer_pairs(dtype: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of the dtype's edge values (its extremes, 0, ±1, ±2, small odd ones), `n` long (repeated)."""
    if dtype == np.bool_:
        s = np.array([False, True])
    else:
        i = np.iinfo(dtype)
        s = np.array(sorted({i.min, i.min + 1, i.max, i.max - 1, 0, 1, 2, 3, 7} | ({-1, -2, -7} if i.min else set())),
                     dtype)
    return np.resize(np.repeat(s, s.size), n), np.resize(np.tile(s, s.size), n)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_integer_division_matches_numpy() -> None:
    """Zero divisors give 0, the smallest int // -1 is itself (no trap), fmod takes the dividend's sign: every
    integer dtype and bool, in one kernel."""
    pairs = [integer_pairs(t, 144) for t in INTS]

    def ops(*arrays):
        return [(np.fmod(a, b), a // b, a % b, *divmod(a, b)) for a, b in zip(arrays[::2], arrays[1::2])]

    operands = [v for pair in pairs for v in pair]
    for t, (x, y), got, want in zip(INTS, pairs, jg.trace(ops)(*operands), ops(*operands)):
        for name, g, w in zip(["fmod", "//", "%", "divmod[0]", "divmod[1]"], got, want):
            assert_same_bits(f"{t.__name__} {name}", g, w, x, y)


ULP_BOUNDS = {"cbrt": {"float32": 1, "float64": 0}, "arccosh": {"float32": 0, "float64": 0},
              "sinc": {"float32": 2, "float64": 0}}  # as docs/ops.md states them


def ordinal(a: np.ndarray) -> np.ndarray:
    """Integers consecutive for consecutive floats (+0 == -0): their difference counts ulps."""
    itype = np.int32 if a.dtype == np.float32 else np.int64
    bits = a.view(itype).astype(np.int64)
    return np.where(bits < 0, np.iinfo(itype).min - bits, bits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_ulp_bounds_against_numpy(dtype) -> None:
    """cbrt (float32: numba's is correctly rounded, numpy calls libm's cbrtf) and sinc (float32: numpy's own
    vector sinf) within their documented ulp of numpy over a sweep of bit patterns and ordinary values;
    arccosh bit for bit; NaN exactly where numpy's."""
    rng = np.random.default_rng(3)
    x = np.concatenate([special_values(dtype), bit_patterns(dtype, 200_000, 4),
                        rng.uniform(-50, 50, 100_000).astype(dtype), rng.uniform(-1e-3, 1e-3, 20_000).astype(dtype)])
    ops = {"cbrt": np.cbrt, "arccosh": np.arccosh, "sinc": np.sinc}
    for (name, f), got in zip(ops.items(), jg.trace(lambda a: [op(a) for op in ops.values()])(x)):
        want = f(x)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        err = np.abs(ordinal(got[ok]) - ordinal(want[ok]))
        bound = ULP_BOUNDS[name][np.dtype(dtype).name] + (4 if NUMPY_SVML else 0)
        i = int(np.argmax(err))
        assert err[i] <= bound, f"{name}({x[ok][i]!r}) = {got[ok][i]!r}, numpy {want[ok][i]!r}: {err[i]} ulp"
        zeros = want[ok] == 0
        assert (np.signbit(got[ok][zeros]) == np.signbit(want[ok][zeros])).all(), name


# The trigonometric and hyperbolic functions and power lower to numba's libm calls: glibc's bits, which are
# numpy's where numpy's loops call libm; float32 sin and cos are numpy's own vector loops (1 ulp apart).
LIBM = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "arcsin": np.arcsin, "arccos": np.arccos, "arctan": np.arctan,
        "sinh": np.sinh, "cosh": np.cosh, "arcsinh": np.arcsinh, "arctanh": np.arctanh,
        "arctan2": lambda a: np.arctan2(a, a[::-1]), "power": lambda a: np.power(np.abs(a), a[::-1])}
NUMPY_OWN_FLOAT32 = {"sin": 1, "cos": 1}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_libm_functions_against_numpy(dtype) -> None:
    """libm's bits (within 4 ulp of numpy's SVML loops on AVX-512 CPUs), NaN exactly where numpy's, as
    docs/ops.md states."""
    rng = np.random.default_rng(5)
    x = np.concatenate([special_values(dtype), bit_patterns(dtype, 50_000, 6),
                        rng.uniform(-4, 4, 50_000).astype(dtype), rng.uniform(-0.999, 0.999, 20_000).astype(dtype)])
    for (name, f), got in zip(LIBM.items(), jg.trace(lambda a: [op(a) for op in LIBM.values()])(x)):
        want = f(x)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        err = np.abs(ordinal(got[ok]) - ordinal(want[ok]))
        bound = 4 if NUMPY_SVML else NUMPY_OWN_FLOAT32.get(name, 0) if dtype == np.float32 else 0
        i = int(np.argmax(err))
        assert err[i] <= bound, f"{name}({x[ok][i]!r}) = {got[ok][i]!r}, numpy {want[ok][i]!r}: {err[i]} ulp"


# ---------------------------------------------------------------------- gradient conventions

def grads(fn, *args):
    return jg.trace(fn).value_and_grad(*args, argnums=tuple(range(len(args))))[1]


def test_gradient_conventions_at_non_smooth_points() -> None:
    """hypot at the origin, sinc at 0, copysign at x = 0 (and none to y), cbrt at 0, fmod's -trunc(x / y)."""
    def losses(zero, h, s_x, s_y, c):
        return np.sum(np.hypot(zero, h) + np.sinc(zero)) + np.sum(np.copysign(s_x, s_y)) + np.sum(np.cbrt(c))

    zero = np.array([0.0, -0.0, 0.0])
    gz, gh, gsx, gsy, gc = grads(losses, zero, np.zeros(3), np.array([0.0, 2.0, -3.0]), np.array([1.0, -1.0, -1.0]),
                                 np.array([0.0, 8.0, -1.0]))
    assert np.array_equal(gz, np.zeros(3)) and np.array_equal(gh, np.zeros(3))
    assert np.array_equal(gsx, [0.0, -1.0, 1.0]) and np.array_equal(gsy, np.zeros(3))
    assert gc[0] == np.inf and gc[1:] == pytest.approx([1 / 12, 1 / 3])
    x, y = np.array([7.0, -7.0, 7.5]), np.array([2.0, 2.0, -2.0])
    gx, gy = grads(lambda a, b: np.sum(np.fmod(a, b) + a // b + divmod(a, b)[0]), x, y)
    assert np.array_equal(gx, np.ones(3)) and np.array_equal(gy, [-3.0, 3.0, 3.0])  # floor division: none


def test_heaviside_gradient_reaches_x2_where_x1_is_zero_only() -> None:
    x, h = np.array([-1.0, 0.0, -0.0, 2.0, np.nan]), np.full(5, 0.5)
    gx, gh = grads(lambda a, b: np.sum(np.heaviside(a, b) * np.arange(1.0, 6.0)), x, h)
    assert np.array_equal(gx, np.zeros(5)) and np.array_equal(gh, [0.0, 2.0, 3.0, 0.0, 0.0])


def test_logaddexp_gradients_are_stable_far_apart() -> None:
    gx, gy = grads(lambda a, b: np.sum(np.logaddexp(a, b) + np.logaddexp2(a, b)), np.array([1000.0, -1000.0]),
                   np.array([-1000.0, 1000.0]))
    assert np.array_equal(gx, [2.0, 0.0]) and np.array_equal(gy, [0.0, 2.0])


def test_ldexp_gradient_is_exact_and_float32_stays_float32() -> None:
    x, e = np.array([1.5, -3.0, 2.0], np.float32), np.array([-1, 4, -149])
    (gx,) = grads(lambda v: np.sum(np.ldexp(v, e)), x)
    assert gx.dtype == np.float32 and np.array_equal(gx, np.ldexp(np.ones(3, np.float32), e))


# ---------------------------------------------------------------------- operators, dtypes, arguments

def test_operators_and_reflected_forms() -> None:
    x, y = np.array([7.0, -7.5, 0.5], np.float32), np.array([2.0, 2.0, -0.25], np.float32)
    got = jg.trace(lambda a, b: (a // b, 3.0 // a, divmod(a, b), divmod(5, a), np.divmod(a, 2.0), y // a))(x, y)
    want = (x // y, 3.0 // x, divmod(x, y), divmod(5, x), np.divmod(x, 2.0), y // x)
    for g, w in zip(_leaves(got), _leaves(want)):
        assert_same_bits("operator", g, w, x, y)


def _leaves(x: Any) -> list:
    return [v for item in x for v in _leaves(item)] if isinstance(x, (list, tuple)) else [x]


def test_promotion_follows_numpy() -> None:
    i8, i32, f32 = np.arange(1, 4, dtype=np.int8), np.arange(1, 4, dtype=np.int32), np.ones(3, np.float32)

    def cases(a, b, c):
        return [np.fmod(a, 2), np.hypot(b, 2), np.copysign(c, b), np.logaddexp(c, 1.0), np.heaviside(b, c), np.sinc(b),
                np.deg2rad(b), np.cbrt(b), a // np.int8(2), np.nan_to_num(a), np.float_power(c, 2), np.ldexp(c, a),
                np.ldexp(b, a)]

    with np.errstate(all="ignore"):
        for k, (got, want) in enumerate(zip(jg.trace(cases)(i8, i32, f32), cases(i8, i32, f32))):
            assert got.dtype == want.dtype, (k, got.dtype, want.dtype)
            if NUMPY_SVML and k in (7, 10):  # cbrt and float_power: SVML's loops on this CPU
                np.testing.assert_array_max_ulp(got, want, 4)
            else:
                np.testing.assert_array_equal(got, want)


def test_float16_results_are_refused_naming_the_op() -> None:
    """numpy gives float16 for these on int8 operands; jitgrad does not compute float16."""
    i8 = np.arange(3, dtype=np.int8)
    for fn, name in [(np.cbrt, "cbrt"), (np.deg2rad, "deg2rad"), (lambda a: np.heaviside(a, a), "heaviside"),
                     (lambda a: np.ldexp(a, a), "ldexp")]:
        with pytest.raises(jg.UnsupportedError, match=name):
            jg.trace(fn)(i8)


def test_ldexp_exponent_errors_follow_numpy() -> None:
    x = np.ones(3)
    with pytest.raises(jg.TraceError, match=r"(?s)numpy\.ldexp of float64\[3\] and float64\[3\].*test_ops_elementwise"):
        jg.trace(lambda a: np.ldexp(a, a))(x)
    with pytest.raises(jg.TraceError, match="ldexp"):
        jg.trace(lambda a: np.ldexp(a, np.arange(3, dtype=np.uint64)))(x)
    with pytest.raises(OverflowError):
        np.ldexp(x, 2 ** 40)
    with pytest.raises(OverflowError):
        jg.trace(lambda a: np.ldexp(a, 2 ** 40))(x)
    traced_int = jg.trace(lambda a, e: np.ldexp(a, e))
    assert np.array_equal(traced_int(x, 3), np.ldexp(x, 3))
    with pytest.raises(OverflowError):
        traced_int(x, 2 ** 40)


def test_nan_to_num_arguments() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    got = jg.trace(lambda a, v: np.nan_to_num(a, nan=v, posinf=1e300, neginf=np.float64(-2)))(x, np.float32(7))
    assert got.dtype == np.float32 and np.array_equal(got, np.nan_to_num(x, nan=7, posinf=1e300, neginf=-2))
    per_element = np.array([1.0, 2.0, 3.0, 4.0])
    assert np.array_equal(jg.trace(lambda a: np.nan_to_num(a, nan=per_element))(x), np.nan_to_num(x, nan=per_element))
    ints = np.arange(3)
    assert np.array_equal(jg.trace(lambda a: np.nan_to_num(a, nan=5.0) * 1)(ints), ints)
    with pytest.raises(jg.UnsupportedError, match=r"copy=False.*np\.nan_to_num\(x\)"):
        jg.trace(lambda a: np.nan_to_num(a, copy=False))(x)
    with pytest.raises(jg.ShapeError, match=r"nan_to_num.*\(2,\).*\(4,\)"):
        jg.trace(lambda a: np.nan_to_num(a, nan=np.ones(2)))(x)


def test_ufunc_arguments_are_refused_by_name() -> None:
    x = np.ones(3)
    for fn, name in [(lambda a: np.fmod(a, 2.0, out=np.empty(3)), "out"),
                     (lambda a: np.divmod(a, 2.0, dtype=np.float32), "dtype"),
                     (lambda a: np.hypot(a, a, where=a > 0), "where")]:
        with pytest.raises(jg.UnsupportedError, match=name):
            jg.trace(fn)(x)


# ---------------------------------------------------------------------- CUDA lowerings

# What the simulator runs: expressions over a, b (floats) and e (an int64 exponent), numpy's and jitgrad's alike.
SIMULATED = ["np.fmod(a, b)", "a // b", "a % b", "divmod(a, b)[0]", "np.hypot(a, b)", "np.logaddexp(a, b)",
             "np.logaddexp2(a, b)", "np.copysign(a, b)", "np.heaviside(a, b)", "np.ldexp(a, e)", "np.cbrt(a)",
             "np.arccosh(a)", "np.sinc(a)", "np.rad2deg(a)", "np.deg2rad(a)", "np.nan_to_num(a, nan=-1.0, posinf=2.0)",
             *([] if NUMPY_SVML else ["np.float_power(a, b)"])]
SIMULATED_INT = ["np.fmod(a, b)", "a // b", "a % b"]
SIMULATOR_RUN = """
import sys
import numpy as np
import jitgrad as jg
data, out, floats, ints = sys.argv[1], sys.argv[2], sys.argv[3].split(";"), sys.argv[4].split(";")
arrays = dict(np.load(data))
fn = eval("lambda a, b, e: [" + ", ".join(floats) + "]", {"np": np})
int_fn = eval("lambda a, b: [" + ", ".join(ints) + "]", {"np": np})
results = {}
for key in sorted({k.split("_")[0] for k in arrays if k != "e"}):
    a, b = arrays[key + "_a"], arrays[key + "_b"]
    got = jg.trace(fn, device="cuda")(a, b, arrays["e"][:a.size]) if a.dtype.kind == "f" else (
        jg.trace(int_fn, device="cuda")(a, b))
    results.update({f"{key}_{k}": g.copy_to_host() for k, g in enumerate(got)})
np.savez(out, **results)
"""


def test_simulator_lowerings_give_numpys_numbers(tmp_path: Path) -> None:
    """The simulator's templates (the CUDA ones' logic in numpy's scalar functions) through the CUDA kernel
    writer, in a process of its own (the simulator must be on before numba is imported): numpy's bits."""
    pytest.importorskip("jitgrad.kernels.cuda")  # a checkout without the CUDA backend runs its CPU tests only
    arrays: dict[str, np.ndarray] = {"e": np.tile(np.arange(-1100, 1100, 157), 400)}
    for dtype in (np.float32, np.float64):
        x, y = operand_pairs(dtype)
        arrays[f"{np.dtype(dtype).name}_a"], arrays[f"{np.dtype(dtype).name}_b"] = x[::7], y[::7]
    for dtype in (np.int8, np.int64, np.uint8):
        i = np.iinfo(dtype)
        s = np.array(sorted({i.min, i.max, 0, 1, 2, 7} | ({-1, -7} if i.min else set())), dtype)
        arrays[f"{i.dtype.name}_a"], arrays[f"{i.dtype.name}_b"] = np.repeat(s, s.size), np.tile(s, s.size)
    np.savez(tmp_path / "in.npz", **arrays)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", SIMULATOR_RUN, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                          ";".join(SIMULATED), ";".join(SIMULATED_INT)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    got = np.load(tmp_path / "out.npz")
    with np.errstate(all="ignore"):
        for key in sorted({k.split("_")[0] for k in arrays if k != "e"}):
            a, b = arrays[key + "_a"], arrays[key + "_b"]
            floats = a.dtype.kind == "f"
            names = SIMULATED if floats else SIMULATED_INT
            for k, expr in enumerate(names):
                want = np.asarray(eval(expr, {"np": np}, {"a": a, "b": b, "e": arrays["e"][:a.size]}))
                assert_same_bits(f"{key} {expr}", got[f"{key}_{k}"], want, a, b)


def test_integer_and_exponent_lowerings_compile_for_sm90() -> None:
    """tests/test_cuda_ptx.py sweeps float operands; here the integer templates and ldexp's int64 exponent."""
    pytest.importorskip("jitgrad.kernels.cuda")  # a checkout without the CUDA backend runs its CPU tests only
    from numba import cuda  # noqa: F401  (numba's CUDA target: PTX needs NVVM, not a GPU)

    from jitgrad.ir.graph import Aval
    from jitgrad.kernels.cuda import codegen as kc
    from jitgrad.passes.loops import Compute
    from jitgrad.ir.primitive import PRIMITIVES
    from test_cuda_ptx import array_type, functions_of, ptx

    cases = [("fmod", np.int64, np.int64), ("floor_divide", np.int64, np.int64), ("fmod", np.uint8, np.uint8),
             ("floor_divide", np.uint8, np.uint8), ("ldexp", np.float32, np.int64)]
    for name, first, second in cases:
        prim, operands = PRIMITIVES[name], [np.dtype(first), np.dtype(second)]
        out = prim.abstract_eval([Aval((), d) for d in operands])
        expr = kc.scalar_expression(Compute("t", prim, ["a0[i]", "a1[i]"], {}, out.dtype), "gpu")
        source = (kc.GPU_HEADER + "\n\ndef k(a0, a1, o):\n    i = cuda.grid(1)\n    if i < o.shape[0]:\n"
                  f"        o[i] = {expr}\n")
        ptx(functions_of(source)["k"], (*[array_type(d, 1) for d in operands], array_type(out.dtype, 1)))
