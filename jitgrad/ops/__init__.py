"""jitgrad's ops: each primitive declared next to its numpy binding, with numpy's broadcasting, dtype
promotion and axis conventions; composites (sigmoid, softmax, logsumexp...) written from primitives,
so they fuse and differentiate with no rule of their own.

Importing the package registers every op (`jitgrad.dispatch`); the modules import only those
before them: core, elementwise, elementwise_more, regions, shapes, reductions, activations, indexing, linalg, constants.
"""
from . import (core, elementwise, elementwise_more, regions, shapes, reductions, activations, indexing, linalg,  # noqa: F401
               decompositions, building, constants, scans, sorting)
