"""numba compile infrastructure, shared by the backends: compiling generated sources and caching their machine
code on disk (`compiler`), the compile helper process, background and quick compiles, the garbage-collector
pause and the interrupt shield. Imports the jitgrad core (cache, logging) only, never a backend."""
