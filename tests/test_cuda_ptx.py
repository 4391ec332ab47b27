"""Every CUDA kernel family compiles to PTX for compute capability 9.0 (H100/H200) without a GPU.

The simulator runs kernels as Python, so it accepts code real hardware rejects; compiling the
GPU variant of each generated kernel through NVVM catches that. `cc=` is always given: without it
numba asks the (absent) driver for the device's capability. Runs in the main, non-simulator process.
numba-cuda 0.30.4 loads three NVIDIA libraries here: the CUDA runtime when `numba.cuda` is imported,
NVVM to compile and NVRTC to list the architectures and to locate libdevice, on every compile. The
`test` extra brings the runtime; `test-cuda` NVVM and NVRTC (about 310 MB). Without them the file is
skipped with the missing library's name, except where CI is set: CI installs `test-cuda`, so there a
missing library is an error, not a quiet skip.
"""
import os
import re

import pytest


def missing_ptx_library() -> str | None:
    """The first of the libraries numba-cuda needs to compile PTX that cannot be loaded, or None."""
    try:
        from cuda import pathfinder
        for library in ("cudart", "nvvm", "nvrtc"):
            pathfinder.load_nvidia_dynamic_lib(library)
    except (ImportError, RuntimeError) as error:  # pathfinder's DynamicLibNotFoundError is a RuntimeError
        return str(error).splitlines()[0]
    return None


MISSING = missing_ptx_library()
if MISSING and os.environ.get("CI"):
    raise RuntimeError(f"CI installs the test-cuda extra, yet PTX cannot be compiled: {MISSING}")
if MISSING:
    pytest.skip(f"PTX needs NVVM and NVRTC (python -m pip install -e '.[test,test-cuda]'): {MISSING}",
                allow_module_level=True)

import numpy as np  # noqa: E402
from numba import cuda, types  # noqa: E402
from numba.np import numpy_support  # noqa: E402

import jitgrad as jg  # noqa: E402
from jitgrad.passes import fusion, loops, simplify  # noqa: E402
from jitgrad.passes.autodiff import joint_vjp_graph, with_unit_cotangent  # noqa: E402
from jitgrad.passes.loops import Compute  # noqa: E402
from jitgrad.ir.graph import Aval, Var  # noqa: E402
from jitgrad.kernels.cuda import codegen as kc  # noqa: E402
from jitgrad.kernels.common import lowering  # noqa: E402
from jitgrad.ir.primitive import PRIMITIVES, Kind, Primitive  # noqa: E402
from jitgrad.kernels.cuda.executor import gather_kernel  # noqa: E402

SM90 = (9, 0)


def array_type(dtype: np.dtype, ndim: int) -> types.Array:
    return types.Array(numpy_support.from_dtype(np.dtype(dtype)), max(ndim, 1), "C")


def signature(k: loops.LoopKernel) -> tuple:
    """The argument types the runtime passes: int64 lengths, C-contiguous arrays (0-d as 1-d), typed scalars."""
    return (*[types.int64] * len(k.domain), *[array_type(a.aval.dtype, a.aval.ndim) for a in k.inputs],
            *[numpy_support.from_dtype(s.aval.dtype) for s in k.scalars],
            *[array_type(o.aval.dtype, o.aval.ndim) for o in k.outputs],
            *[array_type(d, 1) for _, d in kc.scratch(k)])


def functions_of(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<kernel>", "exec"), namespace)
    return namespace


def ptx(fn, sig: tuple) -> str:
    text, _ = cuda.compile_ptx(fn, sig, cc=SM90)
    assert re.search(r"^\.target sm_90\b", text, re.MULTILINE)
    return text


def kernels_of(fn, *args) -> list[loops.LoopKernel]:
    """The fused kernels of the plain call and, for scalar float outputs, of value-and-grad."""
    plan = jg.trace(fn).plan(*args)
    graphs = [plan.graph]
    wrt = plan.all_differentiable()
    if wrt and plan.graph.outputs[0].aval.size == 1 and plan.graph.outputs[0].aval.is_float:
        graphs.append(with_unit_cotangent(joint_vjp_graph(plan.graph, wrt), len(plan.graph.inputs)))
    return [k for g in graphs for k in fusion.schedule(simplify.optimize(g)).kernels]


def ptx_of_kernel(k: loops.LoopKernel) -> dict[str, str]:
    namespace = functions_of(kc.module_source(k, "gpu"))
    return {launch.function: ptx(namespace[launch.function], signature(k)) for launch in kc.launches(k)}


rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
CASES = {
    "elementwise broadcast": (lambda x, b: np.exp(x) * b + np.tanh(x).T.T, f32(4, 5), f32(5)),
    "loss value_and_grad": (lambda w, x, b: np.sum(np.exp(w * x + b) * 2 + np.tanh(x)), f32(64), f32(64), f32(64)),
    "mlp value_and_grad": (lambda x, w, b: np.sum(np.tanh(x @ w + b) ** 2), f32(8, 16), f32(16, 4), f32(4)),
    "softmax rows": (lambda x: jg.softmax(x, axis=1), f32(4, 6)),
    "max/min keepdims": (lambda x: np.max(x, axis=0, keepdims=True) - np.min(x, axis=1, keepdims=True).T, f32(3, 3)),
    "logsumexp of everything": (lambda x: jg.logsumexp(x, axis=(0, 1)) * x, f32(3, 4)),
    "float64 sum": (lambda x: np.sum(x.astype(np.float64) ** 2, axis=1), f32(3, 5)),
    "int8 min": (lambda x: np.min((x * 10).astype(np.int8)), f32(20)),
}


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[tuple[loops.LoopKernel, dict[str, str]]]]:
    return {name: [(k, ptx_of_kernel(k)) for k in kernels_of(fn, *args)] for name, (fn, *args) in CASES.items()}


def test_every_kernel_family_compiles_for_sm90(compiled) -> None:
    families = {kc.family(k) for kernels in compiled.values() for k, _ in kernels}
    assert families == {"elementwise", "rows", "full"}
    for kernels in compiled.values():
        for k, texts in kernels:
            assert set(texts) == {launch.function for launch in kc.launches(k)}


def test_block_reductions_use_warp_shuffles_where_numba_offers_them(compiled) -> None:
    (loss_forward, loss_joint) = compiled["loss value_and_grad"]
    assert all("shfl.sync.down" in text for text in loss_joint[1].values())
    assert all("bar.sync" in text for text in loss_joint[1].values())
    (int8_min,) = compiled["int8 min"]
    assert not any("shfl.sync" in text for text in int8_min[1].values())  # 8-bit: the shared-memory tree


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiled_matmul_compiles_for_sm90(dtype) -> None:
    namespace = functions_of(kc.matmul_source(np.dtype(dtype)))
    arr = array_type(dtype, 3)
    text = ptx(namespace["matmul"], (types.int64, types.int64, types.int64, arr, arr, arr))
    assert "bar.sync" in text and ".shared" in text


def test_view_copy_kernel_compiles_for_sm90() -> None:
    source = Var(Aval((3, 1), np.dtype(np.float32)))
    k = gather_kernel(source, Var(Aval((2, 5, 3), np.dtype(np.float32))), (2, None))  # broadcast + transpose
    assert set(ptx_of_kernel(k)) == {"kernel"}


def _operand_dtypes(prim: Primitive, dtype: np.dtype, arity: int) -> list[np.dtype]:
    if prim.name == "where":
        return [np.dtype(bool), dtype, dtype]
    if prim.name.startswith("logical_"):
        return [np.dtype(bool)] * arity
    return [dtype] * arity


ELEMENTWISE = sorted(n for n, p in PRIMITIVES.items() if p.kind is Kind.ELEMENTWISE)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_primitive_lowers_for_sm90(name) -> None:
    prim = PRIMITIVES[name]
    arity = 1 + max(int(i) for i in re.findall(r"\{(\d+)\}", lowering(prim, kc.BACKENDS["gpu"]).template))
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        params = {"dtype": np.dtype(np.int32)} if name == "convert" else {}
        operands = _operand_dtypes(prim, dtype, arity)
        out = prim.abstract_eval([Aval((), d) for d in operands], **params)
        expr = kc.scalar_expression(Compute("t", prim, [f"a{i}[i]" for i in range(arity)], params, out.dtype),
                                    "gpu")
        args = ", ".join(f"a{i}" for i in range(arity))
        source = (kc.GPU_HEADER + f"\n\ndef k({args}, o):\n    i = cuda.grid(1)\n    if i < o.shape[0]:\n"
                  f"        o[i] = {expr}\n")
        ptx(functions_of(source)["k"], (*[array_type(d, 1) for d in operands], array_type(out.dtype, 1)))


@pytest.mark.parametrize("target", kc.TARGETS)
def test_every_elementwise_primitive_has_a_lowering_on_each_target(target) -> None:
    """The CUDA table (`kernels/cuda/lowerings.py`) or the record's template serves every elementwise primitive on
    both targets; none reads a CPU template that calls vecmath, which device code cannot import."""
    for name in ELEMENTWISE:
        found = lowering(PRIMITIVES[name], kc.BACKENDS[target])
        assert found.imports == () and not re.search(r"vecmath|\bv[a-z]+\(", found.template), name
