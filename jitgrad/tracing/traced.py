"""Tracing a Python function into a closed graph: fresh inputs of the given avals, the arrays it reads
from outside its arguments as traced stand-ins (`jitgrad.tracing.captures`), and its output tree."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from jitgrad.tracing import captures, trees
from jitgrad.ir.graph import Aval, Graph
from jitgrad.tracing.tracer import Builder, Tracer, building, current_builder


@dataclass
class Trace:
    """What tracing a function produced: its graph, its output structure, the enclosing traces'
    values it used (extra trailing inputs) and the arrays it read from outside its arguments."""

    graph: Graph
    tree: Any
    outer: list[Tracer]
    captures: captures.Captures


def trace_to_graph(fn: Any, avals: Sequence[Aval], names: Sequence[str] = (), parent: Builder | None = None,
                   reads_from: Any = None) -> Trace:
    """Trace `fn` on fresh inputs of `avals`. Arrays that `reads_from` (default: `fn`) reaches outside its
    arguments become traced stand-ins (`jitgrad.tracing.captures`): of this graph if it is the outermost trace,
    else of the outermost one (whose inputs the enclosing graphs then capture).

    Outputs may be a tracer/array or a tuple, list or dict of them; the structure is returned
    so callers can rebuild it around computed arrays.
    """
    builder = Builder(parent if parent is not None else current_builder())
    if builder.parent is None:
        builder.known_arrays = {}
    with building(builder), reading_captured(reads_from if reads_from is not None else fn):
        args = [builder.new_input(a, n) for a, n in zip(avals, list(names) + [""] * len(avals))]
        result = fn(*args)
        leaves, tree = trees.flatten_output(result)
        graph, found = builder.graph(leaves)
    return Trace(graph, tree, list(builder.captured_tracers), found)


@contextmanager
def reading_captured(fn: Any) -> Iterator[None]:
    """While tracing `fn`, the arrays it reads from outside its arguments are traced stand-ins of the
    outermost capturing trace (nothing is done where no trace captures)."""
    current = current_builder()
    root = current.capture_root() if current is not None else None
    if root is None:
        yield
        return
    with captures.substituted(fn, root.new_implicit, root.known_arrays, root.structure_guards):
        yield
