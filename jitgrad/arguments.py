"""The arguments of a traced function's calls: bound by its signature, turned into the abstract values
a plan is specialised on (static ones keyed by type and value), torch tensors viewed as numpy arrays,
and cotangents checked against the outputs they belong to."""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InputError
from .ir import Aval
from .tracing import SUPPORTED_DTYPES

WEAK_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


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


@dataclass(frozen=True)
class CallSignature:
    """What a plan is specialised on: per argument an aval, or (None) a static argument, with its value."""

    avals: tuple[Aval | None, ...]
    statics: tuple[tuple[int, StaticValue], ...]


def device_array_aval(x: Any) -> Aval | None:
    """Shape and dtype of a CUDA device array (numba's, or anything with `__cuda_array_interface__`)."""
    interface = getattr(x, "__cuda_array_interface__", None)
    if interface is not None:
        return Aval(tuple(interface["shape"]), np.dtype(interface["typestr"]), False)
    if getattr(x, "__cuda_ndarray__", False):
        return Aval(tuple(x.shape), np.dtype(x.dtype), False)
    return None


def arg_aval(i: int, x: Any, fname: str, device: str = "cpu") -> Aval:
    """The abstract value of argument `i`: Python numbers are weakly typed, arrays keep their dtype."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        if type(x) is int and not _INT64_MIN <= x <= _INT64_MAX:
            raise InputError(f"{fname}: argument {i} is the Python int {x}, outside int64's range; pass it as a "
                             f"float, or as a numpy array of the dtype you need")
        return Aval((), WEAK_DTYPES[type(x)], True)
    if isinstance(x, (np.ma.MaskedArray, np.matrix)):
        raise InputError(f"{fname}: argument {i} is a numpy {type(x).__name__}, whose semantics (masks, matrix "
                         f"products) jitgrad does not follow; pass a plain array (e.g. x.filled(0) or np.asarray(x))")
    on_device = device_array_aval(x)
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


def cotangent_array(g: Any, aval: Aval, fname: str, k: int) -> np.ndarray:
    """A cotangent as an array of its output's dtype; complex or non-numeric values are refused."""
    try:
        arr = np.asarray(g)
    except (TypeError, ValueError):
        arr = np.empty(0, object)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{fname}: cotangent {k} is a {type(g).__name__} of dtype {arr.dtype}; pass a real "
                         f"array of output {k}'s shape {aval.shape} ({aval.dtype})")
    return arr.astype(aval.dtype, copy=False)


def as_array(x: Any, aval: Aval) -> np.ndarray:
    """Argument `x` as an array of its plan's dtype (a no-op for the common case)."""
    if type(x) is np.ndarray and x.dtype == aval.dtype:
        return x
    return np.asarray(x, dtype=aval.dtype)


def numpy_args(args: Sequence[Any], fname: str, device: str = "cpu") -> tuple[Sequence[Any], bool]:
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


def as_tensors(values: Sequence[Any]) -> list[Any]:
    """Results as torch tensors sharing their memory (None stays None)."""
    torch = sys.modules["torch"]
    return [None if v is None else torch.from_numpy(np.asarray(v)) for v in values]


class Arguments:
    """How one traced function takes its arguments: its signature (for keywords and arity), which
    positions are static, and the keys a plan cache looks calls up by."""

    def __init__(self, fn: Callable[..., Any], name: str, static_argnums: tuple[int, ...], device: str):
        self.name = name
        self.static_argnums = static_argnums
        self.device = device
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        self.param_names = list(self.signature.parameters) if self.signature else []

    def positional(self, args: Sequence[Any], kwargs: dict) -> tuple:
        """The arguments checked against fn's signature, keyword ones made positional (plans and argnums are
        positional)."""
        if self.signature is None:  # not introspectable (some builtins): numpy checks the call itself
            if kwargs:
                raise InputError(f"{self.name}: pass arguments by position (its signature cannot be inspected)")
            return tuple(args)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InputError(f"{self.name}: {exc}") from None
        if bound.kwargs:
            raise InputError(f"{self.name}: keyword-only or **kwargs parameters ({sorted(bound.kwargs)}) cannot "
                             f"be traced; make them positional")
        return bound.args

    def names(self, positions: Sequence[int]) -> list[str]:
        return [self.param_names[i] if i < len(self.param_names) else f"arg{i}" for i in positions]

    def call_signature(self, args: Sequence[Any]) -> CallSignature:
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
                avals.append(arg_aval(i, x, self.name, self.device))
        return CallSignature(tuple(avals), tuple(statics))

    def fast_key(self, args: Sequence[Any]) -> tuple | None:
        """A cheap hashable key for the common argument kinds (None: take the validating path)."""
        key: list[Any] = []
        for i, x in enumerate(args):
            if i in self.static_argnums:
                key.append(("static", static_key(x)))
            elif type(x) is np.ndarray:
                key.append((x.shape, x.dtype))
            elif type(x) in WEAK_DTYPES:
                if type(x) is int and not _INT64_MIN <= x <= _INT64_MAX:
                    return None  # the validating path says what is wrong
                key.append(type(x))
            else:
                return None
        return tuple(key)
