"""Lowering of fused IR groups to machine code: ``cpu`` (numba, parallel) and ``cuda`` (numba-cuda
source for a GPU or numba's CUDA simulator)."""
