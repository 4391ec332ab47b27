"""The CPU backend: a fused `LoopKernel` written as numba source (`codegen`, with `emit`, `columns`, `split`,
`carry`), the math that source calls (`vecmath`, `reductions`), and the executor on numpy arrays (`executor`)."""
