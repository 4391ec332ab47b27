"""The backends' home: ``cpu`` (numba code generation, runtime math and the executor on numpy arrays),
``cuda`` (numba-cuda source for a GPU or numba's CUDA simulator, and its executor on device arrays),
``build`` (numba compile infrastructure both share: compiling, disk cache, compile helper, background
compiles), ``common`` (what both code writers share) and ``slots`` (what both executors share)."""
