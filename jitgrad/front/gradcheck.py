"""Gradient checks as in `torch.autograd`: `gradcheck` compares the analytic Jacobian, built row by
row from vjps through the compiled kernels, with central finite differences; `gradgradcheck` does
the same for the vjp itself (second derivatives). The full Jacobian is `jitgrad.front.forward`'s `jacobian`.

Numpy array inputs, and the array leaves of pytree inputs, are the function's variables (float ones are
checked); other inputs (Python numbers, flags) are passed through unchanged.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import trees
from jitgrad.front.api import Traced, trace
from jitgrad.errors import GradcheckError, InputError, UnsupportedError
from jitgrad.tracebacks import api_boundary
from jitgrad.tracing.tracer import Tracer, current_builder
from jitgrad.front.transforms import function_name, vjp
from jitgrad.runtime.backends import compiled_first_calls
from jitgrad.tracing.trees import flatten_output


@dataclass
class _Problem:
    """A function of its array inputs only (the other inputs fixed), traced and compiled."""

    traced: Traced
    arrays: list[np.ndarray]
    input_names: list[str]  # how messages name each array input
    output_names: list[str] | None = None  # how messages name each output (default "output k")

    def output_name(self, k: int) -> str:
        return self.output_names[k] if self.output_names else f"output {k}"

    @property
    def float_inputs(self) -> list[int]:
        return [j for j, a in enumerate(self.arrays) if a.dtype.kind == "f"]

    def outputs(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in flatten_output(self.traced(*arrays))[0]]


def _problem(fn: Callable[..., Any], inputs: Any, what: str) -> _Problem:
    """The traced problem. Inputs may be pytrees; their array leaves are the variables, other leaves stay fixed."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    flat = [trees.tree_flatten(x) for x in inputs]
    if current_builder() is not None or any(isinstance(leaf, Tracer) for leaves, _ in flat for leaf in leaves):
        raise UnsupportedError(f"jg.{what} evaluates on numpy arrays; it cannot be used inside a traced function")
    slots = [(i, j) for i, (leaves, _) in enumerate(flat) for j, leaf in enumerate(leaves)
             if isinstance(leaf, (np.ndarray, np.generic))]
    base = fn.fn if isinstance(fn, Traced) else fn

    def on_arrays(*arrays: Any) -> Any:
        full = [list(leaves) for leaves, _ in flat]
        for (i, j), a in zip(slots, arrays):
            full[i][j] = a
        return base(*[trees.tree_unflatten(treedef, leaves) for leaves, (_, treedef) in zip(full, flat)])

    on_arrays.__name__ = function_name(base)
    arrays = [np.asarray(flat[i][0][j]) for i, j in slots]
    names = [f"input {i}" if flat[i][1].is_leaf() else
             f"input {i}" + "".join(f"[{k!r}]" for k in flat[i][1].paths()[j]) for i, j in slots]
    return _Problem(trace(on_arrays), arrays, names)


def _analytic(problem: _Problem, wrt: Sequence[int]) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Outputs and per (output, input in `wrt`) the Jacobian as (output size, input size), one compiled
    backward run per output element."""
    out, pullback = problem.traced.vjp(*problem.arrays)
    leaves, _ = flatten_output(out)
    leaves = [np.asarray(o) for o in leaves]
    jac = [[np.zeros((o.size, problem.arrays[j].size)) for j in wrt] for o in leaves]
    for k, o in enumerate(leaves):
        if o.dtype.kind != "f":
            continue
        for row in range(o.size):
            cotangents = [np.zeros(leaf.shape, leaf.dtype) for leaf in leaves]
            cotangents[k].flat[row] = 1
            grads = pullback(*cotangents)
            for c, j in enumerate(wrt):
                if grads[j] is not None:
                    jac[k][c][row] = np.asarray(grads[j]).reshape(-1)
    return leaves, jac


def _numerical(problem: _Problem, wrt: Sequence[int], leaves: Sequence[np.ndarray], eps: float
               ) -> list[list[np.ndarray]]:
    """The same Jacobians by central differences (f(x + eps) - f(x - eps)) / (2 eps), element by element."""
    jac = [[np.zeros((o.size, problem.arrays[j].size)) for j in wrt] for o in leaves]
    for c, j in enumerate(wrt):
        x = problem.arrays[j]
        for element in range(x.size):
            args = list(problem.arrays)
            shifted = []
            for step in (eps, -eps):
                moved = x.copy()
                moved.flat[element] += step
                args[j] = moved
                shifted.append(problem.outputs(args))
            for k, (plus, minus) in enumerate(zip(*shifted)):
                if leaves[k].dtype.kind == "f":
                    diff = plus.astype(np.float64) - minus.astype(np.float64)
                    jac[k][c][:, element] = diff.reshape(-1) / (2 * eps)
    return jac


def _element(index: Sequence[int]) -> str:
    """An element index as `[1, 2]`; nothing for a 0-d array."""
    return f"[{', '.join(str(int(i)) for i in index)}]" if len(index) else ""


def _mismatch(problem: _Problem, wrt: Sequence[int], leaves: Sequence[np.ndarray], analytic: list[list[np.ndarray]],
              numerical: list[list[np.ndarray]], atol: float, rtol: float) -> str | None:
    """A message naming the first (input, output) pair whose Jacobians differ and its worst element."""
    for c, j in enumerate(wrt):
        for k, o in enumerate(leaves):
            a, n = analytic[k][c], numerical[k][c]
            error = np.abs(a - n)
            bad = ~(error <= atol + rtol * np.abs(n))
            if not bad.any():
                continue
            row, col = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(error, nan=np.inf), -1.0)), a.shape)
            out_name, in_name = problem.output_name(k), problem.input_names[j]
            out_at = _element(np.unravel_index(row, o.shape))
            in_at = _element(np.unravel_index(col, problem.arrays[j].shape))
            text = (f"Jacobian mismatch for {out_name} with respect to {in_name}: {int(bad.sum())} of {bad.size} "
                    f"entries differ; the worst is d {out_name}{out_at} / d {in_name}{in_at}: analytic "
                    f"{float(a[row, col])!r} vs numerical {float(n[row, col])!r} (allowed: atol {atol} + rtol {rtol} "
                    f"* |numerical|)")
            if a.size <= 64:
                text += f"\nanalytic Jacobian:\n{a}\nnumerical Jacobian:\n{n}"
            return text
    return None


def _warn_precision(problem: _Problem, what: str) -> None:
    for j in problem.float_inputs:
        dtype = problem.arrays[j].dtype
        if dtype != np.float64:
            warnings.warn(f"jg.{what}: {problem.input_names[j]} is {dtype}, not float64; finite differences in lower "
                          f"precision are coarse and the check may fail", UserWarning, stacklevel=3)


def _check(problem: _Problem, what: str, eps: float, atol: float, rtol: float, raise_exception: bool) -> bool:
    wrt = problem.float_inputs
    if not wrt:
        raise InputError(f"jg.{what}: none of the inputs is a float array, so there is no gradient to check")
    with compiled_first_calls():  # the kernels' bits in every call: a numpy first call would put a step in the differences
        leaves, analytic = _analytic(problem, wrt)
        numerical = _numerical(problem, wrt, leaves, eps)
    message = _mismatch(problem, wrt, leaves, analytic, numerical, atol, rtol)
    if message is None:
        return True
    if raise_exception:
        raise GradcheckError(f"jg.{what} failed for {problem.traced.name}: {message}")
    return False


@api_boundary
def gradcheck(fn: Callable[..., Any], inputs: Any, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True) -> bool:
    """True if `fn`'s analytic Jacobian (vjps through the compiled kernels) matches central finite
    differences for every float array input; else raise `GradcheckError` naming the input, output,
    element and both values (or return False with `raise_exception=False`). Use float64 inputs."""
    problem = _problem(fn, inputs, "gradcheck")
    _warn_precision(problem, "gradcheck")
    return _check(problem, "gradcheck", eps, atol, rtol, raise_exception)


@api_boundary
def gradgradcheck(fn: Callable[..., Any], inputs: Any, grad_outputs: Any = None, *, eps: float = 1e-6,
                  atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True) -> bool:
    """`gradcheck` one order higher: checks the function (inputs, grad_outputs) -> gradients of the float
    inputs, itself differentiated by jitgrad. `grad_outputs` (one per float output) default to seeded
    random values."""
    first = _problem(fn, inputs, "gradgradcheck")
    _warn_precision(first, "gradgradcheck")
    leaves = first.outputs(first.arrays)
    float_outputs = [k for k, o in enumerate(leaves) if o.dtype.kind == "f"]
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        cotangents = [rng.standard_normal(leaves[k].shape).astype(leaves[k].dtype) for k in float_outputs]
    else:
        given = list(grad_outputs) if isinstance(grad_outputs, (tuple, list)) else [grad_outputs]
        if len(given) != len(float_outputs):
            raise InputError(f"jg.gradgradcheck: {len(given)} grad_outputs given, but the function has "
                             f"{len(float_outputs)} float output(s)")
        cotangents = [np.asarray(g, leaves[k].dtype) for g, k in zip(given, float_outputs)]
        for g, k in zip(cotangents, float_outputs):
            if g.shape != leaves[k].shape:
                raise InputError(f"jg.gradgradcheck: grad_outputs for output {k} has shape {g.shape}, but the output "
                                 f"has shape {leaves[k].shape}")
    n = len(first.arrays)
    wrt = first.float_inputs
    base = first.traced.fn

    def vjp_of_fn(*args: Any) -> tuple[Any, ...]:
        all_cotangents: list[Any] = [np.zeros(o.shape, o.dtype) for o in leaves]
        for k, g in zip(float_outputs, args[n:]):
            all_cotangents[k] = g
        _, pullback = vjp(base, *args[:n])
        grads = pullback(*all_cotangents)
        return tuple(grads[j] for j in wrt)

    vjp_of_fn.__name__ = f"vjp of {first.traced.name}"
    second = _Problem(trace(vjp_of_fn), first.arrays + cotangents,
                      first.input_names + [f"grad_outputs[{i}]" for i in range(len(cotangents))],
                      [f"grad({first.input_names[j]})" for j in wrt])
    return _check(second, "gradgradcheck", eps, atol, rtol, raise_exception)
