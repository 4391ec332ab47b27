"""The arguments of a traced function's calls: bound by its signature (keywords included), flattened
from pytrees into leaves, turned into the abstract values a plan is specialised on (static ones keyed by
type and value, trees by their structure), torch tensors viewed as numpy arrays; a device backend's arrays
are recognised by asking the registered backends (`jitgrad.runtime.backends`)."""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import optree

from jitgrad.runtime import backends
from jitgrad.tracing import trees
from jitgrad.errors import InputError
from jitgrad.ir.graph import Aval
from jitgrad.tracing.tracer import SUPPORTED_DTYPES

WEAK_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_MASKED = "numpy.ma"  # no masked array exists until it is imported: `np.ma` would import it (~5 ms)


def static_key(x: Any) -> Any:
    """A (hashable) static argument's identity for plan caches: its type with its value, recursively through
    tuples and frozensets, so values that compare equal across types (1, 1.0, True) get plans of their own."""
    if isinstance(x, tuple):
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


LEAF = "leaf"  # an argument that is one array or number (no tree around it)
STATIC = "static"  # a static argument: no leaves, its value is part of the signature


@dataclass(frozen=True)
class CallSignature:
    """What a plan is specialised on: an aval per leaf of the dynamic arguments (in order), per argument
    its structure (LEAF, STATIC or a pytree definition), and the static values."""

    avals: tuple[Aval, ...]
    structures: tuple[Any, ...]
    statics: tuple[tuple[int, StaticValue], ...]

    def leaf_ranges(self) -> list[range]:
        """Per argument, the positions of its leaves among all leaves (empty for a static one)."""
        ranges, start = [], 0
        for s in self.structures:
            n = 0 if s is STATIC else 1 if s is LEAF else s.num_leaves
            ranges.append(range(start, start + n))
            start += n
        return ranges

    def rebuild(self, leaves: Sequence[Any]) -> list[Any]:
        """The arguments from their leaves (static ones from their values)."""
        statics = {i: v.value for i, v in self.statics}
        return [statics[i] if s is STATIC else leaves[r.start] if s is LEAF
                else trees.tree_unflatten(s, leaves[r.start:r.stop])
                for i, (s, r) in enumerate(zip(self.structures, self.leaf_ranges()))]


@dataclass
class Call:
    """One call's arguments, flattened: the leaves (torch tensors viewed as numpy arrays), a cheap key for
    the plan cache (None: look the plan up by its full signature), and whether results go back as tensors."""

    args: tuple
    leaves: list[Any]
    fast: tuple | None
    tensors: bool = False


def arg_aval(what: str | int, x: Any, fname: str, device: str = "cpu") -> Aval:
    """The abstract value of an argument (`what`: its position, or how a message names it): Python numbers are
    weakly typed, arrays keep their dtype."""
    what = f"argument {what}" if isinstance(what, int) else what
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        if type(x) is int and not _INT64_MIN <= x <= _INT64_MAX:
            raise InputError(f"{fname}: {what} is the Python int {x}, outside int64's range; pass it as a "
                             f"float, or as a numpy array of the dtype you need")
        return Aval((), WEAK_DTYPES[type(x)], True)
    if isinstance(x, np.matrix) or (_MASKED in sys.modules and isinstance(x, sys.modules[_MASKED].MaskedArray)):
        raise InputError(f"{fname}: {what} is a numpy {type(x).__name__}, whose semantics (masks, matrix "
                         f"products) jitgrad does not follow; pass a plain array (e.g. x.filled(0) or np.asarray(x))")
    if isinstance(x, (np.ndarray, np.generic)):
        dt = np.asarray(x).dtype
        if dt not in SUPPORTED_DTYPES:
            raise InputError(f"{fname}: {what} has dtype {dt}; jitgrad accepts float32, float64, integer and "
                             f"bool arrays (complex, object, string and float16 are not supported)")
        return Aval(np.shape(x), dt, False)
    found = backends.device_array(x)
    if found is not None:
        owner, on_device = found
        if owner.name != device:
            raise InputError(f"{fname}: {what} is a {owner.title} device array; trace with device={owner.name!r}, "
                             f"or copy it to the host first")
        if on_device.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{fname}: {what} has dtype {on_device.dtype}; jitgrad accepts float32, float64, "
                             f"integer and bool arrays")
        return on_device
    raise InputError(f"{fname}: {what} is a {type(x).__name__}; pass numpy arrays or Python numbers (or trees of "
                     f"them: dicts, lists, tuples, namedtuples, registered dataclasses), or list its position in "
                     f"static_argnums if it is a configuration value")


def numpy_args(args: Sequence[Any], fname: str, device: str = "cpu") -> tuple[Sequence[Any], bool]:
    """The arguments with torch CPU tensors viewed as numpy arrays (no copy), and whether any were tensors.
    Only looks for tensors once the program has imported torch: jitgrad never imports it. On a device
    backend (not `on_host`), tensors on a device stay as they are (its executor takes them as its device
    arrays) and results are its device arrays (not tensors)."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor is None or all(type(a) is np.ndarray for a in args) or not any(isinstance(a, tensor) for a in args):
        return args, False
    if not backends.backend_class(device).on_host:
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
        self.arity = _positional_arity(self.signature)

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

    def bound(self, args: tuple, kwargs: dict) -> tuple:
        """`positional`, skipped for the common call: positional arguments only, as many as fn takes."""
        low, high = self.arity
        if kwargs or not low <= len(args) <= high:
            return self.positional(args, kwargs)
        return args

    def tree_hint(self, sig: CallSignature) -> str | None:
        """For a trace that failed: the first argument that is a pytree but looks meant as an array (a list or
        tuple of numbers) or as nothing (None), said so; None if there is none."""
        for i, structure in enumerate(sig.structures):
            if structure is LEAF or structure is STATIC:
                continue
            r = sig.leaf_ranges()[i]
            if structure.num_leaves == 0 and structure.kind == optree.PyTreeKind.NONE:
                return (f"{self.name}: argument {i} is None, which jitgrad takes as a pytree without leaves (as "
                        f"JAX does); pass an array, or list its position in static_argnums")
            if structure.kind in (optree.PyTreeKind.LIST, optree.PyTreeKind.TUPLE) and \
                    all(sig.avals[k].weak for k in r) and structure.num_children == structure.num_leaves:
                kind = "list" if structure.kind == optree.PyTreeKind.LIST else "tuple"
                return (f"{self.name}: argument {i} is a {kind} of {len(r)} numbers, which jitgrad takes as a pytree "
                        f"of {len(r)} scalars (as JAX does), not as an array; pass np.asarray(...) if it is array data")
        return None

    def leaf_names(self, sig: CallSignature) -> list[str]:
        """A name per leaf for IR listings: the parameter's name, then the leaf's path in its tree."""
        names = []
        for i, structure in enumerate(sig.structures):
            base = self.param_names[i] if i < len(self.param_names) else f"arg{i}"
            if structure is LEAF:
                names.append(base)
            elif structure is not STATIC:
                names += [base + "".join(f"[{k!r}]" for k in path) for path in structure.paths()]
        return names

    def prepare(self, args: tuple) -> Call:
        """Flatten a call's (positional) arguments: through a fast path for arrays, numbers and plain
        dicts, lists and tuples of them; otherwise by optree, with torch tensors viewed as numpy arrays.
        Either way the call gets a cheap plan-cache key (its structures and its leaves' types, shapes and
        dtypes) unless a leaf needs the full signature (a tensor, a device array)."""
        leaves: list[Any] = []
        try:
            key = tuple(("static", self._static_key(i, x)) if i in self.static_argnums else _fast_key(x, leaves)
                        for i, x in enumerate(args))
            return Call(args, leaves, key)
        except _Unusual:
            pass
        except InputError:
            raise
        except TypeError:  # dict keys that do not sort: the full signature says
            pass
        leaves, key, complete = [], [], True
        for i, x in enumerate(args):
            if i in self.static_argnums:
                part = self._static_key(i, x)
            elif _is_leaf(x):
                leaves.append(x)
                part = _leaf_key(x)
            else:
                found, treedef = trees.tree_flatten(x)
                leaves += found
                leaf_keys = tuple(_leaf_key(leaf) for leaf in found)
                part = None if any(k is None for k in leaf_keys) else (treedef, leaf_keys)
            complete = complete and part is not None
            key.append(part)
        converted, tensors = numpy_args(leaves, self.name, self.device)
        fast = ("tree",) + tuple(key) if complete and not tensors else None
        return Call(args, list(converted), fast, tensors)

    def call_signature(self, call: Call) -> CallSignature:
        structures: list[Any] = []
        statics = []
        for i, x in enumerate(call.args):
            if i in self.static_argnums:  # hashable: `prepare` checked
                statics.append((i, StaticValue(x)))
                structures.append(STATIC)
            else:
                structures.append(LEAF if _is_leaf(x) else trees.tree_structure(x))
        sig = CallSignature((), tuple(structures), tuple(statics))
        labels = [f"argument {i}" if s is LEAF else f"a leaf of argument {i}"
                  for i, (s, r) in enumerate(zip(structures, sig.leaf_ranges())) for _ in r]
        avals = tuple(arg_aval(label, x, self.name, self.device) for label, x in zip(labels, call.leaves))
        return CallSignature(avals, sig.structures, sig.statics)

    def _static_key(self, i: int, x: Any) -> Any:
        """Static argument `i`'s plan-cache key; an unhashable value (a list, dict or set, an object with __eq__
        but no __hash__) cannot key a plan and is refused, saying what to pass instead."""
        try:
            hash(x)
        except TypeError as exc:
            raise InputError(f"{self.name}: static argument {i} is a {type(x).__name__}, which is not hashable "
                             f"({exc}); static values key the compiled plans, so pass a hashable one (a tuple for "
                             f"a list, a frozenset for a set, tuple(sorted(d.items())) for a dict; give a class "
                             f"__hash__ with its __eq__), or drop {i} from static_argnums to pass it as a traced "
                             f"pytree") from None
        return static_key(x)

    def positions(self, argnums: Any, argnames: Any) -> Any:
        """`argnames` (parameter names) as argument positions, or `argnums` as given."""
        if argnames is None:
            return argnums
        if argnums is not None:
            raise InputError(f"{self.name}: give argnums or argnames, not both")
        names = [argnames] if isinstance(argnames, str) else list(argnames)
        unknown = [n for n in names if n not in self.param_names]
        if unknown:
            raise InputError(f"{self.name}: no parameter named {unknown[0]!r}; its parameters are {self.param_names}")
        found = [self.param_names.index(n) for n in names]
        return found[0] if isinstance(argnames, str) else tuple(found)


def _positional_arity(signature: inspect.Signature | None) -> tuple[float, float]:
    """How many positional arguments fn accepts without binding: (required, most); (0, inf) unknown."""
    if signature is None:
        return (0, float("inf"))
    kinds = [p for p in signature.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in signature.parameters.values()):
        return (1, 0)  # a required keyword-only parameter: always bind (it says what is wrong)
    required = sum(1 for p in kinds if p.kind != p.VAR_POSITIONAL and p.default is p.empty)
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in kinds) else len(kinds)
    return (required, most)


class _Unusual(Exception):
    """An argument the fast path does not flatten (a namedtuple, a dataclass, a tensor...)."""


def _fast_key(x: Any, leaves: list[Any]) -> Any:
    """The plan-cache key of one argument, appending its leaves in optree's order (dict keys sorted)."""
    t = type(x)
    if t is np.ndarray:
        leaves.append(x)
        return (x.shape, x.dtype)
    if t in WEAK_DTYPES:
        if t is int and not _INT64_MIN <= x <= _INT64_MAX:
            raise _Unusual  # the validating path says what is wrong
        leaves.append(x)
        return t
    if t is dict:
        return (dict, tuple(x), _items_key([x[k] for k in sorted(x)], leaves))
    if t is list or t is tuple:
        return (t, _items_key(x, leaves))
    if x is None:
        return None
    raise _Unusual


def _items_key(items: Sequence[Any], leaves: list[Any]) -> tuple:
    """`_fast_key` of each item in turn, an array's written out (the common item: no call per leaf)."""
    parts = []
    for v in items:
        if type(v) is np.ndarray:
            leaves.append(v)
            parts.append((v.shape, v.dtype))
        else:
            parts.append(_fast_key(v, leaves))
    return tuple(parts)


def _leaf_key(x: Any) -> Any:
    """A leaf's part of a tree call's plan-cache key, or None where only the full signature can say (tensors,
    device arrays, out-of-range ints, other objects)."""
    t = type(x)
    if t is np.ndarray:
        return (x.shape, x.dtype)
    if t in WEAK_DTYPES and not (t is int and not _INT64_MIN <= x <= _INT64_MAX):
        return t
    if isinstance(x, np.generic):
        return (t, x.dtype)
    return None


def _is_leaf(x: Any) -> bool:
    """A bare array or number (or tensor, device array): no tree around it."""
    return trees.tree_structure(x).is_leaf() if not isinstance(x, (np.ndarray, np.generic, bool, int, float)) \
        else True
