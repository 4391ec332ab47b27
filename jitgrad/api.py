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
import logging
import os
import sys
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import buffers, fusion, passes
from .autodiff import inline_graph, joint_vjp_graph, split_forward_backward, with_unit_cotangent
from .errors import InputError, UnsupportedError
from .explain import Explanation, ir_text, render
from .ir import Aval, Graph
from .kernels import compiler
from .runtime import Executable
from .captures import Captures
from .tracing import SUPPORTED_DTYPES, Tracer, current_builder, reading_captured, trace_to_graph, unflatten_output

_WEAK_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}
DEFAULT_MAX_PLANS = 16
log = logging.getLogger("jitgrad.api")
_traced_functions: "weakref.WeakSet[Traced]" = weakref.WeakSet()


def max_plans() -> int:
    """Plans one traced function keeps: `JITGRAD_MAX_PLANS` (default 16; torch.compile keeps 8 recompiles
    per function). The least recently used plan goes first."""
    text = os.environ.get("JITGRAD_MAX_PLANS")
    if text is None:
        return DEFAULT_MAX_PLANS
    try:
        value = int(text)
        if value < 1:
            raise ValueError(text)
    except ValueError:
        log.warning("JITGRAD_MAX_PLANS=%r is not an int >= 1; using %d", text, DEFAULT_MAX_PLANS)
        return DEFAULT_MAX_PLANS
    return value


def clear_caches() -> None:
    """Drop every traced function's plans and every pooled output buffer (compiled kernels stay loaded,
    and the disk cache is untouched): memory back after, say, many shapes of a function."""
    for traced in list(_traced_functions):
        traced.clear_cache()
    buffers.budget.clear()
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class CallSignature:
    """What a plan is specialised on: per argument an aval, or the static value itself."""

    avals: tuple[Aval | None, ...]
    statics: tuple[tuple[int, "StaticValue"], ...]


def static_key(x: Any) -> Any:
    """A static argument's identity for plan caches: its type with its value, recursively through tuples,
    lists and frozensets, so values that compare equal across types (1, 1.0, True) get plans of their own."""
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(static_key(v) for v in x))
    if isinstance(x, frozenset):
        return (frozenset, frozenset(static_key(v) for v in x))
    return (type(x), x)


class StaticValue:
    """A static argument's value, compared and hashed by `static_key`."""

    __slots__ = ("value", "key")

    def __init__(self, value: Any):
        self.value = value
        self.key = static_key(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticValue) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return repr(self.value)


def _device_array_aval(x: Any) -> Aval | None:
    """Shape and dtype of a CUDA device array (numba's, or anything with `__cuda_array_interface__`)."""
    interface = getattr(x, "__cuda_array_interface__", None)
    if interface is not None:
        return Aval(tuple(interface["shape"]), np.dtype(interface["typestr"]), False)
    if getattr(x, "__cuda_ndarray__", False):
        return Aval(tuple(x.shape), np.dtype(x.dtype), False)
    return None


def _arg_aval(i: int, x: Any, fname: str, device: str = "cpu") -> Aval:
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        if type(x) is int and not _INT64_MIN <= x <= _INT64_MAX:
            raise InputError(f"{fname}: argument {i} is the Python int {x}, outside int64's range; pass it as a "
                             f"float, or as a numpy array of the dtype you need")
        return Aval((), _WEAK_DTYPES[type(x)], True)
    if isinstance(x, (np.ma.MaskedArray, np.matrix)):
        raise InputError(f"{fname}: argument {i} is a numpy {type(x).__name__}, whose semantics (masks, matrix "
                         f"products) jitgrad does not follow; pass a plain array (e.g. x.filled(0) or np.asarray(x))")
    on_device = _device_array_aval(x)
    if on_device is not None:
        if device != "cuda":
            raise InputError(f"{fname}: argument {i} is a CUDA device array; trace with device='cuda', or copy it "
                             f"to the host first")
        if on_device.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{fname}: argument {i} has dtype {on_device.dtype}; jitgrad accepts float32, float64, "
                             f"integer and bool arrays")
        return on_device
    if isinstance(x, (np.ndarray, np.generic)):
        dt = np.asarray(x).dtype
        if dt not in SUPPORTED_DTYPES:
            raise InputError(f"{fname}: argument {i} has dtype {dt}; jitgrad accepts float32, float64, integer and "
                             f"bool arrays (complex, object, string and float16 are not supported)")
        return Aval(np.shape(x), dt, False)
    raise InputError(f"{fname}: argument {i} is a {type(x).__name__}; pass numpy arrays or Python numbers, or list "
                     f"its position in static_argnums if it is a configuration value")


def _cotangent_array(g: Any, aval: Aval, fname: str, k: int) -> np.ndarray:
    """A cotangent as an array of its output's dtype; complex or non-numeric values are refused."""
    try:
        arr = np.asarray(g)
    except (TypeError, ValueError):
        arr = np.empty(0, object)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{fname}: cotangent {k} is a {type(g).__name__} of dtype {arr.dtype}; pass a real "
                         f"array of output {k}'s shape {aval.shape} ({aval.dtype})")
    return arr.astype(aval.dtype, copy=False)


def _as_array(x: Any, aval: Aval) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype == aval.dtype:  # the common case, without asarray's cost
        return x
    return np.asarray(x, dtype=aval.dtype)


def _result(a: np.ndarray) -> Any:
    """0-d results come back as numpy scalars, like numpy reductions return them."""
    return a[()] if a.ndim == 0 else a


def _numpy_args(args: Sequence[Any], fname: str, device: str = "cpu") -> tuple[Sequence[Any], bool]:
    """The arguments with torch CPU tensors viewed as numpy arrays (no copy), and whether any were tensors.
    Only looks for tensors once the program has imported torch: jitgrad never imports it. With
    device="cuda", CUDA tensors stay as they are and results are device arrays (not tensors)."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor is None or all(type(a) is np.ndarray for a in args) or not any(isinstance(a, tensor) for a in args):
        return args, False
    if device == "cuda":
        return tuple(_tensor_array(a, i, fname) if isinstance(a, tensor) and a.device.type == "cpu" else a
                     for i, a in enumerate(args)), False
    return tuple(_tensor_array(a, i, fname) if isinstance(a, tensor) else a for i, a in enumerate(args)), True


def _tensor_array(t: Any, i: int, fname: str) -> np.ndarray:
    if t.device.type != "cpu":
        raise InputError(f"{fname}: argument {i} is a torch tensor on {t.device}; jitgrad takes CPU tensors "
                         f"(move it with .cpu())")
    try:
        return t.detach().resolve_conj().resolve_neg().numpy()
    except TypeError:
        raise InputError(f"{fname}: argument {i} is a {t.dtype} tensor, which numpy cannot hold; jitgrad accepts "
                         f"float32, float64, integer and bool tensors") from None


def _as_tensors(values: Sequence[Any]) -> list[Any]:
    """Results as torch tensors sharing their memory (None stays None)."""
    torch = sys.modules["torch"]
    return [None if v is None else torch.from_numpy(np.asarray(v)) for v in values]


@dataclass
class Context:
    """What `Traced.forward` keeps for `backward`: the residuals and how to map gradients back."""

    plan: "Plan"
    residuals: list[np.ndarray]
    torch_outputs: bool = False  # the forward took torch tensors: backward returns tensors too

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
    captures: Captures = field(default_factory=Captures)  # arrays read from outside the arguments
    executables: dict[Any, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # value-and-grad nests builds

    @functools.cached_property
    def dynamic(self) -> list[int]:
        """Positions of the traced (non-static) arguments."""
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


def _cuda_runtime() -> Any:
    """The CUDA runtime module, imported on first use so CPU-only code never loads numba's CUDA target."""
    try:
        from . import runtime_cuda
    except ImportError as exc:
        raise UnsupportedError(f"device='cuda' needs numba's CUDA target (pip install 'jitgrad[cuda]'): "
                               f"{exc}") from None
    return runtime_cuda


def _compile(graph: Graph, device: str = "cpu") -> Any:
    program = fusion.schedule(passes.optimize(graph))
    return _cuda_runtime().CudaExecutable(program) if device == "cuda" else Executable(program)


class Traced:
    """A numpy function compiled by jitgrad: call it, or ask for gradients, VJPs, IR and kernels."""

    def __init__(self, fn: Callable[..., Any], static_argnums: Sequence[int] | int = (), device: str = "cpu"):
        if isinstance(fn, Traced):
            fn = fn.fn
        if device not in ("cpu", "cuda"):
            raise UnsupportedError(f"device {device!r} is not available; jitgrad supports device='cpu' and 'cuda'")
        if device == "cuda":
            _cuda_runtime().require_device()
        self.fn = fn
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.device = device
        self._plans: OrderedDict[CallSignature, Plan] = OrderedDict()  # least recently used first
        self._plans_by_key: dict[tuple, Plan] = {}
        self._repeat_calls: dict[tuple, Callable[[Sequence[Any]], tuple[Any, Any]]] = {}
        self._lock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0}
        functools.update_wrapper(self, fn)
        try:
            self._fn_signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._fn_signature = None
        self._param_names = list(self._fn_signature.parameters) if self._fn_signature else []
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
                statics.append((i, StaticValue(x)))
                avals.append(None)
            else:
                avals.append(_arg_aval(i, x, self.name, self.device))
        return CallSignature(tuple(avals), tuple(statics))

    def _fast_key(self, args: Sequence[Any]) -> tuple | None:
        """A cheap hashable key for the common argument kinds (None: take the validating path)."""
        key: list[Any] = []
        for i, x in enumerate(args):
            if i in self.static_argnums:
                key.append(("static", static_key(x)))
            elif type(x) is np.ndarray:
                key.append((x.shape, x.dtype))
            elif type(x) in _WEAK_DTYPES:
                if type(x) is int and not _INT64_MIN <= x <= _INT64_MAX:
                    return None  # the validating path says what is wrong
                key.append(type(x))
            else:
                return None
        return tuple(key)

    def plan(self, *args: Any) -> Plan:
        """The plan for these arguments' signature, tracing the function on a miss."""
        return self._plan_and_captured(args)[0]

    def _plan_and_captured(self, args: Sequence[Any]) -> tuple[Plan, list[np.ndarray]]:
        """The plan for these arguments and the current values of the arrays it reads from outside
        them; a plan whose captured arrays changed shape or dtype, or were rebound to something else
        than an array, is traced again."""
        args, _ = _numpy_args(args, self.name, self.device)
        plan, sig, fast = self._lookup(args)
        if not plan.captures:
            return plan, []
        captured = plan.captures.read()
        if captured is None:
            plan = self._retrace(plan, args, sig, fast)
            captured = plan.captures.read()
            if captured is None:
                raise InputError(f"{self.name}: the arrays it reads from outside its arguments changed while it "
                                 f"was traced; call it again once they are stable")
        return plan, captured

    def _lookup(self, args: Sequence[Any]) -> tuple[Plan, CallSignature | None, tuple | None]:
        try:
            fast = self._fast_key(args)
            found = self._plans_by_key.get(fast) if fast is not None else None
        except TypeError:
            fast, found = None, None
        if found is not None:
            self._stats["hits"] += 1
            self._used(found)
            return found, None, fast
        self._positional(args, {})
        sig = self._signature(args)
        found = self._plans.get(sig)
        if found is not None:
            self._stats["hits"] += 1
            self._used(found)
            if fast is not None:
                self._plans_by_key[fast] = found
            return found, sig, fast
        with self._lock:
            found = self._plans.get(sig)
            if found is not None:
                self._stats["hits"] += 1
                return found, sig, fast
            return self._traced_plan(args, sig, fast), sig, fast

    def _retrace(self, stale: Plan, args: Sequence[Any], sig: CallSignature | None, fast: tuple | None) -> Plan:
        """Replace a plan whose captured arrays no longer fit it by a new trace."""
        sig = sig or self._signature(args)
        with self._lock:
            current = self._plans.get(sig)
            if current is not None and current is not stale:
                return current  # another thread re-traced it already
            self._forget(stale)
            return self._traced_plan(args, sig, fast)

    def _used(self, plan: Plan) -> None:
        try:
            self._plans.move_to_end(plan.signature)
        except KeyError:  # dropped by another thread meanwhile: this call still runs it
            pass

    def clear_cache(self) -> None:
        """Drop this function's plans (and with them their pooled output buffers); the next call traces again."""
        with self._lock:
            self._plans.clear()
            self._plans_by_key.clear()
            self._repeat_calls.clear()

    def _forget(self, plan: Plan) -> None:
        """Drop a plan and the fast-path entries that lead to it."""
        self._plans.pop(plan.signature, None)
        for table in (self._plans_by_key, self._repeat_calls):
            for key in [k for k, v in table.items() if v is plan or getattr(v, "plan", None) is plan]:
                del table[key]

    def _traced_plan(self, args: Sequence[Any], sig: CallSignature, fast: tuple | None) -> Plan:
        """Trace the function for `sig` and keep the plan (called under `_lock`)."""
        self._stats["misses"] += 1
        statics = {i: v.value for i, v in sig.statics}
        dyn = [i for i, a in enumerate(sig.avals) if a is not None]

        def call_with_statics(*dynamic: Any) -> Any:
            full = list(args)
            for i, v in zip(dyn, dynamic):
                full[i] = v
            for i, v in statics.items():
                full[i] = v
            return self.fn(*full)

        names = [self._param_names[i] if i < len(self._param_names) else f"arg{i}" for i in dyn]
        traced = trace_to_graph(call_with_statics, [sig.avals[i] for i in dyn], names, parent=None,
                                reads_from=self.fn)
        plan = Plan(sig, traced.graph, traced.tree, names, traced.captures)
        self._plans[sig] = plan
        if fast is not None:
            self._plans_by_key[fast] = plan
        limit = max_plans()
        while len(self._plans) > limit:
            self._forget(next(iter(self._plans.values())))
        return plan

    def _inputs(self, plan: Plan, args: Sequence[Any]) -> list[Any]:
        if self.device == "cuda":
            return [args[i] for i in plan.dynamic]  # the CUDA executable moves host values to the device
        return [_as_array(args[i], plan.signature.avals[i]) for i in plan.dynamic]

    def _result(self, a: Any) -> Any:
        """CUDA results stay device arrays (0-d included); CPU 0-d results become numpy scalars."""
        return a if self.device == "cuda" else _result(a)

    # ------------------------------------------------------------------ calling

    def _positional(self, args: Sequence[Any], kwargs: dict) -> tuple:
        """The arguments checked against fn's signature, keyword ones made positional (plans and argnums are
        positional)."""
        if self._fn_signature is None:  # not introspectable (some builtins): numpy checks the call itself
            if kwargs:
                raise InputError(f"{self.name}: pass arguments by position (its signature cannot be inspected)")
            return tuple(args)
        try:
            bound = self._fn_signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{self.name}: {exc}") from None
        if bound.kwargs:
            raise InputError(f"{self.name}: keyword-only or **kwargs parameters ({sorted(bound.kwargs)}) cannot "
                             f"be traced; make them positional")
        return bound.args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self._positional(args, kwargs)
        if any(isinstance(a, Tracer) for a in args) or current_builder() is not None:
            with reading_captured(self.fn):
                return self.fn(*args)
        args, tensors = _numpy_args(args, self.name, self.device)
        plan, captured = self._plan_and_captured(args)
        exe = plan.built("call", lambda: _compile(plan.graph, self.device))
        outs = [self._result(o) for o in exe(self._inputs(plan, args) + captured)]
        return unflatten_output(plan.tree, _as_tensors(outs) if tensors else outs)

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
        outs = plan.graph.outputs
        if len(outs) != 1 or outs[0].aval.size != 1 or not outs[0].aval.is_float:
            shapes = [str(o.aval) for o in outs]
            raise InputError(f"{self.name}.{what} needs a function returning one float scalar, but it returns "
                             f"{', '.join(shapes)}; reduce it (e.g. np.sum) or use vjp/backward with a cotangent")

    def value_and_grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> tuple[Any, Any]:
        """The scalar output and its gradient, computed by one fused forward+backward program."""
        if isinstance(argnums, list):
            argnums = tuple(argnums)  # a key of the compiled programs and the repeat-call table
        try:
            repeat = self._repeat_calls.get((argnums, self._fast_key(args)))
        except TypeError:  # an unhashable static argument: take the general path
            repeat = None
        if repeat is not None:
            return repeat(args)
        args, tensors = _numpy_args(args, self.name, self.device)
        plan, captured = self._plan_and_captured(args)
        exe, positions, wrt_args, shape_result = plan.built(("value_and_grad", argnums),
                                                            lambda: self._value_and_grad_program(plan, argnums))
        outs = exe(self._inputs(plan, args) + captured)
        by_arg = dict(zip(wrt_args, outs[1:]))
        result = [self._result(by_arg[i]) if i in by_arg else None for i in positions]
        value = [self._result(outs[0])]
        if tensors:
            value, result = _as_tensors(value), _as_tensors(result)
        elif self.device == "cpu":
            fast = self._fast_key(args)
            if fast is not None:
                self._repeat_calls[(argnums, fast)] = self._repeat_value_and_grad(plan, exe, positions, wrt_args,
                                                                                 shape_result)
        return unflatten_output(plan.tree, value), shape_result(result)

    def _repeat_value_and_grad(self, plan: Plan, exe: Executable, positions: list[int], wrt_args: list[int],
                               shape_result: Callable[[list], Any]) -> Callable[[Sequence[Any]], tuple[Any, Any]]:
        """value_and_grad for calls whose arguments match a seen signature exactly (numpy arrays of the same
        shapes and dtypes, or Python numbers): the plan lookup and result layout are done once, here."""
        dynamic = [(i, plan.signature.avals[i]) for i in plan.dynamic]
        out_index = {arg: k + 1 for k, arg in enumerate(wrt_args)}
        layout = [out_index.get(i) for i in positions]
        tree = plan.tree
        stats = self._stats
        read_captured = plan.captures.read if plan.captures else None
        used = self._used

        def run(args: Sequence[Any]) -> tuple[Any, Any]:
            inputs = [_as_array(args[i], aval) for i, aval in dynamic]
            if read_captured is not None:
                captured = read_captured()
                if captured is None:  # a captured array changed: forget the plan, the general path traces again
                    with self._lock:
                        self._forget(plan)
                    return self.value_and_grad(*args, argnums=argnums)
                inputs += captured
            stats["hits"] += 1
            used(plan)
            outs = exe(inputs)
            grads = [None if k is None else _result(outs[k]) for k in layout]
            return unflatten_output(tree, [_result(outs[0])]), shape_result(grads)

        run.plan = plan  # type: ignore[attr-defined]  # so a re-traced plan's fast path is dropped
        return run

    def _value_and_grad_program(self, plan: Plan, argnums: int | Sequence[int] | None) -> tuple:
        self._scalar_output(plan, "value_and_grad")
        positions, shape_result = self._argnums(argnums, len(plan.signature.avals))
        self._check_grad_args(plan, positions, argnums is not None)
        wrt_args = [i for i in positions if plan.signature.avals[i] is not None and plan.signature.avals[i].is_float]
        wrt = plan.differentiable(wrt_args)
        exe = plan.built(("joint", tuple(wrt)), lambda: _compile(with_unit_cotangent(joint_vjp_graph(plan.graph, wrt),
                                                                                      len(plan.graph.inputs)),
                                                                  self.device))
        return exe, positions, wrt_args, shape_result

    def grad(self, *args: Any, argnums: int | Sequence[int] | None = None) -> Any:
        """Gradient of the scalar output: a tuple over all arguments (None where not differentiable),
        or one array for an int `argnums`."""
        return self.value_and_grad(*args, argnums=argnums)[1]

    def _split(self, plan: Plan) -> Any:
        def build() -> Any:
            wrt = plan.differentiable(plan.dynamic)
            joint = passes.optimize(joint_vjp_graph(plan.graph, wrt))  # dead gradient ops must not save residuals
            split = split_forward_backward(joint, len(plan.graph.inputs), len(plan.graph.outputs))
            return split, _compile(split.forward, self.device), _compile(split.backward, self.device), wrt
        return plan.built("split", build)

    def forward(self, *args: Any) -> tuple[Any, Context]:
        """Run the compiled forward, keeping the residuals the backward needs in a context."""
        args, tensors = _numpy_args(args, self.name, self.device)
        plan, captured = self._plan_and_captured(args)
        split, fwd, _, _ = self._split(plan)
        outs = fwd(self._inputs(plan, args) + captured)
        n = split.n_outputs
        results = [self._result(o) for o in outs[:n]]
        return (unflatten_output(plan.tree, _as_tensors(results) if tensors else results),
                Context(plan, outs[n:], tensors))

    def backward(self, ctx: Context, *grad_outputs: Any) -> tuple[Any, ...]:
        """Gradients for every argument (None where not differentiable) given the outputs' cotangents.
        May be called any number of times with the same context."""
        if not isinstance(ctx, Context):
            raise InputError(f"{self.name}.backward: the first argument must be the context returned by forward")
        plan = ctx.plan
        split, _, bwd, wrt = self._split(plan)
        grad_outputs, _ = _numpy_args(grad_outputs, f"{self.name}.backward", self.device)
        outs = plan.graph.outputs
        if len(grad_outputs) != len(outs):
            raise InputError(f"{self.name}.backward: expected {len(outs)} cotangent(s), one per output, got "
                             f"{len(grad_outputs)}")
        cts = []
        for k, (g, o) in enumerate(zip(grad_outputs, outs)):
            if not o.aval.is_float:
                arr = np.zeros(o.aval.shape, o.aval.dtype)
            elif self.device == "cuda" and (on_device := _device_array_aval(g)) is not None:
                if on_device.dtype != o.aval.dtype:
                    raise InputError(f"{self.name}.backward: cotangent {k} is a {on_device.dtype} "
                                     f"device array but output {k} is {o.aval.dtype}")
                arr = g  # a device cotangent is used where it lives
            else:
                arr = _cotangent_array(g, o.aval, f"{self.name}.backward", k)
            if arr.shape != o.aval.shape:
                raise InputError(f"{self.name}.backward: cotangent {k} has shape {arr.shape} but output {k} has shape "
                                 f"{o.aval.shape}")
            cts.append(arr)
        grads = bwd(list(ctx.residuals) + cts)
        by_input = dict(zip(wrt, grads))
        dyn = plan.dynamic
        result = [self._result(by_input[dyn.index(i)]) if i in dyn and dyn.index(i) in by_input else None
                  for i in range(len(plan.signature.avals))]
        return tuple(_as_tensors(result) if ctx.torch_outputs else result)

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
        return Explanation(self.name, plan.graph, wrt, self._split(plan)[0] if wrt else None)

    def ir(self, *args: Any) -> str:
        """The forward IR, and the backward IR with the residuals it takes (and their bytes), as text."""
        return ir_text(self._explanation(self.plan(*args)))

    def explain(self, *args: Any, format: str = "text") -> str:
        """IR, saved values, fusion groups and kernel source of each compiled program (call, value-and-grad,
        forward, backward); format="dot" gives a Graphviz DOT of the forward and backward graphs."""
        return render(self._explanation(self.plan(*args)), format)

    def kernel_counts(self, *args: Any) -> dict[str, int]:
        """How many fused kernels each mode runs for these arguments (compiles what it needs)."""
        plan = self.plan(*args)
        counts = {"call": _compile(plan.graph, self.device).kernel_count}
        outs = plan.graph.outputs
        wrt = plan.differentiable(plan.dynamic)
        if wrt and len(outs) == 1 and outs[0].aval.size == 1 and outs[0].aval.is_float:
            joint = with_unit_cotangent(joint_vjp_graph(plan.graph, wrt), len(plan.graph.inputs))
            counts["value_and_grad"] = _compile(joint, self.device).kernel_count
        if wrt:
            _, fwd, bwd, _ = self._split(plan)
            counts["forward"], counts["backward"] = fwd.kernel_count, bwd.kernel_count
        return counts

    def cache_info(self) -> dict[str, int]:
        """Plan cache hits and misses, plans held, and process-wide kernel sources and numba compiles
        (CUDA ones for device="cuda")."""
        if self.device == "cuda":
            st = _cuda_runtime().stats()
            kernels, compiles = st["sources"], st["device_compiles"]
        else:
            st = compiler.stats()
            kernels, compiles = st["sources"], st["numba_compiles"]
        return {"hits": self._stats["hits"], "misses": self._stats["misses"], "entries": len(self._plans),
                "kernels": kernels, "compiles": compiles}


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
    avals = [a.aval if isinstance(a, Tracer) else _arg_aval(i, a, getattr(fn, '__name__', 'function'))
             for i, a in enumerate(args)]
    traced = trace_to_graph(fn, avals)
    graph, tree, captured = traced.graph, traced.tree, traced.outer
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
    avals = [a.aval if isinstance(a, Tracer) else _arg_aval(i, a, getattr(base, '__name__', 'function'))
             for i, a in enumerate(args)]
    traced = trace_to_graph(base, avals)
    graph, tree, captured = traced.graph, traced.tree, traced.outer
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
