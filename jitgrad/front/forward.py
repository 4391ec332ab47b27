"""Forward mode and Jacobians: `jvp`, `linearize`, `jacfwd`, `jacrev`, `hessian` (and `jacobian`, `jacrev`'s
older name), as functions of functions with JAX's conventions, on pytrees.

Forward mode is derived from reverse mode by linearity: the pullback u -> Jᵀu of `joint_vjp_graph` is linear
in u and differentiable again, so its own VJP at u = 0, applied to a tangent v, is Jv. The two reverse passes
are traced into one graph; what depends on u is dead at u = 0 and DCE drops it, and the primal forward fuses
with the tangent computation. Jacobians unroll one JVP (jacfwd) or one VJP (jacrev) per basis vector into one
program. Every function runs a compiled program on concrete arrays and inlines its graph inside a trace.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from jitgrad.tracing import trees
from jitgrad.front.api import Traced
from jitgrad.runtime.arguments import arg_aval
from jitgrad.passes.autodiff import inline_graph, joint_vjp_graph, zeros
from jitgrad.errors import InputError
from jitgrad.front.function_transforms import swap_user_jvps  # also declares custom Functions' batching rules
from jitgrad.ir.graph import Aval, Graph
from jitgrad.tracebacks import api_boundary
from jitgrad.tracing.tracer import Builder, Tracer, building
from jitgrad.front.transforms import FlatArguments, argument_positions, function_name, is_tracing, trace_nested

float0 = trees.float0  # JAX's dtype of the tangent of an integer or bool value
MAX_BASIS = 256  # basis vectors a Jacobian inside a trace unrolls (input elements for jacfwd, output for jacrev)
_PROGRAMS: "OrderedDict[tuple[Any, str], Traced]" = OrderedDict()  # jvp's compiled programs, by function
_MAX_PROGRAMS = 64


def jvp_graph(graph: Graph, wrt: Sequence[int]) -> Graph:
    """Graph (inputs..., a tangent per `wrt` input...) -> (outputs..., a tangent per float output...): the VJP of
    the (linear) pullback at cotangent zero, applied to the tangents. A custom Function with a `jvp` static method
    gets its JVP from it (`function_transforms`)."""
    joint = joint_vjp_graph(swap_user_jvps(graph, True), wrt)
    n_in, outs = len(graph.inputs), graph.outputs
    second = joint_vjp_graph(joint, [n_in + k for k, o in enumerate(outs) if o.aval.is_float])
    builder = Builder(parent=None)
    with building(builder):
        primals = [builder.new_input(v.aval, n) for v, n in zip(graph.inputs, graph.input_names)]
        tangents = [builder.new_input(graph.inputs[i].aval, f"tangent_{graph.input_names[i]}") for i in wrt]
        at_zero = [zeros(o.aval) for o in outs]  # the cotangent u = 0, and no cotangent on the outputs
        results = inline_graph(second, primals + at_zero + at_zero + tangents)
        return swap_user_jvps(builder.graph(results[:len(outs)] + results[len(outs) + len(wrt):])[0], False)


def _leaf_name(flat: FlatArguments, i: int, j: int) -> str:
    """How messages name leaf `j` of primal `i`: `primal 0['w']`."""
    return f"primal {i}" + "".join(f"[{p!r}]" for p in flat.structures[i].paths()[j])


def _tangent_leaves(name: str, primals: Sequence[Any], tangents: Any, flat: FlatArguments) -> dict[int, Any]:
    """The tangent of each float primal leaf (by flat position), checked: same structure, shapes and dtypes; an
    integer or bool leaf takes a float0 tangent of its shape."""
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(primals):
        raise InputError(f"{name}: tangents must be a tuple with one tangent per primal ({len(primals)}), got "
                         f"{type(tangents).__name__}{f' of {len(tangents)}' if isinstance(tangents, (tuple, list)) else ''}")
    found = {}
    for i, (tangent, positions) in enumerate(zip(tangents, flat.ranges())):
        leaves, structure = trees.tree_flatten(tangent)
        if structure != flat.structures[i]:
            raise InputError(f"{name}: tangent {i} has the structure {structure}, but primal {i} has "
                             f"{flat.structures[i]}")
        for j, (k, leaf) in enumerate(zip(positions, leaves)):
            primal, where = flat.avals[k], _leaf_name(flat, i, j)
            if not primal.is_float:
                if getattr(leaf, "dtype", None) != float0 or np.shape(leaf) != primal.shape:
                    raise InputError(f"{name}: {where} is {primal}, which has no tangent; pass float0 zeros "
                                     f"(np.zeros({primal.shape}, jg.float0)) as JAX does, or close over it")
                continue
            aval = leaf.aval if isinstance(leaf, Tracer) else arg_aval(f"the tangent of {where}", leaf, name)
            if aval.shape != primal.shape or aval.dtype != primal.dtype:
                raise InputError(f"{name}: the tangent of {where} is {aval.dtype.name}{list(aval.shape)} but the "
                                 f"primal is {primal.dtype.name}{list(primal.shape)}; a tangent has its primal's "
                                 f"shape and dtype")
            found[k] = leaf
    return found


_PLAIN_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _plain_float_arrays(primals: Any, tangents: Any) -> bool:
    """Are `primals` and `tangents` tuples of float32/float64 arrays, each tangent of its primal's shape and dtype?
    Then `jvp` skips flattening and checking leaf by leaf (about 30 µs of a call): the compiled program checks its
    arguments as any traced call does, and it gets the same arguments the general path passes it."""
    if type(primals) is not tuple or type(tangents) is not tuple or len(primals) != len(tangents):
        return False
    for p, t in zip(primals, tangents):
        if (type(p) is not np.ndarray or type(t) is not np.ndarray or p.dtype not in _PLAIN_DTYPES
                or t.dtype != p.dtype or t.shape != p.shape):
            return False
    return True


def _traced_jvp(fn: Callable[..., Any], flat: FlatArguments, tangents: dict[int, Any]) -> tuple[Any, Any, list]:
    """Inside a trace: the output structure, the output leaves, and per output leaf its tangent (None if not
    float)."""
    traced = trace_nested(fn, flat)
    wrt = sorted(tangents)
    results = inline_graph(jvp_graph(traced.graph, wrt), flat.leaves + traced.outer + [tangents[k] for k in wrt])
    outs = traced.graph.outputs
    tangent_outs = iter(results[len(outs):])
    return traced.tree, results[:len(outs)], [next(tangent_outs) if o.aval.is_float else None for o in outs]


def _jvp_program(fn: Callable[..., Any]) -> Traced:
    """The compiled jvp of `fn` on arrays: (primals, float tangent leaves) -> (outputs, tangent leaves)."""
    key = (fn, "jvp")
    try:
        found = _PROGRAMS.pop(key, None)
    except TypeError:  # an unhashable callable: not kept
        found, key = None, None
    if found is None:
        def program(primals: tuple, tangents: list) -> tuple[Any, list]:
            flat = FlatArguments.of(primals, f"jg.jvp of {function_name(fn)}")
            tree, outs, tangent_outs = _traced_jvp(fn, flat, dict(zip(flat.float_leaves(range(len(primals))),
                                                                      tangents)))
            return trees.unflatten_output(tree, outs), tangent_outs

        program.__name__ = f"jvp_{function_name(fn)}"
        found = Traced(program)
    if key is not None:
        _PROGRAMS[key] = found
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    return found


def _with_float0(out: Any, tangent_leaves: Sequence[Any]) -> Any:
    """The output tangents in the output's structure: float0 zeros where an output is not float (and where it is
    float0 itself)."""
    leaves, structure = trees.flatten_output(out)
    return trees.tree_unflatten(structure, [np.zeros(np.shape(o), float0) if t is None else t
                                            for o, t in zip(leaves, tangent_leaves)])


@api_boundary
def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """(fn(*primals), J·tangents): `primals` and `tangents` are tuples of the same pytrees, each tangent leaf of
    its primal's shape and dtype (float0 for integer and bool leaves); output tangents come in the output's
    structure (float0 zeros for non-float outputs)."""
    base = fn.fn if isinstance(fn, Traced) else fn
    if _plain_float_arrays(primals, tangents):
        out, tangent_outs = _jvp_program(base)(primals, list(tangents))
        if isinstance(out, (np.ndarray, np.generic)) and tangent_outs[0] is not None:  # one float array out
            return out, tangent_outs[0]
        return out, _with_float0(out, tangent_outs)
    name = f"jg.jvp of {function_name(base)}"
    if not isinstance(primals, (tuple, list)):
        raise InputError(f"{name}: primals must be a tuple of the arguments, got {type(primals).__name__}")
    flat = FlatArguments.of(primals, name)
    found = _tangent_leaves(name, primals, tangents, flat)
    if is_tracing([primals, tangents]):
        tree, outs, tangent_outs = _traced_jvp(base, flat, found)
        out = trees.unflatten_output(tree, outs)
    else:
        out, tangent_outs = _jvp_program(base)(tuple(primals), [found[k] for k in sorted(found)])
    return out, _with_float0(out, tangent_outs)


@api_boundary
def linearize(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """(fn(*primals), f_jvp) with f_jvp(*tangents) = J·tangents at `primals`. On arrays each f_jvp call runs
    jvp's fused program, recomputing the forward alongside; inside a trace the copies of the forward are one."""
    flat = FlatArguments.of(primals, f"jg.linearize of {function_name(fn)}")
    zero = [np.zeros(a.shape, a.dtype if a.is_float else float0) for a in flat.avals]
    out, _ = jvp(fn, primals, tuple(flat.rebuild(zero)))

    @api_boundary
    def f_jvp(*tangents: Any) -> Any:
        return jvp(fn, primals, tangents)[1]

    return out, f_jvp


def _basis(avals: Sequence[Aval], limit: int | None, name: str, what: str) -> Iterator[list[np.ndarray]]:
    """The standard basis of the concatenated `avals`, one list of per-leaf arrays per basis vector; more than
    `limit` vectors are refused."""
    n = sum(a.size for a in avals)
    if limit is not None and n > limit:
        raise InputError(f"{name} inside a traced function unrolls one product per {what} element into the "
                         f"program; {n} elements is over its limit of {limit} (on arrays it has no limit)")
    for leaf, aval in enumerate(avals):
        for element in range(aval.size):
            vector = [np.zeros(a.shape, a.dtype) for a in avals]
            vector[leaf].flat[element] = 1
            yield vector


def _cotangents(outs: Sequence[Aval], vector: Sequence[Any]) -> list[Any]:
    """One cotangent per output: the basis vector's leaves for the float outputs, zeros for the others."""
    found = iter(vector)
    return [next(found) if o.is_float else np.zeros(o.shape, o.dtype) for o in outs]


def _blocks(outs: Sequence[Aval], ins: Sequence[Aval], products: Sequence[Sequence[Any]],
            reverse: bool) -> list[list[Any]]:
    """Per output leaf and differentiated leaf, the Jacobian block of shape output.shape + input.shape in the
    input's dtype (zeros for a non-float output), from the products of the basis vectors: per input element the
    tangent of each float output (forward), or per float-output element the gradient of each leaf (reverse)."""
    floats = [k for k, o in enumerate(outs) if o.is_float]
    blocks: list[list[Any]] = [[np.zeros(o.shape + a.shape, a.dtype) for a in ins] for o in outs]
    in_starts, out_starts = np.cumsum([0] + [a.size for a in ins]), np.cumsum([0] + [outs[k].size for k in floats])
    for c, a in enumerate(ins):
        for position, k in enumerate(floats):
            if not a.size or not outs[k].size:
                continue
            if reverse:
                rows = products[out_starts[position]:out_starts[position] + outs[k].size]
                part = np.stack([p[c] for p in rows])
            else:
                part = np.stack([p[position] for p in products[in_starts[c]:in_starts[c] + a.size]], axis=-1)
            blocks[k][c] = part.reshape(outs[k].shape + a.shape).astype(a.dtype)
    return blocks


def _traced_products(fn: Callable[..., Any], flat: FlatArguments, wrt: list[int], reverse: bool,
                     name: str) -> tuple[Any, list[Aval], list[list[Any]]]:
    """Inside a trace: the output structure, the output avals and the products of the basis vectors, each
    product one JVP or VJP inlined."""
    traced = trace_nested(fn, flat)
    graph, known = traced.graph, flat.leaves + traced.outer
    outs = [o.aval for o in graph.outputs]
    if reverse:
        joint = joint_vjp_graph(graph, wrt)
        products = [inline_graph(joint, known + _cotangents(outs, vector))[len(outs):]
                    for vector in _basis([o for o in outs if o.is_float], MAX_BASIS, name, "output")]
    else:
        program = jvp_graph(graph, wrt)
        products = [inline_graph(program, known + vector)[len(outs):]
                    for vector in _basis([flat.avals[k] for k in wrt], MAX_BASIS, name, "input")]
    return traced.tree, outs, products


def _array_products(fn: Traced, args: tuple, flat: FlatArguments, positions: list[int], wrt: list[int],
                    reverse: bool, name: str) -> tuple[Any, list[Aval], list[list[Any]]]:
    """On arrays: the same, by running one compiled program per basis vector (jvp's, or the backward of
    `fn`'s vjp after one forward)."""
    if reverse:
        out, pullback = fn.vjp(*args)
        leaves, tree = trees.flatten_output(out)
        outs = [Aval(np.shape(o), np.asarray(o).dtype) for o in leaves]
        products = [[g for i in positions for g in trees.tree_leaves(pullback(*_cotangents(outs, vector))[i])]
                    for vector in _basis([o for o in outs if o.is_float], None, name, "output")]
        return tree, outs, products
    program, every = _jvp_program(fn.fn), flat.float_leaves(range(len(args)))
    zero = {k: np.zeros(flat.avals[k].shape, flat.avals[k].dtype) for k in every}
    runs = [program(args, [{**zero, **dict(zip(wrt, vector))}[k] for k in every])
            for vector in _basis([flat.avals[k] for k in wrt], None, name, "input")]
    out = runs[0][0] if runs else program(args, list(zero.values()))[0]
    leaves, tree = trees.flatten_output(out)
    outs = [Aval(np.shape(o), np.asarray(o).dtype) for o in leaves]
    return tree, outs, [[t for t in tangents if t is not None] for _, tangents in runs]


def _jacobian(fn: Callable[..., Any], argnums: int | Sequence[int], reverse: bool, name: str) -> Callable[..., Any]:
    """jacfwd (reverse=False) or jacrev: a function returning per output leaf, per argument in `argnums`, the
    Jacobian of shape output.shape + input.shape in the argument's structure."""
    base = fn.fn if isinstance(fn, Traced) else fn
    label = f"jg.{name} of {function_name(base)}"
    compiled = Traced(base)

    @api_boundary
    def jacobian_fn(*args: Any) -> Any:
        positions = argument_positions(argnums, len(args), label)
        flat = FlatArguments.of(args, label)
        ranges = flat.ranges()
        for a, i in zip([argnums] if isinstance(argnums, int) else argnums, positions):
            if not ranges[i] or any(not flat.avals[k].is_float for k in ranges[i]):
                raise InputError(f"{label}: argument {a} is not a float numpy array (or a tree of them), so it has "
                                 f"no Jacobian")
        wrt = [k for i in positions for k in ranges[i]]
        tree, outs, products = _traced_products(base, flat, wrt, reverse, label) if is_tracing(args) else \
            _array_products(compiled, args, flat, positions, wrt, reverse, label)
        per_output = []
        for row in _blocks(outs, [flat.avals[k] for k in wrt], products, reverse):
            parts = iter(row)
            per_argument = [trees.tree_unflatten(flat.structures[i], [next(parts) for _ in ranges[i]])
                            for i in positions]
            per_output.append(per_argument[0] if isinstance(argnums, int) else tuple(per_argument))
        return trees.unflatten_output(tree, per_output)

    jacobian_fn.__name__ = f"{name}_{function_name(base)}"
    return jacobian_fn


def jacfwd(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Jacobian by forward mode, one JVP per input element unrolled into one program (up to MAX_BASIS):
    per output leaf, output.shape + input.shape per leaf of the arguments in `argnums`, as JAX lays it out."""
    return _jacobian(fn, argnums, False, "jacfwd")


def jacrev(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Jacobian by reverse mode, one VJP per output element unrolled into one program (up to MAX_BASIS); the
    same layout as `jacfwd`."""
    return _jacobian(fn, argnums, True, "jacrev")


def hessian(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Hessian of scalar `fn`, jacfwd(jacrev(fn)): input.shape + input.shape per pair of leaves."""
    return jacfwd(jacrev(fn, argnums), argnums)


jacobian = jacrev
