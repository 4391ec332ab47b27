"""Repeat calls: one mode of a plan (call, value-and-grad) for calls of one signature seen before, as one generated
function that checks the arguments and runs the executable (`RepeatCall`), and the signals it answers instead of a
result (`MISS`: not this signature, the general path runs; a plan whose captured arrays changed; an executable that
has settled). `jitgrad.runtime.plans.PlanCache` keeps the entries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.tracing import capture_paths, trees
from jitgrad.runtime.arguments import Call, static_key

Signal = type("Signal", (), {"__slots__": ()})  # what a repeat-call entry answers instead of a result:
MISS = Signal()  # a call it does not match (the general path runs)
STALE = Signal()  # the plan's captured arrays changed (the plan is dropped, then MISS)
SETTLED = Signal()  # its executable has settled (written into it: `RepeatCall.compile`, then run again)


@dataclass
class RepeatCall:
    """One mode of a plan (call, value-and-grad) for calls of one signature, as one generated function
    (`trees.Source`): it checks the arguments' structure, each array's type, shape and dtype, each number's type
    and each static value, in place of binding, flattening and a key; reads the captured arrays (their guards);
    runs the executable, its settled steps written out in the same function once it has them
    (`Executable.steady_source`); and builds the result. `run(args)` returns MISS for arguments it does not match."""

    plan: Any  # the `jitgrad.runtime.plans.Plan` it runs
    exe: Any
    checks: trees.Source  # the argument checks, each leaf left in a variable of `leaves`
    leaves: list[str]
    results: Callable[[trees.Source, Callable[[int], str]], str]  # the result's expression from each output's
    run: Any = None  # the generated function (`compile`)

    @classmethod
    def build(cls, plan: Any, call: Call, static_argnums: Sequence[int], exe: Any,
              results: Callable[[trees.Source, Callable[[int], str]], str]) -> "RepeatCall | None":
        src = trees.Source(ndarray=np.ndarray, asarray=np.asarray, MISS=MISS, STALE=STALE, SETTLED=SETTLED)
        names = [f"a{i}" for i in range(len(call.args))]
        src.lines += [f"if len(args) != {len(names)}: return MISS"] + [f"{', '.join(names)}, = args"] * bool(names)
        avals, leaves = iter(plan.signature.avals), []

        def leaf(src: trees.Source, var: str, x: Any) -> bool:
            aval, t = next(avals, None), type(x)
            if aval is None or getattr(x, "dtype", aval.dtype) != aval.dtype:
                return False
            dt = src.const(aval.dtype)
            if t is np.ndarray:
                src.line(f"if {trees.array_test(var, x.shape, dt)}: return MISS")
            elif t in (bool, int, float) or isinstance(x, np.generic):
                bounds = f" or not {-2**63} <= {var} <= {2**63 - 1}" if t is int else ""
                src.lines += [f"if type({var}) is not {src.const(t)}{bounds}: return MISS",
                              f"{var} = asarray({var}, {dt})"]
            else:
                return False
            leaves.append(var)
            return True

        for i, (var, x) in enumerate(zip(names, call.args)):
            if i in static_argnums:
                src.line(f"if {var} is not {src.const(x)} and {src.const(static_key)}({var}) != "
                         f"{src.const(static_key(x))}: return MISS")
            elif not trees.match_structure(src, var, x, leaf, "MISS"):
                return None
        found = MISS if next(avals, None) is not None else \
            src.function("repeat_inputs", "args", [*src.lines, f"return [{', '.join(leaves)}]"])(call.args)
        if found is MISS or len(found) != len(call.leaves) or \
                any(a is not b and not np.array_equal(a, b, equal_nan=True) for a, b in zip(found, call.leaves)):
            return None  # the generated checks do not see this call as the general path did: not used
        entry = cls(plan, exe, src, leaves, results)
        entry.run = entry.compile()
        return entry

    def compile(self) -> Callable[[tuple], Any]:
        """The function: the checks, the captured arrays, the executable (written out once it has settled)."""
        src, inputs, exe = self.checks.copy(), list(self.leaves), self.exe
        if self.plan.captures:  # read at every call, as `Captures.read` does
            inputs += capture_paths.read_source(src, self.plan.captures, "STALE")
        if getattr(exe, "settled", False):
            lines, names, outs, values = exe.steady_source(inputs)
            src.names.update(names)  # `k<n>`: apart from the checks' `K<n>`
            src.lines += lines
        else:
            settled = f"if {src.const(exe)}.settled: return SETTLED"  # no reference to this entry: no cycle
            src.lines += [settled] * hasattr(exe, "settled") + [f"o = {src.const(exe)}([{', '.join(inputs)}])"]
            outs = [f"o[{k}]" for k in range(len(exe.program.graph.outputs))]
            values = [f"{o}[()]" for o in outs]
        zero_d = [o.aval.ndim == 0 for o in exe.program.graph.outputs]
        src.line(f"return {self.results(src, lambda k: values[k] if zero_d[k] else outs[k])}")
        return src.function("repeat_call", "args")
