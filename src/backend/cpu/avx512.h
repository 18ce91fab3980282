// Internal: what the CPU kernels written in AVX-512 intrinsics (fp8.cpp, fp4.cpp) include. They
// are called only where vector_isa() is Avx512 (detected at run time, never assumed).
#pragma once

#if defined(__x86_64__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as don't-care operands, which its own
// -Wmaybe-uninitialized then flags at every inlined use: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

// A function compiled for AVX-512 F/BW/DQ/VL.
#define MT_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#endif
