"""Where compiled programs run: the `Backend` protocol (what the plan compiler asks of a backend) and the
registry that chooses one by device name.

A backend binds a scheduled program to its kernels (an `Executable`), turns a call's arguments into its
inputs and its outputs into results, takes cotangents, recognises its own device arrays and counts what it
compiled. Each lives in one folder of kernels/ (code generation, executor, adapter); its adapter class is
registered here under the device name `jg.trace(device=...)` takes. This module is the one place that names
the backends: the CPU's is imported with jitgrad, every other on first use, so CPU-only code never loads
one, and a backend whose folder is missing makes its device "not available" and nothing else.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, ContextManager, Protocol, Sequence

from jitgrad.errors import UnsupportedError
from jitgrad.ir.graph import Aval
from jitgrad.kernels.cpu import first_call
from jitgrad.kernels.cpu.backend import CpuBackend
from jitgrad.passes.loops import Program


class Executable(Protocol):
    """A program bound to a backend's kernels: called with the graph's inputs, it returns its outputs."""

    def __call__(self, args: Sequence[Any]) -> list[Any]: ...

    @property
    def kernel_count(self) -> int:
        """The fused kernels it runs (copies and host steps not counted)."""


class Backend(Protocol):
    """What the plan compiler (`jitgrad.runtime.plans`) and the API (`jitgrad.front.api`, `jitgrad.runtime.arguments`) ask of a
    backend. The class attributes and `device_aval` are asked of the class, before (or without) making one:
    making one may fail where its device is missing."""

    name: ClassVar[str]  # the device name it is registered under
    title: ClassVar[str]  # how messages name it ("a <title> device array")
    on_host: ClassVar[bool]  # runs on numpy arrays (torch CPU tensors in, tensors out); False: device arrays
    repeat_calls: ClassVar[bool]  # its executables take a call's numpy arrays as they are and give outputs
    # that need only numpy's 0-d-to-scalar rule: repeat calls may skip `inputs`/`result` (runtime.repeats)

    @staticmethod
    def device_aval(x: Any) -> Aval | None:
        """Shape and dtype of `x` if it is one of this backend's device arrays, else None."""

    def executable(self, program: Program, label: str) -> Executable:
        """`program` bound to compiled kernels; `label` names it in the progress of a slow first call."""

    def inputs(self, args: Sequence[Any], avals: Sequence[Aval]) -> list[Any]:
        """A call's argument leaves as the executable's inputs of `avals` (host values moved in, or not yet)."""

    def result(self, a: Any) -> Any:
        """One output as the caller gets it."""

    def cotangent(self, g: Any, aval: Aval, fname: str, k: int) -> Any:
        """Cotangent `k` of `fname`'s outputs (`aval`'s dtype) as the backward executable's input."""

    def stats(self) -> dict[str, int]:
        """Process-wide counters: `kernels` (sources held), `compiles`, `disk_loads`, `numpy_calls` (calls run by
        numpy while their kernels compiled), `one_core_calls` (calls kept on one core)."""


def _cuda() -> type[Backend]:
    from jitgrad.kernels.cuda.backend import CudaBackend
    return CudaBackend


# device name -> its backend's class (imported on first use): choosing a backend is a lookup here
REGISTRY: dict[str, Callable[[], type[Backend]]] = {"cpu": lambda: CpuBackend, "cuda": _cuda}
_loaded: dict[Callable[[], type[Backend]], type[Backend] | str] = {}  # factory -> its class, or why none


def backend_class(device: str) -> type[Backend]:
    """The class of `device`'s backend; an unknown device, or one whose backend cannot be imported, is refused."""
    factory = REGISTRY.get(device)
    if factory is None:
        *others, last = [repr(d) for d in REGISTRY]
        raise UnsupportedError(f"device {device!r} is not available; jitgrad supports device="
                               f"{', '.join(others) + ' and ' if others else ''}{last}")
    found = _loaded.get(factory)
    if found is None:
        try:
            found = factory()
        except ImportError as exc:
            found = f"device {device!r} is not available: its backend cannot be imported ({exc})"
        _loaded[factory] = found
    if isinstance(found, str):
        raise UnsupportedError(found)
    return found


def backend(device: str) -> Backend:
    """The backend of `device` (a key of `REGISTRY`)."""
    return backend_class(device)()


def device_array(x: Any) -> tuple[type[Backend], Aval] | None:
    """Whose device array `x` is (the backend's class) and its aval; None if no registered backend's (those that
    cannot be imported are not asked)."""
    for device in REGISTRY:
        try:
            kind = backend_class(device)
        except UnsupportedError:
            continue
        aval = kind.device_aval(x)
        if aval is not None:
            return kind, aval
    return None


def compiled_first_calls() -> ContextManager[None]:
    """A block in which every first call runs the compiled kernels (the CPU's numpy first call off, as with
    JITGRAD_FIRST_CALL=compiled): for procedures that compare calls in their last bits (`jg.gradcheck`)."""
    return first_call.compiled_only()
