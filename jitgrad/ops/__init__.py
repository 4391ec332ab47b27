"""jitgrad's ops: each primitive declared next to its numpy binding, with numpy's broadcasting, dtype
promotion and axis conventions; composites (sigmoid, softmax, logsumexp...) written from primitives,
so they fuse and differentiate with no rule of their own.

Importing the package registers every op (`jitgrad.tracing.dispatch`); each module imports only those
before it in the list below: core; the elementwise families arithmetic, comparisons, transcendental;
regions, shapes, reductions, activations; indexing (reads), writes, data_dependent; linalg (products) and
numpy.linalg's lapack (what its primitives share), solvers, factorizations, norms, linalg_refusals; building,
padding, constants, scans, sorting.
`numpy_api` answers numpy's protocols on traced arrays from the bindings registered here; `blas_threads`
sets OpenBLAS's thread count around matmul's host call.
Imports: jitgrad.ir, jitgrad.tracing and the utilities (errors, tracebacks).
"""
from jitgrad.ops import (core, arithmetic, comparisons, transcendental, regions, shapes, reductions,  # noqa: F401
                         activations, indexing, writes, data_dependent, linalg, lapack, solvers, factorizations, norms,
                         linalg_refusals, building, padding, constants, scans, sorting)
from jitgrad.tracing import lax as _lax

if _lax.unfilled():  # every primitive lax binds is declared by the op module that fills its handle
    raise ImportError(f"jitgrad.tracing.lax: no op module filled {', '.join(_lax.unfilled())}")
