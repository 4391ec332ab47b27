"""Plans: what a traced function compiled for one call signature, and the bounded cache of them.

A `Plan` owns the traced graph, the arrays the trace read from outside the arguments and, built on
first use, its programs (`jitgrad.programs`) compiled by the function's backend. A `PlanCache` finds
the plan for a call (a fast key for plain numpy arguments, the full signature otherwise), traces on a
miss, re-traces a plan whose captured arrays no longer fit it, and keeps at most `max_plans()` plans,
dropping the least recently used (and with them their pooled output buffers).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import programs
from .arguments import Arguments, CallSignature
from .autodiff import SplitGraphs
from .captures import Captures
from .errors import InputError
from .ir import Graph
from .traces import trace_to_graph

DEFAULT_MAX_PLANS = 16
log = logging.getLogger("jitgrad.api")


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


@dataclass
class Split:
    """The forward/backward pair of a plan, compiled, and the graph inputs it differentiates."""

    graphs: SplitGraphs
    forward: Any
    backward: Any
    wrt: list[int]


@dataclass
class Plan:
    """Everything compiled for one call signature of a traced function."""

    signature: CallSignature
    graph: Graph
    tree: Any
    names: list[str]
    backend: Any
    captures: Captures = field(default_factory=Captures)  # arrays read from outside the arguments
    executables: dict[Any, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # value-and-grad nests builds

    @functools.cached_property
    def dynamic(self) -> list[int]:
        """Positions of the traced (non-static) arguments."""
        return [i for i, a in enumerate(self.signature.avals) if a is not None]

    @functools.cached_property
    def dynamic_avals(self) -> list[Any]:
        return [self.signature.avals[i] for i in self.dynamic]

    def differentiable(self, argnums: Sequence[int]) -> list[int]:
        """Graph input positions (among dynamic args) for the float arguments in `argnums`."""
        dyn = self.dynamic
        return [dyn.index(i) for i in argnums if i in dyn and self.signature.avals[i].is_float]

    def inputs(self, args: Sequence[Any], captured: list[Any]) -> list[Any]:
        """The programs' inputs for a call: the dynamic arguments, then the captured arrays."""
        return self.backend.inputs([args[i] for i in self.dynamic], self.dynamic_avals) + captured

    def built(self, key: Any, build: Callable[[], Any]) -> Any:
        found = self.executables.get(key)
        if found is None:
            with self.lock:
                found = self.executables.get(key)
                if found is None:
                    found = build()
                    self.executables[key] = found
        return found

    def compile(self, graph: Graph) -> Any:
        return self.backend.executable(programs.schedule(graph))

    def call(self) -> Any:
        """The plain call's executable."""
        return self.built("call", lambda: self.compile(self.graph))

    def value_and_grad(self, wrt: Sequence[int]) -> Any:
        """The joint value-and-grad executable for the graph inputs `wrt`."""
        wrt = tuple(wrt)
        return self.built(("joint", wrt), lambda: self.compile(programs.value_and_grad_graph(self.graph, wrt)))

    def split(self) -> Split:
        """The forward/backward pair, differentiating every float input."""
        def build() -> Split:
            wrt = self.differentiable(self.dynamic)
            graphs = programs.split_graphs(self.graph, wrt)
            return Split(graphs, self.compile(graphs.forward), self.compile(graphs.backward), wrt)
        return self.built("split", build)

    def kernel_counts(self) -> dict[str, int]:
        """How many fused kernels each mode runs (compiling what it needs)."""
        counts = {"call": self.call().kernel_count}
        wrt = self.differentiable(self.dynamic)
        if wrt and programs.has_scalar_output(self.graph):
            counts["value_and_grad"] = self.value_and_grad(wrt).kernel_count
        if wrt:
            split = self.split()
            counts["forward"], counts["backward"] = split.forward.kernel_count, split.backward.kernel_count
        return counts


class PlanCache:
    """The plans of one traced function, least recently used first, with hit and miss counts."""

    def __init__(self, fn: Callable[..., Any], arguments: Arguments, backend: Any):
        self.fn = fn
        self.arguments = arguments
        self.backend = backend
        self.plans: OrderedDict[CallSignature, Plan] = OrderedDict()
        self.by_fast_key: dict[tuple, Plan] = {}
        self.fast_paths: dict[tuple, Any] = {}  # repeat-call closures; each has a `.plan`
        self.lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0}

    def find(self, args: Sequence[Any]) -> tuple[Plan, list[np.ndarray]]:
        """The plan for these arguments and the current values of the arrays it reads from outside them;
        a plan whose captured arrays changed shape or dtype, or were rebound to something else than an
        array, is traced again."""
        plan, sig, fast = self._lookup(args)
        if not plan.captures:
            return plan, []
        captured = plan.captures.read()
        if captured is None:
            plan = self._retrace(plan, args, sig, fast)
            captured = plan.captures.read()
            if captured is None:
                raise InputError(f"{self.arguments.name}: the arrays it reads from outside its arguments changed "
                                 f"while it was traced; call it again once they are stable")
        return plan, captured

    def used(self, plan: Plan) -> None:
        """Mark `plan` as the most recently used."""
        try:
            self.plans.move_to_end(plan.signature)
        except KeyError:  # dropped by another thread meanwhile: this call still runs it
            pass

    def forget(self, plan: Plan) -> None:
        """Drop a plan and the fast-path entries that lead to it (call under `lock`)."""
        self.plans.pop(plan.signature, None)
        for table in (self.by_fast_key, self.fast_paths):
            for key in [k for k, v in table.items() if v is plan or getattr(v, "plan", None) is plan]:
                del table[key]

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()
            self.by_fast_key.clear()
            self.fast_paths.clear()

    def _lookup(self, args: Sequence[Any]) -> tuple[Plan, CallSignature | None, tuple | None]:
        try:
            fast = self.arguments.fast_key(args)
            found = self.by_fast_key.get(fast) if fast is not None else None
        except TypeError:  # an unhashable static argument: the full signature says so
            fast, found = None, None
        if found is not None:
            self.stats["hits"] += 1
            self.used(found)
            return found, None, fast
        self.arguments.positional(args, {})
        sig = self.arguments.call_signature(args)
        found = self.plans.get(sig)
        if found is not None:
            self.stats["hits"] += 1
            self.used(found)
            if fast is not None:
                self.by_fast_key[fast] = found
            return found, sig, fast
        with self.lock:
            found = self.plans.get(sig)
            if found is not None:
                self.stats["hits"] += 1
                return found, sig, fast
            return self._traced(args, sig, fast), sig, fast

    def _retrace(self, stale: Plan, args: Sequence[Any], sig: CallSignature | None, fast: tuple | None) -> Plan:
        """Replace a plan whose captured arrays no longer fit it by a new trace."""
        sig = sig or self.arguments.call_signature(args)
        with self.lock:
            current = self.plans.get(sig)
            if current is not None and current is not stale:
                return current  # another thread re-traced it already
            self.forget(stale)
            return self._traced(args, sig, fast)

    def _traced(self, args: Sequence[Any], sig: CallSignature, fast: tuple | None) -> Plan:
        """Trace the function for `sig` and keep the plan (called under `lock`)."""
        self.stats["misses"] += 1
        statics = {i: v.value for i, v in sig.statics}
        dyn = [i for i, a in enumerate(sig.avals) if a is not None]

        def call_with_statics(*dynamic: Any) -> Any:
            full = list(args)
            for i, v in zip(dyn, dynamic):
                full[i] = v
            for i, v in statics.items():
                full[i] = v
            return self.fn(*full)

        names = self.arguments.names(dyn)
        traced = trace_to_graph(call_with_statics, [sig.avals[i] for i in dyn], names, parent=None,
                                reads_from=self.fn)
        plan = Plan(sig, traced.graph, traced.tree, names, self.backend, traced.captures)
        self.plans[sig] = plan
        if fast is not None:
            self.by_fast_key[fast] = plan
        limit = max_plans()
        while len(self.plans) > limit:
            self.forget(next(iter(self.plans.values())))
        return plan
