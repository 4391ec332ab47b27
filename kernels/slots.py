"""What every backend's executor shares: a call's values in one flat slot list (`SlotTable`), the slots
each step drops once it has run (`release_after`), and running the steps over that list (`run_steps`)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jitgrad.ir.graph import Atom, Graph, Literal, Var


class SlotTable:
    """Numbers a program's values for one flat list per call: graph inputs first, constants preloaded
    (through `place`, e.g. a copy to the device)."""

    def __init__(self, graph: Graph, place: Callable[[np.ndarray], Any] = lambda value: value):
        self.slot_of: dict[Var, int] = {}
        self.initial: list[Any] = []
        self.place = place
        self.graph_inputs = frozenset(graph.inputs)
        for v in graph.inputs:
            self.slot(v)

    def slot(self, a: Atom) -> int:
        if isinstance(a, Literal):
            self.initial.append(self.place(a.value))
            return len(self.initial) - 1
        if a not in self.slot_of:
            self.slot_of[a] = len(self.initial)
            self.initial.append(None)
        return self.slot_of[a]


RELEASE_MIN_BYTES = 4096  # smaller intermediates are not worth a step's bookkeeping


def release_after(table: SlotTable, steps: Sequence[tuple[Sequence[int], Sequence[int]]],
                  keep: Sequence[int]) -> list[tuple[int, ...]]:
    """Per step (its input and output slots), the slots whose value no later step reads and no output
    returns: dropped right after that step, so a call's peak memory is what is live at once rather than
    every intermediate of the call. Graph inputs, constants and values under RELEASE_MIN_BYTES stay."""
    last: dict[int, int] = {}
    for k, (ins, outs) in enumerate(steps):
        for i in (*ins, *outs):
            last[i] = k
    kept = set(keep)
    released: list[list[int]] = [[] for _ in steps]
    for var, i in table.slot_of.items():
        if i in kept or table.initial[i] is not None or i not in last or var in table.graph_inputs:
            continue
        if var.aval.nbytes >= RELEASE_MIN_BYTES:
            released[last[i]].append(i)
    return [tuple(r) for r in released]


def run_steps(steps: Sequence[tuple[Any, tuple[int, ...]]], slots: list[Any]) -> None:
    """Run each call over the slot list, dropping the values `release_after` gave it once it has run."""
    for c, released in steps:
        c.run(slots)
        for i in released:
            slots[i] = None
