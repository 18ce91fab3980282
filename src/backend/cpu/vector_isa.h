// Internal: which vector instruction set the CPU kernels that have several builds run with.
// The elementwise loops are compiled three times, for the x86-64 baseline (SSE2, 4 floats), AVX2
// (8 floats) and AVX-512 (16 floats), and pick one at run time by what the CPU has. All give the
// same values to the bit (only a NaN's sign may differ: which NaN an operation on two keeps
// follows the operand order the compiler picks): the loops use only IEEE operations and
// cpu/vec_math.h, and the library is built with -ffp-contract=off (no multiply and add fused
// unless written as vec_math.h's fma, which rounds once in every build).
#pragma once

#include <optional>

namespace mantissa::backend::cpu {

enum class VectorIsa { Baseline, Avx2, Avx512 };

// What the kernels use: AVX-512 (F, BW, DQ, VL) where the CPU has it, else AVX2, else the
// baseline; MANTISSA_ISA=avx2 or scalar (mantissa/core/cpu.h) caps it, and the environment
// variable MANTISSA_CPU_ISA=baseline forces the baseline.
VectorIsa vector_isa();
// Tests: run with isa (which must be supported) or, with nullopt, go back to the detected one.
void force_vector_isa(std::optional<VectorIsa> isa);
// Whether this CPU can run isa.
bool vector_isa_supported(VectorIsa isa);
const char* vector_isa_name(VectorIsa isa);

// In a file that compiles a loop family once per ISA, in namespaces baseline, avx2 and avx512:
// calls the build for the ISA the kernels run with, MT_ISA_CALL(f<C>(args)).
#define MT_ISA_CALL(...)            \
  switch (vector_isa()) {           \
    case VectorIsa::Avx512:         \
      return avx512::__VA_ARGS__;   \
    case VectorIsa::Avx2:           \
      return avx2::__VA_ARGS__;     \
    case VectorIsa::Baseline:       \
      return baseline::__VA_ARGS__; \
  }

}  // namespace mantissa::backend::cpu
