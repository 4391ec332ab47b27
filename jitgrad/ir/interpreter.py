"""A numpy reference interpreter of IR graphs: each equation runs its primitive's `impl`.

No fusion, no lowering, no numba: what the compiled program must agree with, for any graph
(forward, joint value-and-grad, split forward/backward). Used by the fuzz tests.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitgrad.ir.graph import Atom, Graph, Literal


def evaluate(graph: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    """The graph's outputs for input arrays `args`, each with the shape and dtype its aval declares."""
    if len(args) != len(graph.inputs):
        raise ValueError(f"the graph takes {len(graph.inputs)} inputs, got {len(args)}")
    env: dict[Any, np.ndarray] = {v: np.asarray(a, dtype=v.aval.dtype) for v, a in zip(graph.inputs, args)}

    def read(a: Atom) -> np.ndarray:
        return a.value if isinstance(a, Literal) else env[a]

    last_use = {a: i for i, e in enumerate(graph.eqns) for a in e.inputs if not isinstance(a, Literal)}
    kept = {a for a in graph.outputs if not isinstance(a, Literal)}
    drops: list[list[Any]] = [[] for _ in graph.eqns]  # the values no later equation reads: the peak is what is live
    for a, i in last_use.items():
        if a not in kept:
            drops[i].append(a)
    for e, dropped in zip(graph.eqns, drops):
        result = e.prim.impl(*[a.value if isinstance(a, Literal) else env[a] for a in e.inputs], **e.params)
        for var, value in zip(e.outs, result if len(e.outs) > 1 else (result,)):
            aval = var.aval
            if type(value) is not np.ndarray or value.dtype != aval.dtype:
                value = np.asarray(value).astype(aval.dtype, copy=False)
            if value.shape != aval.shape:
                raise ValueError(f"{e.prim.name} produced shape {value.shape}, but the IR declares {aval}")
            env[var] = value
        for a in dropped:
            env.pop(a, None)
    return [np.array(read(a), copy=True) for a in graph.outputs]
