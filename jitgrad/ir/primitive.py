"""The primitive record: every fact about one IR operation, declared once where the op is defined.

A `Primitive` carries its shape/dtype rule, numpy reference, VJP rule (written with the IR-level
binders of `jitgrad.tracing.lax`, so backward graphs keep dtypes exact and are differentiable again), its
scalar lowering (the CPU's, which other backends read unless their own folder registers one), whether it
is costly to recompute, and, for reductions, how to accumulate.
The stages after tracing (autodiff, passes, fusion, kernels) read these fields and call these
methods; none of them knows a primitive by name. The ops themselves are declared in
`jitgrad.ops`, each next to its numpy binding.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.ir.graph import Atom, Aval, Eqn, Graph

PRIMITIVES: dict[str, "Primitive"] = {}


class Kind(enum.Enum):
    """How fusion may group an equation."""

    ELEMENTWISE = "elementwise"  # per point, operands of one shape: fused into loop nests
    REDUCE = "reduce"  # accumulates over axes (kept as length 1): fused, as a pass over the reduced axes
    VIEW = "view"  # moves indices only (broadcast, reshape, transpose, slice): read through by kernels
    HOST = "host"  # runs its numpy reference on whole arrays between kernels (BLAS, slicing, gathers)
    CALL = "call"  # holds a subgraph (a custom Function): inlined before fusion


@dataclass(frozen=True)
class Offset:
    """An index entry that moves a loop variable: position `start + step * i<axis>` along an array axis
    (`axis` None: the fixed position `start`). A view's index map returns these where it reads its input
    at other positions than its output's (a slice); plain entries are an int (the loop variable) or
    None (position 0)."""

    axis: int | None
    start: int | Param  # a Param once a kernel is built (`loops.LoopKernel.index_params`)
    step: int


@dataclass(frozen=True)
class Param:
    """An integer of a built kernel's index arithmetic that depends on shapes (a slice's start, the end of a
    concatenate's operand, a pad's edge), in place of it in an `Offset` or a region read's bound: the kernel's
    int64 argument `p<number>`, so that the source, and the machine code compiled from it, serve every shape of
    the same structure (an im2col of 8 and of 16 channels, a new batch size). Its sign still shapes the source
    (what an unsigned index adds or subtracts)."""

    number: int
    value: int


def shifted(entry: int | Offset | None, start: int, step: int) -> int | Offset | None:
    """The entry for position `start + step * p`, where `entry` stands for position p; in its plainest form."""
    if entry is None:
        axis, s0, t0 = None, 0, 0
    elif isinstance(entry, Offset):
        axis, s0, t0 = entry.axis, entry.start, entry.step
    else:
        axis, s0, t0 = entry, 0, 1
    s, t = start + step * s0, step * t0
    if axis is None or t == 0:
        return None if s == 0 else Offset(None, s, 0)
    return axis if (s, t) == (0, 1) else Offset(axis, s, t)


def entry_axis(entry: int | Offset | None) -> int | None:
    """The loop variable an index entry moves with (None: a fixed position)."""
    return entry.axis if isinstance(entry, Offset) else entry


@dataclass(frozen=True)
class Lowering:
    """A scalar expression of an elementwise primitive on a backend: a template over `{0}`, `{1}`, ...
    (the operands) and `{cast}` (the result's type), the helpers it calls (as "module.name"), and, where
    integer results need other code than floats, the template for them."""

    template: str
    imports: tuple[str, ...] = ()
    integer: str | None = None

    def for_dtype(self, dtype: np.dtype) -> str:
        return self.integer if self.integer is not None and np.dtype(dtype).kind in "iu" else self.template


def lowerings(cpu: str, imports: tuple[str, ...] = (), integer: str | None = None) -> dict[str, Lowering]:
    """A record's lowering: the CPU's template, with `imports` its helpers; `integer`, if given, is every
    backend's template for integer results. Another backend reads the same template (operators, comparisons)
    unless its folder registers its own for the primitive (`jitgrad.kernels.common.register_lowering`); one
    whose template calls helpers must."""
    return {"cpu": Lowering(cpu, imports, integer)}


@dataclass(frozen=True)
class Reduction:
    """How a reduction primitive accumulates, for every backend.

    `combine` is the sequential rule over two scalar expressions (numpy's order); `vector_combine`,
    where set, is an order-independent form LLVM vectorises (NaN-propagating max/min); `blocked`
    sums go through a fixed-order block sum; `order_dependent` results round differently when the
    terms are combined in another order (float sums and products), so every variant must keep one."""

    identity: Callable[[np.dtype], Any]
    combine: str
    vector_combine: Lowering | None = None
    blocked: bool = False
    order_dependent: bool = False
    widen_floats: bool = False  # accumulate float32 in float64 (sums: numpy's pairwise sum is that accurate)
    rescan_zero: bool = False  # a zero result is recomputed sequentially (the sign of zero follows numpy)

    def accumulator(self, dtype: np.dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        return np.dtype(np.float64) if self.widen_floats and dtype.kind == "f" else dtype


@dataclass(eq=False)
class Primitive:
    """One IR operation. `lowering["cpu"]`, for elementwise ops, is its scalar expression template over `{0}`,
    `{1}`, ... (and `{cast}`, the result's type): the CPU's, and every other backend's that registers none."""

    name: str
    kind: Kind
    abstract_eval: Callable[..., Aval | list[Aval]]
    impl: Callable[..., Any]
    vjp: Callable[..., Sequence[Any]] | None = None
    lowering: dict[str, Lowering] = field(default_factory=dict)
    costly: bool = False  # worth keeping rather than recomputing in a later pass of a kernel
    reduction: Reduction | None = None
    # Views: the index into the input read at an index into the output (None if the view regroups axes);
    # entries are loop variables (int), position 0 (None) or moved positions (`Offset`).
    index_map: Callable[[Eqn, tuple], tuple | None] | None = None
    # Region reads (pad, concatenate), read through by kernels: at an index into the output, the cases
    # (bounds, operand position, index into that operand) tried in order (a bound (entry, lo, hi) holds where
    # lo <= the entry's position < hi), and the value where none holds (None: they cover every point); None
    # where the equation cannot be read so (a pad with interior steps).
    select_map: Callable[[Eqn, tuple], tuple[list[tuple[tuple, int, tuple]], Any] | None] | None = None
    # An exact rewrite (x * 1 -> x): given the equation, a function telling an atom's value where it is one
    # number everywhere, and one giving an atom's producing equation; returns an atom, an equation or None.
    simplify: Callable[[Eqn, Callable[[Atom], Any], Callable[[Atom], Eqn | None]], Atom | Eqn | None] | None = None
    backward_label: str = ""
    fresh_output: bool = False  # a host op whose result is always a new array (never a view of an input)
    takes_out: bool = False  # a fresh host op whose `impl` writes into `out=` with the same bits (pooled buffers)
    contiguous_operands: tuple[int, ...] = ()  # host op operands it reads faster contiguous (`blas_operands`)
    matrix_product: bool = False  # a host op computing x @ y (batched, one dtype): a device backend runs its GEMM
    converts: bool = False  # a dtype cast: each result is its operand's value in the new dtype (a bool's: 0 or 1)
    # vmap's batching rule, `batch(b, e, args, dims) -> (outs, out_dims)`: `e` recorded again on `args`, whose
    # batch axes (of length `b.size`) are at `dims` (None: not batched); `b.move(x, d, to)` moves x's batch axis d
    # to `to` (broadcasting one where d is None). None: vmap refuses the op (`jitgrad.front.batching`).
    batch: Callable[..., tuple[list[Any], list[int | None]]] | None = None

    def __repr__(self) -> str:
        return f"Primitive({self.name})"

    @property
    def label(self) -> str:
        return self.backward_label or "".join(p.capitalize() for p in self.name.split("_")) + "Backward"

    # ---- what the stages after tracing call; a CALL primitive (jitgrad.front.function) overrides them

    def label_of(self, e: Eqn) -> str:
        """The label of the equations this equation's VJP records."""
        return self.label

    def replay(self, inputs: Sequence[Any], e: Eqn, bind: Callable[..., Any]) -> list[Any]:
        """Record `e` again on new inputs (autodiff's replays)."""
        res = bind(self, *inputs, label=e.label, **e.params)
        return res if isinstance(res, list) else [res]

    def pullback(self, cotangents: Sequence[Any | None], inputs: Sequence[Any], outputs: Sequence[Any],
                 e: Eqn, zeros: Callable[[Aval], Any]) -> Sequence[Any]:
        """Cotangents of `e`'s inputs (None: zero) given its outputs' (None: zero, made explicit here)."""
        assert self.vjp is not None
        cts = [zeros(o.aval) if g is None else g for g, o in zip(cotangents, e.outs)]
        return self.vjp(cts, inputs, outputs, **e.params)

    def subgraph(self, e: Eqn) -> Graph | None:
        """The graph to inline in place of `e` before fusion (None: `e` is kept as it is)."""
        return None

    def cse_key(self, e: Eqn) -> Any:
        """What makes two applications equal for CSE (None: never merge them)."""
        return tuple(sorted((k, repr(v)) for k, v in e.params.items()))

    @property
    def foldable(self) -> bool:
        """Can an application to constants be evaluated while compiling?"""
        return self.kind is not Kind.CALL


def declare(prim: Primitive) -> Primitive:
    """Register a primitive under its name (names are unique: they key CSE and the IR printout)."""
    if prim.name in PRIMITIVES:
        raise ValueError(f"primitive {prim.name!r} is declared twice")
    PRIMITIVES[prim.name] = prim
    return prim


def batch_elementwise(b: Any, e: Eqn, args: Sequence[Any], dims: Sequence[int | None]
                      ) -> tuple[list[Any], list[int | None]]:
    """The batching rule of every elementwise primitive (operands of one shape): each operand's batch axis at the
    first batched operand's position (broadcast where an operand is not batched), the same parameters."""
    d = next(d for d in dims if d is not None)
    outs = e.prim.replay([b.move(x, dx, d) for x, dx in zip(args, dims)], e, b.bind)
    return outs, [d] * len(outs)


def _same_aval(avals: Sequence[Aval], **_: Any) -> Aval:
    return avals[0]


stop_gradient_p = declare(Primitive(
    "stop_gradient", Kind.ELEMENTWISE, _same_aval, lambda x: np.array(x, copy=True),
    lambda cts, ins, outs: [None], lowerings("{0}"), batch=batch_elementwise))
