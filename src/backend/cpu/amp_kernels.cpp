// CPU kernels of the mixed-precision recipe (docs/design.md §4): the loss scaler's fused unscale
// and inf/NaN check, and the scale update of a scaler state kept in a tensor (update_scale). One
// call is one pass over all gradients: the work is cut into (tensor, chunk) items of kChunk
// elements, numbered across tensors and spread over one OpenMP parallel region. An item loads its
// chunk into a compute-type buffer (fp32 for f32 and half types, f64 for f64), notes whether any
// element is inf or NaN, multiplies by inv_scale and rounds once on store. Per-item flags are
// combined after the region, so the result does not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/multi_tensor.h"
#include "backend/multi_tensor_check.h"
#include "backend/step_math.h"

namespace mantissa::backend::cpu {
namespace {

std::atomic<int64_t> g_unscale_calls{0};

// Whether any of x[0, n) is inf or NaN, and x *= f unless f == 1 (then x is left bit-identical,
// NaN payloads included, as PyTorch).
template <typename C>
bool check_and_scale(C* x, int64_t n, C f) {
  constexpr C kMax = std::numeric_limits<C>::max();
  int bad = 0;
  // |v| <= max is false exactly for inf and NaN; no early exit: the loop stays vectorizable.
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < n; ++i)
    bad |= !(std::abs(x[i]) <= kMax) ? 1 : 0;
  if (f != C(1)) {
    for (int64_t i = 0; i < n; ++i)
      x[i] = x[i] * f;
  }
  return bad != 0;
}

}  // namespace

int64_t unscale_calls() {
  return g_unscale_calls.load(std::memory_order_relaxed);
}

bool CpuBackend::unscale_and_check(std::span<Tensor> grads, double inv_scale, Tensor* found_inf) {
  g_unscale_calls.fetch_add(1, std::memory_order_relaxed);
  if (found_inf != nullptr) check_found_inf("unscale_and_check", Device::cpu(), *found_inf);
  check_plain_tensors("unscale_and_check", Device::cpu(), grads);
  const ChunkPlan plan(grads);
  std::vector<unsigned char> bad(size_t(plan.chunks()), 0);
  for_each_item(plan, [&](int64_t c, size_t t, int64_t start, int64_t n) {
    const Tensor& g = grads[t];
    dispatch_float(g.dtype(), "unscale_and_check", [&]<typename T>() {
      using C = compute_t<T>;
      const C f = C(inv_scale);
      T* dst = static_cast<T*>(g.data_ptr()) + start;
      if constexpr (std::is_same_v<T, C>) {
        bad[size_t(c)] = check_and_scale<C>(dst, n, f) ? 1 : 0;
      } else {
        alignas(64) C buf[kChunk];
        load_contiguous<T, C>(dst, buf, n);
        bad[size_t(c)] = check_and_scale<C>(buf, n, f) ? 1 : 0;
        if (f != C(1)) store_contiguous<C, T>(buf, dst, n);
      }
    });
  });
  const bool found = std::any_of(bad.begin(), bad.end(), [](unsigned char b) { return b != 0; });
  if (found && found_inf != nullptr) *static_cast<float*>(found_inf->data_ptr()) = 1.0f;
  return found;
}

void CpuBackend::unscale_with_state(std::span<Tensor> grads, const Tensor& scale_state,
                                    Tensor& found_inf) {
  check_scale_state("unscale_and_check", Device::cpu(), scale_state);
  const double scale = *static_cast<const double*>(scale_state.data_ptr());
  unscale_and_check(grads, round_to_f32(1.0 / scale), &found_inf);
}

void CpuBackend::update_scale(Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule) {
  check_scale_state("update_scale", Device::cpu(), state);
  check_found_inf("update_scale", Device::cpu(), found_inf);
  double* s = static_cast<double*>(state.data_ptr());
  const bool found = *static_cast<const float*>(found_inf.data_ptr()) != 0.0f;
  const ScaleState next =
      next_scale_state({s[0], int64_t(s[1]), int64_t(s[2]), int64_t(s[3])}, found, rule);
  s[0] = next.scale;
  s[1] = double(next.growth_tracker);
  s[2] = double(next.hysteresis_tracker);
  s[3] = double(next.min_scale_overflows);
  state.bump_version();
}

}  // namespace mantissa::backend::cpu
