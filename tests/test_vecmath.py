"""Accuracy, special values and dtype handling of jitgrad.kernels.cpu.vecmath."""

import re
import subprocess
import sys

import numba
import numpy as np
import pytest

from jitgrad.kernels.cpu import vecmath
from jitgrad.kernels.cpu.vecmath import ULP_BOUNDS

NAMES = ["vexp", "vexp2", "vexpm1", "vlog", "vlog2", "vlog10", "vlog1p", "vtanh", "vsigmoid"]
DTYPES = [np.float32, np.float64]
INF, NAN = np.inf, np.nan
HAS_LONG_DOUBLE = np.finfo(np.longdouble).nmant >= 63


def _make_loop(fn):
    @numba.njit
    def loop(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
        return fn(x[0])  # makes the scalar result type visible in the signature

    return loop


_LOOPS = {name: _make_loop(getattr(vecmath, name)) for name in NAMES}


def apply(name: str, x: np.ndarray) -> np.ndarray:
    """``name`` applied elementwise by an njit loop (compiled once per dtype)."""
    out = np.empty_like(x)
    _LOOPS[name](x, out)
    return out


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


REFERENCE = {"vexp": np.exp, "vexp2": np.exp2, "vexpm1": np.expm1, "vlog": np.log, "vlog2": np.log2,
             "vlog10": np.log10, "vlog1p": np.log1p,
             "vtanh": np.tanh, "vsigmoid": _sigmoid}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """Correctly rounded (up to rare ties) result: float32 via float64, float64 via long double."""
    wide = np.float64 if x.dtype == np.float32 else np.longdouble
    with np.errstate(all="ignore"):
        return REFERENCE[name](x.astype(wide)).astype(x.dtype)


def _ordinal(a: np.ndarray) -> np.ndarray:
    """Map floats to integers that are consecutive for consecutive floats (+0 == -0)."""
    itype = np.int32 if a.dtype == np.float32 else np.int64
    bits = a.view(itype).astype(np.int64)
    return np.where(bits < 0, np.iinfo(itype).min - bits, bits)


def _from_ordinal(o: np.ndarray, dtype) -> np.ndarray:
    """Inverse of ``_ordinal``."""
    itype = np.int32 if dtype == np.float32 else np.int64
    o = o.astype(np.int64)
    return np.where(o < 0, np.iinfo(itype).min - o, o).astype(itype).view(dtype)


def check_ulp(name: str, x: np.ndarray) -> None:
    """Assert that ``name`` is within its documented ulp bound (and NaN exactly where expected) on x."""
    y, ref = apply(name, x), reference(name, x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    err = np.abs(_ordinal(y[ok]) - _ordinal(ref[ok]))
    i = int(np.argmax(err))
    bound = ULP_BOUNDS[name][x.dtype.name]
    assert err[i] <= bound, f"{name}({x[ok][i]!r}) = {y[ok][i]!r}, want {ref[ok][i]!r}"


def bit_sweep(lo: float, hi: float, count: int, dtype) -> np.ndarray:
    """``count`` floats evenly spaced in bit-pattern order over [lo, hi] (all binades equally)."""
    a, b = _ordinal(np.array([lo, hi], dtype))
    return _from_ordinal(np.linspace(a, b, count).round(), dtype)


def neighbours(x: float, count: int, dtype) -> np.ndarray:
    """The ``count`` consecutive floats centred on x."""
    o = _ordinal(np.array([x], dtype))[0]
    return _from_ordinal(np.arange(o - count // 2, o + count // 2), dtype)


# Per function: a sweep over all binades of its range, a dense linear sweep where
# cancellation is likeliest, and the floats around overflow / underflow / denormal
# thresholds (exp: ln(max), ln(smallest denormal / 2), ln(smallest normal)).
F32_SWEEPS = {
    "vexp": [bit_sweep(-104, 89, 1_500_000, np.float32), np.linspace(-1, 1, 200_001, dtype=np.float32),
             neighbours(88.72284, 2000, np.float32), neighbours(-103.97208, 2000, np.float32),
             neighbours(-87.33655, 2000, np.float32)],
    "vexp2": [bit_sweep(-150, 128, 1_500_000, np.float32), np.linspace(-1, 1, 200_001, dtype=np.float32)]
    + [neighbours(edge, 2000, np.float32) for edge in (128, -126, -149, -150)],
    "vexpm1": [bit_sweep(-20, 89, 1_000_000, np.float32), np.linspace(-1, 1, 200_001, dtype=np.float32),
               neighbours(88.72284, 2000, np.float32)],
    "vlog": [bit_sweep(0, np.finfo(np.float32).max, 1_500_000, np.float32),
             np.linspace(0.5, 2, 300_001, dtype=np.float32)],
    "vlog2": [bit_sweep(0, np.finfo(np.float32).max, 1_500_000, np.float32),
              np.linspace(0.5, 2, 300_001, dtype=np.float32)],
    "vlog10": [bit_sweep(0, np.finfo(np.float32).max, 1_500_000, np.float32),
               np.linspace(0.5, 2, 300_001, dtype=np.float32)],
    "vlog1p": [bit_sweep(-1, np.finfo(np.float32).max, 1_500_000, np.float32),
               np.linspace(-0.5, 1, 300_001, dtype=np.float32)],
    "vtanh": [bit_sweep(-12, 12, 1_500_000, np.float32), np.linspace(-1, 1, 200_001, dtype=np.float32)],
    "vsigmoid": [bit_sweep(-110, 110, 1_500_000, np.float32),
                 np.linspace(-20, 20, 200_001, dtype=np.float32)],
}

F64_SWEEPS = {
    "vexp": [bit_sweep(-746, 710, 400_000, np.float64), np.linspace(-1, 1, 100_001),
             neighbours(709.782712893384, 2000, np.float64), neighbours(-745.1332191019412, 2000, np.float64),
             neighbours(-708.3964185322641, 2000, np.float64)],
    "vexp2": [bit_sweep(-1075, 1024, 400_000, np.float64), np.linspace(-1, 1, 100_001)]
    + [neighbours(edge, 2000, np.float64) for edge in (1024, -1022, -1074, -1075)],
    "vexpm1": [bit_sweep(-40, 710, 400_000, np.float64), np.linspace(-1, 1, 100_001),
               neighbours(709.782712893384, 2000, np.float64)],
    "vlog": [bit_sweep(0, np.finfo(np.float64).max, 400_000, np.float64), np.linspace(0.5, 2, 100_001)],
    "vlog2": [bit_sweep(0, np.finfo(np.float64).max, 400_000, np.float64), np.linspace(0.5, 2, 100_001)],
    "vlog10": [bit_sweep(0, np.finfo(np.float64).max, 400_000, np.float64), np.linspace(0.5, 2, 100_001)],
    "vlog1p": [bit_sweep(-1, np.finfo(np.float64).max, 400_000, np.float64), np.linspace(-0.5, 1, 100_001)],
    "vtanh": [bit_sweep(-25, 25, 400_000, np.float64), np.linspace(-1, 1, 100_001)],
    "vsigmoid": [bit_sweep(-750, 750, 400_000, np.float64), np.linspace(-40, 40, 100_001)],
}


@pytest.mark.parametrize("name", NAMES)
def test_float32_ulp_bound(name):
    for x in F32_SWEEPS[name]:
        check_ulp(name, x)


@pytest.mark.skipif(not HAS_LONG_DOUBLE, reason="float64 reference needs an 80-bit long double")
@pytest.mark.parametrize("name", NAMES)
def test_float64_ulp_bound(name):
    for x in F64_SWEEPS[name]:
        check_ulp(name, x)


def _check_exact(name, dtype, cases):
    x = np.array([c[0] for c in cases], dtype)
    want = np.array([c[1] for c in cases], dtype)
    got = apply(name, x)
    np.testing.assert_array_equal(got, want)
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]),
                                  err_msg=f"{name}: sign of zero")


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_special_values(dtype):
    fi = np.finfo(dtype)
    denormal = fi.smallest_subnormal
    big, small = (89.0, -104.0) if dtype == np.float32 else (710.0, -746.0)
    _check_exact("vexp", dtype, [(INF, INF), (-INF, 0.0), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0),
                                 (denormal, 1.0), (-denormal, 1.0), (big, INF), (1e30, INF),
                                 (small, 0.0), (float(np.nextafter(dtype(small), dtype(-INF))), 0.0), (-1e30, 0.0),
                                 (fi.max, INF), (-fi.max, 0.0)])
    # The smallest denormal result, not 0.
    x = np.array([-103.5 if dtype == np.float32 else -744.9], dtype)
    assert apply("vexp", x)[0] == denormal


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp2_special_values_and_exact_powers_of_two(dtype):
    fi = np.finfo(dtype)
    denormal = fi.smallest_subnormal
    _check_exact("vexp2", dtype, [(INF, INF), (-INF, 0.0), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0), (denormal, 1.0),
                                  (-denormal, 1.0), (fi.maxexp, INF), (fi.max, INF), (-fi.max, 0.0),
                                  (fi.minexp - fi.nmant - 1, 0.0), (fi.minexp - fi.nmant - 0.99, denormal)])
    k = np.arange(fi.minexp - fi.nmant - 3, fi.maxexp + 3)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(apply("vexp2", k.astype(dtype)), np.ldexp(np.ones(k.size, dtype), k))


@pytest.mark.parametrize("name", ["vlog2", "vlog10"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_log2_log10_special_values_and_exact_powers(name, dtype):
    fi = np.finfo(dtype)
    _check_exact(name, dtype, [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-fi.smallest_subnormal, NAN),
                               (-INF, NAN), (INF, INF), (NAN, NAN), (1.0, 0.0)])
    k = np.arange(fi.minexp - fi.nmant, fi.maxexp)
    if name == "vlog2":
        np.testing.assert_array_equal(apply(name, np.ldexp(np.ones(k.size, dtype), k)), k.astype(dtype))
    check_ulp(name, np.array([fi.smallest_subnormal, fi.smallest_normal * 0.75, fi.smallest_normal, fi.max], dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_expm1_special_values(dtype):
    denormal = np.finfo(dtype).smallest_subnormal
    _check_exact("vexpm1", dtype, [(INF, INF), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0),
                                   (denormal, denormal), (-denormal, -denormal), (1e30, INF),
                                   (-100.0, -1.0), (-1e30, -1.0)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_special_values(dtype):
    fi = np.finfo(dtype)
    _check_exact("vlog", dtype, [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-fi.smallest_subnormal, NAN),
                                 (-INF, NAN), (INF, INF), (NAN, NAN), (1.0, 0.0)])
    # Denormals and extremes, against the reference.
    extremes = [fi.smallest_subnormal, fi.smallest_normal * 0.75, fi.smallest_normal, fi.max]
    check_ulp("vlog", np.array(extremes, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_log1p_special_values(dtype):
    denormal = np.finfo(dtype).smallest_subnormal
    _check_exact("vlog1p", dtype, [(-1.0, -INF), (-2.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
                                   (0.0, 0.0), (-0.0, -0.0), (denormal, denormal), (-denormal, -denormal)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_tanh_special_values(dtype):
    denormal = np.finfo(dtype).smallest_subnormal
    _check_exact("vtanh", dtype, [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0),
                                  (denormal, denormal), (-denormal, -denormal), (25.0, 1.0), (-25.0, -1.0),
                                  (1e30, 1.0), (-1e30, -1.0)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_special_values(dtype):
    _check_exact("vsigmoid", dtype, [(-INF, 0.0), (INF, 1.0), (NAN, NAN), (0.0, 0.5), (-0.0, 0.5),
                                     (50.0, 1.0), (-1e30, 0.0), (1e30, 1.0), (-800.0, 0.0)])
    # Large negative inputs give the (denormal) tail e**x, not 0.
    x = np.array([-100.0 if dtype == np.float32 else -740.0], dtype)
    assert 0 < apply("vsigmoid", x)[0] < np.finfo(dtype).smallest_normal
    check_ulp("vsigmoid", x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_dtype_is_preserved(name, dtype):
    x = np.linspace(0.1, 2, 8).astype(dtype)
    out = np.empty_like(x)
    _LOOPS[name](x, out)
    (sig,) = [s for s in _LOOPS[name].nopython_signatures if s.args[0].dtype == numba.from_dtype(dtype)]
    assert sig.return_type == numba.from_dtype(dtype)
    assert out.dtype == dtype


def test_fastmath_caller_keeps_special_values():
    @numba.njit(fastmath=True)
    def loop(x, logs, exps):
        for i in range(x.size):
            logs[i] = vecmath.vlog(x[i])
            exps[i] = vecmath.vexp(x[i])

    x = np.array([NAN, INF, -INF, -1.0, 0.0], np.float32)
    logs, exps = np.empty_like(x), np.empty_like(x)
    loop(x, logs, exps)
    np.testing.assert_array_equal(logs, np.array([NAN, INF, NAN, NAN, -INF], np.float32))
    np.testing.assert_array_equal(exps, np.array([NAN, INF, 0.0, np.exp(-1.0), 1.0], np.float32))


def test_rejects_python_calls_and_other_types():
    with pytest.raises(TypeError, match="numba-compiled"):
        vecmath.vexp(1.0)

    @numba.njit
    def on_int(i):
        return vecmath.vexp(i)

    with pytest.raises(numba.core.errors.TypingError):
        on_int(1)


def test_docstring_table_matches_bounds():
    for name, bound in ULP_BOUNDS.items():
        row = re.search(rf"^\s*{name}\s+(\d+)\s+(\d+)\s*$", vecmath.__doc__, re.MULTILINE)
        assert row is not None, name
        assert (int(row[1]), int(row[2])) == (bound["float32"], bound["float64"])


def test_importing_builds_no_kernel_and_a_compile_builds_its_float_types_only():
    """A process that imports vecmath (one that loads cached kernels) builds none of its dispatchers; the first
    compile calling one builds that float type's set, once."""
    script = (
        "import numba, numpy as np\n"
        "from jitgrad.kernels.cpu import vecmath\n"
        "before = vecmath._kernels.cache_info().currsize\n"
        "f = numba.njit(lambda x: vecmath.vtanh(vecmath.vexp(x)))\n"
        "x = np.float32(0.25)\n"
        "assert abs(f(x) - np.tanh(np.exp(np.float64(x)))) < 1e-6\n"
        "print(before, vecmath._kernels.cache_info().currsize, vecmath._kernels.cache_info().misses)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "1", "1"]
