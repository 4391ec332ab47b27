"""jg.vmap of every op of the op tables (tests/test_ops.py and the four tables beside it: 189 rows) against a
Python loop of the op's numpy reference over the batch, on shapes, axes and parameters drawn by hypothesis
(derandomized): every argument batched at once, and each argument alone batched (the others None, shared by
every example), each batch axis drawn anywhere in the argument, negative axes included; the outputs' batch axis
drawn too (out_axes 0, 1 or -1 where the outputs' ranks allow), and the batch size (1, 2 or 3).

The vmapped op is traced inside `jg.trace`, optimised and run by the numpy reference interpreter, so no kernel
compiles (tests/test_vmap.py runs the compiled programs of tests/test_ops.py's rows; here the host rows of the
other tables run compiled). An op whose graph holds a primitive without a batching rule (jg.nonzero) must be
refused with a jg.UnsupportedError naming it, and is checked to be. A last test checks that the tables reach every
registered primitive but a listed few, and batches the gradients whose backward records primitives of its own.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import jitgrad as jg
from jitgrad.ir.primitive import PRIMITIVES
from test_jvp_every_op import SPECS, TABLES, evaluate_traced, quiet
from test_ops import FORWARD_TOL, EdgeDraw, HypothesisDraw, as_list, lay_out

B = 3  # examples in a batch where not drawn
SIZES = (2, 1, 3)  # batch sizes drawn: 1 too, where a batch axis of length 1 may pass for a broadcast or a K of 1


class Recorded:
    """A draw that answers like `draw` and keeps its answers, so that `Replayed` gives every example of a batch
    the same shapes, axes and parameters."""

    def __init__(self, draw: Any):
        self.draw, self.answers = draw, []
        self.dtype, self.layout, self.seed = draw.dtype, draw.layout, draw.seed

    def _ask(self, name: str, *args: Any, **kwargs: Any) -> Any:
        answer = getattr(self.draw, name)(*args, **kwargs)
        self.answers.append(answer)
        return answer

    def shape(self, *a, **k):
        return self._ask("shape", *a, **k)

    def shapes(self, *a, **k):
        return self._ask("shapes", *a, **k)

    def integers(self, *a, **k):
        return self._ask("integers", *a, **k)

    def choice(self, *a, **k):
        return self._ask("choice", *a, **k)

    def axis(self, *a, **k):
        return self._ask("axis", *a, **k)


class Replayed:
    """The recorded answers, in order."""

    def __init__(self, recorded: Recorded):
        self.answers = iter(recorded.answers)
        self.dtype, self.layout, self.seed = recorded.dtype, recorded.layout, recorded.seed

    def _next(self, *a: Any, **k: Any) -> Any:
        return next(self.answers)

    shape = shapes = integers = choice = axis = _next


def examples(spec, data) -> tuple[list[list[np.ndarray]], dict]:
    """A batch (of a drawn size) of the row's arguments, of one shape each (the draws replayed, the values from
    other seeds), and the first example's params (params are static: shared by the batch)."""
    size = data.draw(st.sampled_from(SIZES), label="batch size")
    first = Recorded(HypothesisDraw(data))
    per_example, params = [], None
    for i in range(size):
        d = first if i == 0 else Replayed(first)
        raw, p = spec.gen(d, np.random.default_rng(first.seed + 7919 * i))
        params = p if i == 0 else params
        per_example.append([lay_out(a.astype(first.dtype), first.layout) if a.dtype == np.float64 else np.asarray(a)
                            for a in raw])
    same = all(len(ex) == len(per_example[0]) and all(a.shape == b.shape and a.dtype == b.dtype
                                                      for a, b in zip(ex, per_example[0])) for ex in per_example)
    return (per_example if same else [per_example[0]] * size), params


def no_rule(spec, args: list[np.ndarray], params: dict) -> list[str]:
    """The primitives of the op's graph that have no batching rule."""
    graph = jg.trace(lambda *xs: spec.fn(*xs, **params)).plan(*args).graph
    return sorted({e.prim.name for e in graph.eqns if e.prim.batch is None})


def check_vmap(spec, per_example: list[list[np.ndarray]], params: dict, axes: dict[int, int], out_axis: int,
               compiled: bool = False) -> None:
    """vmap of the op with argument k batched at axis axes[k] (the others None), outputs at out_axis, against the
    loop of the reference over the examples; traced and run by the interpreter, or on arrays (compiled)."""
    n = len(per_example[0])
    args = [np.moveaxis(np.stack([ex[k] for ex in per_example]), 0, axes[k]) if k in axes else per_example[0][k]
            for k in range(n)]
    in_axes = tuple(axes.get(k) for k in range(n))
    mapped = jg.vmap(lambda *xs: spec.fn(*xs, **params), in_axes=in_axes, out_axes=out_axis)
    if compiled:
        with quiet():
            got = [np.asarray(o) for o in as_list(mapped(*args))]
    else:
        got = evaluate_traced(lambda *xs: as_list(mapped(*xs)), args)
    loop = []
    for ex in per_example:
        with quiet():
            loop.append([np.asarray(o) for o in as_list(spec.reference(*[ex[k] if k in axes else per_example[0][k]
                                                                         for k in range(n)], **params))])
    assert len(got) == len(loop[0]), spec.name
    what = f"{spec.name}: in_axes={in_axes}, out_axes={out_axis}"
    for j, g in enumerate(got):
        want = np.moveaxis(np.stack([outs[j] for outs in loop]), 0, out_axis)
        assert g.shape == want.shape and g.dtype == want.dtype, (what, j, g.shape, g.dtype, want.shape, want.dtype)
        tol = FORWARD_TOL[np.float64 if want.dtype.kind != "f" else want.dtype.type]
        np.testing.assert_allclose(g, want, **tol, err_msg=f"{what}: output {j}")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(derandomize=True, max_examples=3, deadline=None)
@given(data=st.data())
def test_vmap_of_every_op_equals_a_loop(spec, data) -> None:
    per_example, params = examples(spec, data)
    ranks = [a.ndim for a in per_example[0]]
    with quiet():
        try:
            out_ranks = [np.ndim(o) for o in as_list(spec.reference(*per_example[0], **params))]
        except (IndexError, ValueError):  # the generator drew an index numpy refuses (arrays that do not broadcast)
            reject()
    out_axis = data.draw(st.sampled_from([0, -1] + ([1] if min(out_ranks) >= 1 else [])), label="out_axes")
    every = {k: data.draw(st.integers(-r - 1, r), label=f"axis of argument {k}") for k, r in enumerate(ranks)}
    missing = no_rule(spec, per_example[0], params)
    if missing:  # refused by name, never looped over
        for name in missing:
            with pytest.raises(jg.UnsupportedError, match=f"'{name}'.*no batching rule"):
                check_vmap(spec, per_example, params, every, out_axis)
        return
    check_vmap(spec, per_example, params, every, out_axis)
    if len(ranks) > 1:
        for k, r in enumerate(ranks):
            check_vmap(spec, per_example, params, {k: data.draw(st.integers(-r - 1, r), label=f"axis {k} alone")},
                       out_axis)


@pytest.mark.parametrize("table", [t for t in TABLES[1:] if any(s.host for s in t.SPECS)], ids=lambda t: t.__name__)
def test_compiled_vmap_of_the_host_rows(table) -> None:
    """On arrays vmap runs the compiled program: the rows of the newer tables that run on the host (their programs
    compile few kernels; tests/test_vmap.py compiles all of tests/test_ops.py's rows), on the rank-2 edge case,
    every argument batched at its last axis, the outputs at theirs; jg.nonzero refused."""
    for spec in [s for s in table.SPECS if s.host]:
        draws = [spec.gen(EdgeDraw("transposed"), np.random.default_rng(seed)) for seed in range(2)]
        per_example, params = [[np.asarray(a) for a in draws[0][0]], [np.asarray(a) for a in draws[1][0]]], draws[0][1]
        if any(a.shape != b.shape for a, b in zip(*per_example)):
            per_example[1] = per_example[0]
        axes = {k: -1 for k in range(len(per_example[0]))}
        if no_rule(spec, per_example[0], params):
            with pytest.raises(jg.UnsupportedError, match="no batching rule"):
                check_vmap(spec, per_example, params, axes, -1, compiled=True)
            continue
        check_vmap(spec, per_example, params, axes, -1, compiled=True)


def test_matmul_of_two_batched_operands_with_a_batch_of_one_last() -> None:
    """The rule read the contracted length K off the batched left operand before moving its batch axis, so a batch
    of one at its end passed for K = 1 and became an outer product: [[0, 3]] instead of [[5, 14]]. A true K = 1
    (per-example outer products) still becomes an elementwise product."""
    x, y = np.arange(6.0).reshape(2, 3, 1), np.arange(3.0).reshape(1, 3)
    mapped = jg.vmap(np.inner, in_axes=(-1, 0))
    np.testing.assert_allclose(mapped(x, y), [np.inner(x[..., 0], y[0])], rtol=1e-15)  # compiled
    np.testing.assert_allclose(evaluate_traced(mapped, [x, y])[0], [[5.0, 14.0]], rtol=1e-15)
    a, b = np.arange(6.0).reshape(3, 2), np.arange(12.0).reshape(3, 4)
    product = lambda p, q: p[:, None] @ q[None, :]  # noqa: E731  (one matmul of K = 1 per example)
    assert "matmul" in {e.prim.name for e in jg.trace(product).plan(a[0], b[0]).graph.eqns}
    outer = jg.vmap(product)
    assert "matmul" not in {e.prim.name for e in jg.trace(outer).plan(a, b).graph.eqns}
    np.testing.assert_allclose(evaluate_traced(outer, [a, b])[0], [np.outer(p, q) for p, q in zip(a, b)], rtol=1e-15)


# Primitives no row of the op tables records in its forward graph, and where their batching is tested.
NOT_IN_TABLES = {
    "custom_function": "a custom jg.Function's equation: tests/test_vmap.py, tests/test_function_transforms.py",
    "custom_function_jvp": "a custom jg.Function's jvp: tests/test_function_transforms.py",
    "batched_call": "a custom jg.Function batched by generate_vmap_rule: tests/test_function_transforms.py",
    "check_int_range": "the range check of a Python int argument (weak) meeting a narrower integer array; "
                       "vmap's batched arguments are arrays, never weak, so it only ever runs unbatched",
    "scatter_add": "in gradients only (gather's): test_vmap_of_gradients_of_ops_whose_backward_has_its_own_ops",
    "cofactor": "in gradients only (det's): the same test",
    "linear_scan": "in gradients only (cumprod's): the same test",
}


def test_the_tables_reach_every_primitive_and_every_refused_one() -> None:
    """'Every op': the op tables' forward graphs (two fixed examples per row) use every registered primitive but
    those listed in NOT_IN_TABLES, so the tests here exercise every batching rule, and tests/test_jvp_every_op.py
    every derived JVP; and each primitive without a batching rule is used by a row, which
    test_vmap_of_every_op_equals_a_loop checks to be refused by name."""
    reached: set[str] = set()
    for spec in SPECS:
        for kind in ("transposed", "0-d"):
            raw, params = spec.gen(EdgeDraw(kind), np.random.default_rng(0))
            with quiet():
                graph = jg.trace(lambda *xs: spec.fn(*xs, **params)).plan(*raw).graph
            reached |= {e.prim.name for e in graph.eqns}
    assert sorted(set(PRIMITIVES) - reached) == sorted(NOT_IN_TABLES)
    refused = {name for name, p in PRIMITIVES.items() if p.batch is None}
    assert refused == {"nonzero"} and refused <= reached


@pytest.mark.parametrize("name, primitive", [("take", "scatter_add"), ("det", "cofactor"), ("cumprod", "linear_scan")])
def test_vmap_of_gradients_of_ops_whose_backward_has_its_own_ops(name, primitive) -> None:
    """Per-example gradients (vmap of grad) of the rows whose backward records primitives of its own, against the
    loop of grad over the examples: the batching rules of those primitives, with the batch axis last."""
    (spec,) = [s for s in SPECS if s.name == name]
    draws = [spec.gen(EdgeDraw("transposed"), np.random.default_rng(seed)) for seed in range(B)]
    params = draws[0][1]
    xs = [raw[0] for raw, _ in draws]

    def loss(x):
        return sum(jg.sum(o * o) for o in as_list(spec.fn(x, **params)))

    grad = jg.grad(loss)
    mapped = jg.vmap(grad, in_axes=-1, out_axes=-1)
    stacked = np.stack(xs, axis=-1)
    graph = jg.trace(mapped).plan(stacked).graph
    assert primitive in {e.prim.name for e in graph.eqns}
    got = evaluate_traced(mapped, [stacked])[0]
    want = np.stack([evaluate_traced(grad, [x])[0] for x in xs], axis=-1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
