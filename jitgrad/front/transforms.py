"""The composable transformations `value_and_grad`, `grad` and `vjp` as functions of functions.

Called on concrete arrays they run a `Traced` function's compiled programs; called inside an
enclosing trace (on traced arrays, or from a traced function) they differentiate a subgraph and
inline it, so `grad(grad(f))` and a gradient taken inside a traced training step compile into
the enclosing program. Arguments may be pytrees; gradients come back in each argument's structure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from jitgrad.passes import recipes
from jitgrad.tracing import trees
from jitgrad.front.api import Traced
from jitgrad.runtime.arguments import arg_aval
from jitgrad.passes.autodiff import inline_graph, joint_vjp_graph, with_unit_cotangent
from jitgrad.errors import InputError
from jitgrad.ir.graph import Aval, Graph
from jitgrad.runtime.repeats import MISS
from jitgrad.tracing.traced import Trace, trace_to_graph
from jitgrad.tracebacks import api_boundary
from jitgrad.tracing.tracer import Tracer, current_builder


def function_name(fn: Callable[..., Any]) -> str:
    """`Sigmoid.apply` for a Function's apply, the function's name otherwise."""
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "fn")
    return f"{owner.__name__}.{name}" if isinstance(owner, type) else name


def is_tracing(args: Sequence[Any]) -> bool:
    """Is a transformation called inside an enclosing trace (a builder is active, or an argument is traced)?"""
    return current_builder() is not None or any(isinstance(leaf, Tracer) for leaf in trees.tree_leaves(args))


@dataclass
class FlatArguments:
    """Arguments of a nested transformation, flattened: the leaves, their avals, each argument's structure."""

    leaves: list[Any]
    avals: list[Aval]
    structures: list[trees.TreeDef]

    @classmethod
    def of(cls, args: Sequence[Any], name: str) -> "FlatArguments":
        leaves, avals, structures = [], [], []
        for i, arg in enumerate(args):
            found, structure = trees.tree_flatten(arg)
            structures.append(structure)
            for leaf in found:
                leaves.append(leaf)
                avals.append(leaf.aval if isinstance(leaf, Tracer) else
                             arg_aval(i if structure.is_leaf() else f"a leaf of argument {i}", leaf, name))
        return cls(leaves, avals, structures)

    def ranges(self) -> list[range]:
        found, start = [], 0
        for s in self.structures:
            found.append(range(start, start + s.num_leaves))
            start += s.num_leaves
        return found

    def rebuild(self, leaves: Sequence[Any]) -> list[Any]:
        return [trees.tree_unflatten(s, leaves[r.start:r.stop]) for s, r in zip(self.structures, self.ranges())]

    def float_leaves(self, positions: Sequence[int]) -> list[int]:
        ranges = self.ranges()
        return [k for i in positions for k in ranges[i] if self.avals[k].is_float]

    def per_argument(self, grads: dict[int, Any], positions: Sequence[int]) -> list[Any]:
        ranges = self.ranges()
        return [trees.tree_unflatten(self.structures[i], [grads.get(k) for k in ranges[i]]) for i in positions]


def trace_nested(fn: Callable[..., Any], flat: FlatArguments) -> Trace:
    """Trace `fn` on the flattened arguments' avals (inside an enclosing trace, its values it reads are captured)."""
    def on_leaves(*leaves: Any) -> Any:
        return fn(*flat.rebuild(leaves))

    return trace_to_graph(on_leaves, flat.avals, reads_from=fn)


def argument_positions(argnums: int | Sequence[int], nargs: int, name: str) -> list[int]:
    """`argnums` as non-negative positions, each checked against the number of arguments."""
    found = [argnums] if isinstance(argnums, int) else list(argnums)
    for a in found:
        if not -nargs <= int(a) < nargs:
            raise InputError(f"{name}: argnums {a} is out of range for {nargs} argument(s)")
    return [int(a) % nargs for a in found]


def _traced_value_and_grad(fn: Callable[..., Any], args: Sequence[Any], argnums: int | Sequence[int],
                           has_aux: bool) -> Any:
    """value_and_grad inside an enclosing trace: differentiate a subgraph and inline it."""
    name = getattr(fn, "__name__", "function")
    flat = FlatArguments.of(args, name)
    traced = trace_nested(fn, flat)
    graph = traced.graph
    if has_aux and not trees.is_value_aux_pair(traced.tree):
        raise InputError(f"grad of {name} with has_aux=True needs a function returning (loss, aux) with one array "
                         f"as loss; it returns the structure {traced.tree}")
    if not recipes.has_scalar_output(graph, has_aux):
        raise InputError(f"grad of {name} needs a float scalar output{' first' if has_aux else ''}, got "
                         f"{[str(o.aval) for o in graph.outputs]}")
    positions = argument_positions(argnums, len(args), name)
    wrt = flat.float_leaves(positions)
    joint = joint_vjp_graph(graph, wrt, differentiated=1 if has_aux else None)
    outs = inline_graph(with_unit_cotangent(joint, len(graph.inputs)), flat.leaves + traced.outer)
    n_out = len(graph.outputs)
    value = trees.unflatten_output(traced.tree, outs[:n_out])
    grads = flat.per_argument(dict(zip(wrt, outs[n_out:])), positions)
    return value, grads[0] if isinstance(argnums, int) else tuple(grads)


def value_and_grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable[..., tuple[Any, Any]]:
    """A function returning (fn(*args), gradient w.r.t. `argnums`), each gradient in its argument's structure;
    with `has_aux`, fn returns (loss, aux) and so does the value. Composable with itself and `grad`."""
    base = fn.fn if isinstance(fn, Traced) else fn
    compiled: list[Traced] = []

    @api_boundary
    def value_and_grad_fn(*args: Any) -> tuple[Any, Any]:
        if compiled and current_builder() is None:  # a repeat call: its checks see no tracer among the leaves
            found = compiled[0].plans.repeat(("value_and_grad", argnums, None, has_aux), args)
            if found is not MISS:
                return found
        if is_tracing(args):
            return _traced_value_and_grad(base, args, argnums, has_aux)
        if not compiled:
            compiled.append(Traced(base))
        return compiled[0].value_and_grad(*args, argnums=argnums, has_aux=has_aux)

    value_and_grad_fn.__name__ = f"value_and_grad_{getattr(base, '__name__', 'fn')}"
    return value_and_grad_fn


def grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """A function returning the gradient of scalar `fn` w.r.t. `argnums` ((gradient, aux) with `has_aux`);
    `grad(grad(f))` works."""
    vg = value_and_grad(fn, argnums, has_aux)

    @api_boundary
    def grad_fn(*args: Any) -> Any:
        value, grads = vg(*args)
        return (grads, value[1]) if has_aux else grads

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return grad_fn


@api_boundary
def vjp(fn: Callable[..., Any], *args: Any) -> tuple[Any, Callable[..., tuple[Any, ...]]]:
    """(fn(*args), pullback): pullback(cotangent) gives one gradient per argument (None where not
    differentiable), each in its argument's structure; cotangents are one per output leaf, or one tree
    of the outputs' structure."""
    base = fn.fn if isinstance(fn, Traced) else fn
    if not is_tracing(args):
        return Traced(base).vjp(*args)
    name = getattr(base, "__name__", "function")
    flat = FlatArguments.of(args, name)
    traced = trace_nested(base, flat)
    graph, captured = traced.graph, traced.outer
    wrt = flat.float_leaves(range(len(args)))
    joint = joint_vjp_graph(graph, wrt)
    n_out = len(graph.outputs)
    primal_outs = inline_graph(Graph(graph.inputs, graph.eqns, graph.outputs, graph.input_names),
                               flat.leaves + captured)

    @api_boundary
    def pullback(*cotangents: Any) -> tuple[Any, ...]:
        if len(cotangents) == 1 and n_out > 1:
            cotangents = tuple(trees.tree_leaves(cotangents[0]))
        if len(cotangents) != n_out:
            raise InputError(f"vjp of {name}: expected {n_out} cotangent(s), one per output, got {len(cotangents)}")
        outs = inline_graph(joint, flat.leaves + captured + list(cotangents))
        return tuple(flat.per_argument(dict(zip(wrt, outs[n_out:])), range(len(args))))

    return trees.unflatten_output(traced.tree, primal_outs), pullback
