"""Random small programs (elementwise unary/binary ops with broadcasting, reductions with axis and
keepdims, reshape, transpose): the compiled forward and value-and-grad agree with the numpy
reference interpreter run on the same IR, with numpy itself, and (gradients) with central finite
differences. A program starts by combining its two inputs and each later op consumes the latest
value (a binary op's partner may be any earlier one), so no op is dead code. Bounded for CI: the
`ci` hypothesis profile (25 examples, derandomized), at most 4 per axis, at most 5 ops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import jitgrad as jg
from jitgrad.ir import interpreter
from jitgrad.passes.autodiff import joint_vjp_graph, with_unit_cotangent

UNARY: dict[str, Callable[[Any], Any]] = {
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "neg": np.negative, "square": lambda v: v * v,
    "exp_tanh": lambda v: np.exp(np.tanh(v)), "log1p_square": lambda v: np.log(v * v + 1.0),
    "sqrt_hypot": lambda v: np.sqrt(v * v + 0.5), "sigmoid": jg.sigmoid,
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
    "div": lambda a, b: a / (b * b + 1.0),
}
REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max}


@dataclass(frozen=True)
class Step:
    kind: str  # unary | binary | reduce | reshape | transpose
    op: str
    operands: tuple[int, ...]  # indices into the values computed so far (inputs first)
    params: tuple = ()


def apply(step: Step, values: list[Any]) -> Any:
    args = [values[i] for i in step.operands]
    if step.kind == "unary":
        return UNARY[step.op](*args)
    if step.kind == "binary":
        return BINARY[step.op](*args)
    if step.kind == "reduce":
        axis, keepdims = step.params
        return REDUCE[step.op](args[0], axis=axis, keepdims=keepdims)
    if step.kind == "reshape":
        return np.reshape(args[0], step.params)
    return np.transpose(args[0], step.params)


@dataclass(frozen=True)
class Program:
    shapes: tuple[tuple[int, ...], ...]
    steps: tuple[Step, ...]
    dtype: str

    def run(self, *inputs: Any) -> Any:
        values = list(inputs)
        for step in self.steps:
            values.append(apply(step, values))
        return values[-1]


@st.composite
def programs(draw: Any) -> Program:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    stretched = tuple(1 if draw(st.booleans()) else d for d in shape)  # broadcasts against `shape`
    shapes = [shape, stretched[draw(st.integers(0, rank - 1)):]]
    steps = [Step("binary", draw(st.sampled_from(sorted(BINARY))), (0, 1))]
    shapes.append(np.broadcast_shapes(*shapes))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce", "reshape", "transpose"]))
        i = len(shapes) - 1  # every step consumes the latest value, so nothing is dead code
        if kind == "binary":
            partners = [j for j, s in enumerate(shapes) if _broadcasts(shapes[i], s)]
            step = Step(kind, draw(st.sampled_from(sorted(BINARY))), (i, draw(st.sampled_from(partners))))
        elif kind == "reduce" and shapes[i]:
            axis = draw(st.one_of(st.none(), st.integers(-len(shapes[i]), len(shapes[i]) - 1)))
            step = Step(kind, draw(st.sampled_from(sorted(REDUCE))), (i,), (axis, draw(st.booleans())))
        elif kind == "reshape":
            size = int(np.prod(shapes[i]))
            step = Step(kind, "reshape", (i,), draw(st.sampled_from([(size,), (1, size), shapes[i][::-1]])))
        elif kind == "transpose" and len(shapes[i]) > 1:
            step = Step(kind, "transpose", (i,), tuple(draw(st.permutations(range(len(shapes[i]))))))
        else:
            step = Step("unary", draw(st.sampled_from(sorted(UNARY))), (i,))
        steps.append(step)
        shapes.append(np.shape(apply(step, [np.zeros(s) for s in shapes])))
    return Program(tuple(shapes[:2]), tuple(steps), draw(st.sampled_from(["float64", "float32"])))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _central_differences(fn: Callable[..., float], args: list[np.ndarray], eps: float = 1e-6) -> list[np.ndarray]:
    grads = []
    for k, a in enumerate(args):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            hi, lo = [x.copy() for x in args], [x.copy() for x in args]
            hi[k][idx] += eps
            lo[k][idx] -= eps
            g[idx] = (fn(*hi) - fn(*lo)) / (2 * eps)
        grads.append(g)
    return grads


def _close(got: Any, want: Any, rtol: float, what: str) -> None:
    want = np.asarray(want)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, scale), err_msg=what)


@given(program=programs(), seed=st.integers(0, 2**16))
def test_random_programs_match_the_reference(program: Program, seed: int) -> None:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(program.dtype)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    x0, x1 = (rng.uniform(-1.5, 1.5, s).astype(dtype) for s in program.shapes)
    out_shape = np.shape(program.run(np.zeros(program.shapes[0]), np.zeros(program.shapes[1])))
    weights = rng.uniform(-1.0, 1.0, out_shape).astype(dtype)

    def forward(a, b):
        return program.run(a, b)

    def loss(a, b):
        return np.sum(program.run(a, b) * weights)

    compiled = jg.trace(forward)
    out = compiled(x0, x1)
    assert np.shape(out) == out_shape and np.asarray(out).dtype == dtype
    (reference,) = interpreter.evaluate(compiled.plan(x0, x1).graph, [x0, x1])
    _close(out, reference, rtol, f"forward vs interpreter\n{program}")
    _close(out, program.run(x0, x1), rtol, f"forward vs numpy\n{program}")

    traced_loss = jg.trace(loss)
    value, grads = traced_loss.value_and_grad(x0, x1, argnums=(0, 1))
    plan = traced_loss.plan(x0, x1)
    graph = plan.graph  # its inputs: a, b, then `weights`, which the loss reads from its closure
    joint = with_unit_cotangent(joint_vjp_graph(graph, [0, 1]), len(graph.inputs))
    ref_value, *ref_grads = interpreter.evaluate(joint, [x0, x1] + plan.captures.read())
    _close(value, ref_value, rtol, f"value vs interpreter\n{program}")
    for k, (g, r) in enumerate(zip(grads, ref_grads)):
        assert g.shape == program.shapes[k] and g.dtype == dtype
        _close(g, r, rtol, f"gradient {k} vs interpreter\n{program}")

    w64 = weights.astype(np.float64)
    numeric = _central_differences(lambda a, b: float(np.sum(program.run(a, b) * w64)),
                                   [x0.astype(np.float64), x1.astype(np.float64)])
    for k, (g, n) in enumerate(zip(grads, numeric)):
        _close(g, n, 1e-5 if dtype == np.float64 else 2e-3, f"gradient {k} vs finite differences\n{program}")
