"""Runtime: a scheduled `Program` bound to compiled kernels, run on numpy arrays.

An `Executable` keeps every value in a slot list; kernel steps allocate their outputs and call a
numba dispatcher (the serial variant for small domains; for large ones whichever of serial and
parallel proved faster on the first calls), host steps
call the primitive's numpy reference (BLAS for matmul, views for reshapes and slices). Outputs never alias
inputs or each other: anything that would is copied. Kernel output buffers are recycled between
calls, and within a call by later outputs whose lifetimes do not overlap (planned once), only when
nothing else still references them (`jitgrad.kernels.buffers`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numba
import numpy as np

from jitgrad.ir.primitive import Kind
from jitgrad.kernels import recycled
from jitgrad.kernels.buffers import BufferPool, OutputBuffers, outputs_to_copy
from jitgrad.kernels.build import background, compiler, helper, progress, quick_codegen
from jitgrad.kernels.cpu import blas_operands, first_call
from jitgrad.kernels.cpu import codegen as cpu
from jitgrad.kernels.cpu.variants import PARALLEL, SERIAL, CallSpread, VariantChooser
from jitgrad.cores import on_one_core
from jitgrad.passes.loops import HostStep, LoopKernel, Program
from jitgrad.kernels.slots import SlotTable, release_after, run_steps

QUICK = "quick_kernel"  # the serial variant with quick machine code (`quick_codegen`), for a cold first call
PROMOTE_AT_CALL = 2  # a quick kernel's full-level code is compiled once it runs again (a loop), not for one call
VARIANTS = {PARALLEL: {"parallel": True}, SERIAL: {}, QUICK: quick_codegen.QUICK}


@dataclass
class _KernelCall:
    kernel: LoopKernel
    compiled: compiler.CompiledSource
    chooser: VariantChooser
    inputs: list[int]
    outputs: list[int]
    buffers: OutputBuffers
    contiguous: tuple[int, ...] = ()  # inputs host views make (a reshape of a slice may be strided): copied if so

    def __post_init__(self) -> None:
        self.scalars = cpu.scalar_arguments(self.kernel)
        self.helper_key: tuple | None = None  # on the first call: the kernel offered to `kernels.build.helper`
        self.serial = SERIAL  # what runs the serial kernel: QUICK until its full-level code is in (`promote`)
        self.full_level: tuple | None = None  # argument types of the full-level code `promote` asked for
        self.quick_calls = 0
        # No 0-d array to pass as 1-d and no view to make contiguous: `cpu.kernel_arguments` in one expression.
        self.plain = not self.contiguous and all(a.aval.ndim for a in [*self.kernel.inputs, *self.kernel.outputs])
        self.settled: Any = None  # the serial kernel's dispatcher once nothing else can run (`Executable.steady`)

    def guessed_signature(self, slots: list[Any], typed: dict[Any, Any]) -> tuple:
        """numba's types of this call's arguments, guessed before the first call runs: the call's inputs and
        constants as they are (`slots` before any step ran), every other array C-contiguous and writable, of
        its planned dtype and rank. `typed` keeps the array types found in this pass (`first_call.numba_type`)."""
        ins = [slots[i] if slots[i] is not None else first_call.stand_in(a.aval)
               for i, a in zip(self.inputs, self.kernel.inputs)]
        outs = [first_call.stand_in(o.aval) for o in self.kernel.outputs]
        return tuple(first_call.numba_type(a, typed) for a in cpu.kernel_arguments(self.kernel, ins, outs, self.scalars))

    def run(self, slots: list[Any]) -> None:
        outs = self.buffers.take()
        if self.plain:
            args = [*self.kernel.domain, *[slots[i] for i in self.inputs], *self.scalars, *outs]
        else:
            arrays = [slots[i] for i in self.inputs]
            for p in self.contiguous:
                arrays[p] = np.ascontiguousarray(arrays[p])
            args = cpu.kernel_arguments(self.kernel, arrays, outs, self.scalars)
        one_core = on_one_core.on
        chosen = SERIAL if one_core else self.chooser.next()
        variant = self.serial if chosen == SERIAL else chosen
        if one_core or self.chooser.choice is not None:
            self.compiled.call(variant, args)
        elif chosen == PARALLEL and not self.compiled.ready(PARALLEL, args):
            # Tiered start: the serial variant compiles faster and answers the first calls, while the
            # parallel one compiles in the background; timing both starts once it is ready.
            self.compiled.call(self.serial, args)
            if PARALLEL in self.compiled.failed:
                self.chooser.keep(SERIAL)
            else:
                self.compiled.compile_in_background(PARALLEL, args)
        else:
            start = time.perf_counter()
            self.compiled.call(variant, args)
            self.chooser.record(chosen, time.perf_counter() - start)
        if self.serial == QUICK:
            self.promote(args)
        elif self.chooser.fixed and self.chooser.choice == SERIAL and not self.contiguous and not self.buffers.pooled:
            self.settled = self.compiled.functions[SERIAL]
        for i, o in zip(self.outputs, outs):
            slots[i] = o

    def promote(self, args: list[Any]) -> None:
        """A quick kernel's full-level code: from its PROMOTE_AT_CALL-th call on, compiled in the background before
        any parallel variant; the calls after it is in run it, the quick code until then (a kernel a script
        runs once is never compiled twice)."""
        self.quick_calls += 1
        if self.quick_calls < PROMOTE_AT_CALL:
            return
        if self.full_level is None:
            self.full_level = tuple(numba.typeof(a) for a in args)
            self.compiled.compile_in_background(SERIAL, args, urgent=True)
        elif self.full_level in self.compiled.functions[SERIAL].overloads:
            self.serial = SERIAL


@dataclass
class _HostCall:
    fn: Callable[..., Any]
    params: dict[str, Any]
    inputs: list[int]
    outputs: list[int]
    fresh: bool = False  # the result is a new array: an output needs no copy
    buffers: OutputBuffers | None = None  # where `fn` writes its one output (`out=`), for ops that take one

    def run(self, slots: list[Any]) -> None:
        if self.buffers is not None:
            (out,) = self.buffers.take()
            res = self.fn(*[slots[i] for i in self.inputs], out=out, **self.params)
        else:
            res = self.fn(*[slots[i] for i in self.inputs], **self.params)
        if len(self.outputs) == 1:
            slots[self.outputs[0]] = res
        else:
            for i, r in zip(self.outputs, res):
                slots[i] = r


class Executable:
    """A program ready to run: call it with the graph's input arrays, get its output arrays. `label` names
    it in the progress of a slow first call (`jitgrad.progress`)."""

    def __init__(self, program: Program, label: str = "a traced function"):
        self.program = program
        self.label = label
        self.first = True  # the first call compiles the kernels, reporting progress when slow
        self.settled = False  # `run` is the generated `steady` function
        self.numpy_first = first_call.Tier(program.graph, (SERIAL, QUICK), label)  # or runs on numpy while they compile
        graph = program.graph
        self.table = SlotTable(graph)
        self._slot = self.table.slot
        self.buffers = BufferPool()
        self.n_inputs = len(graph.inputs)
        self.host_views = {o for s in program.steps if isinstance(s, HostStep) and s.eqn.prim.kind is Kind.VIEW
                           for o in s.eqn.outs}
        self.copied = blas_operands.copied_views(program.steps)
        texts: dict[str, str] = {}  # the kernel sources `_bind` generates, each text once
        self.calls: list[_KernelCall | _HostCall] = [self._bind(s, texts) for s in program.steps]
        self.output_slots, self.initial = [self._slot(a) for a in graph.outputs], self.table.initial
        self.constants = self.initial[self.n_inputs:]  # the slots after the inputs, as each call starts them
        fresh = {i for c in self.calls if isinstance(c, _KernelCall) for i in c.outputs}
        fresh |= {i for c in self.calls if isinstance(c, _HostCall) and c.fresh for i in c.outputs}
        self.copy_output = outputs_to_copy(self.output_slots, fresh)
        self.any_copy = any(self.copy_output)
        self.sources = [c.compiled.source for c in self.calls if isinstance(c, _KernelCall)]
        released = release_after(self.table, [(c.inputs, c.outputs) for c in self.calls], self.output_slots)
        self.steps = list(zip(self.calls, released))
        returned = [s for s, copy in zip(self.output_slots, self.copy_output) if not copy]  # outlive the call
        self.buffers.plan([(c.inputs, c.outputs, c.buffers, isinstance(c, _HostCall) and not c.fresh)
                           for c in self.calls], released, returned)
        self.spread = CallSpread([c.chooser for c in self.calls if isinstance(c, _KernelCall)],
                                 any(s.eqn.prim.kind is Kind.HOST for s in program.steps if isinstance(s, HostStep)))

    def _bind(self, step: LoopKernel | HostStep, texts: dict[str, str]) -> _KernelCall | _HostCall:
        if isinstance(step, HostStep):
            e = step.eqn
            out = e.outs[0].aval
            copied = e.outs[0] in self.copied
            site = self.buffers.site([out.shape], [out.dtype]) if e.prim.takes_out or copied else None
            pooled = site is not None and site.pooled
            impl = blas_operands.contiguous(e.prim.impl, into=pooled) if copied else e.prim.impl
            return _HostCall(impl, dict(e.params), [self._slot(a) for a in e.inputs],
                             [self._slot(o) for o in e.outs], e.prim.fresh_output or pooled, site if pooled else None)
        source = step.lowered.get("cpu")
        if source is None:  # a program the disk cache stores keeps it (`LoopKernel.lowered`); equal texts shared
            text = cpu.module_source(step)
            source = step.lowered["cpu"] = texts.setdefault(text, text)
        compiled = compiler.load(source, VARIANTS)
        size = math.prod(map(int, step.domain))  # Python ints: exact, and a tenth of np.prod's time
        site = self.buffers.site([o.aval.shape for o in step.outputs], [o.aval.dtype for o in step.outputs])
        return _KernelCall(step, compiled, VariantChooser(size), [self._slot(a) for a in step.inputs],
                           [self._slot(o) for o in step.outputs], site,
                           tuple(p for p, a in enumerate(step.inputs) if a in self.host_views))

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.run(args)

    def run(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """A call over the slot list; replaced on the instance by the generated `steady` function once there is one."""
        slots = [*args, *self.constants]
        if self.first:
            typed: dict[Any, Any] = {}
            guesses = [(c, c.guessed_signature(slots, typed)) for c in self.calls if isinstance(c, _KernelCall)]
            outs = self.numpy_first.call(args, [(c.compiled, signature) for c, signature in guesses])
            if outs is not None:
                return outs
            self._first_run(slots, guesses)
        else:
            self.spread.run(lambda: run_steps(self.steps, slots))
            if all(c.settled is not None if isinstance(c, _KernelCall) else c.buffers is None for c in self.calls):
                self.run, self.settled = self.steady(), True  # type: ignore[method-assign]
        if not self.any_copy:
            return [slots[s] for s in self.output_slots]
        return [np.array(slots[s], copy=True) if copy else slots[s]
                for s, copy in zip(self.output_slots, self.copy_output)]

    def steady(self) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        """The call as one generated function (`steady_source`): `run` once every kernel has settled."""
        params = [f"a{i}" for i in range(self.n_inputs)]
        lines, names, outs, _ = self.steady_source(params)
        text = "".join(f"    {line}\n" for line in [f"{''.join(f'{p}, ' for p in params)}= args" * bool(params),
                                                     *lines, f"return [{', '.join(outs)}]"])
        exec(compile("def steady(args):\n" + text, f"<jitgrad steady call of {self.label}>", "exec"), names)
        return names.pop("steady")  # not left in its own globals (a cycle)

    def steady_source(self, inputs: Sequence[str]) -> tuple[list[str], dict[str, Any], list[str], list[str]]:
        """The settled call (every kernel on its settled serial code, no host step writing into a pooled buffer) as
        lines reading the graph inputs from the expressions `inputs`: outputs allocated as each kernel takes them, or
        small ones recycled (`jitgrad.kernels.recycled`; 0-d as 1-d, `t<slot>`), dispatchers and constants bound (names `k<n>` of the returned dict), values dropped where
        `release_after` says; no slot list. Also each output's expression (copied where `copy_output` says) and its
        value's as a numpy scalar (a 0-d result's)."""
        ring: list[Any] = []  # two places per recycled output (`jitgrad.kernels.recycled`)
        recycle = recycled.enabled()
        names: dict[str, Any] = dict(empty=np.empty, array=np.array, count=compiler.CompiledSource._count_new_overloads,
                                     ring=ring, **recycled.names())

        def ref(value: Any) -> str:
            names[f"k{len(names)}"] = value
            return f"k{len(names) - 1}"

        slot = [f"s{i}" if v is None else ref(v) for i, v in enumerate(self.initial)]
        slot[:self.n_inputs] = inputs
        read, scalar = {i for c in self.calls for i in c.inputs}, {}
        lines: list[str] = []
        for c, released in self.steps:
            ins = [slot[i] for i in c.inputs]
            if isinstance(c, _KernelCall):
                zero_d = [o.aval.ndim == 0 for o in c.kernel.outputs]
                outs = [f"t{i}" if z else slot[i] for i, z in zip(c.outputs, zero_d)]
                for t, o in zip(outs, c.kernel.outputs):
                    allocate = f"empty({tuple(map(int, o.aval.shape)) or (1,)!r}, {ref(o.aval.dtype)})"
                    if recycle and o.aval.nbytes <= recycled.RING_BYTES:
                        lines += recycled.take_lines(t, allocate, "ring", len(ring) // 2)
                        ring += [None, None]
                    else:
                        lines.append(f"{t} = {allocate}")
                ins = [f"{s}.reshape(1)" if a.aval.ndim == 0 else s for s, a in zip(ins, c.kernel.inputs)]
                fn, source = ref(c.settled), ref(c.compiled)
                lines += [f"known = len({fn}.overloads)", f"{fn}({''.join(f'{int(d)}, ' for d in c.kernel.domain)}"
                          f"{''.join(f'{a}, ' for a in [*ins, *map(ref, c.scalars)])}{', '.join(outs)})",
                          f"if len({fn}.overloads) != known: count({source}, {SERIAL!r})"]
                for i in (i for i, z in zip(c.outputs, zero_d) if z):  # a result takes `t<slot>[0]`
                    lines += [f"s{i} = t{i}.reshape(())"] * (i in read)
                    slot[i], scalar[i] = f"s{i}" if i in read else f"t{i}.reshape(())", f"t{i}[0]"
            else:
                lines.append(f"{', '.join(slot[i] for i in c.outputs)}{', *_' * (len(c.outputs) > 1)} = "
                             f"{ref(c.fn)}({''.join(f'{a}, ' for a in ins)}**{ref(c.params)})")
            lines += [f"s{i} = None" for i in released if slot[i] == f"s{i}"]
        outs = [f"array({slot[s]}, copy=True)" if copy else slot[s]
                for s, copy in zip(self.output_slots, self.copy_output)]
        return lines, names, outs, [scalar.get(s, f"{slot[s]}[()]") for s in self.output_slots]

    def _first_run(self, slots: list[Any], guesses: list[tuple[_KernelCall, tuple]]) -> None:
        """Run every step, telling a progress reporter before each kernel (each compiles on its first run).
        With the compile helper (`kernels.build.helper`), the kernels are first compiled here and there, largest
        first, then the steps run. Background compiles wait until it returns (`background.Scheduler.foreground`).
        A first call that raised (a KeyboardInterrupt in a compile, say) leaves the next call a first call."""
        with background.scheduler.foreground():
            self._first_steps(slots, guesses)
        self.first = False

    def _first_steps(self, slots: list[Any], guesses: list[tuple[_KernelCall, tuple]]) -> None:
        compile_helper = self._offer_to_helper(guesses)
        report = progress.first_call(self.label, self.kernel_count)
        if report is None and compile_helper is None:
            run_steps(self.steps, slots)
            return
        k = 0
        try:
            if compile_helper is not None:
                self._compile_ahead(compile_helper, report)
            for c, released in self.steps:
                if isinstance(c, _KernelCall):
                    k += 1
                    if report is not None:
                        report.kernel(k)
                    if c.helper_key is not None and compile_helper is not None:
                        compile_helper.take(c.helper_key)
                c.run(slots)
                for i in released:
                    slots[i] = None
        except BaseException:
            if report is not None:
                report.end(completed=False)
            raise
        if report is not None:
            report.end(completed=True)

    def _offer_to_helper(self, guesses: list[tuple[_KernelCall, tuple]]) -> helper.CompileHelper | None:
        """Queue the kernels this first call will compile for the compile helper, largest first; None when it
        is not used (too few kernels to build, or `helper.helper` is None). Kernels whose serial machine code is
        neither here nor on disk run their quick code (`quick_codegen`), built here and there or read from disk,
        until `_KernelCall.promote` has their full-level code."""
        compile_helper = helper.helper()
        if compile_helper is None:
            return None
        found: dict[tuple, helper.Job | None] = {}  # per kernel and signature: an unrolled loop's steps share them
        to_build: list[tuple[_KernelCall, helper.Job]] = []
        for c, signature in guesses:
            key = first_call.kernel_key(c.compiled, signature)
            if key not in found:
                found[key] = helper.job_for(c.compiled, SERIAL, signature)
            if found[key] is not None:
                to_build.append((c, found[key]))
        if len({job.key for _, job in to_build}) < helper.MIN_KERNELS:
            return None
        quick = quick_codegen.enabled()
        jobs: dict[tuple, tuple[int, helper.Job]] = {}
        for c, serial_job in to_build:
            job: helper.Job | None = serial_job
            if quick:  # the quick code is built instead, unless it is on disk already
                c.serial = QUICK
                job = helper.job_for(c.compiled, QUICK, serial_job.key[2])
            c.helper_key = None if job is None else job.key
            if job is not None:
                jobs.setdefault(job.key, (len(c.compiled.source), job))
        compile_helper.offer([job for _, job in sorted(jobs.values(), key=lambda sized: -sized[0])])
        return compile_helper

    def _compile_ahead(self, compile_helper: helper.CompileHelper, report: progress.FirstCall | None) -> None:
        """Compile queued kernels here, largest first, while the helper compiles others, until the queue is
        empty; the steps then run with every kernel built here or on disk (or compile one whose guessed
        argument types were wrong). A compile that fails here is left for its step, which raises it."""
        step_keys = [c.helper_key for c in self.calls if isinstance(c, _KernelCall)]
        queued = [key for key in step_keys if key is not None]
        while True:
            if report is not None:
                report.building(len(step_keys) - len(queued) + compile_helper.settled(queued))
            job = compile_helper.claim_next()
            if job is None:
                return
            try:
                helper.compile_here(job)
            except Exception:  # noqa: BLE001 - the step compiles it again and raises it to the caller
                pass

    @property
    def kernel_count(self) -> int:
        return sum(isinstance(c, _KernelCall) for c in self.calls)
