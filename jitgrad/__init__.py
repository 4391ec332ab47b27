"""jitgrad: trace numpy functions, differentiate them symbolically, fuse and compile with numba.

    import jitgrad as jg

    @jg.trace
    def loss(w, x, b):
        return np.sum(np.exp(w * x + b))

    value, (gw, gx, gb) = loss.value_and_grad(w, x, b, argnums=(0, 1, 2))
"""
import os as _os
import sys as _sys
from importlib import util as _util


def _kernels_of_a_clone() -> None:
    """`jitgrad.kernels` is the top-level kernels/ folder (pyproject's package-dir). Installed, it is a folder
    of the package; run from a clone (its jitgrad/ first on sys.path, even where jitgrad or another clone is
    installed), it is that clone's kernels/ beside jitgrad/, never another copy's."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    beside = _os.path.join(_os.path.dirname(here), "kernels")
    if _os.path.isdir(_os.path.join(here, "kernels")) or not _os.path.isfile(_os.path.join(beside, "__init__.py")):
        return
    spec = _util.spec_from_file_location("jitgrad.kernels", _os.path.join(beside, "__init__.py"),
                                         submodule_search_locations=[beside])
    module = _util.module_from_spec(spec)
    _sys.modules["jitgrad.kernels"] = module
    spec.loader.exec_module(module)
    globals()["kernels"] = module  # as the import system binds an imported submodule on its package


_kernels_of_a_clone()


def _check_numpy() -> None:
    """jitgrad binds to numpy 2.4's signatures and names: an older numpy is refused at import, with what to do."""
    import numpy

    if tuple(int(p) for p in numpy.__version__.split(".")[:2] if p.isdigit()) < (2, 4):
        raise ImportError(f"jitgrad needs numpy 2.4 or newer (numpy {numpy.__version__} is installed, at "
                          f"{_os.path.dirname(numpy.__file__)}): python -m pip install -U 'numpy>=2.4'")


_check_numpy()

from jitgrad.runtime import threads as _threads  # noqa: E402

_threads.choose_threading_layer()
_threads.quiet_openmp_spinning()
_threads.build_blas_handoff_in_background()

from jitgrad.front.api import Context, Traced, clear_caches, trace  # noqa: E402
from jitgrad.front.transforms import grad, value_and_grad, vjp  # noqa: E402
from jitgrad.errors import (ArgumentError, ConcretizationError, FunctionError, GradcheckError, InputError,
                            JitgradError, PrecisionWarning, ShapeError, TraceError,
                            UnsupportedError)
from jitgrad.ops import numpy_api as _numpy_api  # noqa: E402,F401  (registers every op and numpy's protocols on traced arrays)
from jitgrad.tracing.dispatch import EXPORTS as _EXPORTS  # noqa: E402
from jitgrad.tracing.tracer import no_grad  # noqa: E402
from jitgrad.tracing.trees import (register_dataclass, register_pytree_node, tree_flatten, tree_leaves, tree_map,
                                   tree_structure, tree_unflatten)
from jitgrad.front.function import Function, FunctionCtx  # noqa: E402
from jitgrad.front.gradcheck import gradcheck, gradgradcheck  # noqa: E402
from jitgrad.front.forward import float0, hessian, jacfwd, jacobian, jacrev, jvp, linearize  # noqa: E402
from jitgrad.front.batching import vmap  # noqa: E402
from jitgrad import optim  # noqa: E402  (jg.optim.SGD, Adam, AdamW)

globals().update(_EXPORTS)  # jg.<op> for every op the modules of jitgrad.ops declare (jg.sum, jg.gelu, ...)
__version__ = "0.1.0"
__all__ = ["ArgumentError", "Context", "Traced", "clear_caches", "grad", "trace", "value_and_grad", "vjp",
           "ConcretizationError", "FunctionError", "GradcheckError", "InputError", "JitgradError", "PrecisionWarning",
           "ShapeError", "TraceError", "UnsupportedError", "no_grad", "Function", "FunctionCtx", "gradcheck",
           "gradgradcheck", "jacobian", "jacfwd", "jacrev", "hessian", "jvp", "linearize", "float0", "vmap",
           "register_dataclass", "register_pytree_node", "tree_flatten", "tree_leaves",
           "tree_map", "tree_structure", "tree_unflatten", "optim"]
__all__.extend(sorted(_EXPORTS))


def __getattr__(name: str) -> object:
    """`jg.torch` (PyTorch interop) and `jg.distributed` (Dask) are imported on first use: importing jitgrad never
    imports torch or Dask."""
    if name == "torch":
        from jitgrad.front import torch_interop
        globals()["torch"] = torch_interop
        return torch_interop
    if name == "distributed":  # a submodule of the attribute's own name: `from . import` would recurse here
        import importlib
        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module 'jitgrad' has no attribute {name!r}")
