"""Vectorisable float32/float64 elementary functions for numba kernels.

numba lowers ``math.exp``/``np.exp`` & co. to scalar libm calls, and the llvmlite
wheel has no SVML, so a loop that calls them is never vectorised.  The functions
here are range reduction + polynomial in plain arithmetic, with bit manipulation
done through LLVM bitcasts and special values handled with selects instead of
branches, so that after inlining LLVM can turn ``out[i] = vexp(x[i])`` into SIMD.

Use them only inside numba-compiled code; each one dispatches on its argument's
type (float32 or float64; anything else is a typing error), and float32 stays
float32, never promoted to float64::

    from jitgrad.kernels.cpu.vecmath import vexp

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = vexp(x[i])

The one fast-math flag used is LLVM's ``contract``: a multiply followed by an add
may become one fused multiply-add where the CPU has FMA (one rounding instead of
two: the polynomials get faster and no less accurate; 30% off ``vexp``).  No
other flag: the results must match numpy, and the rest of fast-math lets LLVM
assume there are no NaNs, infinities or signed zeros, which would break the
special-value handling below.  Special values follow IEEE/numpy:
exp(+-inf) = inf/0, log(0) = -inf, log(x<0) = nan, tanh(+-inf) = +-1,
tanh(-0.0) = -0.0, sigmoid(+-inf) = 1/0, NaN in gives NaN out, overflow gives
inf and underflow gives the correctly scaled denormal or 0.  exp2 of an integer is
the exact power of two (denormals included) and log2 of a power of two the exact
integer: their reductions are exact, where exp(x ln 2) and log(x) / ln 2 are not.

Maximum error in ulps (``ULP_BOUNDS``, re-checked by tests/test_vecmath.py), against
the correctly rounded result: for float32, numpy's float64 result rounded to
float32; for float64, numpy evaluated in 80-bit long double and rounded to float64.
Measured (with FMA contraction, 2026-11-29) over every third float32 bit pattern of
each function's range (every pattern for tanh) and 8 million float64 samples per
function spread over all binades (float64 tanh measured 2 there; its bound stays
at the 3 that 20 million samples found before contraction).  vexp2 (2026-12-05):
every float32 pattern in [-150, 128], 0.8% of them 1 ulp off, and 12.8 million
float64 samples; vlog2 and vlog10: every seventh positive float32 pattern (0.05%
1 ulp off) and 8.4 million float64 samples over all binades.

    ==========  =======  =======
    function    float32  float64
    ==========  =======  =======
    vexp        1        1
    vexp2       1        1
    vexpm1      2        2
    vlog        1        1
    vlog2       1        1
    vlog10      1        1
    vlog1p      1        1
    vtanh       2        3
    vsigmoid    2        2
    ==========  =======  =======
"""

import functools
import math
from collections.abc import Callable

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

__all__ = ["ULP_BOUNDS", "vexp", "vexp2", "vexpm1", "vlog", "vlog10", "vlog1p", "vlog2", "vsigmoid", "vtanh"]

ULP_BOUNDS: dict[str, dict[str, int]] = {
    "vexp": {"float32": 1, "float64": 1},
    "vexp2": {"float32": 1, "float64": 1},
    "vexpm1": {"float32": 2, "float64": 2},
    "vlog": {"float32": 1, "float64": 1},
    "vlog2": {"float32": 1, "float64": 1},
    "vlog10": {"float32": 1, "float64": 1},
    "vlog1p": {"float32": 1, "float64": 1},
    "vtanh": {"float32": 2, "float64": 3},
    "vsigmoid": {"float32": 2, "float64": 2},
}

# error_model="numpy": float division must not get a Python ZeroDivisionError branch.
# fastmath={"contract"} is explicit so that a fast-math caller does not pass its other flags on.
_jit = numba.njit(error_model="numpy", fastmath={"contract"})
# The pieces the public functions are built of are inlined into them in numba's IR, with the same flags: each
# @njit function is its own library (typed, lowered, optimised and linked once per process), and a first call
# that compiles kernels pays for every one of them, in the compile helper too.
_piece = numba.njit(error_model="numpy", fastmath={"contract"}, inline="always")


def _bitcast(context, builder, sig, args):
    return builder.bitcast(args[0], context.get_value_type(sig.return_type))


@intrinsic
def _bits(typingctx, x):
    """The bit pattern of a float32/float64 as int32/int64 (an LLVM bitcast)."""
    if isinstance(x, types.Float) and x.bitwidth in (32, 64):
        return getattr(types, f"int{x.bitwidth}")(x), _bitcast
    return None


@intrinsic
def _from_bits(typingctx, i):
    """The float32/float64 whose bit pattern is the int32/int64 ``i`` (an LLVM bitcast)."""
    if isinstance(i, types.Integer) and i.bitwidth in (32, 64):
        return getattr(types, f"float{i.bitwidth}")(i), _bitcast
    return None


def _bits_of(v: np.floating) -> np.signedinteger:
    """Python-level twin of ``_bits``, for building constants."""
    return v.view(np.int32 if v.dtype == np.float32 else np.int64)


def _build(ft: type) -> dict:
    """The kernels for one float type (np.float32 or np.float64), by public name."""
    single = ft is np.float32
    it = np.int32 if single else np.int64
    mant = it(23 if single else 52)  # explicit mantissa bits
    bias = it(127 if single else 1023)
    mant_mask = it((1 << mant) - 1)
    zero, half, one, two = ft(0.0), ft(0.5), ft(1.0), ft(2.0)
    inf, nan = ft(np.inf), ft(np.nan)
    # Adding 1.5 * 2**mant rounds a float to an integer that sits in the low
    # mantissa bits, which converts float <-> int without a (poison-prone) fptosi.
    shifter = ft(1.5 * 2.0**mant)
    shifter_bits = _bits_of(shifter)
    # ln(2) split so that k * ln2_hi is exact for every exponent k that occurs.
    ln2_hi = ft(0.693359375 if single else 0.6931471803691238)
    ln2_lo = ft(-2.12194440e-4 if single else 1.9082149292705877e-10)
    log2e = ft(1.4426950408889634)
    # Beyond these, exp and expm1 have overflowed to inf or underflowed to 0 / -1.
    exp_lo, exp_hi = ft(-104.0 if single else -746.0), ft(89.0 if single else 710.0)
    expm1_lo = ft(-20.0 if single else -40.0)
    exp2_lo, exp2_hi = ft(-150.0 if single else -1075.0), ft(128.0 if single else 1024.0)
    ln2 = ft(math.log(2.0))
    # tanh(x) rounds to 1 beyond this (and expm1(2x) stays finite).
    tanh_sat = ft(10.0 if single else 20.0)
    # Below this, expm1(x) and log1p(x) round to x; that select also passes NaN,
    # -0.0 and denormals through unchanged.
    tiny = ft(2.0**-60)
    smallest_normal = ft(np.finfo(ft).tiny)
    denormal_scale = ft(2.0**mant)
    sqrt_half_bits = _bits_of(ft(math.sqrt(0.5)))
    # fdlibm's split constants for log2 and log10: 1/ln2, 1/ln10 and log10(2) as a short high part (whose
    # products with f's high bits, hi_mask, and with k are exact) plus the rest.
    hi_mask = it(-(1 << 12) if single else -(1 << 32))
    ivln2_hi, ivln2_lo = (ft(1.4428710938e+00), ft(-1.7605285393e-04)) if single else (
        ft(1.44269504072144627571e+00), ft(1.67517131648865118353e-10))
    ivln10_hi, ivln10_lo = (ft(4.3432617188e-01), ft(-3.1689971365e-05)) if single else (
        ft(4.34294481878168880939e-01), ft(2.50829467116452752298e-11))
    log10_2_hi, log10_2_lo = (ft(3.0102920532e-01), ft(7.9034151668e-07)) if single else (
        ft(3.01029995663611771306e-01), ft(3.69423907715893078616e-13))
    # Near-minimax fits (Chebyshev, 50 digits): expm1(r) = r + r^2 P(r), |r| <= 0.35
    # and log(1+f) = f - f^2/2 + s (f^2/2 + z Q(z)), s = f/(2+f), z = s^2 <= 0.0295.
    exp_p = tuple(map(ft, (
        (0.5, 0.16666573, 0.04166655, 0.008363767, 0.0013926919) if single else
        (0.5000000000000001, 0.16666666666666669, 0.04166666666662068, 0.008333333333329796,
         0.0013888888918918907, 0.00019841269864364933, 2.4801518672268355e-05,
         2.7557266442353424e-06, 2.7621324269313687e-07, 2.5101335854788522e-08))))
    log_q = tuple(map(ft, (
        (0.66666687, 0.3998876, 0.29580986) if single else
        (0.666666666666667, 0.3999999999989889, 0.28571428626253836, 0.22222211089379496,
         0.1818289243253687, 0.15331611722055008, 0.14617807153417325))))

    @_piece
    def poly(x, coeffs):
        """coeffs[0] + coeffs[1] x + ... by Horner's rule."""
        acc = coeffs[-1]
        for i in range(len(coeffs) - 2, -1, -1):
            acc = acc * x + coeffs[i]
        return acc

    @_piece
    def pow2(n):
        """2.0**n for an integer n in the normal exponent range."""
        return _from_bits(it((n + bias) << mant))

    @_piece
    def int_to_float(k):
        """float(k) for |k| < 2**(mant - 1), with integer add + bitcast only."""
        return _from_bits(it(k + shifter_bits)) - shifter

    @_piece
    def reduce_exp(x):
        """(r, n) with x = n ln2 + r, |r| <= ln2/2 (x must be finite and clamped)."""
        t = x * log2e + shifter
        nf = t - shifter
        n = it(_bits(t) - shifter_bits)
        return (x - nf * ln2_hi) - nf * ln2_lo, n

    @_piece
    def expm1_poly(r):
        return r + r * r * poly(r, exp_p)

    @_piece
    def scaled(p, n):
        """(1 + p) 2**n, scaled in two exact steps: 2**n need not be representable, a denormal is rounded once."""
        n1 = n >> 1
        return (one + p) * pow2(n1) * pow2(n - n1)

    @_jit
    def exp(x):
        # At or below exp_lo (-inf and NaN too) the result is 0 (NaN is put back at the end): those lanes
        # compute exp(0) and are replaced, because scaling down to 0 goes through denormals, which cost
        # Intel CPUs a microcode assist per operation (a masked softmax row of -inf ran 15x slower).
        low = not x > exp_lo
        xc = zero if low else x
        xc = xc if xc < exp_hi else exp_hi
        r, n = reduce_exp(xc)
        y = zero if low else scaled(expm1_poly(r), n)
        return y if x == x else x

    @_jit
    def exp2(x):
        # exp's recipe with an exact reduction: x = n + r, |r| <= 1/2, so an integer x gives r = 0 and an
        # exact power of two. At or below exp2_lo (half the smallest denormal, which rounds to 0) the result
        # is 0; from exp2_hi up it overflows to inf.
        low = not x > exp2_lo
        xc = zero if low else x
        xc = xc if xc < exp2_hi else exp2_hi
        t = xc + shifter
        r = xc - (t - shifter)
        y = zero if low else scaled(expm1_poly(r * ln2), it(_bits(t) - shifter_bits))
        return y if x == x else x

    @_jit
    def expm1(x):
        xc = x if x > expm1_lo else expm1_lo
        xc = xc if xc < exp_hi else exp_hi
        r, n = reduce_exp(xc)
        # 2**n (1 + p) - 1 = 2 (h p + (h - 1/2)) with h = 2**(n-1): h - 1/2 is exact
        # for the n where it matters, and n = 128 / 1024 needs no unrepresentable 2**n.
        h = pow2(n - 1)
        y = two * (h * expm1_poly(r) + (h - half))
        return y if abs(x) >= tiny else x

    @_piece
    def log_parts(x):
        """(k, f, hfsq, t) with x = 2**k (1 + f) and log(1 + f) = f - (hfsq - t), for finite x > 0."""
        scaled = x < smallest_normal
        xs = x * denormal_scale if scaled else x
        # x = 2**k m with m in [sqrt(1/2), sqrt(2)): subtracting the bits of sqrt(1/2)
        # carries into the exponent field exactly when the mantissa reaches it.
        # Denormals were scaled up by 2**mant, which the exponent takes back.
        ix = _bits(xs) - sqrt_half_bits
        k = (ix >> mant) - (mant if scaled else 0)
        f = _from_bits(it((ix & mant_mask) + sqrt_half_bits)) - one
        s = f / (two + f)
        z = s * s
        hfsq = half * f * f
        return int_to_float(k), f, hfsq, s * (hfsq + z * poly(z, log_q))

    @_piece
    def log_core(x, c):
        """log(x) + c for finite x > 0, where c is a small correction term."""
        kf, f, hfsq, t = log_parts(x)
        lo = t + (kf * ln2_lo + c)
        return kf * ln2_hi + (f - (hfsq - lo))

    @_piece
    def log_base(x, k_hi, k_lo, inv_hi, inv_lo):
        """k log_b(2) + log(1 + f) / ln(b) for finite x > 0 (fdlibm's log2 and log10): the short high parts
        make k_hi k and hi inv_hi exact, and the sum of the large terms is compensated; so a power of two's
        log2 is exactly k."""
        kf, f, hfsq, t = log_parts(x)
        hi = _from_bits(it(_bits(f - hfsq) & hi_mask))
        lo = (f - hi) - hfsq + t
        k_part, val_hi = kf * k_hi, hi * inv_hi
        w = k_part + val_hi
        return (kf * k_lo + (lo + hi) * inv_lo + lo * inv_hi + ((k_part - w) + val_hi)) + w

    @_piece
    def log_special(x, y):
        """y for finite x > 0; else the log of x: inf at inf, -inf at +-0, nan below 0 and at nan."""
        y = y if x < inf else x
        return y if x > zero else (-inf if x == zero else nan)

    @_jit
    def log(x):
        return log_special(x, log_core(x, zero))

    @_jit
    def log2(x):
        return log_special(x, log_base(x, one, zero, ivln2_hi, ivln2_lo))

    @_jit
    def log10(x):
        return log_special(x, log_base(x, log10_2_hi, log10_2_lo, ivln10_hi, ivln10_lo))

    @_jit
    def log1p(x):
        u = one + x
        # The rounding error of 1 + x, exactly; feeding c/u to log keeps it.
        c = (x - (u - one)) if u < two else (one - (u - x))
        y = log_core(u, c / u)
        y = y if abs(x) >= tiny else x
        y = y if x < inf else x
        return y if x > -one else (-inf if x == -one else nan)

    @_jit
    def tanh(x):
        a = abs(x)
        a = tanh_sat if a > tanh_sat else a
        t = expm1(a + a)
        return math.copysign(t / (t + two), x)

    @_jit
    def sigmoid(x):
        # exp(-|x|) never overflows; for x < 0 this is e^x / (1 + e^x).
        e = exp(-abs(x))
        return (one if x >= zero else e) / (one + e)

    return {"vexp": exp, "vexp2": exp2, "vexpm1": expm1, "vlog": log, "vlog2": log2, "vlog10": log10,
            "vlog1p": log1p,
            "vtanh": tanh, "vsigmoid": sigmoid}


_FLOAT_TYPES = {32: np.float32, 64: np.float64}


@functools.cache
def _kernels(bitwidth: int) -> dict:
    """The kernels for float32 or float64 (`bitwidth`), built when a compile first types a call to one: importing
    this module (every process that runs a kernel calling them does, even one that only loads kernels from the
    disk cache, whose object code holds them) builds none of the 38 dispatchers. Typing runs under numba's
    compiler lock, so one process builds each set once."""
    return _build(_FLOAT_TYPES[bitwidth])


def _public(name: str, doc: str) -> Callable[[float], float]:
    """A numba-only function ``name`` that dispatches to the float32/float64 kernel."""

    def stub(x: float) -> float:
        raise TypeError(f"{name}() is only callable inside numba-compiled code")

    stub.__name__ = stub.__qualname__ = name
    bound = ULP_BOUNDS[name]
    stub.__doc__ = f"{doc}  Max error: {bound['float32']} ulp (float32), {bound['float64']} ulp (float64)."

    @overload(stub, jit_options={"error_model": "numpy", "fastmath": {"contract"}})
    def _typed(x):
        if isinstance(x, types.Float) and x.bitwidth in _FLOAT_TYPES:
            kernel = _kernels(x.bitwidth)[name]
            return lambda x: kernel(x)
        return None

    return stub


vexp = _public("vexp", "e**x; overflows to inf and underflows through denormals to 0.")
vexp2 = _public("vexp2", "2**x; exact powers of two for integer x, overflow to inf from 2**(emax + 1), "
                 "underflow through denormals to 0.")
vexpm1 = _public("vexpm1", "e**x - 1, accurate near 0.")
vlog = _public("vlog", "Natural logarithm; log(0) = -inf, log(x < 0) = nan, denormals handled.")
vlog2 = _public("vlog2", "Base-2 logarithm; exact integers at powers of two, log's special values.")
vlog10 = _public("vlog10", "Base-10 logarithm; log's special values.")
vlog1p = _public("vlog1p", "log(1 + x), accurate near 0.")
vtanh = _public("vtanh", "Hyperbolic tangent, as t / (t + 2) with t = expm1(2|x|); odd, keeps -0.0.")
vsigmoid = _public("vsigmoid", "1 / (1 + e**-x), without overflow: e**x / (1 + e**x) for x < 0.")
