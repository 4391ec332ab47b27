"""The CUDA backend: a fused `LoopKernel` written as numba-cuda source for a GPU or numba's simulator
(`codegen`, with the scalar templates of `lowerings`), the executor on device arrays (`executor`, imported on
first use) and the adapter `jitgrad.runtime.backends` registers as device "cuda" (`backend`). CUDA's compiler may
contract a multiply and an add into one FMA in one kernel and not in another, so a value `jitgrad.passes.remat`
recomputes may differ from the forward's in the last bit here (on the CPU it has the same bits)."""
