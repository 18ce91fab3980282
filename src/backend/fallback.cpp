// The CPU fallback: the default body of every op of the Backend table (backend_ops.h). An op a
// backend does not override copies its tensors to the CPU, runs the CPU backend's kernel and
// copies what the kernel wrote back (with the backend's own copy, which every backend has), once
// per call; the first call of each op warns, every call is counted (mantissa::warn, key
// "fallback:<backend>:<op>"). Correct and slow: the way a new backend or a new op works before
// its kernel exists.
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/device_hooks.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"

namespace mantissa::backend {
namespace {

// The kernels' own copies, without the op layer (no autograd, no version bumps: the op layer
// that called the backend does those).
Tensor contiguous_on(const Tensor& t, Device device) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), device);
  if (t.device() == device) {
    backend_for(device).copy(t, out);
  } else if (t.is_contiguous()) {
    copy_across_devices(t, out, /*non_blocking=*/false);
  } else {
    copy_across_devices(contiguous_on(t, t.device()), out, /*non_blocking=*/false);
  }
  return out;
}

// An input on the CPU: itself when it is there, else a copy.
Tensor input_on_cpu(const Tensor& t) {
  return t.defined() && !t.device().is_cpu() ? contiguous_on(t, Device::cpu()) : t;
}

// An output (or in-place operand) on the CPU: always a copy, which write_back returns.
Tensor output_on_cpu(const Tensor& t) {
  return t.defined() ? contiguous_on(t, Device::cpu()) : t;
}

void write_back(const Tensor& cpu, Tensor& original) {
  if (!original.defined()) return;
  if (original.device().is_cpu()) {
    cpu_backend().copy(cpu, original);
  } else if (original.is_contiguous()) {
    copy_across_devices(cpu, original, /*non_blocking=*/false);
  } else {
    backend_for(original.device()).copy(contiguous_on(cpu, original.device()), original);
  }
}

// One argument of a fallback call: what the CPU kernel gets (get()) and what goes back to the
// caller's tensors after it ran (finish()). Values and option structs pass through.
template <typename T>
struct Arg {
  T value;
  explicit Arg(T v) : value(v) {}
  T get() { return value; }
  void finish() {}
};

template <>
struct Arg<const Tensor&> {
  Tensor cpu;
  explicit Arg(const Tensor& t) : cpu(input_on_cpu(t)) {}
  const Tensor& get() { return cpu; }
  void finish() {}
};

template <>
struct Arg<Tensor&> {  // written (and maybe read): copied there and back
  Tensor& original;
  Tensor cpu;
  explicit Arg(Tensor& t) : original(t), cpu(output_on_cpu(t)) {}
  Tensor& get() { return cpu; }
  void finish() { write_back(cpu, original); }
};

template <>
struct Arg<const Tensor*> {
  Tensor cpu;
  bool given;
  explicit Arg(const Tensor* t) : cpu(t ? input_on_cpu(*t) : Tensor()), given(t != nullptr) {}
  const Tensor* get() { return given ? &cpu : nullptr; }
  void finish() {}
};

template <>
struct Arg<Tensor*> {
  Tensor* original;
  Tensor cpu;
  explicit Arg(Tensor* t) : original(t), cpu(t ? output_on_cpu(*t) : Tensor()) {}
  Tensor* get() { return original ? &cpu : nullptr; }
  void finish() {
    if (original) write_back(cpu, *original);
  }
};

template <>
struct Arg<std::span<const Tensor>> {
  std::vector<Tensor> cpu;
  explicit Arg(std::span<const Tensor> ts) {
    for (const Tensor& t : ts)
      cpu.push_back(input_on_cpu(t));
  }
  std::span<const Tensor> get() { return cpu; }
  void finish() {}
};

template <>
struct Arg<std::span<Tensor>> {
  std::span<Tensor> original;
  std::vector<Tensor> cpu;
  explicit Arg(std::span<Tensor> ts) : original(ts) {
    for (const Tensor& t : ts)
      cpu.push_back(output_on_cpu(t));
  }
  std::span<Tensor> get() { return cpu; }
  void finish() {
    for (size_t i = 0; i < cpu.size(); ++i)
      write_back(cpu[i], original[i]);
  }
};

// The tensors inside the optimizer steps' options: masters, step counts, compensations and
// state scales are written, the found-inf flag is read.
struct CpuStepOptions {
  const MultiTensorOptions& original;
  Arg<std::span<Tensor>> masters;
  Arg<Tensor*> step_counts;
  Arg<const Tensor*> found_inf;
  Arg<std::span<Tensor>> compensations;
  Arg<std::span<Tensor>> state_scales;
  explicit CpuStepOptions(const MultiTensorOptions& o)
      : original(o),
        masters(o.masters),
        step_counts(o.step_counts),
        found_inf(o.found_inf),
        compensations(o.compensations),
        state_scales(o.state_scales) {}
  MultiTensorOptions get() {
    MultiTensorOptions o = original;
    o.masters = masters.get();
    o.step_counts = step_counts.get();
    o.found_inf = found_inf.get();
    o.compensations = compensations.get();
    o.state_scales = state_scales.get();
    return o;
  }
  void finish() {
    masters.finish();
    step_counts.finish();
    compensations.finish();
    state_scales.finish();
  }
};

template <typename Step>
struct StepArg {
  Step hyper;
  CpuStepOptions options;
  explicit StepArg(const Step& h) : hyper(h), options(h.options) {}
  const Step& get() {
    hyper.options = options.get();
    return hyper;
  }
  void finish() { options.finish(); }
};
template <>
struct Arg<const SgdStep&> : StepArg<SgdStep> {
  using StepArg::StepArg;
};
template <>
struct Arg<const AdamWStep&> : StepArg<AdamWStep> {
  using StepArg::StepArg;
};

// fp8_quantize's parameters: the given scale is a tensor on the caller's device.
template <>
struct Arg<const Fp8QuantizeParams&> {
  Fp8QuantizeParams params;
  Arg<const Tensor*> given;
  explicit Arg(const Fp8QuantizeParams& p) : params(p), given(p.given) {}
  const Fp8QuantizeParams& get() {
    params.given = given.get();
    return params;
  }
  void finish() {}
};

// fp4_quantize's parameters: the given amax is a tensor on the caller's device.
template <>
struct Arg<const Fp4QuantizeParams&> {
  Fp4QuantizeParams params;
  Arg<const Tensor*> amax;
  explicit Arg(const Fp4QuantizeParams& p) : params(p), amax(p.amax) {}
  const Fp4QuantizeParams& get() {
    params.amax = amax.get();
    return params;
  }
  void finish() {}
};

// Runs `op` of the CPU backend on CPU copies of `args` (the parameters P of the op), then writes
// back what it wrote.
template <typename R, typename... P, typename... A>
R run_on_cpu(const Backend& self, const char* name, R (Backend::*op)(P...), A&&... args) {
  const std::string key = std::string("fallback:") + std::string(self.name()) + ":" + name;
  warn(key, detail::concat("the ", self.name(), " backend has no ", name,
                           " kernel; it runs on the CPU, its tensors copied there and back: "
                           "correct but slow (warning_count(\"",
                           key, "\") counts the calls)"));
  MT_ASSERT(&self != &cpu_backend(), "the CPU backend lacks ", name);
  std::tuple<Arg<P>...> cpu_args(std::forward<A>(args)...);
  auto finish = [&] { std::apply([](auto&... a) { (a.finish(), ...); }, cpu_args); };
  if constexpr (std::is_void_v<R>) {
    std::apply([&](auto&... a) { (cpu_backend().*op)(a.get()...); }, cpu_args);
    finish();
  } else {
    R result = std::apply([&](auto&... a) { return (cpu_backend().*op)(a.get()...); }, cpu_args);
    finish();
    return result;
  }
}

}  // namespace

#define MT_BACKEND_FALLBACK(family, R, op, params, args)         \
  R Backend::op params {                                         \
    return run_on_cpu(*this, #op, &Backend::op, MT_UNPACK args); \
  }
#define MT_UNPACK(...) __VA_ARGS__
MT_FORALL_BACKEND_OPS(MT_BACKEND_FALLBACK)
#undef MT_UNPACK
#undef MT_BACKEND_FALLBACK

}  // namespace mantissa::backend
