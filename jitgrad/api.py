"""The user-facing API: `trace`, the `Traced` object, and the composable transformations
`grad`, `value_and_grad` and `vjp`.

A `Traced` function keeps one `Plan` per call signature (input shapes, dtypes, weak types and
static arguments). A plan holds the traced graph and, built on first use, an executable per
mode: plain call, value-and-grad (one joint forward+backward program), and the forward/backward
pair used by `forward`/`backward`/`vjp`. Kernels are shared between plans through the compiler's
source cache, so a new length of the same rank compiles no new numba code.
"""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import fusion, passes
from .autodiff import inline_graph, joint_vjp_graph, split_forward_backward, with_unit_cotangent
from .errors import InputError, UnsupportedError
from .ir import Aval, Graph, format_graph
from .kernels import compiler, cpu
from .runtime import Executable
from .tracing import SUPPORTED_DTYPES, Tracer, current_builder, trace_to_graph, unflatten_output

_WEAK_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}


@dataclass(frozen=True)
class CallSignature:
    """What a plan is specialised on: per argument an aval, or the static value itself."""

    avals: tuple[Aval | None, ...]
    statics: tuple[tuple[int, Any], ...]


def _arg_aval(i: int, x: Any, fname: str) -> Aval:
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return Aval((), _WEAK_DTYPES[type(x)], True)
    if isinstance(x, (np.ndarray, np.generic)):
        dt = np.asarray(x).dtype
        if dt not in SUPPORTED_DTYPES:
            raise InputError(f"{fname}: argument {i} has dtype {dt}; jitgrad accepts float32, float64, integer and "
                             f"bool arrays (complex, object, string and float16 are not supported)")
        return Aval(np.shape(x), dt, False)
    raise InputError(f"{fname}: argument {i} is a {type(x).__name__}; pass numpy arrays or Python numbers, or list "
                     f"its position in static_argnums if it is a configuration value")


def _as_array(x: Any, aval: Aval) -> np.ndarray:
    return np.asarray(x, dtype=aval.dtype)


def _result(a: np.ndarray) -> Any:
    """0-d results come back as numpy scalars, like numpy reductions return them."""
    return a[()] if a.ndim == 0 else a


@dataclass
class Context:
    """What `Traced.forward` keeps for `backward`: the residuals and how to map gradients back."""

    plan: "Plan"
    residuals: list[np.ndarray]

    @property
    def saved_bytes(self) -> int:
        return sum(r.nbytes for r in self.residuals)


@dataclass
class Plan:
    """Everything compiled for one call signature of a traced function."""

    signature: CallSignature
    graph: Graph
    tree: Any
    names: list[str]
    executables: dict[Any, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def dynamic(self) -> list[int]:
        return [i for i, a in enumerate(self.signature.avals) if a is not None]

    def differentiable(self, argnums: Sequence[int]) -> list[int]:
        """Graph input positions (among dynamic args) for the float arguments in `argnums`."""
        dyn = self.dynamic
        return [dyn.index(i) for i in argnums if i in dyn and self.signature.avals[i].is_float]

    def built(self, key: Any, build: Callable[[], Any]) -> Any:
        found = self.executables.get(key)
        if found is None:
            with self.lock:
                found = self.executables.get(key)
                if found is None:
                    found = build()
                    self.executables[key] = found
        return found


def _compile(graph: Graph) -> Executable:
    return Executable(fusion.schedule(passes.optimize(graph)))


class Traced:
    """A numpy function compiled by jitgrad: call it, or ask for gradients, VJPs, IR and kernels."""

    def __init__(self, fn: Callable[..., Any], static_argnums: Sequence[int] | int = (), device: str = "cpu"):
        if isinstance(fn, Traced):
            fn = fn.fn
        if device != "cpu":
            raise UnsupportedError(f"device {device!r} is not available; jitgrad supports device='cpu'")
        self.fn = fn
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.device = device
        self._plans: dict[CallSignature, Plan] = {}
        self._lock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0}
        functools.update_wrapper(self, fn)
        try:
            self._param_names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._param_names = []

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "function")

    def __repr__(self) -> str:
        return f"<jitgrad.Traced {self.name}>"

    # ------------------------------------------------------------------ plans

    def _signature(self, args: Sequence[Any]) -> CallSignature:
        avals: list[Aval | None] = []
        statics = []
        for i, x in enumerate(args):
            if i in self.static_argnums:
                try:
                    hash(x)
                except TypeError:
                    raise InputError(f"{self.name}: static argument {i} must be hashable, got a "
                                     f"{type(x).__name__}") from None
                statics.append((i, x))
                avals.append(None)
            else:
                avals.append(_arg_aval(i, x, self.name))
        return CallSignature(tuple(avals), tuple(statics))

    def _check_arity(self, args: Sequence[Any]) -> None:
        try:
            inspect.signature(self.fn).bind(*args)
        except TypeError as exc:
            raise InputError(f"{self.name}: {exc}") from None
        except ValueError:
            pass

    def plan(self, *args: Any) -> Plan:
        """The plan for these arguments' signature, tracing the function on a miss."""
        self._check_arity(args)
        sig = self._signature(args)
        found = self._plans.get(sig)
        if found is not None:
            self._stats["hits"] += 1
            return found
        with self._lock:
            found = self._plans.get(sig)
            if found is not None:
                self._stats["hits"] += 1
                return found
            self._stats["misses"] += 1
            statics = dict(sig.statics)
            dyn = [i for i, a in enumerate(sig.avals) if a is not None]

            def call_with_statics(*dynamic: Any) -> Any:
                full = list(args)
                for i, v in zip(dyn, dynamic):
                    full[i] = v
                for i, v in statics.items():
                    full[i] = v
                return self.fn(*full)

            names = [self._param_names[i] if i < len(self._param_names) else f"arg{i}" for i in dyn]
            graph, tree, captured = trace_to_graph(call_with_statics, [sig.avals[i] for i in dyn], names, parent=None)
            plan = Plan(sig, graph, tree, names)
            self._plans[sig] = plan
            return plan

    def _inputs(self, plan: Plan, args: Sequence[Any]) -> list[np.ndarray]:
        return [_as_array(args[i], plan.signature.avals[i]) for i in plan.dynamic]

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(a, Tracer) for a in args) or current_builder() is not None:
            return self.fn(*args)
        plan = self.plan(*args)
        exe = plan.built("call", lambda: _compile(plan.graph))
        outs = exe(self._inputs(plan, args))
        return unflatten_output(plan.tree, [_result(o) for o in outs])

    def _argnums(self, argnums: int | Sequence[int] | None, nargs: int) -> tuple[list[int], Callable[[list], Any]]:
        """Normalise argnums; returns the positions and how to shape the gradient result."""
        if argnums is None:
            return list(range(nargs)), tuple
        if isinstance(argnums, int):
            return [argnums % nargs if nargs else argnums], lambda g: g[0]
        return [int(a) % nargs for a in argnums], tuple

    def _check_grad_args(self, plan: Plan, positions: Sequence[int], explicit: bool) -> None:
        for i in positions:
            if i >= len(plan.signature.avals):
                raise InputError(f"{self.name}: argnums {i} is out of range for {len(plan.signature.avals)} arguments")
            a = plan.signature.avals[i]
            if explicit and (a is None or not a.is_float):
                what = "a static argument" if a is None else f"of dtype {a.dtype}"
                raise InputError(f"{self.name}: cannot differentiate with respect to argument {i}, which is {what}; "
                                 f"only float32/float64 arrays and Python floats have gradients")

    def _scalar_output(self, plan: Plan, what: str) -> None:
        outs = plan.graph.outputs
        if len(outs) != 1 or outs[0].aval.size != 1 or not outs[0].aval.is_float:
            shapes = [str(o.aval) for o in outs]
            raise InputError(f"{self.name}.{what} needs a function returning one float scalar, but it returns "
                             f"{', '.join(shapes)}; reduce it (e.g. np.sum) or use vjp/backward with a cotangent")

    def value_and_grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> tuple[Any, Any]:
        """The scalar output and its gradient, computed by one fused forward+backward program."""
        plan = self.plan(*args)
        self._scalar_output(plan, "value_and_grad")
        positions, shape_result = self._argnums(argnums, len(args))
        self._check_grad_args(plan, positions, argnums is not None)
        wrt_args = [i for i in positions if plan.signature.avals[i] is not None and plan.signature.avals[i].is_float]
        wrt = plan.differentiable(wrt_args)
        key = ("value_and_grad", tuple(wrt))
        exe = plan.built(key, lambda: _compile(with_unit_cotangent(joint_vjp_graph(plan.graph, wrt),
                                                                     len(plan.graph.inputs))))
        outs = exe(self._inputs(plan, args))
        value, grads = outs[0], outs[1:]
        by_arg = dict(zip(wrt_args, grads))
        result = [_result(by_arg[i]) if i in by_arg else None for i in positions]
        return unflatten_output(plan.tree, [_result(value)]), shape_result(result)

    def grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> Any:
        """Gradient of the scalar output: a tuple over all arguments (None where not differentiable),
        or one array for an int `argnums`."""
        return self.value_and_grad(*args, argnums=argnums)[1]

    def _split(self, plan: Plan) -> Any:
        def build() -> Any:
            wrt = plan.differentiable(plan.dynamic)
            joint = joint_vjp_graph(plan.graph, wrt)
            split = split_forward_backward(joint, len(plan.graph.inputs), len(plan.graph.outputs))
            return split, _compile(split.forward), _compile(split.backward), wrt
        return plan.built("split", build)

    def forward(self, *args: Any) -> tuple[Any, Context]:
        """Run the compiled forward, keeping the residuals the backward needs in a context."""
        plan = self.plan(*args)
        split, fwd, _, _ = self._split(plan)
        outs = fwd(self._inputs(plan, args))
        n = split.n_outputs
        return unflatten_output(plan.tree, [_result(o) for o in outs[:n]]), Context(plan, outs[n:])

    def backward(self, ctx: Context, *grad_outputs: Any) -> tuple[Any, ...]:
        """Gradients for every argument (None where not differentiable) given the outputs' cotangents.
        May be called any number of times with the same context."""
        if not isinstance(ctx, Context):
            raise InputError(f"{self.name}.backward: the first argument must be the context returned by forward")
        plan = ctx.plan
        split, _, bwd, wrt = self._split(plan)
        outs = plan.graph.outputs
        if len(grad_outputs) != len(outs):
            raise InputError(f"{self.name}.backward: expected {len(outs)} cotangent(s), one per output, got "
                             f"{len(grad_outputs)}")
        cts = []
        for k, (g, o) in enumerate(zip(grad_outputs, outs)):
            arr = np.asarray(g, dtype=o.aval.dtype) if o.aval.is_float else np.zeros(o.aval.shape, o.aval.dtype)
            if arr.shape != o.aval.shape:
                raise InputError(f"{self.name}.backward: cotangent {k} has shape {arr.shape} but output {k} has shape "
                                 f"{o.aval.shape}")
            cts.append(arr)
        grads = bwd(list(ctx.residuals) + cts)
        by_input = dict(zip(wrt, grads))
        dyn = plan.dynamic
        return tuple(_result(by_input[dyn.index(i)]) if i in dyn and dyn.index(i) in by_input else None
                     for i in range(len(plan.signature.avals)))

    def vjp(self, *args: Any) -> tuple[Any, Callable[..., tuple[Any, ...]]]:
        """The outputs and a pullback mapping output cotangents to argument gradients."""
        out, ctx = self.forward(*args)

        def pullback(*cotangents: Any) -> tuple[Any, ...]:
            if len(cotangents) == 1 and isinstance(cotangents[0], (tuple, list)) and len(ctx.plan.graph.outputs) > 1:
                cotangents = tuple(cotangents[0])
            return self.backward(ctx, *cotangents)

        return out, pullback

    # ------------------------------------------------------------------ inspection

    def ir(self, *args: Any) -> str:
        """The forward IR, and the backward IR with the residuals it takes, as text."""
        plan = self.plan(*args)
        text = [format_graph(plan.graph, "# traced forward")]
        if plan.differentiable(plan.dynamic):
            split = self._split(plan)[0]
            text.append(format_graph(passes.optimize(split.forward), "# optimised forward (outputs, then residuals)"))
            text.append(format_graph(passes.optimize(split.backward), "# optimised backward (residuals, cotangents)"))
        return "\n\n".join(text)

    def explain(self, *args: Any) -> str:
        """IR, fusion groups and generated kernel source for the call and for value-and-grad."""
        plan = self.plan(*args)
        parts = [self.ir(*args)]
        modes = [("call", passes.optimize(plan.graph))]
        outs = plan.graph.outputs
        wrt = plan.differentiable(plan.dynamic)
        if wrt and len(outs) == 1 and outs[0].aval.size == 1 and outs[0].aval.is_float:
            joint = with_unit_cotangent(joint_vjp_graph(plan.graph, wrt), len(plan.graph.inputs))
            modes.append(("value_and_grad", passes.optimize(joint)))
        for name, graph in modes:
            program = fusion.schedule(graph)
            parts.append(f"# {name}: {len(program.kernels)} kernel(s)\n{fusion.describe(program)}")
            for k, kern in enumerate(program.kernels):
                parts.append(f"# {name} kernel {k} source\n{cpu.generate(kern, f'kernel_{k}')}")
        return "\n\n".join(parts)

    def kernel_counts(self, *args: Any) -> dict[str, int]:
        """How many fused kernels each mode runs for these arguments (compiles what it needs)."""
        plan = self.plan(*args)
        counts = {"call": _compile(plan.graph).kernel_count}
        outs = plan.graph.outputs
        wrt = plan.differentiable(plan.dynamic)
        if wrt and len(outs) == 1 and outs[0].aval.size == 1 and outs[0].aval.is_float:
            joint = with_unit_cotangent(joint_vjp_graph(plan.graph, wrt), len(plan.graph.inputs))
            counts["value_and_grad"] = _compile(joint).kernel_count
        if wrt:
            _, fwd, bwd, _ = self._split(plan)
            counts["forward"], counts["backward"] = fwd.kernel_count, bwd.kernel_count
        return counts

    def cache_info(self) -> dict[str, int]:
        """Plan cache hits and misses, plans held, and process-wide kernel sources and numba compiles."""
        st = compiler.stats()
        return {"hits": self._stats["hits"], "misses": self._stats["misses"], "entries": len(self._plans),
                "kernels": st["sources"], "compiles": st["numba_compiles"]}


def trace(fn: Callable[..., Any] | None = None, *, static_argnums: Sequence[int] | int = (),
          device: str = "cpu") -> Any:
    """Compile a numpy function: `@jg.trace` or `@jg.trace(static_argnums=(1,))`."""
    if fn is None:
        return lambda f: Traced(f, static_argnums=static_argnums, device=device)
    return Traced(fn, static_argnums=static_argnums, device=device)


# ---------------------------------------------------------------------- transformations

def _traced_value_and_grad(fn: Callable[..., Any], args: Sequence[Any], argnums: int | Sequence[int]) -> Any:
    """value_and_grad inside an enclosing trace: differentiate a subgraph and inline it."""
    positions = [argnums] if isinstance(argnums, int) else list(argnums)
    avals = [a.aval if isinstance(a, Tracer) else Traced(fn)._signature([a]).avals[0] for a in args]
    graph, tree, captured = trace_to_graph(fn, avals)
    if len(graph.outputs) != 1 or graph.outputs[0].aval.size != 1:
        raise InputError(f"grad of {getattr(fn, '__name__', 'function')} needs a scalar output, got "
                         f"{[str(o.aval) for o in graph.outputs]}")
    joint = with_unit_cotangent(joint_vjp_graph(graph, positions), len(graph.inputs))
    outs = inline_graph(joint, list(args) + captured)
    value, grads = outs[0], outs[1:]
    return unflatten_output(tree, [value]), grads[0] if isinstance(argnums, int) else tuple(grads)


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
    avals = [a.aval if isinstance(a, Tracer) else Traced(base)._signature([a]).avals[0] for a in args]
    graph, tree, captured = trace_to_graph(base, avals)
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

    return unflatten_output(tree, primal_outs), pullback
