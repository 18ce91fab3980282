// Internal: MT_HOST_DEVICE marks a function that every backend compiles, the host's compiler for
// the CPU and nvcc for both sides of the CUDA backend (the elementwise math of op_math.h, the
// recipe arithmetic of step_math.h, the dtype switch of dispatch.h). Always inlined: these are
// the bodies of per-element loops.
#pragma once

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MT_HOST_DEVICE inline __attribute__((always_inline))
#endif
