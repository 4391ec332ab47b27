"""Lowering of fused IR groups to machine code: ``cpu`` (numba, parallel) today."""
