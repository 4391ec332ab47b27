"""Trees of traced values: what a traced function returns (an array, or tuples, lists and dicts of them)
flattened into leaves and a structure, and rebuilt around computed arrays."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import TraceError
from .tracing import Tracer


def flatten_output(result: Any) -> tuple[list[Any], Any]:
    """Flatten a returned value (array, or tuple/list/dict of arrays) into leaves and a structure."""
    if isinstance(result, (tuple, list)):
        leaves: list[Any] = []
        subs = []
        for r in result:
            l, t = flatten_output(r)
            leaves += l
            subs.append((len(l), t))
        return leaves, (type(result), subs)
    if isinstance(result, dict):
        keys = list(result.keys())
        l, t = flatten_output([result[k] for k in keys])
        return l, (dict, keys, t)
    if result is None:
        raise TraceError("the traced function returned None; it must return an array or a tuple/list/dict of "
                         "arrays")
    if not isinstance(result, (Tracer, np.ndarray, np.generic, int, float, bool)):
        raise TraceError(f"the traced function returned a {type(result).__name__}; it must return arrays "
                         "(or a tuple/list/dict of them)")
    return [result], None


def unflatten_output(tree: Any, leaves: Sequence[Any]) -> Any:
    if tree is None:
        return leaves[0]
    if tree[0] is dict:
        _, keys, t = tree
        vals = unflatten_output(t, leaves)
        return dict(zip(keys, vals))
    kind, subs = tree
    out, i = [], 0
    for n, t in subs:
        out.append(unflatten_output(t, leaves[i:i + n]))
        i += n
    return kind(out) if kind is not list else out
