"""What `python -m jitgrad ops [NAME]` prints: whether a numpy or jitgrad function traces, the keywords it
refuses, its gradient convention and notes, and for an unsupported one what to write instead.

Nothing here is a table of its own. Whether an op is supported and which keywords it takes come from the
registry the ops fill (`jitgrad.tracing.dispatch`: FUNCTIONS, UFUNCS, METHODS, EXPORTS and each binding's numpy
signature); what to write instead of an unsupported function from `numpy_api.EQUIVALENTS`, which its error
message reads too; the gradient conventions and notes from the rows of docs/ops.md that name the op (the
installed package carries a copy of docs/ops.md, see pyproject's package-data).
"""
from __future__ import annotations

import difflib
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jitgrad.ops import numpy_api
from jitgrad.tracing.dispatch import (_HINTS, EXPORTS, FUNCTIONS, METHOD_BINDINGS, METHODS, UFUNCS, Binding, numpy_name)

_HERE = os.path.dirname(os.path.abspath(__file__))
# docs/ops.md: a copy inside the installed package, or the clone's docs/ beside jitgrad/
OPS_PAGES = (os.path.join(_HERE, "docs", "ops.md"), os.path.join(os.path.dirname(_HERE), "docs", "ops.md"))
CONVENTIONS = "Gradient conventions at non-smooth points"
_PREFIXES = ("numpy.", "np.", "jitgrad.", "jg.", "scipy.special.", "ndarray.", "x.", ".")


@dataclass
class OpInfo:
    """What `python -m jitgrad ops NAME` says about one name."""

    query: str
    name: str = ""  # as the user knows it: "numpy.ptp", "numpy.linalg.solve", "jg.gelu", "ndarray.astype"
    supported: bool = False
    exists: bool = True  # False: neither numpy nor jitgrad has it
    refused: list[str] = field(default_factory=list)  # "out (traced arrays are immutable: ...)"
    instead: str | None = None  # an unsupported op's equivalent that traces
    gradient: list[str] = field(default_factory=list)  # docs/ops.md's conventions rows
    notes: list[str] = field(default_factory=list)  # docs/ops.md's other rows: "section: text"
    summary: str = ""  # the first line of the jitgrad implementation's docstring
    close: list[str] = field(default_factory=list)  # names like an unknown one

    def lines(self) -> list[str]:
        if not self.exists:
            hint = f"; did you mean {', '.join(self.close)}?" if self.close else ""
            return [f"{self.query}: neither numpy nor jitgrad has a function of this name{hint}",
                    "python -m jitgrad ops lists the supported ops"]
        if not self.supported:
            out = [f"{self.name}: not supported under tracing (jg.UnsupportedError when called on a traced array)"]
            out.append(f"  write instead: {self.instead}" if self.instead else
                       "  no single jg or numpy expression does the same: compute it outside the traced function "
                       "and pass the result in as an argument")
            return out + [f"  note ({n})" for n in self.notes]
        out = [f"{self.name}: supported under tracing" + (f" ({self.summary})" if self.summary else "")]
        out += [f"  gradient: {g}" for g in self.gradient] or ["  gradient: no special convention recorded"]
        out += [f"  refused keywords (accepted only at numpy's default): {', '.join(self.refused)}"] if self.refused \
            else ["  refused keywords: none"]
        return out + [f"  notes ({n})" for n in self.notes]


def _short_name(name: str) -> str:
    """"np.linalg.solve" -> "linalg.solve", "jg.gelu" -> "gelu", "np.clip(x, lo, hi)" -> "clip"."""
    name = name.strip().split("(")[0].strip()
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _numpy_object(path: str) -> tuple[Any, str]:
    """numpy's object at a dotted path ("linalg.solve", "add.reduce": the ufunc and "reduce"), or (None, "")."""
    obj: Any = np
    parts = path.split(".")
    for i, part in enumerate(parts):
        if isinstance(obj, np.ufunc) and i == len(parts) - 1 and part in ("reduce", "accumulate", "at", "outer"):
            return obj, part
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return None, ""
    return obj, "__call__"


def _refused(binding: Binding | Callable[..., Any]) -> list[str]:
    """The numpy parameters a binding accepts only at numpy's default, each with the reason where one is known."""
    if not isinstance(binding, Binding):
        return []
    out = []
    for p in binding.signature.parameters.values():
        if p.name in binding.accepts or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = _HINTS.get(p.name)
        out.append(f"{p.name}={p.default!r}" if p.default is not inspect.Parameter.empty else p.name)
        if hint:
            out[-1] += f" ({hint})"
    return out


def _doc_rows() -> list[tuple[str, list[str], str]]:
    """docs/ops.md's table rows: (section, the short names in the first cell, the rest of the row)."""
    page = next((p for p in OPS_PAGES if os.path.isfile(p)), None)
    if page is None:
        return []
    rows, section, header = [], "", None
    with open(page, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("|"):
                header = None  # the next table's first row is its header
                section = line.lstrip("#").strip() if line.startswith("#") else section
            elif not line.startswith("|---"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
                if header is None:
                    header = cells
                    continue
                names = [_short_name(n) for n in re.findall(r"`([^`]+)`", cells[0])] if cells else []
                labelled = [f"{h}: {c}" if len(cells) > 2 and not (i == 0 and h.startswith(("gradient", "notes")))
                            else c for i, (h, c) in enumerate(zip(header[1:], cells[1:])) if c]
                if names and labelled:
                    rows.append((section, names, "; ".join(labelled)))
    return rows


def _docs(info: OpInfo, keys: set[str]) -> None:
    for section, names, text in _doc_rows():
        if keys & set(names):
            if section == CONVENTIONS:
                info.gradient.append(text)
            else:
                info.notes.append(f"docs/ops.md, {section}: {text}")


def _summary(impl: Callable[..., Any]) -> str:
    doc = inspect.getdoc(impl) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first if len(first) <= 160 else first[:157] + "..."


def describe(query: str) -> OpInfo:
    """What jitgrad knows about `query` ("ptp", "np.ptp", "tanh", "linalg.solve", "jg.gelu", "add.reduce")."""
    info = OpInfo(query)
    short = _short_name(query)
    obj, method = _numpy_object(short)
    binding: Any = None
    if query.strip().startswith("scipy."):  # SciPy's functions never trace; some have a jg equivalent
        info.name, info.instead = query.strip(), numpy_api.EQUIVALENTS.get(short)
        return info
    if isinstance(obj, np.ufunc):
        binding = UFUNCS.get((obj, method))
        info.name = f"numpy.{obj.__name__}" + ("" if method == "__call__" else f".{method}")
        key = obj.__name__ if method == "__call__" else f"{obj.__name__}.{method}"
    elif obj is not None and callable(obj) and not isinstance(obj, type):
        binding = FUNCTIONS.get(obj)
        info.name = binding.name if binding else numpy_name(obj)
        key = info.name.removeprefix("numpy.")
    elif short in EXPORTS:  # jitgrad's own op (jg.gelu, jg.add_at) or a jg name of a numpy one
        binding, info.name, key = EXPORTS[short], f"jg.{short}", short
    elif short in METHODS:
        binding, info.name, key = METHOD_BINDINGS.get(short), f"ndarray.{short}", short
    elif short in numpy_api.EQUIVALENTS:  # SciPy's functions that jitgrad names an equivalent for
        info.name, key = short, short
    else:
        info.exists = False
        known = set(EXPORTS) | set(METHODS) | set(n for n in dir(np) if not n.startswith("_"))
        info.close = difflib.get_close_matches(short, sorted(known), n=3)
        return info
    info.supported = binding is not None or (short in METHODS and obj is None)
    keys = {short, key, _short_name(info.name)}
    if info.supported:
        impl = getattr(binding, "impl", None) or getattr(binding, "__wrapped__", None) or binding
        info.summary = _summary(impl) if impl is not None else ""
        info.refused = _refused(binding) if binding is not None else []
    else:
        info.instead = numpy_api.EQUIVALENTS.get(key)
        if short in METHODS:
            info.notes.append(f"the ndarray method x.{short}(...) is supported")
    _docs(info, keys)
    return info


def supported_names() -> list[str]:
    """Every supported name, as a user writes it: np.<function>, np.<ufunc>[.method], np.linalg.<function>,
    jg.<op> for jitgrad's own, x.<method> for ndarray methods and attributes."""
    names = {b.name.replace("numpy.", "np.", 1) for b in FUNCTIONS.values()}
    names |= {b.name.replace("numpy.", "np.", 1) for b in UFUNCS.values()}
    numpy_names = {n.split(".")[-1] for n in names}
    names |= {f"jg.{n}" for n in EXPORTS if n not in numpy_names}
    names |= {f"x.{n}" for n in METHODS}
    return sorted(names, key=lambda n: (n.split(".")[0], n.lower()))
