// Autocast regions (thread-local state, nesting), the policy applied to an op's inputs, and the
// weight-cast cache. The table itself is in cast_policy.cpp.
#include "mantissa/autocast/autocast.h"

#include <atomic>
#include <functional>
#include <memory>
#include <unordered_map>

#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

namespace detail {
thread_local bool t_any_enabled = false;
}  // namespace detail

bool autocast_active() {
  return detail::t_any_enabled;
}

namespace {

// PyTorch's defaults: bf16 on the CPU, fp16 on CUDA.
constexpr std::array<DType, kNumDeviceTypes> kDefaultDType{DType::BF16, DType::F16};

struct State {
  std::array<bool, kNumDeviceTypes> enabled{};
  std::array<DType, kNumDeviceTypes> dtype = kDefaultDType;
  int depth = 0;
  // Ops with a floating input on each device type seen while any region was enabled: how a
  // region learns that it never met its own device type.
  std::array<int64_t, kNumDeviceTypes> seen{};
};
thread_local State t_state;

void refresh_any() {
  bool any = false;
  for (bool e : t_state.enabled)
    any = any || e;
  detail::t_any_enabled = any;
}

// ---- the cache ---------------------------------------------------------------------------------

struct CacheKey {
  const TensorImpl* impl;
  DType dtype;
  bool grad;  // made with grad mode on: a copy made under NoGrad must not serve a recorded use
  bool operator==(const CacheKey&) const = default;
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (size_t(k.dtype) << 1) ^ size_t(k.grad);
  }
};

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;  // an address reused by a new tensor must not hit
  std::shared_ptr<Storage> source_storage;
  uint32_t source_version = 0;  // an in-place update (optimizer step) invalidates the copy
  Tensor copy;                  // low precision, no autograd
  uint32_t copy_version = 0;
};

struct Cache {
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> entries;
  int64_t casts = 0;
  int64_t hits = 0;
};
thread_local Cache t_cache;

bool cacheable(const Tensor& t, DType target) {
  return (target == DType::F16 || target == DType::BF16) && t.dtype() == DType::F32 &&
         t.is_leaf() && t.requires_grad();
}

// The low-precision copy of a parameter as a new tensor whose backward sends the gradient (in
// f32) to the parameter: every use gets its own node, so each use's gradient reaches it, also
// after an earlier backward released the nodes of a previous forward in the same region.
Tensor cached_cast(const Tensor& t, DType target) {
  const CacheKey key{t.impl(), target, autograd::grad_enabled()};
  CacheEntry& e = t_cache.entries[key];
  const bool valid = e.copy.defined() && e.source.lock() == t.impl_ptr() &&
                     e.source_storage == t.storage() && e.source_version == t.version() &&
                     e.copy_version == e.copy.version();
  if (valid) {
    ++t_cache.hits;
  } else {
    NoGrad ng;
    e.source = t.impl_ptr();
    e.source_storage = t.storage();
    e.source_version = t.version();
    e.copy = cast(t, target);
    e.copy_version = e.copy.version();
    ++t_cache.casts;
  }
  Tensor out = e.copy.detach();
  autograd::record("CastBackward", {t}, {out}, [](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].defined() ? g[0].to(DType::F32) : Tensor()};
  });
  return out;
}

Tensor cast_to(const Tensor& t, DType target) {
  if (t_state.depth > 0 && cacheable(t, target)) return cached_cast(t, target);
  return cast(t, target);
}

// Inputs autocast may cast: f32/f16/bf16 on a device type with an enabled region. f64, fp8 and
// integer tensors keep their dtype.
bool eligible(const Tensor& t) {
  if (!t.defined()) return false;
  const DType d = t.dtype();
  if (d != DType::F32 && d != DType::F16 && d != DType::BF16) return false;
  return t_state.enabled[size_t(t.device().type)];
}

#ifdef NDEBUG
std::atomic<bool> g_region_check{false};
#else
std::atomic<bool> g_region_check{true};
#endif

}  // namespace

// ---- regions -----------------------------------------------------------------------------------

void set_autocast_region_check(bool on) {
  g_region_check.store(on);
}

bool autocast_region_check() {
  return g_region_check.load();
}

DType default_autocast_dtype(DeviceType device) {
  return kDefaultDType[size_t(device)];
}

Autocast::Autocast(DeviceType device, std::optional<DType> dtype_arg, bool enabled)
    : device_(device), enabled_(enabled), seen_at_start_(t_state.seen) {
  const DType dtype = dtype_arg.value_or(default_autocast_dtype(device));
  MT_CHECK(!enabled || dtype == DType::F16 || dtype == DType::BF16,
           "Autocast: the region's low-precision dtype must be f16 or bf16, got ",
           dtype_name(dtype),
           "; for fp32 leave autocast off (Autocast(device, DType::BF16, /*enabled=*/false))");
  const size_t d = size_t(device);
  prev_enabled_ = t_state.enabled[d];
  prev_dtype_ = t_state.dtype[d];
  t_state.enabled[d] = enabled;
  if (enabled) t_state.dtype[d] = dtype;
  ++t_state.depth;
  refresh_any();
}

Autocast::~Autocast() {
  const size_t d = size_t(device_);
  t_state.enabled[d] = prev_enabled_;
  t_state.dtype[d] = prev_dtype_;
  refresh_any();
  if (--t_state.depth == 0) t_cache.entries.clear();
  if (!enabled_ || !autocast_region_check() || t_state.seen[d] != seen_at_start_[d]) return;
  for (size_t other = 0; other < t_state.seen.size(); ++other) {
    if (other == d || t_state.seen[other] == seen_at_start_[other]) continue;
    const Device mine{device_, 0}, theirs{DeviceType(other), 0};
    const std::string type = mine.str(), other_type = theirs.str();
    warn("autocast:device:" + type,
         ::mantissa::detail::concat("an autocast region for ", type, " ended without meeting a ",
                                    type, " tensor; its ops ran on ", other_type,
                                    " untouched by it. Open the region for the device of the model "
                                    "(Autocast(x.device(), dtype))"));
    return;
  }
}

NoAutocast::NoAutocast() : prev_(t_state.enabled) {
  t_state.enabled.fill(false);
  refresh_any();
}

NoAutocast::~NoAutocast() {
  t_state.enabled = prev_;
  refresh_any();
}

bool is_autocast_enabled(DeviceType device) {
  return t_state.enabled[size_t(device)];
}

DType autocast_dtype(DeviceType device) {
  return t_state.dtype[size_t(device)];
}

int autocast_nesting() {
  return t_state.depth;
}

CastCacheStats cast_cache_stats() {
  CastCacheStats s;
  s.casts = t_cache.casts;
  s.hits = t_cache.hits;
  for (const auto& [key, e] : t_cache.entries) {
    if (!e.copy.defined()) continue;
    ++s.entries;
    s.bytes += int64_t(e.copy.nbytes());
  }
  return s;
}

void reset_cast_cache_stats() {
  t_cache.casts = 0;
  t_cache.hits = 0;
}

void clear_cast_cache() {
  t_cache.entries.clear();
}

// ---- the policy --------------------------------------------------------------------------------

namespace detail {

void apply_policy(OpId op, const Tensor** ins, Tensor* store, size_t n) {
  const PolicyEntry& entry = policy_entry(op);
  for (size_t i = 0; i < n; ++i) {
    if (ins[i]->defined() && ins[i]->is_floating_point()) {
      ++t_state.seen[size_t(ins[i]->device().type)];
      break;
    }
  }
  if (entry.fp16 == Fp16Rule::Banned) {
    for (size_t i = 0; i < n; ++i) {
      const Tensor& t = *ins[i];
      if (!t.defined() || !t_state.enabled[size_t(t.device().type)]) continue;
      MT_CHECK(t_state.dtype[size_t(t.device().type)] != DType::F16, op_name(op),
               " is unsafe to autocast in an fp16 region (its gradient underflows or overflows "
               "in fp16); ",
               entry.instead,
               ". To keep it, run it in a NoAutocast block (or after the region) on fp32 inputs");
    }
  }
  switch (entry.policy) {
    case CastPolicy::None:
      return;
    case CastPolicy::LowerPrecision:
    case CastPolicy::Fp32:
      for (size_t i = 0; i < n; ++i) {
        const Tensor& t = *ins[i];
        if (!eligible(t)) continue;
        const DType target =
            entry.policy == CastPolicy::Fp32 ? DType::F32 : t_state.dtype[size_t(t.device().type)];
        if (t.dtype() == target) continue;
        store[i] = cast_to(t, target);
        ins[i] = &store[i];
      }
      return;
    case CastPolicy::Promote: {
      bool found = false;
      DType widest = DType::F32;
      for (size_t i = 0; i < n; ++i) {
        if (!eligible(*ins[i])) continue;
        widest = found ? promote_types(widest, ins[i]->dtype()) : ins[i]->dtype();
        found = true;
      }
      if (!found) return;
      for (size_t i = 0; i < n; ++i) {
        const Tensor& t = *ins[i];
        if (!eligible(t) || t.dtype() == widest) continue;
        store[i] = cast(t, widest);
        ins[i] = &store[i];
      }
      return;
    }
  }
}

}  // namespace detail

std::vector<Tensor> autocast_list(OpId op, const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out(tensors.size());
  if (!autocast_active()) return tensors;
  std::vector<const Tensor*> ptrs(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    ptrs[i] = &tensors[i];
  detail::apply_policy(op, ptrs.data(), out.data(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (ptrs[i] == &tensors[i]) out[i] = tensors[i];
  }
  return out;
}

}  // namespace mantissa::amp
