"""What a traced function compiles to, for people: the forward and backward IR, the values the
forward saves for the backward (and their bytes), the fusion groups and each kernel's source, as
text or as a Graphviz DOT graph.

`Traced.ir`/`Traced.explain` and `python -m jitgrad explain` render an `Explanation` built from
a plan's graphs; nothing here runs code, and kernel source is generated, not compiled.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np

from jitgrad.passes import fusion, recipes
from jitgrad.passes.autodiff import SplitGraphs
from jitgrad.tracing.captures import Captures
from jitgrad.errors import InputError
from jitgrad.ir.graph import Atom, Eqn, Graph, Literal, Var, format_graph
from jitgrad.passes.loops import HostStep
from jitgrad.kernels.cpu import codegen as cpu


@dataclass
class Explanation:
    """One plan's graphs: the traced forward, the differentiated inputs and the forward/backward split."""

    name: str
    graph: Graph
    wrt: list[int]  # graph inputs with gradients
    split: SplitGraphs | None  # None when nothing is differentiable
    captures: Captures | None = None  # arrays read from outside the arguments (the graph's trailing inputs)

    @cached_property
    def forward(self) -> Graph:
        """The forward as it runs (optimised): outputs, then (when differentiable) the residuals."""
        return recipes.call_graph(self.split.forward if self.split else self.graph)

    @cached_property
    def backward(self) -> Graph | None:
        """The backward as it runs (optimised): takes the residuals, then one cotangent per output."""
        return recipes.call_graph(self.split.backward) if self.split else None

    @property
    def n_outputs(self) -> int:
        return len(self.graph.outputs)

    @property
    def residuals(self) -> list[Atom]:
        return list(self.forward.outputs[self.n_outputs:])

    def modes(self) -> list[tuple[str, Graph]]:
        """Each compiled program by name: call, value_and_grad (scalar outputs), forward and backward."""
        found = [("call", recipes.call_graph(self.graph))]
        if self.wrt and recipes.has_scalar_output(self.graph):
            found.append(("value_and_grad", recipes.value_and_grad_graph(self.graph, self.wrt)))
        if self.split:
            found += [("forward", self.forward), ("backward", self.backward)]
        return found


def nbytes(a: Atom) -> int:
    return a.aval.nbytes


def _input_name(graph: Graph, k: int) -> str:
    return graph.input_names[k] if k < len(graph.input_names) else f"arg{k}"


def _what(a: Atom, graph: Graph, producers: dict[Var, Eqn]) -> str:
    """Where a value comes from: an input's name, a constant, or the op computing it."""
    if isinstance(a, Literal):
        return "constant"
    if a in graph.inputs:
        return f"input {_input_name(graph, graph.inputs.index(a))}"
    e = producers[a]
    return f"{e.prim.name} ({e.label})" if e.label else e.prim.name


def saved_text(ex: Explanation) -> str:
    """The residuals table: one line per value the forward saves, with its type and bytes."""
    residuals = ex.residuals
    total = sum(nbytes(r) for r in residuals)
    forward = ex.forward
    producers = forward.producers()
    lines = [f"# saved for backward: {len(residuals)} value(s), {total} bytes "
             f"(the forward's outputs after the first {ex.n_outputs}; the backward's inputs res0...)"]
    lines += [f"  res{k}  {r.aval}  {nbytes(r)} B  {_what(r, forward, producers)}" for k, r in enumerate(residuals)]
    return "\n".join(lines)


def ir_text(ex: Explanation) -> str:
    """The traced forward IR and, when differentiable, the optimised forward and backward IR."""
    text = [format_graph(ex.graph, "# traced forward")]
    if ex.captures:
        text.append("# arrays read from outside the arguments\n" + "\n".join(f"  {line}" for line in
                                                                             ex.captures.describe()))
    if ex.split:
        text.append(format_graph(ex.forward, "# optimised forward (outputs, then residuals)"))
        text.append(format_graph(ex.backward, "# optimised backward (residuals, cotangents)"))
        text.append(saved_text(ex))
    return "\n\n".join(text)


def shared_kernels(program: fusion.Program) -> list[list[int]]:
    """The program's kernels grouped by the compiled code they run: fused groups of one structure (every
    step of an unrolled loop, two LayerNorms) share one compiled kernel, whatever their lengths."""
    by_source: dict[str, list[int]] = {}
    for k, kern in enumerate(program.kernels):
        by_source.setdefault(cpu.module_source(kern), []).append(k)
    return list(by_source.values())


def explain_text(ex: Explanation) -> str:
    """IR, saved values, and per compiled program its fusion groups, which of them share compiled code,
    and the generated source of each distinct kernel."""
    parts = [ir_text(ex)]
    for mode, graph in ex.modes():
        program = fusion.schedule(graph)
        shared = shared_kernels(program)
        sharing = "".join(f"\n  kernels {', '.join(map(str, ks))} share one compiled kernel" for ks in shared
                          if len(ks) > 1)
        parts.append(f"# {mode}: {len(program.kernels)} kernel(s) run, {len(shared)} distinct compiled kernel(s)"
                     f"{sharing}\n{fusion.describe(program)}")
        for ks in shared:
            kern = program.kernels[ks[0]]
            parts.append(f"# {mode} kernel {ks[0]} source\n{cpu.generate(kern, f'kernel_{ks[0]}')}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------- DOT

def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _literal_text(a: Literal) -> str:
    return repr(a.scalar().item()) if a.is_scalar and a.aval.ndim == 0 else f"const {a.aval}"


class _DotGraph:
    """One graph as a DOT cluster: node declarations grouped by kernel (host steps grey), and its edges,
    which the caller writes at top level so they do not pull nodes into clusters."""

    def __init__(self, prefix: str, graph: Graph, input_label: Callable[[int, Var], str],
                 output_label: Callable[[int, Atom], str]):
        self.prefix = prefix
        self.node_of: dict[Var, str] = {}
        self.nodes: list[str] = []  # declared in the graph's cluster, outside any kernel
        self.edges: list[str] = []
        self.counter = 0
        self.program = fusion.schedule(graph)
        self.kernel_nodes: list[list[str]] = [[] for _ in self.program.kernels]
        kernel_of = {id(e): k for k, kern in enumerate(self.program.kernels) for e in kern.eqns}
        host = {id(s.eqn) for s in self.program.steps if isinstance(s, HostStep)}
        self.inputs: list[str] = []
        for k, v in enumerate(graph.inputs):
            self.inputs.append(self.declare(f"{input_label(k, v)}\n{v.aval}", ", shape=ellipse", self.nodes))
            self.node_of[v] = self.inputs[-1]
        for e in graph.eqns:
            k = kernel_of.get(id(e))
            label = (f"{e.label}\n" if e.label else "") + e.prim.name + "\n" + ", ".join(str(o.aval) for o in e.outs)
            style = ", style=filled, fillcolor=\"#dddddd\"" if id(e) in host else ""
            name = self.declare(label, f", shape=box{style}", self.nodes if k is None else self.kernel_nodes[k])
            self.node_of.update((o, name) for o in e.outs)
        for e in graph.eqns:
            self.edges += [f"{self.source(a)} -> {self.node_of[e.outs[0]]};" for a in e.inputs]
        for k, a in enumerate(graph.outputs):
            out = self.declare(output_label(k, a), ", shape=plaintext", self.nodes)
            self.edges.append(f"{self.source(a)} -> {out};")

    def declare(self, label: str, attrs: str, into: list[str]) -> str:
        self.counter += 1
        name = f"{self.prefix}{self.counter}"
        into.append(f"{name} [label={_quote(label)}{attrs}];")
        return name

    def source(self, a: Atom) -> str:
        """The node holding `a` (a literal gets a node of its own)."""
        if isinstance(a, Var):
            return self.node_of[a]
        return self.declare(_literal_text(a), ", shape=plaintext", self.nodes)

    def cluster(self, title: str) -> list[str]:
        lines = [f"  subgraph cluster_{self.prefix} {{", f"    label={_quote(title)};"]
        lines += ["    " + d for d in self.nodes]
        for k, (kern, nodes) in enumerate(zip(self.program.kernels, self.kernel_nodes)):
            lines.append(f"    subgraph cluster_{self.prefix}_kernel{k} {{")
            lines.append(f"      label={_quote(f'kernel {k}: {kern.domain}, {len(kern.stages)} pass(es)')}; "
                         f"style=filled; fillcolor=\"#eef4fb\";")
            lines += ["      " + d for d in nodes]
            lines.append("    }")
        lines.append("  }")
        return lines


def explain_dot(ex: Explanation) -> str:
    """A Graphviz DOT digraph of the forward and backward graphs, one nested cluster per fused kernel;
    dashed edges carry the values the forward saves for the backward, labelled with their bytes."""
    forward = ex.forward
    fwd = _DotGraph("f", forward, lambda k, v: _input_name(forward, k),
                    lambda k, a: f"output {k}" if k < ex.n_outputs else f"res{k - ex.n_outputs}")
    graphs = [(fwd, f"forward of {ex.name}")]
    saved = []
    backward = ex.backward
    if backward is not None:
        residuals = ex.residuals
        bwd = _DotGraph("b", backward, lambda k, v: f"res{k}" if k < len(residuals) else f"d_out{k - len(residuals)}",
                        lambda k, a: f"grad {_input_name(forward, ex.wrt[k])}")
        graphs.append((bwd, f"backward of {ex.name}"))
        saved = [f"{fwd.source(r)} -> {bwd.inputs[k]} [style=dashed, label={_quote(f'{nbytes(r)} B')}];"
                 for k, r in enumerate(residuals)]
    lines = [f"digraph {_quote(ex.name)} {{", "  rankdir=TB;", "  node [fontname=\"monospace\", fontsize=10];"]
    for g, title in graphs:
        lines += g.cluster(title)
    lines += ["  " + e for g, _ in graphs for e in g.edges]
    lines += ["  " + e for e in saved]
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(ex: Explanation, format: str = "text") -> str:
    """`explain_text` or `explain_dot`, by name."""
    if format == "text":
        return explain_text(ex)
    if format == "dot":
        return explain_dot(ex)
    raise InputError(f"{ex.name}.explain: format must be 'text' or 'dot', got {format!r}")


# ---------------------------------------------------------------------- command line helpers

_DTYPES = {"f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16, "i32": np.int32,
           "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "bool": np.bool_}
_SPEC = re.compile(r"\s*([A-Za-z0-9_]+)\[([0-9,\s]*)\]\s*(?:,|$)")


def example_arrays(spec: str) -> list[np.ndarray]:
    """Zero arrays for a shape list like "f32[1000],f64[4,8],i64[]" (a numpy dtype name works too)."""
    arrays, pos = [], 0
    while pos < len(spec):
        m = _SPEC.match(spec, pos)
        if m is None:
            raise InputError(f"--shapes: cannot read {spec[pos:]!r}; write dtype[dims] items separated by commas, "
                             f"e.g. f32[1000],f64[4,8],i64[]")
        name, dims = m.group(1), m.group(2)
        try:
            dtype = np.dtype(_DTYPES.get(name, name))
        except TypeError:
            raise InputError(f"--shapes: unknown dtype {name!r}; use one of {', '.join(_DTYPES)}") from None
        shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
        arrays.append(np.zeros(shape, dtype))
        pos = m.end()
    return arrays


def load_function(target: str) -> Any:
    """The object named by "package.module:function" (dots after the colon reach attributes)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"expected module:function, got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
