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
from typing import Any, Callable, Sequence

import numpy as np
import optree

from .errors import TraceError
from .tracing import Tracer

NAMESPACE = "jitgrad"
TreeDef = optree.PyTreeSpec


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

    return register_pytree_node(cls, flatten, unflatten)


def flatten_output(result: Any) -> tuple[list[Any], TreeDef]:
    """Flatten what a traced function returned: a tree whose leaves are arrays or numbers."""
    leaves, treedef = tree_flatten(result)
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
