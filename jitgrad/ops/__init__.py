"""jitgrad's ops: each primitive declared next to its numpy binding, with numpy's broadcasting, dtype
promotion and axis conventions; composites (sigmoid, softmax, logsumexp...) written from primitives,
so they fuse and differentiate with no rule of their own.

Importing the package registers every op (`jitgrad.tracing.dispatch`); the modules import only those
before them: core, elementwise, elementwise_more, regions, shapes, reductions, activations, indexing, linalg, constants.
`numpy_api` answers numpy's protocols on traced arrays from the bindings registered here; `blas_threads`
sets OpenBLAS's thread count around matmul's host call.
Imports: jitgrad.ir, jitgrad.tracing and the utilities (errors, tracebacks).
"""
from jitgrad.ops import (core, elementwise, elementwise_more, regions, shapes, reductions, activations,  # noqa: F401
                         indexing, linalg, decompositions, building, constants, scans, sorting)
from jitgrad.tracing import lax as _lax

if _lax.unfilled():  # every primitive lax binds is declared by the op module that fills its handle
    raise ImportError(f"jitgrad.tracing.lax: no op module filled {', '.join(_lax.unfilled())}")
