"""Plans: what a traced function compiled for one call signature, and the bounded cache of them.

A `Plan` owns the traced graph, the arrays the trace read from outside the arguments and, built on
first use, its programs (`jitgrad.passes.recipes`) compiled by the function's backend. A `PlanCache` finds
the plan for a call (a fast key for plain numpy arguments, the full signature otherwise; a repeat call of
a signature seen before runs one generated function, `RepeatCall`), traces on a miss, re-traces a plan
whose captured arrays no longer fit it, and keeps at most `max_plans()` plans, dropping the least recent.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from jitgrad.tracing import trees
from jitgrad.passes import recipes
from jitgrad.passes.loops import Program
from jitgrad.runtime import graph_keys, programs
from jitgrad.runtime.arguments import LEAF, STATIC, Arguments, Call, CallSignature
from jitgrad.runtime.repeats import MISS, SETTLED, RepeatCall, Signal
from jitgrad.passes.autodiff import SplitGraphs
from jitgrad.runtime.backends import Backend
from jitgrad.tracing.captures import Captures
from jitgrad.errors import InputError, JitgradError
from jitgrad.ir.graph import Graph
from jitgrad.kernels.build import collector
from jitgrad.kernels.build.progress import describe
from jitgrad.tracing.traced import trace_to_graph

DEFAULT_MAX_PLANS = 16
MAX_REPEATS = 8  # repeat-call entries kept per mode (signatures a loop alternates between)
log = logging.getLogger("jitgrad.front.api")
T = TypeVar("T")


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
    backend: Backend
    captures: Captures = field(default_factory=Captures)  # arrays read from outside the arguments
    label: str = "a traced function"  # the user's function, for compile progress (`jitgrad.kernels.build.progress.describe`)
    executables: dict[Any, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)  # value-and-grad nests builds
    repeat_tried: set = field(default_factory=set)  # modes `PlanCache.remember` was asked for (done once each)
    wrt_of: dict = field(default_factory=dict)  # `differentiable`'s answers, by argnums

    @functools.cached_property
    def leaf_ranges(self) -> list[range]:
        """Per argument, the graph inputs holding its leaves (none for a static argument)."""
        return self.signature.leaf_ranges()

    def differentiable(self, argnums: Sequence[int]) -> tuple[int, ...]:
        """Graph input positions of the float leaves of the arguments `argnums` (kept per `argnums`: calls ask
        again and again)."""
        key = tuple(argnums)
        found = self.wrt_of.get(key)
        if found is None:
            found = self.wrt_of[key] = tuple(k for i in key for k in self.leaf_ranges[i]
                                             if self.signature.avals[k].is_float)
        return found

    def all_differentiable(self) -> list[int]:
        """Graph input positions of every float leaf."""
        return [k for k, a in enumerate(self.signature.avals) if a.is_float]

    def inputs(self, leaves: Sequence[Any], captured: list[Any]) -> list[Any]:
        """The programs' inputs for a call: the argument leaves, then the captured arrays."""
        return self.backend.inputs(leaves, self.signature.avals) + captured

    def per_argument(self, values: dict[int, Any], positions: Sequence[int]) -> list[Any]:
        """Per argument in `positions`, its leaves' values (by graph input, None where missing) in its own
        structure: an array for a bare one, a tree for a tree."""
        found = []
        for i in positions:
            structure, leaves = self.signature.structures[i], [values.get(k) for k in self.leaf_ranges[i]]
            found.append(None if structure is STATIC else leaves[0] if structure is LEAF
                         else trees.tree_unflatten(structure, leaves))
        return found

    def built(self, key: Any, build: Callable[[], Any]) -> Any:
        found = self.executables.get(key)
        if found is None:
            with self.lock:
                found = self.executables.get(key)
                if found is None:
                    with collector.pause:
                        found = build()
                    self.executables[key] = found
        return found

    @functools.cached_property
    def text(self) -> str | None:
        """The traced graph as the program cache's key (`graph_keys.describe`; None: it has none)."""
        return graph_keys.describe(self.graph)

    def program(self, recipe: tuple, derive: Callable[[], T], bind: Callable[[T], Any]) -> Any:
        """`bind` of what `derive()` makes of the traced graph for `recipe`, or of what a process stored for the same
        recipe of the same graph and jitgrad (`jitgrad.runtime.programs`, which stores it bound)."""
        return programs.cached(lambda: self.text, recipe, self.backend.name, derive, bind)

    def compile(self, program: Program, mode: str) -> Any:
        """`program` bound to kernels by the backend, named for progress as `mode` of the function."""
        return self.backend.executable(program, f"{mode} of {self.label}")

    def call(self) -> Any:
        """The plain call's executable."""
        return self.built("call", lambda: self.program(
            ("call",), lambda: recipes.schedule(self.graph), lambda program: self.compile(program, "call")))

    def value_and_grad(self, wrt: Sequence[int], has_aux: bool = False) -> Any:
        """The joint value-and-grad executable for the graph inputs `wrt` (with `has_aux`, the outputs after
        the first are computed alongside, undifferentiated)."""
        wrt = tuple(wrt)
        return self.built(("joint", wrt, has_aux), lambda: self.program(
            ("value_and_grad", wrt, has_aux),
            lambda: recipes.schedule(recipes.value_and_grad_graph(self.graph, wrt, has_aux)),
            lambda program: self.compile(program, "value_and_grad")))

    def split(self) -> Split:
        """The forward/backward pair, differentiating every float input."""
        def derive(wrt: list[int]) -> tuple[SplitGraphs, Program, Program]:
            graphs = recipes.split_graphs(self.graph, wrt)
            return graphs, recipes.schedule(graphs.forward), recipes.schedule(graphs.backward)

        def build() -> Split:
            wrt = self.all_differentiable()
            return self.program(("split", tuple(wrt)), lambda: derive(wrt), lambda derived: Split(
                derived[0], self.compile(derived[1], "forward"), self.compile(derived[2], "backward"), wrt))
        return self.built("split", build)

    def kernel_counts(self) -> dict[str, int]:
        """How many fused kernels each mode runs (compiling what it needs)."""
        counts = {"call": self.call().kernel_count}
        wrt = self.all_differentiable()
        if wrt and recipes.has_scalar_output(self.graph):
            counts["value_and_grad"] = self.value_and_grad(wrt).kernel_count
        if wrt:
            split = self.split()
            counts["forward"], counts["backward"] = split.forward.kernel_count, split.backward.kernel_count
        return counts


class PlanCache:
    """The plans of one traced function, least recently used first, with hit and miss counts."""

    def __init__(self, fn: Callable[..., Any], arguments: Arguments, backend: Backend):
        self.fn = fn
        self.arguments = arguments
        self.backend = backend
        self.plans: OrderedDict[CallSignature, Plan] = OrderedDict()
        self.by_fast_key: dict[tuple, Plan] = {}
        self.repeats: dict[Any, tuple[RepeatCall, ...]] = {}  # per mode and options, newest first
        self.lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0}
        self.label = describe(fn)
        self._recent: Plan | None = None  # the plan `used` last: marking it again is skipped

    def repeat(self, key: Any, args: tuple) -> Any:
        """The result of a call whose arguments match a repeat-call entry of `key` (a mode and its options as the
        caller passed them), or MISS. A plan whose captured arrays changed is dropped (MISS: the call traces)."""
        try:
            entries = self.repeats.get(key)
        except TypeError:  # an unhashable option (argnums as a list): the general path
            return MISS
        if entries is None:
            return MISS
        for entry in entries:
            result = entry.run(args)
            if type(result) is Signal:
                if result is MISS:
                    continue
                if result is SETTLED:
                    entry.run = entry.compile()
                    return self.repeat(key, args)
                self.drop(entry.plan)
                return MISS
            self.stats["hits"] += 1
            if self._recent is not entry.plan:
                self.used(entry.plan)
            return result
        return MISS

    def remember(self, key: Any, call: Call, plan: Plan, exe: Any, results: Callable[..., str]) -> None:
        """Make later calls of `key` with arguments of this call's signature run `exe` through one `RepeatCall`,
        whose result `results` writes; not for tensors, backends without `repeat_calls`, arguments it cannot
        check (objects)."""
        try:
            if call.tensors or not self.backend.repeat_calls or key in plan.repeat_tried:
                return
            plan.repeat_tried.add(key)
            entry = RepeatCall.build(plan, call, self.arguments.static_argnums, exe, results)
        except TypeError:  # an unhashable option or static value: the general path only
            return
        with self.lock:
            if entry is None or self.plans.get(plan.signature) is not plan:
                return  # not checkable, or dropped meanwhile
            kept = [e for e in self.repeats.get(key, ()) if e.plan is not plan]
            for e in kept[MAX_REPEATS - 1:]:
                e.plan.repeat_tried.discard(key)
            self.repeats[key] = (entry, *kept[:MAX_REPEATS - 1])

    def drop(self, plan: Plan) -> None:
        """Forget `plan` (its captured arrays changed, say): the next call with its signature traces again."""
        with self.lock:
            self.forget(plan)

    def info(self) -> dict[str, int]:
        """Hit and miss counts and plans held (`Traced.cache_info`)."""
        return {**self.stats, "entries": len(self.plans)}

    def repeat_count(self) -> int:
        """Repeat-call entries held, over every mode."""
        return sum(map(len, self.repeats.values()))

    def find(self, call: Call) -> tuple[Plan, list[np.ndarray]]:
        """The plan for a call's arguments and the current values of the arrays it reads from outside them;
        a plan whose captured arrays changed shape or dtype, or were rebound to something else than an
        array, is traced again."""
        plan, sig = self._lookup(call)
        if not plan.captures:
            return plan, []
        captured = plan.captures.read()
        if captured is None:
            plan = self._retrace(plan, call, sig)
            captured = plan.captures.read()
            if captured is None:
                raise InputError(f"{self.arguments.name}: the arrays it reads from outside its arguments changed "
                                 f"while it was traced; call it again once they are stable")
        return plan, captured

    def used(self, plan: Plan) -> None:
        """Mark `plan` as the most recently used."""
        self._recent = plan
        try:
            self.plans.move_to_end(plan.signature)
        except KeyError:  # dropped by another thread meanwhile: this call still runs it
            pass

    def forget(self, plan: Plan) -> None:
        """Drop a plan and the fast keys and repeat-call entries that lead to it (call under `lock`)."""
        self.plans.pop(plan.signature, None)
        for key in [k for k, v in self.by_fast_key.items() if v is plan]:
            del self.by_fast_key[key]
        self.repeats = {k: tuple(e for e in entries if e.plan is not plan) for k, entries in self.repeats.items()}
        if self._recent is plan:
            self._recent = None

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()
            self.by_fast_key.clear()
            self.repeats.clear()
            self._recent = None

    def _lookup(self, call: Call) -> tuple[Plan, CallSignature | None]:
        fast = call.fast
        found = self.by_fast_key.get(fast) if fast is not None else None
        if found is not None:
            self.stats["hits"] += 1
            self.used(found)
            return found, None
        sig = self.arguments.call_signature(call)
        found = self.plans.get(sig)
        if found is not None:
            self.stats["hits"] += 1
            self.used(found)
            if fast is not None:
                self.by_fast_key[fast] = found
            return found, sig
        with self.lock:
            found = self.plans.get(sig)
            if found is not None:
                self.stats["hits"] += 1
                return found, sig
            return self._traced(sig, fast), sig

    def _retrace(self, stale: Plan, call: Call, sig: CallSignature | None) -> Plan:
        """Replace a plan whose captured arrays no longer fit it by a new trace."""
        sig = sig or self.arguments.call_signature(call)
        with self.lock:
            current = self.plans.get(sig)
            if current is not None and current is not stale:
                return current  # another thread re-traced it already
            self.forget(stale)
            return self._traced(sig, call.fast)

    def _traced(self, sig: CallSignature, fast: tuple | None) -> Plan:
        """Trace the function for `sig` and keep the plan (called under `lock`)."""
        self.stats["misses"] += 1

        def on_leaves(*leaves: Any) -> Any:
            return self.fn(*sig.rebuild(leaves))

        names = self.arguments.leaf_names(sig)
        try:
            with collector.pause:
                traced = trace_to_graph(on_leaves, list(sig.avals), names, parent=None, reads_from=self.fn)
        except (JitgradError, TypeError) as exc:
            hint = self.arguments.tree_hint(sig)
            if hint is None:
                raise
            raise InputError(f"{hint}; tracing failed with it:\n{type(exc).__name__}: {exc}") from exc
        plan = Plan(sig, traced.graph, traced.tree, names, self.backend, traced.captures, label=self.label)
        self.plans[sig] = plan
        if fast is not None:
            self.by_fast_key[fast] = plan
        limit = max_plans()
        while len(self.plans) > limit:
            self.forget(next(iter(self.plans.values())))
        return plan
