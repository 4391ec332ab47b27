"""The programs a plan compiles, each with one recipe: the call, value-and-grad (the joint forward and
backward with the output cotangent fixed to 1) and the split forward/backward pair. The API runs them;
`explain` and `kernel_counts` show the same graphs."""
from __future__ import annotations

from typing import Sequence

from jitgrad.passes import fusion, simplify
from jitgrad.passes.autodiff import SplitGraphs, joint_vjp_graph, split_forward_backward, with_unit_cotangent
from jitgrad.ir.graph import Graph
from jitgrad.passes.loops import Program


def call_graph(graph: Graph) -> Graph:
    """The traced forward, optimised."""
    return simplify.optimize(graph)


def has_scalar_output(graph: Graph, has_aux: bool = False) -> bool:
    """Does the graph return one float scalar (first, then auxiliary values with `has_aux`), so that
    value-and-grad applies?"""
    outs = graph.outputs
    return (len(outs) >= 1 if has_aux else len(outs) == 1) and outs[0].aval.size == 1 and outs[0].aval.is_float


def value_and_grad_graph(graph: Graph, wrt: Sequence[int], has_aux: bool = False) -> Graph:
    """One program computing the scalar first output (and, with `has_aux`, the other outputs alongside)
    and its gradient w.r.t. the inputs `wrt`, optimised."""
    joint = joint_vjp_graph(graph, list(wrt), differentiated=1 if has_aux else None)
    return simplify.optimize(with_unit_cotangent(joint, len(graph.inputs)))


def split_graphs(graph: Graph, wrt: Sequence[int]) -> SplitGraphs:
    """The forward (outputs, then residuals) and backward (residuals, cotangents -> gradients), each to be
    optimised when compiled. The joint graph is optimised first, so dead gradient ops save no residuals."""
    joint = simplify.optimize(joint_vjp_graph(graph, list(wrt)))
    return split_forward_backward(joint, len(graph.inputs), len(graph.outputs))


def schedule(graph: Graph) -> Program:
    """A graph as kernels and host steps: optimised, then fused."""
    return fusion.schedule(simplify.optimize(graph))
