"""The user-facing API: `trace` and the `Traced` object (the composable transformations `grad`,
`value_and_grad` and `vjp` are in `jitgrad.front.transforms`).

A `Traced` function keeps its plans in a `PlanCache` (one plan per call signature; `jitgrad.runtime.plans`),
binds arguments with `jitgrad.runtime.arguments` and runs on one backend (`jitgrad.runtime.backends`). Kernels are
shared between plans through the compiler's source cache, so a new length of the same rank compiles
no new numba code.
"""
from __future__ import annotations

import functools
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.kernels import buffers
from jitgrad.passes import recipes
from jitgrad.tracing import trees
from jitgrad.runtime.arguments import LEAF, STATIC, Arguments, as_tensors, numpy_args
from jitgrad.runtime.backends import backend
from jitgrad.errors import InputError
from jitgrad.front.explain import Explanation, ir_text, render
from jitgrad.runtime.plans import Plan, PlanCache
from jitgrad.runtime.repeats import MISS
from jitgrad.tracing.traced import reading_captured
from jitgrad.tracebacks import api_boundary, filtered, keeps_all_frames
from jitgrad.tracing.tracer import Tracer, current_builder
from jitgrad.tracing.trees import unflatten_output

_traced_functions: "weakref.WeakSet[Traced]" = weakref.WeakSet()


def clear_caches() -> None:
    """Drop every traced function's plans and every pooled output buffer (compiled kernels stay loaded,
    and the disk cache is untouched): memory back after, say, many shapes of a function."""
    for traced in list(_traced_functions):
        traced.clear_cache()
    buffers.budget.clear()


@dataclass
class Context:
    """What `Traced.forward` keeps for `backward`: the residuals and how to map gradients back."""

    plan: Plan
    residuals: list[Any]
    torch_outputs: bool = False  # the forward took torch tensors: backward returns tensors too

    @property
    def saved_bytes(self) -> int:
        return sum(r.nbytes for r in self.residuals)


class Traced:
    """A numpy function compiled by jitgrad: call it, or ask for gradients, VJPs, IR and kernels."""

    def __init__(self, fn: Callable[..., Any], static_argnums: Sequence[int] | int = (), device: str = "cpu"):
        if isinstance(fn, Traced):
            fn = fn.fn
        self.backend = backend(device)
        self.fn = fn
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.device = device
        functools.update_wrapper(self, fn)
        self.arguments = Arguments(fn, self.name, self.static_argnums, device)
        self.plans = PlanCache(fn, self.arguments, self.backend)
        _traced_functions.add(self)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "function")

    def __repr__(self) -> str:
        return f"<jitgrad.Traced {self.name}>"

    def __reduce__(self) -> Any:
        """Pickle by reference to the wrapped function; plans and kernels are rebuilt where it is unpickled
        (from that process's caches). A traced function that is its module's attribute pickles as that
        global, so `@jg.trace` on a module-level function works with pickle and "spawn" pools; a function
        defined in `__main__` travels by value under cloudpickle (Dask), which copies its code."""
        module = sys.modules.get(getattr(self.fn, "__module__", None) or "")
        qualname = getattr(self.fn, "__qualname__", "")
        by_name = module is not None and "<" not in qualname and _resolve(module, qualname) is self
        if by_name and not (module.__name__ == "__main__" and _pickling_by_value()):
            return qualname
        return (Traced, (self.fn, self.static_argnums, self.device))

    # ------------------------------------------------------------------ plans

    @api_boundary
    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """The plan for these arguments' signature, tracing the function on a miss."""
        return self.plans.find(self._call(args, kwargs))[0]

    def clear_cache(self) -> None:
        """Drop this function's plans (and with them their pooled output buffers); the next call traces again."""
        self.plans.clear()

    def _call(self, args: tuple, kwargs: dict) -> Any:
        """A call's arguments bound by the function's signature and flattened (`jitgrad.runtime.arguments.Call`)."""
        return self.arguments.prepare(tuple(self.arguments.bound(args, kwargs)))

    def _results(self, values: list[Any], tensors: bool) -> list[Any]:
        results = [None if v is None else self.backend.result(v) for v in values]
        return as_tensors(results) if tensors else results

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:  # `api_boundary` inlined: the hot entry points spare its frame
            tracing = current_builder() is not None
            if not kwargs and not tracing:
                found = self.plans.repeat("call", args)  # a repeat call: one generated function (`RepeatCall`)
                if found is not MISS:
                    return found
            if tracing or any(isinstance(a, Tracer) for a in args):
                if kwargs:
                    args = self.arguments.positional(args, kwargs)
                with reading_captured(self.fn):
                    return self.fn(*args)
            call = self._call(args, kwargs)
            plan, captured = self.plans.find(call)
            exe = plan.call()
            outs = exe(plan.inputs(call.leaves, captured))
            n = len(outs)  # (the closure below must not keep the outputs: their buffers return to the pool)
            self.plans.remember("call", call, plan, exe, lambda src, out: trees.expression(
                src, plan.tree, [out(k) for k in range(n)]))
            return unflatten_output(plan.tree, self._results(outs, call.tensors))
        except Exception as exc:
            if keeps_all_frames(exc):
                raise
            raise filtered(exc)

    def _argnums(self, argnums: int | Sequence[int], nargs: int) -> tuple[list[int], Callable[[list], Any]]:
        """Normalise argnums (never None: `value_and_grad` made it 0); returns the positions and how to shape the
        gradient result: one gradient for an int, a tuple for a sequence, as `jg.grad` and JAX."""
        for a in [argnums] if isinstance(argnums, int) else argnums:
            if not -nargs <= int(a) < nargs:
                raise InputError(f"{self.name}: argnums {a} is out of range for {nargs} argument(s)")
        if isinstance(argnums, int):
            return [argnums % nargs], lambda g: g[0]
        return [int(a) % nargs for a in argnums], tuple

    def _check_grad_args(self, plan: Plan, positions: Sequence[int]) -> None:
        for i in positions:  # in range: `_argnums` checked
            structure = plan.signature.structures[i]
            leaves = [plan.signature.avals[k] for k in plan.leaf_ranges[i]]
            if structure == "static" or not any(a.is_float for a in leaves):
                what = "a static argument" if structure == "static" else \
                    f"of dtype {leaves[0].dtype}" if len(leaves) == 1 else "without float leaves"
                raise InputError(f"{self.name}: cannot differentiate with respect to argument {i}, which is {what}; "
                                 f"only float32/float64 arrays and Python floats have gradients")

    def _scalar_output(self, plan: Plan, what: str, has_aux: bool) -> None:
        if has_aux and not trees.is_value_aux_pair(plan.tree):
            raise InputError(f"{self.name}.{what}(..., has_aux=True) needs a function returning a pair "
                             f"(loss, aux) with one array as loss; it returns the structure {plan.tree}")
        if not recipes.has_scalar_output(plan.graph, has_aux):
            shapes = [str(o.aval) for o in plan.graph.outputs]
            raise InputError(f"{self.name}.{what} needs a function returning one float scalar"
                             f"{' first (then its aux)' if has_aux else ''}, but it returns {', '.join(shapes)}; "
                             f"reduce it (e.g. np.sum), return (loss, aux) with has_aux=True, or use vjp/backward "
                             f"with a cotangent")

    def value_and_grad(self, *args: Any, argnums: int | Sequence[int] | None = None, argnames: Any = None,
                       has_aux: bool = False, **kwargs: Any) -> tuple[Any, Any]:
        """The scalar output and its gradient, computed by one fused forward+backward program. The gradient's
        structure follows `jg.grad` and JAX: with respect to argument 0 by default (one gradient); an int
        `argnums` gives one gradient, a tuple `argnums=(0, 1, ...)` a tuple of them; `argnames` picks arguments
        by parameter name. Gradients come in each argument's own structure (a dict of parameters gives a dict
        of gradients). With `has_aux=True` the function returns (loss, aux): the result is ((loss, aux), grads)."""
        try:  # `api_boundary` inlined, as in __call__
            key = ("value_and_grad", argnums, argnames, has_aux)  # the options as given: a repeat call's key
            if not kwargs:
                found = self.plans.repeat(key, args)
                if found is not MISS:
                    return found
            argnums = self.arguments.positions(argnums, argnames)
            if argnums is None:
                argnums = 0  # JAX's default, and jg.grad's (not every argument: write argnums=(0, 1, ...))
            if isinstance(argnums, list):
                argnums = tuple(argnums)  # a key of the compiled programs
            call = self._call(args, kwargs)
            plan, captured = self.plans.find(call)
            exe, positions, shape_result = plan.built(("value_and_grad", argnums, has_aux),
                                                      lambda: self._value_and_grad_program(plan, argnums, has_aux))
            outs = exe(plan.inputs(call.leaves, captured))
            result = self._value_and_grad_result(plan, outs, positions, shape_result, call.tensors)
            self.plans.remember(key, call, plan, exe, self._repeat_results(plan, positions, shape_result))
            return result
        except Exception as exc:
            if keeps_all_frames(exc):
                raise
            raise filtered(exc)

    def _value_and_grad_result(self, plan: Plan, outs: list[Any], positions: list[int],
                               shape_result: Callable[[list], Any], tensors: bool) -> tuple[Any, Any]:
        n_values = len(plan.graph.outputs)
        wrt = plan.differentiable(positions)
        grads = dict(zip(wrt, self._results(outs[n_values:], tensors)))
        values = unflatten_output(plan.tree, self._results(outs[:n_values], tensors))
        return values, shape_result(plan.per_argument(grads, positions))

    @staticmethod
    def _repeat_results(plan: Plan, positions: list[int], shape_result: Callable[[list], Any]) -> Callable[..., str]:
        """For `PlanCache.remember`: the expression of what `_value_and_grad_result` returns, from the expression
        `out(k)` of each output as a result."""
        def results(src: trees.Source, out: Callable[[int], str]) -> str:
            n, wrt = len(plan.graph.outputs), plan.differentiable(positions)
            grads = []
            for i in positions:
                structure = plan.signature.structures[i]
                leaves = [out(n + wrt.index(k)) if k in wrt else "None" for k in plan.leaf_ranges[i]]
                grads.append("None" if structure is STATIC else leaves[0] if structure is LEAF
                             else trees.expression(src, structure, leaves))
            shaped = f"({', '.join(grads)}{',' * bool(grads)})" if shape_result is tuple else grads[0]
            return f"({trees.expression(src, plan.tree, [out(k) for k in range(n)])}, {shaped})"
        return results

    def _value_and_grad_program(self, plan: Plan, argnums: int | Sequence[int] | None, has_aux: bool) -> tuple:
        self._scalar_output(plan, "value_and_grad", has_aux)
        positions, shape_result = self._argnums(argnums, len(plan.signature.structures))
        self._check_grad_args(plan, positions)
        return plan.value_and_grad(plan.differentiable(positions), has_aux), positions, shape_result

    @api_boundary
    def grad(self, *args: Any, argnums: int | Sequence[int] | None = None, argnames: Any = None,
             has_aux: bool = False, **kwargs: Any) -> Any:
        """Gradient of the scalar output with respect to argument 0 (JAX's and `jg.grad`'s default): one gradient
        for an int `argnums`, a tuple for `argnums=(0, 1, ...)`; each in its argument's structure. With
        `has_aux`, (grads, aux)."""
        (value, grads) = self.value_and_grad(*args, argnums=argnums, argnames=argnames, has_aux=has_aux, **kwargs)
        return (grads, value[1]) if has_aux else grads

    @api_boundary
    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, Context]:
        """Run the compiled forward, keeping the residuals the backward needs in a context."""
        call = self._call(args, kwargs)
        plan, captured = self.plans.find(call)
        split = plan.split()
        outs = split.forward(plan.inputs(call.leaves, captured))
        n = split.graphs.n_outputs
        return unflatten_output(plan.tree, self._results(outs[:n], call.tensors)), Context(plan, outs[n:],
                                                                                             call.tensors)

    @api_boundary
    def backward(self, ctx: Context, *grad_outputs: Any) -> tuple[Any, ...]:
        """Gradients for every argument (None where not differentiable, in each argument's structure) given
        the outputs' cotangents (one per output leaf, or a tree of the outputs' structure). May be called any
        number of times with the same context."""
        if not isinstance(ctx, Context):
            raise InputError(f"{self.name}.backward: the first argument must be the context returned by forward")
        plan = ctx.plan
        split = plan.split()
        outs = plan.graph.outputs
        if len(grad_outputs) == 1 and len(outs) > 1 and not isinstance(grad_outputs[0], np.ndarray):
            grad_outputs = tuple(trees.tree_leaves(grad_outputs[0]))
        grad_outputs, _ = numpy_args(grad_outputs, f"{self.name}.backward", self.device)
        if len(grad_outputs) != len(outs):
            raise InputError(f"{self.name}.backward: expected {len(outs)} cotangent(s), one per output, got "
                             f"{len(grad_outputs)}")
        cts = []
        for k, (g, o) in enumerate(zip(grad_outputs, outs)):
            arr = np.zeros(o.aval.shape, o.aval.dtype) if not o.aval.is_float else \
                self.backend.cotangent(g, o.aval, f"{self.name}.backward", k)
            if arr.shape != o.aval.shape:
                raise InputError(f"{self.name}.backward: cotangent {k} has shape {arr.shape} but output {k} has shape "
                                 f"{o.aval.shape}")
            cts.append(arr)
        grads = dict(zip(split.wrt, self._results(split.backward(list(ctx.residuals) + cts), ctx.torch_outputs)))
        return tuple(plan.per_argument(grads, range(len(plan.signature.structures))))

    @api_boundary
    def vjp(self, *args: Any, **kwargs: Any) -> tuple[Any, Callable[..., tuple[Any, ...]]]:
        """The outputs and a pullback mapping output cotangents to argument gradients."""
        out, ctx = self.forward(*args, **kwargs)

        @api_boundary
        def pullback(*cotangents: Any) -> tuple[Any, ...]:
            if len(cotangents) == 1 and isinstance(cotangents[0], (tuple, list)) and len(ctx.plan.graph.outputs) > 1:
                cotangents = tuple(cotangents[0])
            return self.backward(ctx, *cotangents)

        return out, pullback

    # ------------------------------------------------------------------ inspection

    def _explanation(self, plan: Plan) -> Explanation:
        wrt = plan.all_differentiable()
        return Explanation(self.name, plan.graph, wrt, plan.split().graphs if wrt else None, plan.captures)

    @api_boundary
    def ir(self, *args: Any, **kwargs: Any) -> str:
        """The forward IR, and the backward IR with the residuals it takes (and their bytes), as text."""
        return ir_text(self._explanation(self.plan(*args, **kwargs)))

    @api_boundary
    def explain(self, *args: Any, format: str = "text", **kwargs: Any) -> str:
        """IR, saved values, fusion groups and kernel source of each compiled program (call, value-and-grad,
        forward, backward); format="dot" gives a Graphviz DOT of the forward and backward graphs."""
        return render(self._explanation(self.plan(*args, **kwargs)), format)

    @api_boundary
    def kernel_counts(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        """How many fused kernels each mode runs for these arguments (compiles what it needs)."""
        return self.plan(*args, **kwargs).kernel_counts()

    def cache_info(self) -> dict[str, int]:
        """Counters, to see what a call traced and compiled. Per function: `hits` and `misses` of its plan cache
        (a miss traces) and `entries`, the plans it holds. Per process, shared by every traced function (kernels
        are shared): `kernels`, kernel sources held; `compiles`, machine code numba built; `disk_loads`, machine
        code loaded from the disk cache instead (a warm process: compiles 0); `numpy_calls`, first calls run on numpy while
        their kernels compiled (the first-call tier; JITGRAD_FIRST_CALL); `one_core_calls`, calls run with every kernel
        serial and no product split over threads, because that proved faster than spreading them over the cores. A
        device backend's for its device."""
        return {**self.plans.info(), **self.backend.stats()}


def _resolve(module: Any, qualname: str) -> Any:
    """The object at dotted `qualname` in `module`, or None."""
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _pickling_by_value() -> bool:
    """Is cloudpickle the pickler calling us? It copies `__main__` functions by value, which a worker
    process that never ran the user's script needs; plain pickle looks them up by name."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("cloudpickle"):
            return True
        frame = frame.f_back
    return False


def trace(fn: Callable[..., Any] | None = None, *, static_argnums: Sequence[int] | int = (),
          device: str = "cpu") -> Any:
    """Compile a numpy function: `@jg.trace` or `@jg.trace(static_argnums=(1,))`; `device` names the backend it
    runs on (`jitgrad.runtime.backends.REGISTRY`: "cpu", or a GPU's, with its device arrays in and out)."""
    if fn is None:
        return lambda f: Traced(f, static_argnums=static_argnums, device=device)
    return Traced(fn, static_argnums=static_argnums, device=device)
