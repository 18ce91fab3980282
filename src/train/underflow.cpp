// The fp16 underflow measurement of --underflow-every: how many non-zero fp32 gradient values
// become zero in fp16, overall and per parameter (docs/training.md, docs/amp.md).
#include <algorithm>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {

UnderflowStats Trainer::measure_underflow(const std::vector<Tensor>& reference) const {
  NoGrad ng;
  UnderflowStats u;
  u.measurements = 1;
  const double scale = amp_->scaler().get_scale();
  const NamedTensors params = model_->named_parameters();
  // Elements where both masks are true.
  auto both = [](const Tensor& a, const Tensor& b) {
    return int64_t(sum(mul(a.to(DType::F32), b.to(DType::F32))).item());
  };
  // The zeros compared with live on the gradients' device (binary ops take no cpu scalar with
  // a cuda tensor).
  const Tensor zero16 = Tensor::scalar(0.0, DType::F16, device_);
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
    l.observed = own.defined() ? both(nz, eq(own, Tensor::scalar(0.0, own.dtype(), own.device())))
                               : both(nz, nz);
    u.nonzero += l.nonzero;
    u.cast_unscaled += l.cast_unscaled;
    u.cast_scaled += l.cast_scaled;
    u.observed += l.observed;
  }
  return u;
}

UnderflowStats& UnderflowStats::operator+=(const UnderflowStats& o) {
  measurements += o.measurements;
  nonzero += o.nonzero;
  cast_unscaled += o.cast_unscaled;
  cast_scaled += o.cast_scaled;
  observed += o.observed;
  if (layers.empty()) {
    layers = o.layers;
  } else {
    MT_ASSERT(layers.size() == o.layers.size(), "underflow measurements of different models");
    for (size_t i = 0; i < layers.size(); ++i) {
      layers[i].nonzero += o.layers[i].nonzero;
      layers[i].cast_unscaled += o.layers[i].cast_unscaled;
      layers[i].cast_scaled += o.layers[i].cast_scaled;
      layers[i].observed += o.layers[i].observed;
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
