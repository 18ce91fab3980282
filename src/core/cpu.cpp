#include "mantissa/core/cpu.h"

#include <cstdint>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MT_X86 1
#endif

#include "mantissa/core/error.h"

namespace mantissa {
namespace {

#ifdef MT_X86
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}
#endif

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#ifdef MT_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool has_avx = c & (1u << 28);
  const bool cpu_f16c = c & (1u << 29);
  const bool cpu_fma = c & (1u << 12);
  if (!osxsave || !has_avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  if (!os_ymm) return f;
  f.f16c = cpu_f16c;
  f.fma = cpu_fma;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = b & (1u << 5);
  if (os_zmm) {
    f.avx512f = b & (1u << 16);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512_fp16 = d & (1u << 23);
  }
  if (os_amx) f.amx_bf16 = d & (1u << 22);
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if (os_zmm) f.avx512_bf16 = a1 & (1u << 5);
#endif
  return f;
}

namespace {

CpuFeatures capped(CpuFeatures f) {
  const char* env = std::getenv("MANTISSA_ISA");
  if (env == nullptr || *env == '\0') return f;
  const std::string_view isa(env);
  if (isa == "avx512" || isa == "native") return f;
  MT_CHECK(isa == "scalar" || isa == "avx2", "MANTISSA_ISA=", isa,
           " is not known; use scalar, avx2 or avx512 (or unset it)");
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512_bf16 = f.avx512_fp16 = f.amx_bf16 = false;
  if (isa == "scalar") f.avx2 = f.fma = f.f16c = false;
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = capped(detect_cpu_features());
  return features;
}

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none (scalar)" : s;
}

}  // namespace mantissa
