// The fp16 underflow measurement of --underflow-every: how many non-zero fp32 gradient values
// become zero in fp16, overall and per parameter (docs/training.md, docs/amp.md).
#include "train/underflow.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/round.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"
#include "train/trainee.h"

namespace mantissa::train {

UnderflowStats measure_underflow(const Trainee& trainee, const std::vector<Tensor>& reference) {
  NoGrad ng;
  UnderflowStats u;
  u.measurements = 1;
  const double scale = trainee.amp().scaler().get_scale();
  const NamedTensors params = trainee.model().named_parameters();
  const Device device = params.front().second.device();
  // Elements where both masks are true.
  auto both = [](const Tensor& a, const Tensor& b) {
    return int64_t(sum(mul(a.to(DType::F32), b.to(DType::F32))).item());
  };
  // The zeros compared with live on the gradients' device (binary ops take no cpu scalar with
  // a cuda tensor).
  const Tensor zero16 = Tensor::scalar(0.0, DType::F16, device);
  for (size_t i = 0; i < params.size(); ++i) {
    LayerUnderflow& l = u.layers.emplace_back();
    l.name = params[i].first;
    if (!reference[i].defined()) continue;
    const Tensor r = reference[i].to(DType::F32);
    const Tensor nz = ne(r, Tensor::scalar(0.0, DType::F32, r.device()));
    l.nonzero = int64_t(sum(nz.to(DType::F32)).item());
    l.cast_unscaled = both(nz, eq(r.to(DType::F16), zero16));
    l.cast_scaled = both(nz, eq(mul(r, scale).to(DType::F16), zero16));
    const Tensor own = params[i].second.grad();
    const Tensor own_zero =
        own.defined() ? eq(own, Tensor::scalar(0.0, own.dtype(), own.device())) : Tensor();
    l.observed = own.defined() ? both(nz, own_zero) : both(nz, nz);
    if (own.defined() && own.dim() >= 2 && own.numel() > 0) {
      const int64_t rows = own.size(0), cols = own.numel() / rows;
      auto per_row = [&](const Tensor& mask) {
        return sum(mask.to(DType::F32).reshape({rows, cols}), {1});
      };
      const Tensor all_zero =
          eq(per_row(own_zero), Tensor::scalar(double(cols), DType::F32, own.device()));
      const Tensor reference_has = gt(per_row(nz), Tensor::scalar(0.0, DType::F32, own.device()));
      l.zero_rows = both(all_zero, reference_has);
    }
    u.nonzero += l.nonzero;
    u.cast_unscaled += l.cast_unscaled;
    u.cast_scaled += l.cast_scaled;
    u.observed += l.observed;
    u.zero_rows += l.zero_rows;
  }
  return u;
}

UnderflowStats& UnderflowStats::operator+=(const UnderflowStats& o) {
  measurements += o.measurements;
  nonzero += o.nonzero;
  cast_unscaled += o.cast_unscaled;
  cast_scaled += o.cast_scaled;
  observed += o.observed;
  zero_rows += o.zero_rows;
  if (layers.empty()) {
    layers = o.layers;
  } else {
    MT_ASSERT(layers.size() == o.layers.size(), "underflow measurements of different models");
    for (size_t i = 0; i < layers.size(); ++i) {
      layers[i].nonzero += o.layers[i].nonzero;
      layers[i].cast_unscaled += o.layers[i].cast_unscaled;
      layers[i].cast_scaled += o.layers[i].cast_scaled;
      layers[i].observed += o.layers[i].observed;
      layers[i].zero_rows += o.layers[i].zero_rows;
    }
  }
  return *this;
}

std::vector<LayerUnderflow> UnderflowStats::worst(size_t n) const {
  std::vector<LayerUnderflow> out;
  for (const LayerUnderflow& l : layers)
    if (l.nonzero > 0) out.push_back(l);
  std::sort(out.begin(), out.end(), [](const LayerUnderflow& a, const LayerUnderflow& b) {
    const double x = double(a.observed) / double(a.nonzero);
    const double y = double(b.observed) / double(b.nonzero);
    return x != y ? x > y : a.name < b.name;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

}  // namespace mantissa::train

// ---- the picture (underflow.h) -------------------------------------------------------------

namespace mantissa::train {

void Log2Counts::add(float x) {
  if (x == 0.0f) {
    ++zeros_;
  } else if (!std::isfinite(x)) {
    ++nonfinite_;
  } else {
    // ilogb gives subnormals their true exponent (frexp's minus one).
    ++counts_[size_t(std::ilogb(x) - kMinExponent)];
  }
}

void Log2Counts::add(const Tensor& t) {
  NoGrad ng;
  for (const float x : t.to(DType::F32).to(Device::cpu()).contiguous().to_vector<float>())
    add(x);
}

int64_t Log2Counts::nonzero() const {
  int64_t n = 0;
  for (const int64_t c : counts_)
    n += c;
  return n;
}

nlohmann::ordered_json Log2Counts::to_json() const {
  size_t lo = 0, hi = counts_.size();
  while (lo < hi && counts_[lo] == 0)
    ++lo;
  while (hi > lo && counts_[hi - 1] == 0)
    --hi;
  nlohmann::ordered_json j;
  j["zeros"] = zeros_;
  j["nonfinite"] = nonfinite_;
  j["min_exponent"] = lo < hi ? int(lo) + kMinExponent : 0;
  j["counts"] = std::vector<int64_t>(counts_.begin() + std::ptrdiff_t(lo),
                                     counts_.begin() + std::ptrdiff_t(hi));
  return j;
}

void ActivationGradients::add(const Tensor& gradient) {
  NoGrad ng;
  const std::vector<float> g =
      gradient.to(DType::F32).to(Device::cpu()).contiguous().to_vector<float>();
  for (const float x : g) {
    log2_.add(x);
    if (x == 0.0f || !std::isfinite(x)) continue;
    ++nonzero_;
    if (round_to(Format::FP16, x) == 0.0f) ++cast_unscaled_;
    if (round_to(Format::FP16, x * scale_) == 0.0f) ++cast_scaled_;
  }
}

nlohmann::ordered_json ActivationGradients::to_json() const {
  nlohmann::ordered_json j;
  j["nonzero"] = nonzero_;
  j["cast_unscaled"] = cast_unscaled_;
  j["cast_scaled"] = cast_scaled_;
  j["log2"] = log2_.to_json();
  return j;
}

nlohmann::ordered_json weight_updates(const std::vector<Tensor>& before,
                                      const std::vector<Tensor>& after) {
  MT_ASSERT(before.size() == after.size(), "weight_updates: ", before.size(), " tensors before, ",
            after.size(), " after");
  Log2Counts ratio;
  int64_t moved = 0, lost_bf16 = 0, lost_fp16 = 0;
  // Whether w stored in `f` keeps no trace of the update: the stored value plus the update (in
  // double, exact for these magnitudes, then rounded once into f) is the stored value again.
  auto lost = [](Format f, float w, double update) {
    const float stored = round_to(f, w);
    return decode(f, encode(f, double(stored) + update)) == stored;
  };
  for (size_t i = 0; i < before.size(); ++i) {
    if (!before[i].defined() || !after[i].defined()) continue;
    const std::vector<float> w = before[i].to(DType::F32).contiguous().to_vector<float>();
    const std::vector<float> v = after[i].to(DType::F32).contiguous().to_vector<float>();
    for (size_t k = 0; k < w.size(); ++k) {
      const double update = double(v[k]) - double(w[k]);
      if (update == 0.0 || w[k] == 0.0f || !std::isfinite(update)) continue;
      ++moved;
      ratio.add(float(std::abs(update) / std::abs(double(w[k]))));
      lost_bf16 += lost(Format::BF16, w[k], update);
      lost_fp16 += lost(Format::FP16, w[k], update);
    }
  }
  nlohmann::ordered_json j;
  j["moved"] = moved;
  j["lost_bf16"] = lost_bf16;
  j["lost_fp16"] = lost_fp16;
  j["log2_ratio"] = ratio.to_json();
  return j;
}

}  // namespace mantissa::train
