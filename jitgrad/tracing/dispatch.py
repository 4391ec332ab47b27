"""The numpy front end's registry: which numpy function, ufunc method or ndarray method each jitgrad op
implements, filled by the `implements` decorator where each op is defined.

Every call that reaches jitgrad through numpy's protocols (or through `jg.<op>`) is bound to the numpy
callable's own signature first. An argument numpy accepts is then either passed to the jitgrad
implementation, which takes it under the same name (and follows numpy's semantics for it), or, when
the implementation does not take it, accepted only at numpy's default value: anything else raises
`UnsupportedError` naming the argument. So no numpy argument is ever silently ignored.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jitgrad.errors import TraceError, UnsupportedError
from jitgrad.tracebacks import api_boundary
from jitgrad.tracing.tracer import where_text

FUNCTIONS: dict[Any, "Binding"] = {}  # numpy function -> binding (numpy's __array_function__)
UFUNCS: dict[tuple[np.ufunc, str], "Binding"] = {}  # (ufunc, method) -> binding (numpy's __array_ufunc__)
METHODS: dict[str, Callable[[Any], Any]] = {}  # ndarray attribute name -> factory taking the traced array
METHOD_BINDINGS: dict[str, "Binding"] = {}  # the ndarray methods whose signature differs from their function's
EXPORTS: dict[str, Callable[..., Any]] = {}  # what `jitgrad` exports: jg.<name>

NO_VALUE = np._NoValue
# Why an argument may be refused, in the words a user needs.
_HINTS = {
    "out": "traced arrays are immutable: use the returned value",
    "where": "mask the operand instead, e.g. np.where(mask, x, 0)",
    "order": "jitgrad's results are C-ordered arrays",
    "casting": "cast the operands with .astype first",
    "subok": "jitgrad's results are plain arrays",
    "signature": "cast the operands with .astype first",
    "dtype": "cast the operands with .astype first",
    "device": "jitgrad traces host arrays",
}


def _signature_of(text: str) -> inspect.Signature:
    """A signature written as numpy documents it, e.g. "(array, /, axis=0, initial=NO_VALUE)"."""
    namespace: dict[str, Any] = {"NO_VALUE": NO_VALUE}
    exec(f"def f{text}: pass", namespace)
    return inspect.signature(namespace["f"])


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if default is NO_VALUE or default is inspect.Parameter.empty:
        return False
    if default is None and isinstance(value, tuple):  # numpy hands ufunc overrides `out` as a tuple
        return all(v is None for v in value)
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # an array compared with a default: not the default
        return False


def _short(value: Any) -> str:
    text = f"an array of shape {np.shape(value)}" if hasattr(value, "shape") else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Binding:
    """A jitgrad implementation of one numpy callable, called with numpy's arguments."""

    name: str  # as the user knows it: "numpy.sum", "numpy.add.reduce", "ndarray.reshape"
    signature: inspect.Signature  # numpy's
    impl: Callable[..., Any]
    accepts: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self._routes: dict[tuple, list[tuple[inspect.Parameter, Any]]] = {}
        numpy_params = self.signature.parameters
        operands = [p.name for p in numpy_params.values() if p.kind is p.POSITIONAL_ONLY]  # passed by position
        own = list(inspect.signature(self.impl).parameters.values())[len(operands):]
        required = [p.name for p in own if p.name not in numpy_params and p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if required:
            raise TypeError(f"{self.impl.__qualname__} requires {required}, which {self.name} does not take")
        self.accepts = frozenset(operands) | frozenset(p.name for p in own if p.name in numpy_params)

    def _route(self, shape: tuple) -> list[tuple[inspect.Parameter, Any]]:
        """Where each bound parameter's value comes from in a call of `shape` (its positional count, then its keyword
        names): a position, a keyword name, a tuple of positions (*args) or a dict of names (**kwargs). numpy's
        signature binds by that shape alone, so it is bound once per shape, on placeholders."""
        found = self._routes.get(shape)
        if found is None:
            try:
                bound = self.signature.bind(*range(shape[0]), **{k: k for k in shape[1:]})
            except TypeError as exc:
                raise TraceError(f"{self.name}: {exc}{where_text()}") from None
            found = self._routes[shape] = [(p, bound.arguments[p.name]) for p in self.signature.parameters.values()
                                           if p.name in bound.arguments]
        return found

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call_args: list[Any] = []
        call_kwargs: dict[str, Any] = {}
        for p, where in self._route((len(args), *kwargs)):
            t = type(where)
            value = (args[where] if t is int else kwargs[where] if t is str else tuple(args[i] for i in where)
                     if t is tuple else {k: kwargs[k] for k in where})
            if p.name not in self.accepts:
                self._refuse_unless_default(p, value)
            elif p.kind is p.POSITIONAL_ONLY:
                call_args.append(value)
            elif p.kind is p.VAR_POSITIONAL:
                call_args.extend(value)
            elif p.kind is p.VAR_KEYWORD:
                call_kwargs.update(value)
            else:
                call_kwargs[p.name] = value
        return self.impl(*call_args, **call_kwargs)

    def _refuse_unless_default(self, p: inspect.Parameter, value: Any) -> None:
        if p.kind is p.VAR_KEYWORD:
            given = {k: v for k, v in value.items()}
            if given:
                key = next(iter(given))
                self._refuse(key, given[key])
            return
        if p.kind is p.VAR_POSITIONAL:
            if value:
                self._refuse(f"*{p.name}", value)
            return
        if not _is_default(value, p.default):
            self._refuse(p.name, value)

    def _refuse(self, name: str, value: Any) -> None:
        hint = _HINTS.get(name)
        taken = ", ".join(sorted(self.accepts)) or "no arguments besides its operands"
        raise UnsupportedError(f"{self.name}(..., {name}={_short(value)}) is not supported by jitgrad"
                               f"{' (' + hint + ')' if hint else ''}; it takes {taken}. `python -m jitgrad ops "
                               f"{self.name}` lists what it refuses"
                               f"{where_text()}")


def numpy_name(fn: Any, method: str = "__call__") -> str:
    if isinstance(fn, np.ufunc):
        return f"numpy.{fn.__name__}" + ("" if method == "__call__" else f".{method}")
    module = getattr(fn, "__module__", "numpy") or "numpy"
    prefix = "numpy.linalg" if module.startswith("numpy.linalg") else "numpy"
    return f"{prefix}.{fn.__name__}"


def implements(numpy_fn: Any, *, signature: str | None = None, ufunc_method: str = "__call__",
               method: str | None = None, method_signature: str | None = None,
               export: str | bool = True, aliases: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Register the decorated function as jitgrad's implementation of `numpy_fn` (a function, or a ufunc's
    `ufunc_method`), optionally also of the ndarray method `method` (with numpy's `method_signature`,
    "(self, ...)", when it differs from the function's), and export it as `jg.<name>`. Returns the
    function itself: other ops call it directly."""
    def register(impl: Callable[..., Any]) -> Callable[..., Any]:
        sig = _signature_of(signature) if signature else inspect.signature(numpy_fn)
        binding = Binding(numpy_name(numpy_fn, ufunc_method), sig, impl)
        if isinstance(numpy_fn, np.ufunc):
            UFUNCS[(numpy_fn, ufunc_method)] = binding
        else:
            FUNCTIONS[numpy_fn] = binding
        if method is not None:
            register_method(method, impl if method_signature else binding, method_signature)
        if export:
            exported = _exported(binding)
            for name in ([impl.__name__ if export is True else export] + list(aliases)):
                EXPORTS[name] = exported
        return impl
    return register


def _exported(binding: Binding) -> Callable[..., Any]:
    """`jg.<op>`: the implementation's name, docstring and signature, called with numpy's argument checks."""
    @api_boundary  # called outside a trace, jg.<op> is an entry point of its own
    @functools.wraps(binding.impl)
    def op(*args: Any, **kwargs: Any) -> Any:
        return binding(*args, **kwargs)
    return op


def register_method(name: str, impl: Callable[..., Any], signature: str | None = None) -> None:
    """`traced.name(...)` calls `impl(traced, ...)`, checked against numpy's method `signature` if given
    (otherwise `impl` is already a checked binding of the numpy function the method mirrors)."""
    call = Binding(f"ndarray.{name}", _signature_of(signature), impl) if signature else impl
    if signature:
        METHOD_BINDINGS[name] = call
    METHODS[name] = lambda t: functools.partial(call, t)


def register_property(name: str, getter: Callable[[Any], Any]) -> None:
    """`traced.name` is `getter(traced)` (ndarray properties such as T)."""
    METHODS[name] = getter


def export(fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """Export a jitgrad op without a numpy counterpart (`jg.gelu`, `jg.logsumexp`) as `jg.<name>`."""
    EXPORTS[name or fn.__name__] = api_boundary(fn)
    return fn
