"""The package's structure as docs/architecture.md states it: the import graph of jitgrad/ and kernels/
has no cycle (function-level imports included), kernels/ never names a primitive (but a backend's lowering
table), a backend's folder is imported only from inside it and by the one place that chooses backends, no
module outside the CUDA backend's folder but that registry names CUDA, backends are chosen by a registry
lookup (a backend registered there is used, and needs nothing else), the helpers a lowering names exist, and
every primitive carries what the later stages read from it."""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import jitgrad  # noqa: F401  (registers every primitive)
from jitgrad.runtime import backends
from jitgrad.ir import interpreter
from jitgrad.ir.primitive import PRIMITIVES, Kind

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
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
    assert "jitgrad.ops" not in graph["jitgrad.tracing.tracer"] and "jitgrad.ops.numpy_api" not in graph["jitgrad.tracing.tracer"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# a backend's lowering table registers templates for the primitives it names (the executors read fields:
# `Primitive.matrix_product` tells the CUDA executor to run its GEMM)
NAMES_A_PRIMITIVE = {"cuda/lowerings.py"}
BACKEND_FOLDERS = ("cpu", "cuda")
CHOOSES_BACKENDS = "jitgrad.runtime.backends"
CHOOSES_BACKENDS_FILE = "jitgrad/runtime/backends.py"
CPU_READERS = {"jitgrad.front.explain"}  # outside kernels/cpu/, still reads the CPU backend: shows its kernel source


def test_kernels_read_primitive_fields_never_names() -> None:
    for path in PACKAGES["jitgrad.kernels"].rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"prim\.name\b", text), path  # not compared, not looked up, not printed
        if path.relative_to(PACKAGES["jitgrad.kernels"]).as_posix() not in NAMES_A_PRIMITIVE:
            assert "PRIMITIVES" not in text and "jitgrad.ops" not in text, path  # nor a primitive object


def _name_lookups(source: str) -> list[str]:
    """Where `source` looks a primitive up by its name: `PRIMITIVES[...]` or `PRIMITIVES.get(...)` read (any key:
    a name in a variable is a name too), or `<x>.name` compared with a string that names a primitive (`==`, `!=`,
    `in` a literal tuple, list or set). Other `.name` comparisons (`os.name != "nt"`, a backend's) are not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            strings = {c.value for side in sides
                       for c in (side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side])
                       if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if any(isinstance(side, ast.Attribute) and side.attr == "name" for side in sides) and strings & set(PRIMITIVES):
                found.append(ast.unparse(node))
            continue
        else:
            continue
        if (target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)) == "PRIMITIVES":
            found.append(ast.unparse(node))
    return found


def test_the_name_lookup_check_finds_lookups() -> None:
    planted = """
convert = PRIMITIVES["convert"]
other = registry.PRIMITIVES.get(name)
if e.prim.name == "broadcast_to" or "reshape" != prim.name or e.prim.name in ("matmul", "dot"):
    pass
if os.name != "nt" and backend.name == "cpu" and x == "convert":
    PRIMITIVES[prim.name] = prim
"""
    assert sorted(_name_lookups(planted)) == sorted([
        "PRIMITIVES['convert']", "registry.PRIMITIVES.get(name)", "e.prim.name == 'broadcast_to'",
        "'reshape' != prim.name", "e.prim.name in ('matmul', 'dot')"])  # not os.name, backend.name nor the store


def test_no_primitive_is_looked_up_by_name_outside_its_record() -> None:
    """Issue 35: stages and binders hold primitive objects (imported, or lax's handles) or read record fields; only
    jitgrad/ops, where each record is declared, and the registry itself (`declare`) may name one."""
    for name, path in _modules().items():
        if name == "jitgrad.ops" or name.startswith("jitgrad.ops.") or name == "jitgrad.ir.primitive":
            continue
        assert _name_lookups(path.read_text(encoding="utf-8")) == [], name


def test_lax_binds_the_primitive_objects_the_ops_declare(monkeypatch) -> None:
    from jitgrad.tracing import lax

    handles = [h for h in lax.__annotations__ if h.endswith("_p")]
    assert len(handles) > 30 and lax.unfilled() == []
    for h in handles:
        assert getattr(lax, h) is PRIMITIVES[h[:-2]], h  # filled with the record of that name, by its module
    monkeypatch.delattr(lax, "convert_p")  # an op module that forgot to fill its handle: jitgrad.ops refuses
    assert lax.unfilled() == ["convert_p"]


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
        assert set(prim.lowering) == {"cpu"}, name  # the record's lowering; other backends register theirs
    if prim.kind is Kind.REDUCE:
        assert prim.reduction is not None and prim.reduction.combine, name
    if prim.kind is Kind.VIEW:
        assert prim.index_map is not None, name


MAX_LINES = 450  # no module is longer, and none has a waiver
SAY_WHY_OVER = 400  # a module longer than this says why in its first 12 lines ("over 400 lines: ...")


def test_no_module_is_longer_than_450_lines_nor_over_400_without_saying_why() -> None:
    for path in list(PACKAGES["jitgrad"].rglob("*.py")) + list(PACKAGES["jitgrad.kernels"].rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        assert len(lines) <= MAX_LINES, f"{path} has {len(lines)} lines: split it by what its parts are"
        if len(lines) > SAY_WHY_OVER:
            head = "\n".join(lines[:12])
            assert "over 400 lines" in head.lower(), f"{path} has {len(lines)} lines and no reason at its top"


# ---------------------------------------------------------------------- backends: one folder, one registry line

def test_only_the_cuda_folder_and_the_registry_mention_cuda() -> None:
    """`grep -ril cuda jitgrad kernels --include=*.py` finds kernels/cuda/ and jitgrad/runtime/backends.py only: a
    backend is one folder plus its registry line, and nothing else knows it (docstrings say "device backends")."""
    found = sorted(path.relative_to(ROOT).as_posix() for folder in PACKAGES.values() for path in folder.rglob("*.py")
                   if "cuda" in path.read_text(encoding="utf-8").lower())
    assert found, "the CUDA backend's folder is gone: nothing to check"
    assert [f for f in found if not f.startswith("kernels/cuda/") and f != CHOOSES_BACKENDS_FILE] == []


def test_choosing_a_backend_is_a_registry_lookup() -> None:
    """`backends.backend` looks the device up in `REGISTRY` (no string switch), and every backend that loads
    here has every member of the `Backend` protocol under the name it is registered by."""
    tree = ast.parse((ROOT / CHOOSES_BACKENDS_FILE).read_text(encoding="utf-8"))
    compared = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for c in [n.left, *n.comparators] if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    assert compared == [], "backends compares device names with strings"
    members = {m for m in vars(backends.Backend) if not m.startswith("_")} | set(backends.Backend.__annotations__)
    assert {"name", "on_host", "repeat_calls", "device_aval", "executable", "inputs", "result", "cotangent", "stats"} <= members
    loaded = 0
    for device in backends.REGISTRY:
        try:
            kind = backends.backend_class(device)
        except jitgrad.UnsupportedError:
            continue  # a backend whose folder is missing: "not available", nothing else
        loaded += 1
        assert kind.name == device and all(hasattr(kind, m) for m in members), (device, members - set(dir(kind)))
    assert loaded and type(backends.backend("cpu")).name == "cpu"
    with pytest.raises(jitgrad.UnsupportedError, match="device 'tpu' is not available; jitgrad supports device='cpu'"):
        jitgrad.trace(lambda x: x, device="tpu")


class _ReferenceExecutable:
    """A program run by the numpy reference interpreter."""

    kernel_count = 0

    def __init__(self, program):
        self.graph = program.graph

    def __call__(self, args):
        return interpreter.evaluate(self.graph, args)


class ReferenceBackend:
    """A third backend, numba-free: the whole of what one needs besides its registry line."""

    name, title, on_host, repeat_calls = "reference", "reference", True, False

    @staticmethod
    def device_aval(x):
        return None

    def executable(self, program, label):
        return _ReferenceExecutable(program)

    def inputs(self, args, avals):
        return [np.asarray(x, dtype=a.dtype) for x, a in zip(args, avals)]

    def result(self, a):
        return a

    def cotangent(self, g, aval, fname, k):
        return np.asarray(g, dtype=aval.dtype)

    def stats(self):
        return {"kernels": 0, "compiles": 0, "disk_loads": 0, "numpy_calls": 0, "one_core_calls": 0}


def test_a_backend_registered_in_the_registry_is_used(monkeypatch) -> None:
    monkeypatch.setitem(backends.REGISTRY, "reference", lambda: ReferenceBackend)
    w, x = np.linspace(-1, 1, 12).reshape(3, 4), np.linspace(0, 2, 4)

    def loss(w, x):
        return np.sum(np.tanh(w @ x) ** 2) + np.max(w)

    f = jitgrad.trace(loss, device="reference")
    assert f.cache_info()["kernels"] == 0 and f.plan(w, x).backend.name == "reference"
    value, grads = f.value_and_grad(w, x, argnums=(0, 1))
    want_value, want_grads = jitgrad.trace(loss).value_and_grad(w, x, argnums=(0, 1))
    np.testing.assert_allclose(f(w, x), loss(w, x), rtol=1e-12)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_a_backend_that_cannot_be_imported_is_not_available(monkeypatch) -> None:
    def missing():
        raise ModuleNotFoundError("No module named 'jitgrad.kernels.elsewhere'")

    monkeypatch.setitem(backends.REGISTRY, "elsewhere", missing)
    with pytest.raises(jitgrad.UnsupportedError, match="device 'elsewhere' is not available: .*elsewhere"):
        jitgrad.trace(lambda x: x, device="elsewhere")
    assert jitgrad.trace(lambda x: x + 1)(np.float64(1)) == 2  # asked about device arrays, it is passed over


def test_a_backend_reads_the_record_lowering_unless_it_registers_its_own() -> None:
    from jitgrad.kernels import common

    add, exp = PRIMITIVES["add"], PRIMITIVES["exp"]
    assert common.lowering(add, "elsewhere").template == add.lowering["cpu"].template == "({0} + {1})"
    with pytest.raises(LookupError, match="vexp"):  # the CPU's vecmath: no other backend can import it
        common.lowering(exp, "elsewhere")
    common.register_lowering(exp, "elsewhere", "np.exp({0})")
    try:
        assert common.lowering(exp, "elsewhere").template == "np.exp({0})"
        assert common.lowering(exp, "cpu") is exp.lowering["cpu"]
    finally:
        del common._TABLES["elsewhere"]


# jitgrad/'s wings, lowest first: a module imports its own wing, the wings before it and the utilities only
WINGS = ("ir", "tracing", "ops", "passes", "kernels", "runtime", "front")
UTILITIES = {"jitgrad.errors", "jitgrad.tracebacks", "jitgrad.logging_setup", "jitgrad.cache",
             "jitgrad.cores"}  # importable anywhere
TOP_LEVEL = {"jitgrad", "jitgrad.__main__", "jitgrad.opinfo", "jitgrad.optim",
             "jitgrad.distributed"} | UTILITIES  # the package, its command line, op lookup and public namespaces


def _wing(name: str) -> int | None:
    parts = name.split(".")
    return WINGS.index(parts[1]) if len(parts) > 1 and parts[1] in WINGS else None


def test_each_wing_imports_only_the_wings_below_it_and_the_utilities() -> None:
    modules = _modules()
    for name, path in modules.items():
        own = _wing(name)
        for target in _imports(name, path, set(modules)) - {"jitgrad"}:  # `from jitgrad import cache`: its module
            if target in UTILITIES:
                continue
            if name in UTILITIES:
                raise AssertionError(f"utility {name} imports {target}")
            if own is None:
                continue  # the package and the top-level modules above every wing
            reached = _wing(target)
            assert reached is not None and reached <= own, f"{name} ({WINGS[own]}) imports {target}"


def test_jitgrad_has_at_most_ten_top_level_modules_besides_its_wings() -> None:
    top = {p.stem for p in PACKAGES["jitgrad"].glob("*.py")}
    assert {f"jitgrad.{m}" if m != "__init__" else "jitgrad" for m in top} == TOP_LEVEL and len(top) <= 10
    for wing in WINGS:
        if wing != "kernels":
            doc = ast.get_docstring(ast.parse((PACKAGES["jitgrad"] / wing / "__init__.py").read_text(encoding="utf-8")))
            assert doc and "Imports" in doc, wing  # what the wing owns and what it may import
