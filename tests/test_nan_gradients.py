"""Derivatives at NaN, ±0, ±inf and ties against torch autograd, bit for bit with the sign of zero (issue 32).

Every op with a piecewise derivative runs on one batch of special and ordinary points (each point twice, with
cotangent +1 and -1). Per dtype, all ops are one traced function of one argument per op, so one plan compiles."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest
import torch

import jitgrad as jg

NAN, INF = np.nan, np.inf
POINTS = [NAN, -0.0, 0.0, INF, -INF, 1.5, -2.0, 0.5, -0.5, 1.0, -1.0, 2.0, 2.5, 3.0, -3.0]
PAIRS = [(NAN, 1.0), (1.0, NAN), (NAN, NAN), (1.0, 1.0), (1.0, 2.0), (2.0, 1.0), (-0.0, 0.0), (0.0, -0.0),
         (-0.0, -0.0), (0.0, 0.0), (INF, INF), (-INF, -INF), (INF, 1.0), (-INF, 2.0), (2.0, -INF), (-3.0, -3.0),
         (0.5, 0.25), (NAN, INF), (INF, NAN), (0.0, 1.5), (-0.0, -1.5), (1.5, 0.0), (-2.5, -0.0), (-7.0, 2.0)]
ROWS = [[1.0, 3.0, 3.0, 0.0], [1.0, NAN, 3.0, NAN], [0.0, -0.0, -1.0, -2.0], [INF, INF, 1.0, 2.0],
        [-INF, -INF, -INF, -INF], [NAN, 1.0, 2.0, 3.0], [-0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]]
SMOOTH_RTOL = {np.float32: 1e-5, np.float64: 1e-12}


class Op(NamedTuple):
    """jitgrad's form (numpy code on traced arrays), torch's, and the input kind: points, pairs or rows."""
    jitgrad: Callable[..., Any]
    torch: Callable[..., Any]
    inputs: str = "points"
    # A composite smooth away from the special points: ordinary points may differ by rounding, and a zero's
    # sign is not compared (x feeds two paths whose gradients add, and +0 + -0 is +0: softplus at -inf).
    smooth: bool = False


def _sorted_weighted(sort: Callable[[Any], Any], x: Any, arange: Callable[..., Any]) -> Any:
    """Sorted rows weighted 1, 2, ... by position (no zero weight: a -0.0 cotangent scatter-adds to +0.0)."""
    return sort(x) * arange(1, x.shape[-1] + 1, dtype=x.dtype)


OPS = {
    "relu": Op(jg.relu, torch.relu),
    "abs": Op(np.abs, torch.abs),
    "clip": Op(lambda x: np.clip(x, -1.0, 2.0), lambda x: torch.clamp(x, -1.0, 2.0)),
    "clip_min": Op(lambda x: np.clip(x, -1.0, None), lambda x: torch.clamp(x, min=-1.0)),
    "clip_max": Op(lambda x: np.clip(x, None, 2.0), lambda x: torch.clamp(x, max=2.0)),
    "clip_crossed": Op(lambda x: np.clip(x, 2.0, -1.0), lambda x: torch.clamp(x, 2.0, -1.0)),
    "sign": Op(np.sign, torch.sign),
    "floor": Op(np.floor, torch.floor),
    "ceil": Op(np.ceil, torch.ceil),
    "rint": Op(np.rint, torch.round),
    "round": Op(np.round, torch.round),
    "softplus": Op(jg.softplus, torch.nn.functional.softplus, smooth=True),
    "gelu": Op(jg.gelu, lambda x: torch.nn.functional.gelu(x, approximate="tanh"), smooth=True),
    "sigmoid": Op(jg.sigmoid, torch.sigmoid, smooth=True),
    "maximum": Op(np.maximum, torch.maximum, "pairs"),
    "minimum": Op(np.minimum, torch.minimum, "pairs"),
    "fmax": Op(np.fmax, torch.fmax, "pairs"),
    "fmin": Op(np.fmin, torch.fmin, "pairs"),
    "where": Op(lambda a, b: np.where(a > b, a, b), lambda a, b: torch.where(a > b, a, b), "pairs"),
    "clip_arrays": Op(lambda a, b: np.clip(a, b, 2.0), lambda a, b: torch.clamp(a, b, torch.full_like(a, 2.0)),
                      "pairs"),
    "clip_max_arrays": Op(lambda a, b: np.clip(a, -1.0, b), lambda a, b: torch.clamp(a, torch.full_like(a, -1.0), b),
                          "pairs"),
    "copysign": Op(np.copysign, torch.copysign, "pairs"),
    "fmod": Op(np.fmod, torch.fmod, "pairs"),
    "remainder": Op(np.remainder, torch.remainder, "pairs"),
    "max": Op(lambda x: np.max(x, axis=1), lambda x: torch.amax(x, 1), "rows"),
    "min": Op(lambda x: np.min(x, axis=1), lambda x: torch.amin(x, 1), "rows"),
    "max_all": Op(np.max, torch.amax, "rows"),
    "sort": Op(lambda x: _sorted_weighted(np.sort, x, np.arange),
               lambda x: _sorted_weighted(lambda v: torch.sort(v, stable=True).values, x, torch.arange), "rows"),
}
FLOAT32_OPS = ["relu", "abs", "clip", "maximum", "fmax", "where", "max", "sort", "copysign"]


def _inputs(kind: str, dtype: type) -> list[np.ndarray]:
    """The op's operands, each point (pair, row) twice: the first copy gets cotangent +1, the second -1."""
    if kind == "points":
        return [np.array(POINTS * 2, dtype)]
    if kind == "pairs":
        return [np.array([p[i] for p in PAIRS] * 2, dtype) for i in (0, 1)]
    return [np.array(ROWS * 2, dtype)]


def _signs(out_shape: tuple[int, ...]) -> np.ndarray:
    """+1 on the first half of the leading axis, -1 on the second (1 for a scalar output)."""
    if not out_shape:
        return np.ones(())
    half = out_shape[0] // 2
    return np.concatenate([np.ones(half), -np.ones(out_shape[0] - half)]).reshape((-1,) + (1,) * (len(out_shape) - 1))


def _names(dtype: type) -> list[str]:
    return list(OPS) if dtype == np.float64 else FLOAT32_OPS


@functools.cache
def _jitgrad_grads(dtype: type) -> dict[str, list[np.ndarray]]:
    """Each op's gradients, all ops in one traced loss (one plan, one compile per dtype)."""
    names = _names(dtype)
    args = [_inputs(OPS[n].inputs, dtype) for n in names]
    flat = [a for group in args for a in group]

    def loss(*xs: Any) -> Any:
        total, k = 0.0, 0
        for name, group in zip(names, args):
            out = OPS[name].jitgrad(*xs[k:k + len(group)])
            total = total + np.sum(out * _signs(np.shape(out)).astype(dtype))
            k += len(group)
        return total

    grads = jg.trace(loss).grad(*flat, argnums=tuple(range(len(flat))))
    result, k = {}, 0
    for name, group in zip(names, args):
        result[name] = [np.asarray(g) for g in grads[k:k + len(group)]]
        k += len(group)
    return result


def _torch_grads(name: str, dtype: type) -> list[np.ndarray]:
    xs = [torch.tensor(a, requires_grad=True) for a in _inputs(OPS[name].inputs, dtype)]
    out = OPS[name].torch(*xs)
    torch.sum(out * torch.from_numpy(_signs(tuple(out.shape)).astype(dtype))).backward()
    return [x.grad.numpy() for x in xs]


def _same(got: np.ndarray, want: np.ndarray, signed_zeros: bool = True) -> np.ndarray:
    """Where `got` and `want` are equal (NaN equal to NaN), zeros of the same sign if `signed_zeros`."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    return same & ((got != 0) | (np.signbit(got) == np.signbit(want))) if signed_zeros else same


CASES = [(n, d) for d in (np.float64, np.float32) for n in _names(d)]


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in CASES])
def test_derivative_matches_torch_bitwise(name: str, dtype: type) -> None:
    op = OPS[name]
    inputs = _inputs(op.inputs, dtype)
    for i, (x, got, want) in enumerate(zip(inputs, _jitgrad_grads(dtype)[name], _torch_grads(name, dtype))):
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        if op.smooth:
            close = np.isclose(got, want, rtol=SMOOTH_RTOL[dtype], atol=0, equal_nan=True)
            bad = ~np.where(~np.isfinite(x) | (x == 0), _same(got, want, signed_zeros=False), close)
        else:
            bad = ~_same(got, want)
        operands = [v[bad] for v in inputs]
        assert not bad.any(), f"{name} d/d(operand {i}) at {operands}: jitgrad {got[bad]}, torch {want[bad]}"


VALUE_OPS = ["relu", "clip", "clip_min", "clip_max", "clip_crossed", "clip_arrays", "clip_max_arrays"]
NUMPY_VALUES = {"relu": lambda x: np.maximum(x, 0.0)}


def test_values_match_numpy_at_special_points() -> None:
    """The forward values of the ops whose composites changed for these rules: NaN in any operand gives NaN.
    numpy's clip gives a tie of -0.0 and +0.0 the bound's sign with array bounds, the operand's with scalar ones
    (jitgrad's): the sign of such a zero is not compared."""
    args = [_inputs(OPS[n].inputs, np.float64) for n in VALUE_OPS]
    got = jg.trace(lambda *groups: [OPS[n].jitgrad(*g) for n, g in zip(VALUE_OPS, groups)])(*args)
    for name, group, value in zip(VALUE_OPS, args, got):
        want = NUMPY_VALUES.get(name, OPS[name].jitgrad)(*group)
        zero_tie = np.all([v == 0 for v in group], axis=0) & (len(group) > 1)
        bad = ~np.where(zero_tie, _same(value, want, signed_zeros=False), _same(value, want))
        assert not bad.any(), f"{name} at {[v[bad] for v in group]}: jitgrad {value[bad]}, numpy {want[bad]}"
