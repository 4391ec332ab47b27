"""The package's structure as docs/architecture.md states it: the import graph of jitgrad/ and kernels/
has no cycle (function-level imports included), kernels/ never names a primitive, a backend's folder is
imported only from inside it and by the one place that chooses backends, the helpers a lowering names
exist, and every primitive carries what the later stages read from it."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

import jitgrad  # noqa: F401  (registers every primitive)
from jitgrad.primitive import BACKENDS, PRIMITIVES, Kind

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"jitgrad": ROOT / "jitgrad", "jitgrad.kernels": ROOT / "kernels"}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package,) + tuple(p for p in parts if p != "__init__"))
            found[name] = path
    return found


def _imports(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    """The jitgrad modules `name` imports anywhere in its file (a package import counts as its __init__)."""
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = base
            for _ in range(node.level - 1):
                prefix = prefix.rpartition(".")[0]
            module = f"{prefix}.{node.module}" if node.level and node.module else (node.module or prefix)
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is how it is assembled, not a dependency loop
    for name in graph:
        graph[name] = {m for m in graph[name] if not (m.startswith(name + ".") and modules[name].name == "__init__.py")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    assert "jitgrad.ops" not in graph["jitgrad.tracing"] and "jitgrad.numpy_api" not in graph["jitgrad.tracing"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# the CUDA executor still runs matmul by its primitive object (`matmul_p`): issue 35's lookups by identity
NAMES_A_PRIMITIVE = {"cuda/executor.py"}
BACKEND_FOLDERS = ("cpu", "cuda")
CHOOSES_BACKENDS = "jitgrad.backends"
CPU_READERS = {"jitgrad.explain"}  # outside kernels/cpu/, still reads the CPU backend: shows its kernel source


def test_kernels_read_primitive_fields_never_names() -> None:
    for path in PACKAGES["jitgrad.kernels"].rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"prim\.name\b", text), path  # not compared, not looked up, not printed
        if path.relative_to(PACKAGES["jitgrad.kernels"]).as_posix() not in NAMES_A_PRIMITIVE:
            assert "PRIMITIVES" not in text and "jitgrad.ops" not in text, path  # nor a primitive object


@pytest.mark.parametrize("backend", BACKEND_FOLDERS)
def test_a_backend_folder_is_imported_from_inside_it_or_where_backends_are_chosen(backend) -> None:
    modules = _modules()
    folder = f"jitgrad.kernels.{backend}"
    for name, path in modules.items():
        if name == folder or name.startswith(folder + ".") or name == CHOOSES_BACKENDS:
            continue
        if backend == "cpu" and name in CPU_READERS:
            continue
        reached = {m for m in _imports(name, path, set(modules)) if m == folder or m.startswith(folder + ".")}
        assert not reached, f"{name} imports {sorted(reached)}"


def test_every_helper_a_lowering_names_exists() -> None:
    """Lowerings name the helpers their source imports as "module.name" strings (`Lowering.imports`): each
    resolves to an attribute of an importable module, so a moved module cannot leave a stale name."""
    import importlib

    named = set()
    for prim in PRIMITIVES.values():
        for lowering in (prim.lowering or {}).values():
            named.update(lowering.imports)
        vector = prim.reduction.vector_combine if prim.reduction is not None else None
        if vector is not None:
            named.update(vector.imports)
    assert named
    for dotted in sorted(named):
        module, _, attribute = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), dotted


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
def test_every_primitive_declares_what_later_stages_read(name) -> None:
    prim = PRIMITIVES[name]
    assert isinstance(prim.kind, Kind)
    if prim.kind is Kind.ELEMENTWISE:
        assert set(prim.lowering) == set(BACKENDS), name
    if prim.kind is Kind.REDUCE:
        assert prim.reduction is not None and prim.reduction.combine, name
    if prim.kind is Kind.VIEW:
        assert prim.index_map is not None, name


def test_no_module_is_longer_than_400_lines_without_saying_why() -> None:
    for path in list(PACKAGES["jitgrad"].rglob("*.py")) + list(PACKAGES["jitgrad.kernels"].rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > 400:
            head = "\n".join(lines[:12])
            assert "over 400 lines" in head.lower(), f"{path} has {len(lines)} lines and no reason at its top"
