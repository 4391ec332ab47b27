"""Pytrees: nested containers of arrays (dicts, lists, tuples, namedtuples, registered classes and
dataclasses) as a traced function's arguments and results, flattened into leaves and a structure
by optree, the C++ pytree library PyTorch's pytree utilities can use, and rebuilt from them.

`None` is a node without leaves (it stays None). Dict leaves come in sorted key order; a rebuilt
dict keeps its original key order. User classes join with `register_pytree_node` or
`register_dataclass` (in jitgrad's own optree namespace, so other libraries' registrations do not
interfere).
"""
from __future__ import annotations

import dataclasses
import keyword
import operator
from typing import Any, Callable, Sequence

import numpy as np
import optree

from jitgrad.errors import TraceError
from jitgrad.tracing.tracer import Tracer

NAMESPACE = "jitgrad"
TreeDef = optree.PyTreeSpec
float0 = np.dtype([("float0", np.void, 0)])  # JAX's dtype of the tangent of an integer or bool value
DATACLASS_FIELDS: dict[type, tuple[str, ...]] = {}  # each `register_dataclass` class: its fields, its children's order


def tree_flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    """The leaves of `tree` (in a fixed order: dict keys sorted) and its structure."""
    return optree.tree_flatten(tree, namespace=NAMESPACE)


def tree_unflatten(treedef: TreeDef, leaves: Sequence[Any]) -> Any:
    """The tree of `treedef`'s structure holding `leaves`."""
    return optree.tree_unflatten(treedef, list(leaves))


def tree_leaves(tree: Any) -> list[Any]:
    return optree.tree_leaves(tree, namespace=NAMESPACE)


def tree_structure(tree: Any) -> TreeDef:
    return optree.tree_structure(tree, namespace=NAMESPACE)


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """`fn` applied to every leaf of `tree` (and the matching leaves of `rest`, of the same structure)."""
    return optree.tree_map(fn, tree, *rest, namespace=NAMESPACE)


def register_pytree_node(cls: type, flatten: Callable[[Any], tuple[Sequence[Any], Any]],
                         unflatten: Callable[[Any, Sequence[Any]], Any]) -> type:
    """Make instances of `cls` pytrees: `flatten(obj) -> (children, aux)`, `unflatten(aux, children) -> obj`
    (aux is hashable and part of the structure: plans are keyed on it)."""
    optree.register_pytree_node(cls, lambda obj: tuple(flatten(obj)), unflatten, namespace=NAMESPACE)
    return cls


def register_dataclass(cls: type) -> type:
    """Make a dataclass a pytree whose leaves are its fields (usable as a decorator)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"register_dataclass: {cls.__name__} is not a dataclass")
    names = tuple(f.name for f in dataclasses.fields(cls))

    def flatten(obj: Any) -> tuple[list[Any], tuple[str, ...]]:
        return [getattr(obj, n) for n in names], names

    def unflatten(field_names: tuple[str, ...], children: Sequence[Any]) -> Any:
        return cls(**dict(zip(field_names, children)))

    register_pytree_node(cls, flatten, unflatten)
    DATACLASS_FIELDS[cls] = names
    return cls


class _Float0Zeros:
    """A float0 array in a traced function's result (the tangent of an integer or bool value): it holds no data,
    so it is part of the result's structure, not a leaf, and comes back as zeros of its shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


register_pytree_node(_Float0Zeros, lambda z: ((), z.shape), lambda shape, _: np.zeros(shape, float0))


def is_float0(leaf: Any) -> bool:
    """Is `leaf` an array of dtype float0 (no data: a tangent of an integer or bool value)?"""
    return isinstance(leaf, np.ndarray) and leaf.dtype == float0


def flatten_output(result: Any) -> tuple[list[Any], TreeDef]:
    """Flatten what a traced function returned: a tree whose leaves are arrays or numbers (float0 arrays become
    part of its structure, rebuilt as zeros of their shape)."""
    leaves, treedef = tree_flatten(tree_map(lambda x: _Float0Zeros(x.shape) if is_float0(x) else x, result))
    if result is None:
        raise TraceError("the traced function returned None; it must return an array or a tree (tuple, list, "
                         "dict...) of arrays")
    for leaf in leaves:
        if not isinstance(leaf, (Tracer, np.ndarray, np.generic, int, float, bool)):
            raise TraceError(f"the traced function returned a {type(leaf).__name__}; it must return arrays (or a "
                             f"tree of them: tuples, lists, dicts, namedtuples, registered classes)")
    return leaves, treedef


def unflatten_output(treedef: TreeDef, leaves: Sequence[Any]) -> Any:
    return tree_unflatten(treedef, leaves)


def is_value_aux_pair(treedef: TreeDef) -> bool:
    """Is this the structure of `(value, aux)`: a tuple or list of two whose first item is one leaf?"""
    return (treedef.kind in (optree.PyTreeKind.TUPLE, optree.PyTreeKind.LIST) and treedef.num_children == 2
            and treedef.children()[0].is_leaf())


# ---------------------------------------------------------------------- known structures, checked fast

class Source:
    """A Python function being generated: its lines and the constants they name. Repeat calls of a traced
    function run through one (`jitgrad.runtime.plans.RepeatCall`): its checks of a call's arguments are written out
    once for the structure they must have, so a call runs no loop and no tree walk over them."""

    def __init__(self, **names: Any) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = dict(names)
        self.known: dict[int, str] = {}  # id of a constant -> its name (the names dict keeps it alive)
        self.count = 0

    def const(self, value: Any) -> str:
        """A name the generated code reads `value` by."""
        name = self.known.get(id(value))
        if name is None:
            name = self.known[id(value)] = f"K{len(self.names)}"
            self.names[name] = value
        return name

    def copy(self) -> "Source":
        other = Source(**self.names)
        other.lines, other.known, other.count = list(self.lines), dict(self.known), self.count
        return other

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def line(self, text: str) -> None:
        self.lines.append(text)

    def function(self, name: str, params: str, lines: Sequence[str] | None = None) -> Callable[..., Any]:
        """The function of these lines (or of `lines`); its text is its `source` attribute."""
        body = self.lines if lines is None else lines
        text = f"def {name}({params}):\n" + "".join(f"    {line}\n" for line in body)
        scope = dict(self.names)
        exec(compile(text, f"<jitgrad repeat call {name}>", "exec"), scope)  # noqa: S102 - our own source
        fn = scope.pop(name)  # not left in its own globals: no cycle keeping its constants alive
        fn.source = text  # type: ignore[attr-defined]
        return fn


def array_test(var: str, shape: tuple[int, ...], dtype: str) -> str:
    """The condition, for generated code, that `var` is not an ndarray of this shape and of the dtype named `dtype`.
    A 0-d or 1-d shape is tested by `ndim` and `len`: reading `.shape` builds a new tuple, twice their cost."""
    if len(shape) == 0:
        dims = f"{var}.ndim != 0"
    elif len(shape) == 1:
        dims = f"{var}.ndim != 1 or len({var}) != {int(shape[0])}"
    else:
        dims = f"{var}.shape != {tuple(map(int, shape))!r}"
    return f"type({var}) is not ndarray or {dims} or ({var}.dtype is not {dtype} and {var}.dtype != {dtype})"


def match_structure(src: Source, var: str, x: Any, leaf: Callable[[Source, str, Any], bool], miss: str) -> bool:
    """Write the checks that the value in `var` has `x`'s structure, `return {miss}` when it has not, and for
    each leaf (in `tree_flatten`'s order) what `leaf(src, variable, example leaf)` writes. Plain dicts, lists,
    tuples, None and `register_dataclass` classes are checked in place; other nodes (namedtuples, registered
    classes) by `tree_flatten` and their structure. False (and nothing usable written) where a leaf callback
    refuses its leaf."""
    t = type(x)
    if t is dict:
        try:
            keys = sorted(x)
        except TypeError:  # keys that do not sort: optree keeps their order, `tree_flatten` says it
            return _match_flattened(src, var, x, leaf, miss)
        src.line(f"if type({var}) is not dict or len({var}) != {len(keys)}: return {miss}")
        return _match_items(src, [x[k] for k in keys], leaf, miss,
                            f"{src.const(operator.itemgetter(*keys))}({var})" if keys else "", missing="KeyError")
    if t is list or t is tuple:
        src.line(f"if type({var}) is not {t.__name__} or len({var}) != {len(x)}: return {miss}")
        return _match_items(src, list(x), leaf, miss, var, one_is_bare=False)
    if x is None:
        src.line(f"if {var} is not None: return {miss}")
        return True
    fields = DATACLASS_FIELDS.get(t)
    if fields is not None:  # its flatten's children, read as it reads them (an exact type: optree's registry is)
        src.line(f"if type({var}) is not {src.const(t)}: return {miss}")
        return _match_items(src, [getattr(x, n) for n in fields], leaf, miss,
                            f"{src.const(operator.attrgetter(*fields))}({var})" if fields else "")
    if tree_structure(x).is_leaf():
        return leaf(src, var, x)
    return _match_flattened(src, var, x, leaf, miss)


def _match_items(src: Source, items: list, leaf: Callable[[Source, str, Any], bool], miss: str, unpack: str,
                 missing: str | None = None, one_is_bare: bool = True) -> bool:
    """Unpack `items` (a dict's values by an itemgetter, `missing` its KeyError; a dataclass's fields by an
    attrgetter; a sequence's), where `one_is_bare`: one item is the getter's value itself; and match each."""
    names = [src.fresh() for _ in items]
    if names:
        target = names[0] if one_is_bare and len(names) == 1 else ", ".join(names) + ","
        if missing:
            src.line("try:")
            src.line(f"    {target} = {unpack}")
            src.line(f"except {missing}: return {miss}")
        else:
            src.line(f"{target} = {unpack}")
    return all(match_structure(src, n, item, leaf, miss) for n, item in zip(names, items))


def _match_flattened(src: Source, var: str, x: Any, leaf: Callable[[Source, str, Any], bool], miss: str) -> bool:
    found, treedef = tree_flatten(x)
    flat = src.fresh()
    src.line(f"{flat}, structure = {src.const(tree_flatten)}({var})")
    src.line(f"if structure != {src.const(treedef)}: return {miss}")
    names = [src.fresh() for _ in found]
    if names:
        src.line(f"{', '.join(names)}{',' if len(names) == 1 else ''} = {flat}")
    return all(leaf(src, n, item) for n, item in zip(names, found))


def expression(src: Source, treedef: TreeDef, leaves: Sequence[str]) -> str:
    """The expression building `treedef`'s tree from leaf expressions, as `tree_unflatten` builds it: displays for
    tuples, lists, dicts (keys in its order) and None, a keyword call for a `register_dataclass` class (its
    `unflatten`), nested; a call of `tree_unflatten` for any other node (namedtuples, registered classes)."""
    if treedef.is_leaf():
        return leaves[0]
    kind, node = treedef.kind, treedef.type
    fields = DATACLASS_FIELDS.get(node) if kind == optree.PyTreeKind.CUSTOM else None
    named = fields is not None and all(n.isidentifier() and not keyword.iskeyword(n) for n in fields)
    if kind not in _DISPLAYED and not named:
        return f"{src.const(tree_unflatten)}({src.const(treedef)}, [{', '.join(leaves)}])"
    children, start = [], 0
    for child in treedef.children():
        children.append(expression(src, child, leaves[start:start + child.num_leaves]))
        start += child.num_leaves
    if kind == optree.PyTreeKind.NONE:
        return "None"
    if kind == optree.PyTreeKind.DICT:  # children in sorted key order; the dict in its own (the one-level template's)
        position = tree_unflatten(treedef.one_level(), range(len(children)))
        return "{" + ", ".join(f"{src.const(k)}: {children[i]}" for k, i in position.items()) + "}"
    if kind == optree.PyTreeKind.LIST:
        return f"[{', '.join(children)}]"
    if kind == optree.PyTreeKind.TUPLE:
        return f"({', '.join(children)}{',' * bool(children)})"
    return f"{src.const(node)}({', '.join(f'{n}={c}' for n, c in zip(fields, children))})"


_DISPLAYED = (optree.PyTreeKind.NONE, optree.PyTreeKind.DICT, optree.PyTreeKind.LIST, optree.PyTreeKind.TUPLE)
