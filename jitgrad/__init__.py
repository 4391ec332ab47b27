"""jitgrad: trace numpy functions, differentiate them symbolically, fuse and compile with numba.

    import jitgrad as jg

    @jg.trace
    def loss(w, x, b):
        return np.sum(np.exp(w * x + b))

    value, (gw, gx, gb) = loss.value_and_grad(w, x, b)
"""
import os as _os

# numba's OpenMP workers spin-wait by default; on a loaded machine that stalls every parallel
# kernel call by milliseconds. Passive waiting must be chosen before the OpenMP runtime starts. It is
# the process's environment, so later OpenMP runtimes (torch's) get it too; a value set before the
# import is kept (README's limits, docs/troubleshooting.md).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import threads as _threads  # noqa: E402

_threads.choose_threading_layer()

from .api import Context, Traced, clear_caches, trace  # noqa: E402
from .transforms import grad, value_and_grad, vjp  # noqa: E402
from .errors import (ArgumentError, ConcretizationError, FunctionError, GradcheckError, InputError, JitgradError,  # noqa: E402
                     PrecisionWarning, ShapeError, TraceError, UnsupportedError)
from . import numpy_api as _numpy_api  # noqa: E402,F401  (registers every op and numpy's protocols on traced arrays)
from .dispatch import EXPORTS as _EXPORTS  # noqa: E402
from .tracing import no_grad  # noqa: E402
from .trees import (register_dataclass, register_pytree_node, tree_flatten, tree_leaves, tree_map,  # noqa: E402
                    tree_structure, tree_unflatten)
from .function import Function, FunctionCtx  # noqa: E402
from .gradcheck import gradcheck, gradgradcheck, jacobian  # noqa: E402
from . import optim  # noqa: E402  (jg.optim.SGD, Adam, AdamW)

globals().update(_EXPORTS)  # jg.<op> for every op the modules of jitgrad.ops declare (jg.sum, jg.gelu, ...)
__version__ = "0.1.0"
__all__ = ["ArgumentError", "Context", "Traced", "clear_caches", "grad", "trace", "value_and_grad", "vjp",
           "ConcretizationError", "FunctionError", "GradcheckError", "InputError", "JitgradError", "PrecisionWarning",
           "ShapeError", "TraceError", "UnsupportedError", "no_grad", "Function", "FunctionCtx", "gradcheck",
           "gradgradcheck", "jacobian", "register_dataclass", "register_pytree_node", "tree_flatten", "tree_leaves",
           "tree_map", "tree_structure", "tree_unflatten", "optim"]
__all__.extend(sorted(_EXPORTS))


def __getattr__(name: str) -> object:
    """`jg.torch` (PyTorch interop) and `jg.distributed` (Dask) are imported on first use: importing jitgrad never
    imports torch or Dask."""
    if name == "torch":
        from . import torch_interop
        globals()["torch"] = torch_interop
        return torch_interop
    if name == "distributed":  # a submodule of the attribute's own name: `from . import` would recurse here
        import importlib
        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module 'jitgrad' has no attribute {name!r}")
