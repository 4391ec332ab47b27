"""The compiled kernels of forward mode and vmap on every elementwise row of the op tables, in a kernel or two.

tests/test_jvp_every_op.py runs each row's traced jvp graph on the numpy reference interpreter (a compile per row
and dtype would take minutes), so the kernels of the elementwise primitives' JVPs never run there. Here the jvps of
all the elementwise rows are traced into ONE function per dtype, on inputs of one shape that each row's generator
draws (its domain: log's positive inputs, remainder's away from its jumps), seeded per row. The inputs and
tangents are passed stacked, a few arrays that every row's operands are views of, so fusion merges the rows'
groups as siblings that share inputs: one kernel per dtype, where unrelated inputs would give one per row. Each
tangent is compared with test_jvp_every_op's oracle (torch.func.jvp of the row's torch function) at its
tolerances. vmap of the elementwise rows that no other file compiles vmapped is one traced function too, against a
Python loop of each row's numpy reference.

A row is elementwise when, traced on operands of SHAPE, every equation of its forward graph that reads an input
(directly or through others) is elementwise (constants may be broadcast by views), one at least, every input and
output has SHAPE, and an input is float. That is the unary and binary ufuncs and the rows built of them (clip,
where, select, heaviside, nan_to_num, tril's mask) and the comparisons, whose tangents are float0.
"""
from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import jitgrad as jg
import test_ops
from jitgrad.ir.graph import Var
from jitgrad.ir.primitive import Kind
from test_jvp_every_op import JVP_TOL, LOOSER, SPECS, inputs, is_float0, quiet, torch_jvp
from test_ops import FORWARD_TOL, as_list

SHAPE = (3, 67)  # a loop nest of two axes, the inner one past any vector width
FLOATS = (np.float32, np.float64)
BATCH = 3
MAX_KERNELS = 4  # kernels of the program of every row's jvp (1 today) or vmap (2); one per row would be over 70
FIRST_TABLE = {s.name for s in test_ops.SPECS}  # tests/test_vmap.py compiles these rows' vmap


class RowDraw:
    """A generator's draws for one seed: SHAPE for every operand, the first option of every choice, the lowest
    integer, the last axis; in the given dtype, C order."""

    def __init__(self, dtype: Any, seed: int):
        self.dtype, self.layout, self.seed = dtype, "C", seed

    def shape(self, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 3) -> tuple:
        return (2,) * (min_dims - len(SHAPE)) + SHAPE

    def shapes(self, n: int, min_dims: int = 0, max_dims: int = 3, min_side: int = 0) -> list[tuple]:
        return [self.shape(min_dims)] * n

    def integers(self, lo: int, hi: int) -> int:
        return lo

    def choice(self, options: list) -> Any:
        return options[0]

    def axis(self, shape: tuple, tuples: bool = True, none: bool = True) -> Any:
        return -1


def seed_of(spec) -> int:
    """A seed per row, from its name: a row's inputs do not change when rows are added before it."""
    return zlib.crc32(spec.name.encode())


def is_elementwise(spec) -> bool:
    """Does the row's forward graph, on operands of SHAPE, fuse as one loop nest over SHAPE: every equation that
    reads an input (directly or not) elementwise, and one at least (not the identity), every input and output of
    SHAPE, a float input?"""
    args, params, _ = inputs(spec, RowDraw(np.float64, seed_of(spec)))
    graph = jg.trace(lambda *xs: spec.fn(*xs, **params)).plan(*args).graph
    from_inputs, computes = set(graph.inputs), False
    for eqn in graph.eqns:
        if any(a in from_inputs for a in eqn.inputs if isinstance(a, Var)):
            if eqn.prim.kind != Kind.ELEMENTWISE:
                return False
            from_inputs.update(eqn.outs)
            computes = True
    values = list(graph.inputs) + list(graph.outputs)
    return computes and all(v.aval.shape == SHAPE for v in values) and any(v.aval.is_float for v in graph.inputs)


@lru_cache(maxsize=None)
def elementwise_rows() -> tuple:
    """The rows of the tables that are elementwise, in table order (traced once per process)."""
    return tuple(s for s in SPECS if is_elementwise(s))


def packed(arrays: list[np.ndarray]) -> tuple[dict[str, np.ndarray], list[tuple[str, int]]]:
    """The arrays stacked into one argument per dtype and shape, and where each one is in them. Every row's
    kernel then reads the same few arguments (its operands are views of them), so fusion merges the rows'
    kernels as siblings, where it keeps apart kernels that share no input."""
    stacked: dict[str, list[np.ndarray]] = {}
    where = []
    for a in arrays:
        key = f"{a.dtype.str}{list(a.shape)}"
        group = stacked.setdefault(key, [])
        where.append((key, len(group)))
        group.append(a)
    return {key: np.stack(group) for key, group in stacked.items()}, where


# ---------------------------------------------------------------------- jvp


def jvp_cases(dtype: Any) -> list[tuple]:
    """Per row: the row, its arguments (float ones in `dtype`), params, and a tangent per float argument."""
    cases = []
    for spec in elementwise_rows():
        args, params, rng = inputs(spec, RowDraw(dtype, seed_of(spec)))
        tangents = {k: rng.standard_normal(a.shape).astype(a.dtype) for k, a in enumerate(args) if a.dtype.kind == "f"}
        cases.append((spec, args, params, tangents))
    return cases


def every_jvp(cases: list[tuple]) -> tuple[Any, dict[str, np.ndarray]]:
    """One traced function of every row's arguments and tangents (packed) -> {row: its float outputs' tangents}:
    every row's jvp in one program, and its argument. While tracing, each output's tangent is checked to be
    float0 for a bool or integer output (comparisons), a float one of its shape otherwise."""
    stacks, where = packed([x for _, args, _, tangents in cases for x in list(args) + [tangents[k] for k in
                                                                                      sorted(tangents)]])

    def all_tangents(stacks):
        out, flat = {}, iter(stacks[key][i] for key, i in where)
        for spec, args, params, tangents in cases:
            primals = [next(flat) for _ in args]
            full = [next(flat) if k in tangents else np.zeros(a.shape, jg.float0) for k, a in enumerate(args)]
            outs, touts = jg.jvp(lambda *ys, spec=spec, params=params: spec.fn(*ys, **params), tuple(primals),
                                 tuple(full))
            outs, touts = as_list(outs), as_list(touts)
            assert [np.dtype(o.dtype).kind == "f" for o in outs] == [not is_float0(t) for t in touts], spec.name
            assert all(np.shape(t) == np.shape(o) for o, t in zip(outs, touts)), spec.name
            out[spec.name] = [t for t in touts if not is_float0(t)]
        return out
    return jg.trace(all_tangents), stacks


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
def test_compiled_jvp_of_every_elementwise_row_matches_torch(dtype) -> None:
    """Every elementwise row's jvp, run by the kernels of one program, against torch.func.jvp of its torch
    function (the rows without one have bool outputs: no float tangent): the compiled JVPs of the elementwise
    primitives, in a handful of kernels."""
    cases = jvp_cases(dtype)
    traced, stacks = every_jvp(cases)
    with quiet():
        got = traced(stacks)
    assert traced.plan(stacks).call().kernel_count <= MAX_KERNELS
    assert sorted(got) == sorted(spec.name for spec, *_ in cases)
    for spec, args, params, tangents in cases:
        want = [] if spec.torch_fn is None else torch_jvp(spec, args, tangents, params)
        tol = LOOSER.get(spec.name, JVP_TOL[dtype]) if dtype == np.float64 else JVP_TOL[dtype]
        assert len(got[spec.name]) == len(want), spec.name
        for j, (g, w) in enumerate(zip(got[spec.name], want)):
            g = np.asarray(g)
            assert g.shape == w.shape and g.dtype == w.dtype, (spec.name, g.shape, g.dtype, w.shape, w.dtype)
            np.testing.assert_allclose(g, w, **tol, err_msg=f"{spec.name}: compiled tangent of output {j}")


# ---------------------------------------------------------------------- vmap


def vmap_cases(dtype: Any) -> list[tuple]:
    """Per elementwise row whose vmap no other file compiles (tests/test_vmap.py compiles one program per row of
    tests/test_ops.py; tests/test_vmap_every_op.py runs the others on the interpreter): the row, BATCH examples of
    its arguments (the params of the first, shared) and in_axes: the first argument batched at axis 0, the others
    at their last axis, so the batching rules move axes."""
    cases = []
    for spec in elementwise_rows():
        if spec.name in FIRST_TABLE:
            continue
        examples, params = [], None
        for i in range(BATCH):
            args, p, _ = inputs(spec, RowDraw(dtype, seed_of(spec) + 7919 * i))
            examples.append(args)
            params = p if params is None else params
        cases.append((spec, examples, params, tuple(0 if k == 0 else -1 for k in range(len(examples[0])))))
    return cases


def test_compiled_vmap_of_the_other_tables_elementwise_rows_equals_a_loop() -> None:
    """Those rows vmapped (outputs at axis 0), in one program, against a loop of their numpy reference over the
    examples. float64 only: every elementwise primitive has the one batching rule (`batch_elementwise`), which
    moves axes whatever the dtype (all 81 rows in both dtypes would be two more programs of ~9 s of compile)."""
    cases = vmap_cases(np.float64)
    stacks, where = packed([np.stack([ex[k] for ex in examples], axis=axis)
                            for _, examples, _, in_axes in cases for k, axis in enumerate(in_axes)])

    def all_batched(stacks):
        out, flat = {}, iter(stacks[key][i] for key, i in where)
        for spec, _, params, in_axes in cases:
            mapped = jg.vmap(lambda *xs, spec=spec, params=params: spec.fn(*xs, **params), in_axes=in_axes)
            out[spec.name] = as_list(mapped(*[next(flat) for _ in in_axes]))
        return out

    traced = jg.trace(all_batched)
    with quiet():
        got = traced(stacks)
    assert traced.plan(stacks).call().kernel_count <= MAX_KERNELS
    for spec, examples, params, _ in cases:
        with quiet():
            loop = [[np.asarray(o) for o in as_list(spec.reference(*ex, **params))] for ex in examples]
        assert len(got[spec.name]) == len(loop[0]), spec.name
        for j, g in enumerate(got[spec.name]):
            want, g = np.stack([outs[j] for outs in loop]), np.asarray(g)
            assert g.shape == want.shape and g.dtype == want.dtype, (spec.name, g.shape, g.dtype, want.shape)
            tol = FORWARD_TOL[np.float64 if want.dtype.kind != "f" else want.dtype.type]
            np.testing.assert_allclose(g, want, **tol, err_msg=f"{spec.name}: output {j}")


def test_the_selection_is_the_elementwise_rows() -> None:
    """The selection, read off the rows' graphs: the unary and binary ufuncs of the tables and the rows built
    of them (clip, where, select, tril's mask), the comparisons, and none of the reductions, views or host ops."""
    names = {s.name for s in elementwise_rows()}
    assert {"exp", "log", "arctanh", "power", "arctan2", "hypot", "logaddexp", "ldexp", "nan_to_num", "clip_arrays",
            "where", "divmod"} <= names
    assert {"less", "logical_ops", "isnan"} <= names  # bool outputs: float0 tangents, and vmap
    assert not names & {"sum", "softmax", "transpose", "T", "cumsum", "matmul", "outer", "take_wrap_traced", "swapaxes"}
