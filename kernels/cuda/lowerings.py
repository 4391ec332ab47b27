"""The CUDA backend's lowerings: per primitive, its scalar expression template on a GPU (``"cuda"``) and in
numba's CUDA simulator (``"cuda_sim"``), registered where the primitive's record template (the CPU's, over
numpy's scalar functions) does not serve; `kernels.common.lowering` looks them up for `codegen`.

Operators, comparisons, logic, `where` and casts have no entry: their record template is every backend's.
On a GPU numpy's scalar functions do not exist, so math names `math` (numba-cuda maps it to libdevice) or
libdevice itself. The simulator runs the kernels as plain Python, whose `math` raises on inf and nan: it
keeps the record's numpy template, and registers numpy's own function where the record's calls the CPU's
vector math (`vexp`), which it cannot import, or where numpy's own gives numpy's bits and the template not.
"""
from __future__ import annotations

from jitgrad.kernels.common import RECORD, register_lowering
from jitgrad.ops import arithmetic as ar
from jitgrad.ops import comparisons as cmp
from jitgrad.ops import transcendental as tr
from jitgrad.ir.primitive import Primitive

GPU = "cuda"  # numba's CUDA target
SIMULATOR = "cuda_sim"  # numba's CUDA simulator


def _record(prim: Primitive) -> str:
    return prim.lowering[RECORD].template


def _libm(prim: Primitive, renames: dict[str, str] | None = None) -> str:
    """The record's template with numpy's scalar functions taken from `math` instead, except `renames`
    (another name first: libdevice's)."""
    template = _record(prim)
    for name, replacement in (renames or {}).items():
        template = template.replace(name, replacement)
    return template.replace("np.", "math.")


# ---------------------------------------------------------------------- math functions: `math` on a GPU

_MATH = {tr.exp_p: "exp", tr.expm1_p: "expm1", tr.log_p: "log", tr.log1p_p: "log1p", tr.sin_p: "sin",
         tr.cos_p: "cos", tr.tan_p: "tan", tr.tanh_p: "tanh", tr.sinh_p: "sinh", tr.cosh_p: "cosh",
         tr.arcsin_p: "asin", tr.arccos_p: "acos", tr.arctan_p: "atan", tr.arcsinh_p: "asinh",
         tr.arctanh_p: "atanh", ar.sqrt_p: "sqrt", ar.floor_p: "floor", ar.ceil_p: "ceil", cmp.isnan_p: "isnan",
         cmp.isfinite_p: "isfinite", tr.arccosh_p: "acosh"}
for _prim, _name in _MATH.items():
    register_lowering(_prim, GPU, f"math.{_name}({{0}})")

# exp2, log2 and log10 from libdevice: exact at integers and powers of two (exp(x ln 2), log(x) / ln 2 are not);
# rint and cbrt, which `math` lacks
_LIBDEVICE = {tr.exp2_p: "exp2", tr.log2_p: "log2", tr.log10_p: "log10", ar.rint_p: "rint", ar.cbrt_p: "cbrt"}
for _prim, _name in _LIBDEVICE.items():
    register_lowering(_prim, GPU, f"libdevice.{_name}{{f}}({{0}})")

# the simulator: numpy's function where the record's template calls the CPU's vector math
for _prim, _name in {tr.exp_p: "exp", tr.expm1_p: "expm1", tr.exp2_p: "exp2", tr.log_p: "log", tr.log1p_p: "log1p",
                     tr.log2_p: "log2", tr.log10_p: "log10", tr.tanh_p: "tanh"}.items():
    register_lowering(_prim, SIMULATOR, f"np.{_name}({{0}})")

register_lowering(tr.erf_p, GPU, "math.erf({0})")
register_lowering(ar.sign_p, GPU,
                  "({cast}(1) if {0} > 0 else ({cast}(-1) if {0} < 0 else ({0} if {0} != {0} else {cast}(0))))")
register_lowering(tr.atan2_p, GPU, "math.atan2({0}, {1})")

# the logistic function without overflow (exp is only taken of -|x|), where the CPU calls vecmath's vsigmoid
_LOGISTIC = "({cast}(1) / ({cast}(1) + F(-{0})) if {0} >= 0 else F({0}) / ({cast}(1) + F({0})))"
register_lowering(tr.logistic_p, GPU, _LOGISTIC.replace("F", "math.exp"))
register_lowering(tr.logistic_p, SIMULATOR, _LOGISTIC.replace("F", "np.exp"))

# ---------------------------------------------------------------------- numpy's recipes, from `math`

for _prim in (ar.remainder_p, ar.fmod_p, ar.floor_divide_p, tr.hypot_p, ar.copysign_p, tr.logaddexp_p):
    register_lowering(_prim, GPU, _libm(_prim))
register_lowering(tr.logaddexp2_p, GPU, _libm(tr.logaddexp2_p, {"np.exp2(": "libdevice.exp2{f}("}))
# The simulator calls numpy's own: its np.exp of a float32 scalar is numpy's vector expf, not the libm expf
# numpy's logaddexp loop calls, and the difference grows by cancellation (the CPU test checks the template).
register_lowering(tr.logaddexp_p, SIMULATOR, "np.logaddexp({0}, {1})")
register_lowering(tr.logaddexp2_p, SIMULATOR, "np.logaddexp2({0}, {1})")

# ldexp: math's on a GPU, the exponent clamped into int32 as on the CPU; numpy's own in the simulator
register_lowering(ar.ldexp_p, GPU, _record(ar.ldexp_p).replace("np.ldexp(", "math.ldexp("))
register_lowering(ar.ldexp_p, SIMULATOR, "np.ldexp({0}, {1})")
