"""jg.jvp of every op of the op tables (tests/test_ops.py and the four tables beside it: 189 rows) against
torch.func.jvp, in float32 and float64, on shapes, axes, parameters and memory layouts drawn by hypothesis
(derandomized).

Each example traces `jg.jvp(op, primals, tangents)` inside `jg.trace` (jvp's in-a-trace path: the VJP of the
pullback inlined), optimises the graph and evaluates it with the numpy reference interpreter, so no kernel
compiles (189 ops x 2 dtypes of compiles would take minutes; the kernels of the same primitives are tested by the
op tables themselves). The rows that run on the host also run jg.jvp on arrays, compiled. Integer arguments
(indices, labels) take float0 tangents; integer and bool outputs must get float0 tangents, float outputs float
tangents of their shape and dtype. The oracle is torch.func.jvp of the row's torch function, or where torch has
no forward-mode rule for one of its ops, torch.autograd.functional.jvp (the double-backward trick, exact as
torch's VJP is); rows with float outputs and no torch function (singular and QR vectors) take central
differences of the numpy reference.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import jitgrad as jg
import test_ops
import test_ops_elementwise_more
import test_ops_linalg
import test_ops_scans_sorting
import test_ops_shapes_more
from jitgrad.ir import interpreter
from jitgrad.passes import simplify
from test_ops import FD_EPS, FD_TOL, FORWARD_TOL, EdgeDraw, HypothesisDraw, as_list, lay_out

TABLES = (test_ops, test_ops_elementwise_more, test_ops_linalg, test_ops_scans_sorting, test_ops_shapes_more)
SPECS = [s for table in TABLES for s in table.SPECS]
FLOATS = (np.float32, np.float64)
# float64: jitgrad's tangent and torch's are the same formulas in another order: a few ulp apart. Where the
# tangent is a sum of terms that cancel (a variance's, a determinant's), atol bounds the rounding of the terms.
# float32: both sides round every intermediate to float32, as the gradient tests allow (test_ops.TORCH_TOL).
JVP_TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=2e-4, atol=2e-5)}
# Ops of symmetric matrices (they read one triangle; their gradient convention is the symmetric one, as torch's):
# a tangent that leaves the symmetric matrices has no agreed derivative, so theirs are symmetric.
SYMMETRIC = {"cholesky", "eigh", "eigvalsh"}
# torch's softplus is x itself beyond its threshold of 20, derivative 1, where the exact one, sigmoid(x), which
# jitgrad's is, differs from 1 by up to exp(-20) = 2.1e-9.
LOOSER = {"softplus": dict(rtol=3e-9, atol=1e-12)}
# Rows with float outputs but no torch function (vectors defined up to sign): central differences of the numpy
# reference are their oracle (LAPACK picks the same signs for a matrix moved by 1e-6).
FD_ONLY = {"svd_vectors", "qr_vectors"}


class DtypeDraw(HypothesisDraw):
    """hypothesis's draws (shapes, axes, layout, seed) with the dtype fixed."""

    def __init__(self, data: Any, dtype: Any):
        super().__init__(data)
        self.dtype = dtype


def inputs(spec, d) -> tuple[list[np.ndarray], dict, np.random.Generator]:
    """The row's arguments for draw `d` (float ones in d's dtype and layout), its params, and the generator."""
    rng = np.random.default_rng(d.seed)
    raw, params = spec.gen(d, rng)
    args = [lay_out(a.astype(d.dtype), d.layout) if a.dtype == np.float64 else a for a in raw]
    return args, params, rng


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """numpy's warnings off (empty means, dead branches of where): the references and the interpreter warn."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def evaluate_traced(fn, args: list[np.ndarray]) -> list[np.ndarray]:
    """`fn(*args)`'s output leaves, traced by jg.trace, optimised and run by the numpy reference interpreter."""
    plan = jg.trace(fn).plan(*args)
    captured = plan.captures.read() or []
    with quiet():
        return interpreter.evaluate(simplify.optimize(plan.graph), list(args) + captured)


def is_float0(t: Any) -> bool:
    return getattr(t, "dtype", None) == jg.float0


def torch_jvp(spec, args: list[np.ndarray], tangents: dict[int, np.ndarray], params: dict) -> list[np.ndarray]:
    """The tangents of the row's torch function's outputs: torch.func.jvp, else the double-backward trick."""
    tensors = [torch.tensor(np.array(a, order="C")) for a in args]
    wrt = sorted(tangents)

    def fn(*floats):
        full = list(tensors)
        for k, t in zip(wrt, floats):
            full[k] = t
        return tuple(as_list(spec.torch_fn(*full, **params)))

    primals = tuple(tensors[k] for k in wrt)
    directions = tuple(torch.tensor(np.array(tangents[k], order="C")) for k in wrt)
    try:
        _, out = torch.func.jvp(fn, primals, directions)
    except (RuntimeError, NotImplementedError):  # no forward-mode rule in torch for one of its ops
        _, out = torch.autograd.functional.jvp(fn, primals, directions)
    return [t.detach().numpy(force=True) for t in out]


def finite_differences(spec, args: list[np.ndarray], tangents: dict[int, np.ndarray], params: dict
                       ) -> list[np.ndarray]:
    """(ref(x + eps t) - ref(x - eps t)) / 2 eps per float output, in float64."""
    def at(sign: float) -> list[np.ndarray]:
        moved = [a.astype(np.float64) + sign * FD_EPS * tangents[k] if k in tangents else a for k, a in enumerate(args)]
        with quiet():
            return [np.asarray(o, np.float64) for o in as_list(spec.reference(*moved, **params))
                    if np.asarray(o).dtype.kind == "f"]
    return [(u - d) / (2 * FD_EPS) for u, d in zip(at(1.0), at(-1.0))]


def draw_tangents(spec, args: list[np.ndarray], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """A standard normal tangent per float argument, in its dtype; symmetric ones for the SYMMETRIC rows."""
    tangents = {k: rng.standard_normal(a.shape).astype(a.dtype) for k, a in enumerate(args) if a.dtype.kind == "f"}
    if spec.name in SYMMETRIC:
        tangents = {k: (t + np.swapaxes(t, -1, -2)) / 2 for k, t in tangents.items()}
    return tangents


def expected_tangents(spec, args: list[np.ndarray], tangents: dict[int, np.ndarray], params: dict, dtype: Any,
                      float_shapes: list[tuple]) -> tuple[list[np.ndarray], dict, str]:
    """The tangents of the row's float outputs (of `float_shapes`) that jitgrad's must match, their tolerance (for
    arguments of `dtype`) and the oracle's name: torch's jvp of the row's torch function, else central differences
    of its numpy reference."""
    assert (spec.torch_fn is None) == (spec.name in FD_ONLY), spec.name  # a new row without torch: decide here
    fd_tol = FD_TOL if dtype == np.float64 else JVP_TOL[dtype]
    if spec.name in FD_ONLY:
        want = finite_differences(spec, args, tangents, params)
        if spec.name == "svd_vectors" and params["full_matrices"]:
            # U's and Vh's vectors past min(m, n) are any basis of the complement, whose cotangent reverse mode
            # ignores (docs/ops.md, as torch): their tangent, its transpose, is zero
            k = min(args[0].shape[-2:])
            want[0][..., k:], want[2][..., k:, :] = 0.0, 0.0
        return want, fd_tol, "finite differences"
    want = torch_jvp(spec, args, tangents, params)
    assert len(want) == len(float_shapes), spec.name
    if [np.shape(w) for w in want] != list(float_shapes):
        # the row's torch function is no oracle for this draw (t_diff joins prepend/append where numpy's diff
        # with n=0 returns x as it is): central differences of the numpy reference instead
        return finite_differences(spec, args, tangents, params), fd_tol, "finite differences"
    return want, LOOSER.get(spec.name, JVP_TOL[dtype]) if dtype == np.float64 else JVP_TOL[dtype], "torch"


def check_jvp(spec, d, compiled: bool = False) -> None:
    """jg.jvp of the row on draw `d`: traced and run by the interpreter, or on arrays (compiled) if `compiled`."""
    args, params, rng = inputs(spec, d)
    floats = [k for k, a in enumerate(args) if a.dtype.kind == "f"]
    tangents = draw_tangents(spec, args, rng)
    n = len(args)
    with quiet():
        try:
            expected = [np.asarray(e) for e in as_list(spec.reference(*args, **params))]
        except (IndexError, ValueError):  # the generator drew an index numpy refuses (arrays that do not broadcast)
            reject()

    def run(primals, tans):
        full = tuple(tans.pop(0) if k in tangents else np.zeros(np.shape(args[k]), jg.float0) for k in range(n))
        out, tangent_out = jg.jvp(lambda *ys: spec.fn(*ys, **params), tuple(primals), full)
        outs, touts = as_list(out), as_list(tangent_out)
        assert len(outs) == len(touts)
        # a float output gets a float tangent, an integer or bool one a float0 tangent of its shape
        assert [np.dtype(o.dtype).kind == "f" for o in outs] == [not is_float0(t) for t in touts], spec.name
        assert all(np.shape(t) == np.shape(o) for o, t in zip(outs, touts)), spec.name
        return outs + [t for t in touts if not is_float0(t)]

    if compiled:
        def call():
            with quiet():
                return [np.asarray(g) for g in run(args, [tangents[k] for k in floats])]
    else:
        def call():
            return evaluate_traced(lambda *xs: run(xs[:n], list(xs[n:])), args + [tangents[k] for k in floats])
    if spec.name.startswith("qr") and params.get("mode") == "complete" and args[0].shape[-2] > args[0].shape[-1]:
        # Q's last columns are any basis of the complement: refused, by name, as torch refuses it
        with pytest.raises(jg.UnsupportedError, match="mode='complete' of a tall .* is not differentiable"):
            call()
        return
    got = call()
    primal_outs, tangent_outs = got[:len(expected)], got[len(expected):]
    for g, e in zip(primal_outs, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, (spec.name, g.shape, g.dtype, e.shape, e.dtype)
        np.testing.assert_allclose(g, e, **FORWARD_TOL[d.dtype], err_msg=f"{spec.name}: primal output")
    float_outs = [e for e in expected if e.dtype.kind == "f"]
    assert len(tangent_outs) == len(float_outs), spec.name
    for t, e in zip(tangent_outs, float_outs):
        assert t.shape == e.shape and t.dtype == e.dtype, (spec.name, t.shape, t.dtype, e.shape, e.dtype)
    if not floats or not float_outs:
        return
    want, tol, oracle = expected_tangents(spec, args, tangents, params, d.dtype, [e.shape for e in float_outs])
    assert len(want) == len(tangent_outs), spec.name
    for j, (t, w) in enumerate(zip(tangent_outs, want)):
        np.testing.assert_allclose(t, w, **tol, err_msg=f"{spec.name}: tangent of output {j} against {oracle}")


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(derandomize=True, max_examples=2, deadline=None)
@given(data=st.data())
def test_jvp_of_every_op_matches_torch(spec, dtype, data) -> None:
    check_jvp(spec, DtypeDraw(data, dtype))


class EdgeDtype(EdgeDraw):
    """The rank-2 transposed edge case of tests/test_ops.py, in either dtype."""

    def __init__(self, dtype: Any):
        super().__init__("transposed")
        self.dtype = dtype


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
def test_compiled_jvp_on_arrays(dtype) -> None:
    """jg.jvp on arrays runs the compiled jvp program: every row that runs on the host (whose jvp programs
    compile few kernels), on the rank-2 edge case, against torch; float0 tangents for integer outputs."""
    for spec in [s for s in SPECS if s.host]:
        check_jvp(spec, EdgeDtype(dtype), compiled=True)
