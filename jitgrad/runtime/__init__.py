"""Running plans in this process: the plan cache, the backend registry that compiles plans into kernels,
and the process's OpenMP threads. Imports: every wing below it (jitgrad.kernels included) and the utilities."""
