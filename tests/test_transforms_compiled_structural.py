"""Forward mode and vmap of every NON-elementwise row of the op tables, compiled: through the real kernels and host
steps, a few programs per transform.

tests/test_jvp_every_op.py and tests/test_vmap_every_op.py run every row's jvp and vmap on the numpy reference
interpreter; tests/test_jvp_compiled_rows.py compiles the elementwise rows'. Here the other rows (reductions and the
activations built on them, views and shape ops, and the host steps: products, gathers and scatters, scans, sorting,
linear algebra) are traced into one function per family and dtype, so that their JVP and batched graphs go through
the passes, fusion and the kernels. A row's family is read off its forward graph: "host" if an equation reading an
input runs on the host, else "reduce" if one reduces, else "view".

Each dtype has its own draw of every row's inputs (the table generators' `Draw`). float32: rank-3 inputs read with a
stride, the last option of every choice (keepdims True), axis 0 or the axes (0, -1), middle sizes; every row. float64:
rank-2 inputs in column-major order, the first option of every choice (keepdims False), the last axis, the largest
sizes: the draw on which other files already compile the jvp of the rows that run on the host and the vmap of
test_ops.py's rows and of the host rows, so float64 takes the others. The jvp's tangents are compared with
test_jvp_every_op's oracle (torch.func.jvp of the row's torch function, or central differences); vmap's outputs with
a Python loop of the row's numpy reference over the examples, the first argument batched at axis -1, the second
shared (None) and the others at 0 in float64, and the first at axis 1, the second at -1 and the others shared in
float32, outputs at 0 and at -1. Each program is called twice: the second call traces nothing, writes no new kernel
and gives the same bits.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import jitgrad as jg
import test_ops
from jitgrad.ir.graph import Var
from jitgrad.ir.primitive import Kind
from test_jvp_compiled_rows import elementwise_rows, seed_of
from test_jvp_every_op import SPECS, draw_tangents, expected_tangents, inputs, is_float0, quiet
from test_ops import FORWARD_TOL, EdgeDraw, as_list
from test_vmap_every_op import no_rule

FLOATS = (np.float64, np.float32)
FAMILIES = ("reduce", "view", "host")
BATCH = 3
FIRST_TABLE = {s.name for s in test_ops.SPECS}
# Rows whose jvp jitgrad refuses on a dtype's draw, and why (tests/test_jvp_every_op.py checks the same refusal).
REFUSED_JVP = {("qr_vectors", np.float64): "mode='complete' of a tall .* is not differentiable"}


class FirstDraw(EdgeDraw):
    """Rank-2 (or the least rank allowed) inputs in column-major order, the first option of every choice, the last
    axis, the largest of every range of integers (the linalg generators' largest matrices)."""

    def __init__(self, dtype: Any, seed: int):
        super().__init__("transposed")
        self.dtype, self.seed = dtype, seed

    def integers(self, lo: int, hi: int) -> int:
        return hi


class LastDraw(EdgeDraw):
    """Rank-3 (or the most rank allowed) inputs read with a stride, further operands broadcast against the first
    (fewer leading axes), the last option of every choice, axis 0 or the axes (0, -1), middle integers."""

    def __init__(self, dtype: Any, seed: int):
        super().__init__("strided")
        self.dtype, self.seed = dtype, seed

    def shape(self, min_dims=0, max_dims=3, min_side=0, max_side=3):
        rank = min(max(3, min_dims), max_dims)
        return tuple(min(max(side, min_side), max_side) for side in (2, 3, 4)[:rank])

    def shapes(self, n, min_dims=0, max_dims=3, min_side=0):
        full = self.shape(min_dims, max_dims, min_side)
        return [full[min(k, len(full) - min_dims):] for k in range(n)]

    def integers(self, lo, hi):
        return (lo + hi + 1) // 2

    def choice(self, options):
        return options[-1]

    def axis(self, shape, tuples=True, none=True):
        if not shape:
            return None
        return (0, -1) if tuples and len(shape) >= 2 else 0


DRAWS = {np.float64: FirstDraw, np.float32: LastDraw}


def family(spec) -> str:
    """'host', 'reduce' or 'view': the kinds of the equations of the row's forward graph that read an input."""
    args, params, _ = inputs(spec, FirstDraw(np.float64, seed_of(spec)))
    graph = jg.trace(lambda *xs: spec.fn(*xs, **params)).plan(*args).graph
    from_inputs, kinds = set(graph.inputs), set()
    for eqn in graph.eqns:
        if any(a in from_inputs for a in eqn.inputs if isinstance(a, Var)):
            kinds.add(eqn.prim.kind)
            from_inputs.update(eqn.outs)
    return "host" if Kind.HOST in kinds else "reduce" if Kind.REDUCE in kinds else "view"


@lru_cache(maxsize=None)
def structural_rows() -> dict[str, tuple]:
    """The rows of the tables that are not elementwise, by family, in table order (traced once per process)."""
    elementwise = {s.name for s in elementwise_rows()}
    rows: dict[str, list] = {f: [] for f in FAMILIES}
    for spec in SPECS:
        if spec.name not in elementwise:
            rows[family(spec)].append(spec)
    return {f: tuple(r) for f, r in rows.items()}


def jvp_rows(fam: str, dtype: Any) -> tuple:
    """The family's rows whose jvp is compiled here in `dtype`: every one in float32, on a draw no other file
    compiles; in float64 those that tests/test_jvp_every_op.py's test_compiled_jvp_on_arrays does not compile on
    its rank-2 transposed draw (which is FirstDraw but for the sizes): the rows that do not run on the host."""
    return tuple(s for s in structural_rows()[fam] if dtype == np.float32 or not s.host)


def vmap_rows(fam: str, dtype: Any) -> tuple:
    """The family's rows vmapped here in `dtype`: every one in float32; in float64 those no other file compiles
    vmapped (tests/test_vmap.py compiles test_ops.py's rows, tests/test_vmap_every_op.py the other tables' host
    rows, on the rank-2 transposed draw)."""
    return tuple(s for s in structural_rows()[fam] if dtype == np.float32 or not (s.host or s.name in FIRST_TABLE))


def call_twice(traced: Any, args: list) -> Any:
    """traced(*args), then again: the second call must hit the plan, write no new kernel and give the same bits
    (it may run a kernel's full-level code, compiled in the background, where the first ran its quick code)."""
    with quiet():
        got = traced(*args)
    before = traced.cache_info()
    with quiet():
        again = traced(*args)
    after = traced.cache_info()
    assert (after["misses"], after["kernels"], after["hits"]) == (before["misses"], before["kernels"],
                                                                  before["hits"] + 1)
    for g, a in zip(leaves(got), leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(a))
    return got


def leaves(tree: Any) -> list:
    """The arrays of nested dicts, lists and tuples, in a fixed order."""
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in leaves(item)]
    return [tree]


# ---------------------------------------------------------------------- jvp


def jvp_of(spec, params: dict, n: int, floats: list[int]):
    """primals + float tangents -> (outputs, tangents) of the row's jvp (float0 tangents for integer arguments)."""
    def one(*xs):
        tangents = iter(xs[n:])
        full = tuple(next(tangents) if k in floats else np.zeros(np.shape(xs[k]), jg.float0) for k in range(n))
        outs, touts = jg.jvp(lambda *ys: spec.fn(*ys, **params), tuple(xs[:n]), full)
        outs, touts = as_list(outs), as_list(touts)
        # a float output gets a float tangent of its shape, an integer or bool one float0 zeros of its shape, which
        # a traced function cannot return (tracing refuses a float0 constant): checked here, and dropped
        assert [np.dtype(o.dtype).kind == "f" for o in outs] == [not is_float0(t) for t in touts], spec.name
        assert all(np.shape(t) == np.shape(o) for o, t in zip(outs, touts)), spec.name
        return outs, [t for t in touts if not is_float0(t)]
    return one


def jvp_cases(rows: tuple, dtype: Any) -> tuple[list[tuple], dict[str, str]]:
    """Per row: the row, its arguments, params and tangents (one per float argument) on the dtype's draw; and the
    rows whose jvp jitgrad refuses, with the message."""
    cases, refused = [], {}
    for spec in rows:
        args, params, rng = inputs(spec, DRAWS[dtype](dtype, seed_of(spec)))
        tangents = draw_tangents(spec, args, rng)
        try:
            jg.trace(jvp_of(spec, params, len(args), sorted(tangents))).plan(*args, *tangents.values())
        except jg.UnsupportedError as e:
            refused[spec.name] = str(e)
            continue
        cases.append((spec, args, params, tangents))
    return cases, refused


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("fam", FAMILIES)
def test_compiled_jvp_of_every_structural_row_matches_torch(fam: str, dtype: Any) -> None:
    """The family's rows' jvps in one compiled program, against torch.func.jvp (or central differences): primal
    outputs against the numpy reference, float0 tangents for integer and bool outputs."""
    rows = jvp_rows(fam, dtype)
    cases, refused = jvp_cases(rows, dtype)
    expected_refusals = {name: why for (name, t), why in REFUSED_JVP.items() if t == dtype}
    assert sorted(refused) == sorted(n for n in expected_refusals if n in {s.name for s in rows})
    for name, message in refused.items():
        assert re.search(expected_refusals[name], message), message
    flat = [x for _, args, _, tangents in cases for x in list(args) + [tangents[k] for k in sorted(tangents)]]

    def every_jvp(*xs):
        out, at = {}, 0
        for spec, args, params, tangents in cases:
            width = len(args) + len(tangents)
            out[spec.name] = jvp_of(spec, params, len(args), sorted(tangents))(*xs[at:at + width])
            at += width
        return out

    traced = jg.trace(every_jvp)
    got = call_twice(traced, flat)
    for spec, args, params, tangents in cases:
        outs, touts = got[spec.name]
        with quiet():
            expected = [np.asarray(e) for e in as_list(spec.reference(*args, **params))]
        float_outs = [e for e in expected if e.dtype.kind == "f"]
        assert len(outs) == len(expected) and len(touts) == len(float_outs), spec.name
        for o, e in zip(outs, expected):
            o = np.asarray(o)
            assert o.shape == e.shape and o.dtype == e.dtype, (spec.name, o.shape, o.dtype, e.shape, e.dtype)
            np.testing.assert_allclose(o, e, **FORWARD_TOL[dtype], err_msg=f"{spec.name}: primal output")
        touts = [np.asarray(t) for t in touts]
        for t, e in zip(touts, float_outs):
            assert t.shape == e.shape and t.dtype == e.dtype, (spec.name, t.shape, t.dtype, e.shape, e.dtype)
        if not tangents or not touts:
            continue
        want, tol, oracle = expected_tangents(spec, args, tangents, params, dtype, [e.shape for e in float_outs])
        for j, (t, w) in enumerate(zip(touts, want)):
            np.testing.assert_allclose(t, w, **tol, err_msg=f"{spec.name}: compiled tangent of output {j} ({oracle})")


# ---------------------------------------------------------------------- vmap

# Per dtype: the batch axis of argument k (None: shared by the examples), for an example of rank r; the outputs'.
IN_AXES = {np.float64: lambda k, r: {0: -1, 1: None}.get(k, 0), np.float32: lambda k, r: {0: min(1, r), 1: -1}.get(k)}
OUT_AXIS = {np.float64: 0, np.float32: -1}


def vmap_cases(rows: tuple, dtype: Any) -> tuple[list[tuple], dict[str, list[str]]]:
    """Per row: the row, BATCH examples of its arguments on the dtype's draw (other seeds; the first example's
    params, which are static, shared), and in_axes; and the rows refused for primitives without a batching rule."""
    cases, refused = [], {}
    for spec in rows:
        draws = [inputs(spec, DRAWS[dtype](dtype, seed_of(spec) + 7919 * i))[:2] for i in range(BATCH)]
        examples, params = [args for args, _ in draws], draws[0][1]
        assert all([(a.shape, a.dtype) for a in ex] == [(a.shape, a.dtype) for a in examples[0]] for ex in examples)
        in_axes = tuple(IN_AXES[dtype](k, a.ndim) for k, a in enumerate(examples[0]))
        missing = no_rule(spec, examples[0], params)
        if missing:
            refused[spec.name] = missing
            with pytest.raises(jg.UnsupportedError, match=f"'{missing[0]}'.*no batching rule"):
                jg.trace(batched(spec, params, in_axes, OUT_AXIS[dtype])).plan(*stacked(examples, in_axes))
            continue
        cases.append((spec, examples, params, in_axes))
    return cases, refused


def batched(spec, params: dict, in_axes: tuple, out_axis: int):
    """args -> the list of the row's outputs, vmapped."""
    return lambda *xs: as_list(jg.vmap(lambda *ys: spec.fn(*ys, **params), in_axes=in_axes, out_axes=out_axis)(*xs))


def stacked(examples: list[list[np.ndarray]], in_axes: tuple) -> list[np.ndarray]:
    """The examples' arguments stacked at their batch axes (a shared argument: the first example's)."""
    return [examples[0][k] if axis is None else np.moveaxis(np.stack([ex[k] for ex in examples]), 0, axis)
            for k, axis in enumerate(in_axes)]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("fam", FAMILIES)
def test_compiled_vmap_of_every_structural_row_equals_a_loop(fam: str, dtype: Any) -> None:
    """The family's rows vmapped in one compiled program against a loop of their numpy reference; jg.nonzero,
    which has no batching rule, refused by name."""
    rows = vmap_rows(fam, dtype)
    cases, refused = vmap_cases(rows, dtype)
    assert refused == ({"jg_nonzero": ["nonzero"]} if "jg_nonzero" in {s.name for s in rows} else {})
    flat = [x for _, examples, _, in_axes in cases for x in stacked(examples, in_axes)]

    def every_vmap(*xs):
        out, at = {}, 0
        for spec, _, params, in_axes in cases:
            out[spec.name] = batched(spec, params, in_axes, OUT_AXIS[dtype])(*xs[at:at + len(in_axes)])
            at += len(in_axes)
        return out

    got = call_twice(jg.trace(every_vmap), flat)
    for spec, examples, params, in_axes in cases:
        loop = []
        for ex in examples:
            args = [ex[k] if axis is not None else examples[0][k] for k, axis in enumerate(in_axes)]
            with quiet():
                loop.append([np.asarray(o) for o in as_list(spec.reference(*args, **params))])
        assert len(got[spec.name]) == len(loop[0]), spec.name
        what = f"{spec.name}: in_axes={in_axes}, out_axes={OUT_AXIS[dtype]}"
        for j, g in enumerate(got[spec.name]):
            want, g = np.moveaxis(np.stack([outs[j] for outs in loop]), 0, OUT_AXIS[dtype]), np.asarray(g)
            assert g.shape == want.shape and g.dtype == want.dtype, (what, j, g.shape, g.dtype, want.shape, want.dtype)
            tol = FORWARD_TOL[np.float64 if want.dtype.kind != "f" else want.dtype.type]
            np.testing.assert_allclose(g, want, **tol, err_msg=f"{what}: output {j}")


def test_the_families_cover_the_non_elementwise_rows() -> None:
    """Every row is elementwise or in one family, and the families are what their names say."""
    rows = structural_rows()
    names = {f: {s.name for s in r} for f, r in rows.items()}
    assert sum(map(len, names.values())) + len(elementwise_rows()) == len(SPECS)
    assert {"sum", "mean", "prod", "max", "var", "std", "logsumexp", "softmax", "log_softmax"} <= names["reduce"]
    assert {"reshape", "transpose", "broadcast_to", "squeeze", "expand_dims", "split", "getitem"} <= names["view"]
    assert {"matmul", "einsum", "tensordot", "concatenate", "stack", "take", "take_along_axis", "cumsum", "cumprod",
            "sort", "inv", "solve", "det", "cholesky", "eigh", "svd", "qr", "median"} <= names["host"]
