#include "mantissa/autograd/checkpoint.h"

#include <array>
#include <memory>
#include <optional>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::autograd {

namespace {

// The autocast state of every device type where a segment first ran. The recomputation runs in
// backward, usually after the region has ended: without this it would compute the segment in
// other dtypes than the first time and the gradients would not be the ones of the forward
// (PyTorch's checkpoint saves and restores autocast the same way).
struct AutocastState {
  std::array<bool, kNumDeviceTypes> enabled{};
  std::array<DType, kNumDeviceTypes> dtype{};

  static AutocastState current() {
    AutocastState s;
    for (int d = 0; d < kNumDeviceTypes; ++d) {
      s.enabled[size_t(d)] = amp::is_autocast_enabled(DeviceType(d));
      s.dtype[size_t(d)] = amp::autocast_dtype(DeviceType(d));
    }
    return s;
  }

  // Regions that set this state until they are destroyed (innermost last).
  std::vector<std::unique_ptr<amp::Autocast>> enter() const {
    std::vector<std::unique_ptr<amp::Autocast>> regions;
    for (int d = 0; d < kNumDeviceTypes; ++d) {
      regions.push_back(
          std::make_unique<amp::Autocast>(DeviceType(d), dtype[size_t(d)], enabled[size_t(d)]));
    }
    return regions;
  }
};

}  // namespace

std::vector<Tensor> checkpoint(const Segment& fn, const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return fn(inputs);
  const GeneratorState rng = generator_state();
  const AutocastState autocast = AutocastState::current();
  amp::Fp8Context* const fp8 = amp::fp8_context();  // fp8 layers recompute in fp8 too
  std::vector<Tensor> outputs;
  {
    NoGrad ng;
    outputs = fn(inputs);
  }
  // The outputs carry no graph yet: detach them so the node below owns them as its results.
  for (Tensor& o : outputs)
    o = o.detach();

  std::vector<SavedTensor> saved;
  std::vector<bool> wants;
  for (const Tensor& in : inputs) {
    saved.emplace_back(in);
    wants.push_back(in.defined() && in.requires_grad());
  }
  // Recorded even when no input requires grad: parameters inside fn may.
  std::vector<Tensor> record_inputs = inputs;
  auto node_fn = [fn, saved, wants, rng, autocast, fp8](const std::vector<Tensor>& grads) {
    // Recompute with the same random numbers, on fresh leaves that stand for the inputs.
    std::vector<Tensor> leaves;
    std::vector<Tensor> wanted_leaves;
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor t = saved[i].unpack();
      if (t.defined()) t = t.detach();
      if (wants[i]) {
        t.set_requires_grad(true);
        wanted_leaves.push_back(t);
      }
      leaves.push_back(t);
    }
    const GeneratorState now = generator_state();
    set_generator_state(rng);
    std::vector<Tensor> outs;
    {
      EnableGrad eg;
      const auto regions = autocast.enter();
      std::optional<amp::Fp8Autocast> f8;
      if (fp8) {
        f8.emplace(*fp8);
      } else if (amp::Fp8Context* now_on = amp::fp8_context()) {
        f8.emplace(*now_on, false);
      }
      outs = fn(leaves);
    }
    set_generator_state(now);
    MT_CHECK(outs.size() == grads.size(), "checkpoint: the segment returned ", outs.size(),
             " tensors on recomputation but ", grads.size(), " the first time");
    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (grads[i].defined() && outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    std::vector<Tensor> input_grads(saved.size());
    if (roots.empty()) return input_grads;
    // Parameters inside the segment accumulate into .grad as usual; the stand-in leaves'
    // gradients are captured and handed on to the inputs.
    std::vector<Tensor> captured;
    {
      EnableGrad eg;
      captured = wanted_leaves.empty() ? std::vector<Tensor>()
                                       : grad(roots, root_grads, wanted_leaves, false);
      if (wanted_leaves.empty()) backward(roots, root_grads, false);
    }
    for (size_t i = 0, k = 0; i < saved.size(); ++i) {
      if (wants[i]) input_grads[i] = captured[k++];
    }
    return input_grads;
  };

  bool any_param = false;
  for (const Tensor& in : inputs)
    any_param = any_param || (in.defined() && in.requires_grad());
  if (!any_param) {
    // No input needs a gradient, but the segment's parameters may: record on a dummy leaf.
    Tensor anchor = Tensor::zeros({}, DType::F32);
    anchor.set_requires_grad(true);
    record_inputs.push_back(anchor);
    auto inner = node_fn;
    record("CheckpointBackward", record_inputs, outputs, [inner](const std::vector<Tensor>& g) {
      std::vector<Tensor> r = inner(g);
      r.push_back(Tensor());
      return r;
    });
  } else {
    record("CheckpointBackward", record_inputs, outputs, node_fn);
  }
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    {input})[0];
}

}  // namespace mantissa::autograd
