#include "backend/backend.h"

#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/device_hooks.h"
#include "mantissa/core/error.h"

namespace mantissa::backend {

// The CPU backend is the fallback's target: it must have every op itself. An op it only
// inherits would be the Backend default (&Backend::op, not &CpuBackend::op) and fall back to
// itself forever.
template <typename M>
struct ClassOf;
template <typename R, typename C, typename... A>
struct ClassOf<R (C::*)(A...)> {
  using type = C;
};
#define MT_CPU_HAS(family, R, op, params, args)                                                 \
  static_assert(std::is_same_v<ClassOf<decltype(&cpu::CpuBackend::op)>::type, cpu::CpuBackend>, \
                "the CPU backend lacks " #op ": it is the reference and the fallback");
MT_FORALL_BACKEND_OPS(MT_CPU_HAS)
#undef MT_CPU_HAS

std::string_view cpu::CpuBackend::name() const {
  return "cpu";
}

Backend& cpu_backend() {
  static cpu::CpuBackend* backend = new cpu::CpuBackend();  // outlives every tensor
  return *backend;
}

Backend& backend_for(Device device) {
  if (device.is_cuda()) return cuda_backend(device.index);
  return cpu_backend();
}

}  // namespace mantissa::backend
