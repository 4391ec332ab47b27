"""Runtime: a scheduled `Program` bound to compiled kernels, run on numpy arrays.

An `Executable` keeps every value in a slot list; kernel steps allocate their outputs and call a
numba dispatcher (the serial variant for small domains, the parallel one for large), host steps
call the primitive's numpy reference (BLAS for matmul, views for reshapes). Outputs never alias
inputs or each other: anything that would is copied.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .fusion import HostStep, LoopKernel, Program
from .ir import Atom, Literal, Var
from .kernels import compiler, cpu

@dataclass
class _KernelCall:
    kernel: LoopKernel
    compiled: compiler.CompiledSource
    variant: str
    inputs: list[int]
    outputs: list[int]
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[np.dtype]

    def run(self, slots: list[Any]) -> None:
        outs = [np.empty(s, d) for s, d in zip(self.out_shapes, self.out_dtypes)]
        ins = [slots[i] for i in self.inputs]
        self.compiled.call(self.variant, cpu.kernel_arguments(self.kernel, ins, outs))
        for i, o in zip(self.outputs, outs):
            slots[i] = o


@dataclass
class _HostCall:
    fn: Callable[..., Any]
    params: dict[str, Any]
    inputs: list[int]
    outputs: list[int]

    def run(self, slots: list[Any]) -> None:
        res = self.fn(*[slots[i] for i in self.inputs], **self.params)
        if len(self.outputs) == 1:
            slots[self.outputs[0]] = res
        else:
            for i, r in zip(self.outputs, res):
                slots[i] = r


class Executable:
    """A program ready to run: call it with the graph's input arrays, get its output arrays."""

    def __init__(self, program: Program):
        self.program = program
        graph = program.graph
        self.slot_of: dict[Var, int] = {}
        self.initial: list[Any] = []
        for v in graph.inputs:
            self._slot(v)
        self.n_inputs = len(graph.inputs)
        self.calls: list[_KernelCall | _HostCall] = [self._bind(s) for s in program.steps]
        self.output_slots = [self._slot(a) for a in graph.outputs]
        fresh = {i for c in self.calls if isinstance(c, _KernelCall) for i in c.outputs}
        fresh |= {i for c in self.calls if isinstance(c, _HostCall) and c.fn is np.matmul for i in c.outputs}
        seen: set[int] = set()
        self.copy_output = []
        for s in self.output_slots:
            self.copy_output.append(s not in fresh or s in seen)
            seen.add(s)
        self.sources = [c.compiled.source for c in self.calls if isinstance(c, _KernelCall)]

    def _slot(self, a: Atom) -> int:
        if isinstance(a, Literal):
            self.initial.append(a.value)
            return len(self.initial) - 1
        if a not in self.slot_of:
            self.slot_of[a] = len(self.initial)
            self.initial.append(None)
        return self.slot_of[a]

    def _bind(self, step: LoopKernel | HostStep) -> _KernelCall | _HostCall:
        if isinstance(step, HostStep):
            e = step.eqn
            return _HostCall(e.prim.impl, dict(e.params), [self._slot(a) for a in e.inputs],
                             [self._slot(o) for o in e.outs])
        compiled = compiler.load(cpu.module_source(step), {"parallel_kernel": {"parallel": True},
                                                           "serial_kernel": {}})
        size = int(np.prod(step.domain, dtype=np.int64))
        variant = "parallel_kernel" if size >= cpu.PARALLEL_MIN_SIZE else "serial_kernel"
        return _KernelCall(step, compiled, variant, [self._slot(a) for a in step.inputs],
                           [self._slot(o) for o in step.outputs], [o.aval.shape for o in step.outputs],
                           [o.aval.dtype for o in step.outputs])

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        slots = list(self.initial)
        slots[:self.n_inputs] = args
        for c in self.calls:
            c.run(slots)
        return [np.array(slots[s], copy=True) if copy else slots[s]
                for s, copy in zip(self.output_slots, self.copy_output)]

    @property
    def kernel_count(self) -> int:
        return sum(isinstance(c, _KernelCall) for c in self.calls)
