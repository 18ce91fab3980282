// Tests: the CPU kernels run with one vector build (cpu/vector_isa.h) while an object of this
// class lives, and with the detected one again after.
#pragma once

#include "backend/cpu/vector_isa.h"

namespace mantissa::backend::cpu {

class ForcedIsa {
 public:
  explicit ForcedIsa(VectorIsa isa) { force_vector_isa(isa); }
  ~ForcedIsa() { force_vector_isa(std::nullopt); }
  ForcedIsa(const ForcedIsa&) = delete;
  ForcedIsa& operator=(const ForcedIsa&) = delete;
};

}  // namespace mantissa::backend::cpu
