// What the CPU can do, detected at run time (cpuid + the OS's saved-state mask), never assumed.
// MANTISSA_ISA=scalar|avx2|avx512 caps what Mantissa uses, to test or compare the fallbacks.
#pragma once

#include <string>

namespace mantissa {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;  // vcvtneps2bf16, vdpbf16ps
  bool avx512_fp16 = false;  // native fp16 arithmetic (Sapphire Rapids and later)
  bool amx_bf16 = false;

  // AVX-512 foundation + byte/word + vector-length: what the bulk kernels need.
  bool avx512_core() const { return avx512f && avx512bw && avx512vl; }
  std::string describe() const;
};

// The features Mantissa may use: the hardware's, capped by MANTISSA_ISA. Detected once.
const CpuFeatures& cpu_features();

// What the hardware has, ignoring MANTISSA_ISA.
CpuFeatures detect_cpu_features();

}  // namespace mantissa
