"""The backends' home, one folder each: ``cpu`` (numba code generation, runtime math and the executor on numpy
arrays) and the device backends' (code generation, lowerings, executor and adapter), each registered by
`jitgrad.runtime.backends`; ``build`` (the numba compile infrastructure they share: compiling, disk cache, compile
helper, background compiles), ``common`` (what the code writers share, the per-backend lowering tables
included), ``slots`` (what the executors share) and ``host`` (what the adapters share)."""
