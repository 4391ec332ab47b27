"""The CUDA backend: a fused `LoopKernel` written as numba-cuda source for a GPU or numba's simulator
(`codegen`), and the executor on device arrays (`executor`), imported on first use."""
