#include "backend/cpu/vector_isa.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backend/backend.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu {
namespace {

VectorIsa detect() {
  const char* env = std::getenv("MANTISSA_CPU_ISA");
  if (env != nullptr && std::string_view(env) == "baseline") return VectorIsa::Baseline;
  // MANTISSA_ISA=avx2|scalar (mantissa/core/cpu.h) caps these loops as it caps the rest.
  const CpuFeatures& f = cpu_features();
  if (f.avx512_core() && vector_isa_supported(VectorIsa::Avx512)) return VectorIsa::Avx512;
  if (f.avx2 && vector_isa_supported(VectorIsa::Avx2)) return VectorIsa::Avx2;
  return VectorIsa::Baseline;
}

std::atomic<int> g_forced{-1};

}  // namespace

bool vector_isa_supported(VectorIsa isa) {
  if (isa == VectorIsa::Baseline) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  // The AVX2 build also uses FMA (vec_math.h's fma); every AVX2 CPU made has it.
  if (isa == VectorIsa::Avx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

VectorIsa vector_isa() {
  static const VectorIsa detected = detect();
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced < 0 ? detected : VectorIsa(forced);
}

void force_vector_isa(std::optional<VectorIsa> isa) {
  if (isa) {
    MT_CHECK(vector_isa_supported(*isa), "this CPU cannot run ", vector_isa_name(*isa));
  }
  g_forced.store(isa ? int(*isa) : -1, std::memory_order_relaxed);
}

const char* vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::Avx512:
      return "AVX-512";
    case VectorIsa::Avx2:
      return "AVX2";
    case VectorIsa::Baseline:
      break;
  }
  return "the x86-64 baseline";
}

}  // namespace mantissa::backend::cpu

namespace mantissa::backend {

const char* cpu_vector_build() {
  return cpu::vector_isa_name(cpu::vector_isa());
}

}  // namespace mantissa::backend
