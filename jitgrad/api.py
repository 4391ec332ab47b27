"""The user-facing API: `trace`, the `Traced` object, and the composable transformations
`grad`, `value_and_grad` and `vjp`.

A `Traced` function keeps its plans in a `PlanCache` (one plan per call signature; `jitgrad.plans`),
binds arguments with `jitgrad.arguments` and runs on one backend (`jitgrad.backends`). Kernels are
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

from . import buffers
from .arguments import Arguments, arg_aval, as_tensors, numpy_args
from .autodiff import inline_graph, joint_vjp_graph, with_unit_cotangent
from .backends import backend
from .errors import InputError
from .explain import Explanation, ir_text, render
from .ir import Graph
from .plans import Plan, PlanCache
from .programs import has_scalar_output
from .traces import reading_captured, trace_to_graph
from .tracing import Tracer, current_builder
from .trees import unflatten_output

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

    def plan(self, *args: Any) -> Plan:
        """The plan for these arguments' signature, tracing the function on a miss."""
        args, _ = numpy_args(args, self.name, self.device)
        return self.plans.find(args)[0]

    def clear_cache(self) -> None:
        """Drop this function's plans (and with them their pooled output buffers); the next call traces again."""
        self.plans.clear()

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self.arguments.positional(args, kwargs)
        if any(isinstance(a, Tracer) for a in args) or current_builder() is not None:
            with reading_captured(self.fn):
                return self.fn(*args)
        args, tensors = numpy_args(args, self.name, self.device)
        plan, captured = self.plans.find(args)
        outs = [self.backend.result(o) for o in plan.call()(plan.inputs(args, captured))]
        return unflatten_output(plan.tree, as_tensors(outs) if tensors else outs)

    def _argnums(self, argnums: int | Sequence[int] | None, nargs: int) -> tuple[list[int], Callable[[list], Any]]:
        """Normalise argnums; returns the positions and how to shape the gradient result."""
        if argnums is None:
            return list(range(nargs)), tuple
        for a in [argnums] if isinstance(argnums, int) else argnums:
            if not -nargs <= int(a) < nargs:
                raise InputError(f"{self.name}: argnums {a} is out of range for {nargs} argument(s)")
        if isinstance(argnums, int):
            return [argnums % nargs], lambda g: g[0]
        return [int(a) % nargs for a in argnums], tuple

    def _check_grad_args(self, plan: Plan, positions: Sequence[int], explicit: bool) -> None:
        for i in positions:  # in range: `_argnums` checked
            a = plan.signature.avals[i]
            if explicit and (a is None or not a.is_float):
                what = "a static argument" if a is None else f"of dtype {a.dtype}"
                raise InputError(f"{self.name}: cannot differentiate with respect to argument {i}, which is {what}; "
                                 f"only float32/float64 arrays and Python floats have gradients")

    def _scalar_output(self, plan: Plan, what: str) -> None:
        if not has_scalar_output(plan.graph):
            shapes = [str(o.aval) for o in plan.graph.outputs]
            raise InputError(f"{self.name}.{what} needs a function returning one float scalar, but it returns "
                             f"{', '.join(shapes)}; reduce it (e.g. np.sum) or use vjp/backward with a cotangent")

    def value_and_grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> tuple[Any, Any]:
        """The scalar output and its gradient, computed by one fused forward+backward program."""
        if isinstance(argnums, list):
            argnums = tuple(argnums)  # a key of the compiled programs and the repeat-call table
        try:
            repeat = self.plans.fast_paths.get((argnums, self.arguments.fast_key(args)))
        except TypeError:  # an unhashable static argument: take the general path
            repeat = None
        if repeat is not None:
            return repeat(args)
        args, tensors = numpy_args(args, self.name, self.device)
        plan, captured = self.plans.find(args)
        exe, positions, wrt_args, shape_result = plan.built(("value_and_grad", argnums),
                                                            lambda: self._value_and_grad_program(plan, argnums))
        outs = exe(plan.inputs(args, captured))
        by_arg = dict(zip(wrt_args, outs[1:]))
        result = [self.backend.result(by_arg[i]) if i in by_arg else None for i in positions]
        value = [self.backend.result(outs[0])]
        if tensors:
            value, result = as_tensors(value), as_tensors(result)
        elif self.device == "cpu":
            fast = self.arguments.fast_key(args)
            if fast is not None:
                self.plans.fast_paths[(argnums, fast)] = self._repeat_value_and_grad(plan, exe, positions, wrt_args,
                                                                                     shape_result, argnums)
        return unflatten_output(plan.tree, value), shape_result(result)

    def _repeat_value_and_grad(self, plan: Plan, exe: Any, positions: list[int], wrt_args: list[int],
                               shape_result: Callable[[list], Any], argnums: Any
                               ) -> Callable[[Sequence[Any]], tuple[Any, Any]]:
        """value_and_grad for calls whose arguments match a seen signature exactly (numpy arrays of the same
        shapes and dtypes, or Python numbers): the plan lookup and result layout are done once, here."""
        dynamic, avals = plan.dynamic, plan.dynamic_avals
        out_index = {arg: k + 1 for k, arg in enumerate(wrt_args)}
        layout = [out_index.get(i) for i in positions]
        tree = plan.tree
        cache = self.plans
        inputs_of, result = self.backend.inputs, self.backend.result
        read_captured = plan.captures.read if plan.captures else None

        def run(args: Sequence[Any]) -> tuple[Any, Any]:
            inputs = inputs_of([args[i] for i in dynamic], avals)
            if read_captured is not None:
                captured = read_captured()
                if captured is None:  # a captured array changed: forget the plan, the general path traces again
                    with cache.lock:
                        cache.forget(plan)
                    return self.value_and_grad(*args, argnums=argnums)
                inputs += captured
            cache.stats["hits"] += 1
            cache.used(plan)
            outs = exe(inputs)
            grads = [None if k is None else result(outs[k]) for k in layout]
            return unflatten_output(tree, [result(outs[0])]), shape_result(grads)

        run.plan = plan  # type: ignore[attr-defined]  # so a re-traced plan's fast path is dropped
        return run

    def _value_and_grad_program(self, plan: Plan, argnums: int | Sequence[int] | None) -> tuple:
        self._scalar_output(plan, "value_and_grad")
        positions, shape_result = self._argnums(argnums, len(plan.signature.avals))
        self._check_grad_args(plan, positions, argnums is not None)
        wrt_args = [i for i in positions if plan.signature.avals[i] is not None and plan.signature.avals[i].is_float]
        return plan.value_and_grad(plan.differentiable(wrt_args)), positions, wrt_args, shape_result

    def grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> Any:
        """Gradient of the scalar output: a tuple over all arguments (None where not differentiable),
        or one array for an int `argnums`."""
        return self.value_and_grad(*args, argnums=argnums)[1]

    def forward(self, *args: Any) -> tuple[Any, Context]:
        """Run the compiled forward, keeping the residuals the backward needs in a context."""
        args, tensors = numpy_args(args, self.name, self.device)
        plan, captured = self.plans.find(args)
        split = plan.split()
        outs = split.forward(plan.inputs(args, captured))
        n = split.graphs.n_outputs
        results = [self.backend.result(o) for o in outs[:n]]
        return (unflatten_output(plan.tree, as_tensors(results) if tensors else results),
                Context(plan, outs[n:], tensors))

    def backward(self, ctx: Context, *grad_outputs: Any) -> tuple[Any, ...]:
        """Gradients for every argument (None where not differentiable) given the outputs' cotangents.
        May be called any number of times with the same context."""
        if not isinstance(ctx, Context):
            raise InputError(f"{self.name}.backward: the first argument must be the context returned by forward")
        plan = ctx.plan
        split = plan.split()
        grad_outputs, _ = numpy_args(grad_outputs, f"{self.name}.backward", self.device)
        outs = plan.graph.outputs
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
        grads = split.backward(list(ctx.residuals) + cts)
        by_input = dict(zip(split.wrt, grads))
        dyn = plan.dynamic
        result = [self.backend.result(by_input[dyn.index(i)]) if i in dyn and dyn.index(i) in by_input else None
                  for i in range(len(plan.signature.avals))]
        return tuple(as_tensors(result) if ctx.torch_outputs else result)

    def vjp(self, *args: Any) -> tuple[Any, Callable[..., tuple[Any, ...]]]:
        """The outputs and a pullback mapping output cotangents to argument gradients."""
        out, ctx = self.forward(*args)

        def pullback(*cotangents: Any) -> tuple[Any, ...]:
            if len(cotangents) == 1 and isinstance(cotangents[0], (tuple, list)) and len(ctx.plan.graph.outputs) > 1:
                cotangents = tuple(cotangents[0])
            return self.backward(ctx, *cotangents)

        return out, pullback

    # ------------------------------------------------------------------ inspection

    def _explanation(self, plan: Plan) -> Explanation:
        wrt = plan.differentiable(plan.dynamic)
        return Explanation(self.name, plan.graph, wrt, plan.split().graphs if wrt else None, plan.captures)

    def ir(self, *args: Any) -> str:
        """The forward IR, and the backward IR with the residuals it takes (and their bytes), as text."""
        return ir_text(self._explanation(self.plan(*args)))

    def explain(self, *args: Any, format: str = "text") -> str:
        """IR, saved values, fusion groups and kernel source of each compiled program (call, value-and-grad,
        forward, backward); format="dot" gives a Graphviz DOT of the forward and backward graphs."""
        return render(self._explanation(self.plan(*args)), format)

    def kernel_counts(self, *args: Any) -> dict[str, int]:
        """How many fused kernels each mode runs for these arguments (compiles what it needs)."""
        return self.plan(*args).kernel_counts()

    def cache_info(self) -> dict[str, int]:
        """This function's plan cache (hits, misses, plans held) and, for the whole process, kernel sources
        held, machine-code compiles and kernels loaded from the disk cache (CUDA ones for device="cuda")."""
        return {**self.plans.stats, "entries": len(self.plans.plans), **self.backend.stats()}


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
    """Compile a numpy function: `@jg.trace` or `@jg.trace(static_argnums=(1,))`; `device="cuda"` runs it on
    a CUDA GPU (or numba's CUDA simulator) with device arrays in and out."""
    if fn is None:
        return lambda f: Traced(f, static_argnums=static_argnums, device=device)
    return Traced(fn, static_argnums=static_argnums, device=device)


# ---------------------------------------------------------------------- transformations

def _traced_value_and_grad(fn: Callable[..., Any], args: Sequence[Any], argnums: int | Sequence[int]) -> Any:
    """value_and_grad inside an enclosing trace: differentiate a subgraph and inline it."""
    positions = [argnums] if isinstance(argnums, int) else list(argnums)
    avals = [a.aval if isinstance(a, Tracer) else arg_aval(i, a, getattr(fn, '__name__', 'function'))
             for i, a in enumerate(args)]
    traced = trace_to_graph(fn, avals)
    graph = traced.graph
    if len(graph.outputs) != 1 or graph.outputs[0].aval.size != 1:
        raise InputError(f"grad of {getattr(fn, '__name__', 'function')} needs a scalar output, got "
                         f"{[str(o.aval) for o in graph.outputs]}")
    joint = with_unit_cotangent(joint_vjp_graph(graph, positions), len(graph.inputs))
    outs = inline_graph(joint, list(args) + traced.outer)
    value, grads = outs[0], outs[1:]
    return unflatten_output(traced.tree, [value]), grads[0] if isinstance(argnums, int) else tuple(grads)


def value_and_grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., tuple[Any, Any]]:
    """A function returning (fn(*args), gradient w.r.t. `argnums`); composable with itself and `grad`."""
    base = fn.fn if isinstance(fn, Traced) else fn
    compiled: list[Traced] = []

    def value_and_grad_fn(*args: Any) -> tuple[Any, Any]:
        if any(isinstance(a, Tracer) for a in args) or current_builder() is not None:
            return _traced_value_and_grad(base, args, argnums)
        if not compiled:
            compiled.append(Traced(base))
        return compiled[0].value_and_grad(*args, argnums=argnums)

    value_and_grad_fn.__name__ = f"value_and_grad_{getattr(base, '__name__', 'fn')}"
    return value_and_grad_fn


def grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """A function returning the gradient of scalar `fn` w.r.t. `argnums`; `grad(grad(f))` works."""
    vg = value_and_grad(fn, argnums)

    def grad_fn(*args: Any) -> Any:
        return vg(*args)[1]

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return grad_fn


def vjp(fn: Callable[..., Any], *args: Any) -> tuple[Any, Callable[..., tuple[Any, ...]]]:
    """(fn(*args), pullback): pullback(cotangent) gives one gradient per argument."""
    base = fn.fn if isinstance(fn, Traced) else fn
    if not (any(isinstance(a, Tracer) for a in args) or current_builder() is not None):
        return Traced(base).vjp(*args)
    avals = [a.aval if isinstance(a, Tracer) else arg_aval(i, a, getattr(base, '__name__', 'function'))
             for i, a in enumerate(args)]
    traced = trace_to_graph(base, avals)
    graph, captured = traced.graph, traced.outer
    wrt = [i for i, a in enumerate(avals) if a.is_float]
    joint = joint_vjp_graph(graph, wrt)
    n_out = len(graph.outputs)
    primal_outs = inline_graph(Graph(graph.inputs, graph.eqns, graph.outputs, graph.input_names),
                               list(args) + captured)

    def pullback(*cotangents: Any) -> tuple[Any, ...]:
        if len(cotangents) == 1 and isinstance(cotangents[0], (tuple, list)) and n_out > 1:
            cotangents = tuple(cotangents[0])
        outs = inline_graph(joint, list(args) + captured + list(cotangents))
        grads = dict(zip(wrt, outs[n_out:]))
        return tuple(grads.get(i) for i in range(len(args)))

    return unflatten_output(traced.tree, primal_outs), pullback
