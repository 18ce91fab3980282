// The Python module `mantissa._mantissa` (nanobind): tensors that share memory with NumPy and
// PyTorch through DLPack, the bulk numerics, the pieces of a custom training loop (autocast,
// GradScaler, optimizers, models) and the Trainer. python/mantissa/__init__.py is the public face.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mantissa/config/run_config.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/stop_signals.h"
#include "mantissa/mantissa.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace mt = mantissa;

namespace {

// ---- dtypes ------------------------------------------------------------------------------------

mt::DType dtype_of(const std::string& name) {
  const std::optional<mt::DType> d = mt::parse_dtype(name);
  MT_CHECK(d.has_value(), "unknown dtype '", name,
           "'; use f32, f64, f16, bf16, fp8_e4m3, fp8_e5m2, i64, i32, u8 or bool");
  return *d;
}

// "contiguous" (row-major) or "channels_last" (NHWC strides), PyTorch's torch.memory_format
// names without the prefix.
mt::MemoryFormat memory_format_of(const std::string& name) {
  if (name == "contiguous") return mt::MemoryFormat::Contiguous;
  MT_CHECK(name == "channels_last", "unknown memory_format '", name,
           "'; use \"contiguous\" or \"channels_last\"");
  return mt::MemoryFormat::ChannelsLast;
}

// A tensor's sizes or strides (`of` per dim) as a Python tuple, as PyTorch's shape and stride().
nb::tuple dims_tuple(const mt::Tensor& t, int64_t (mt::Tensor::*of)(int64_t) const) {
  std::vector<int64_t> v;
  for (int i = 0; i < t.dim(); ++i)
    v.push_back((t.*of)(i));
  return nb::tuple(nb::cast(v));
}

nb::dlpack::dtype dlpack_dtype(mt::DType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C code, int bits) { return nb::dlpack::dtype{uint8_t(code), uint8_t(bits), 1}; };
  switch (d) {
    case mt::DType::F64:
      return make(C::Float, 64);
    case mt::DType::F32:
      return make(C::Float, 32);
    case mt::DType::F16:
      return make(C::Float, 16);
    case mt::DType::BF16:
      return make(C::Bfloat, 16);
    case mt::DType::FP8_E4M3:
      return make(C::Float8_E4M3FN, 8);
    case mt::DType::FP8_E5M2:
      return make(C::Float8_E5M2, 8);
    case mt::DType::I64:
      return make(C::Int, 64);
    case mt::DType::I32:
      return make(C::Int, 32);
    case mt::DType::U8:
      return make(C::UInt, 8);
    case mt::DType::Bool:
      return make(C::Bool, 8);
  }
  MT_ASSERT(false, "unreachable");
  return {};
}

mt::DType dtype_of(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  for (int i = 0; i < mt::kNumDTypes; ++i) {
    const auto d = mt::DType(i);
    const nb::dlpack::dtype m = dlpack_dtype(d);
    if (m.code == t.code && m.bits == t.bits && t.lanes == 1) return d;
  }
  MT_CHECK(false, "a DLPack tensor of type code ", int(t.code), " with ", int(t.bits),
           " bits has no Mantissa dtype (", int(C::Float), " = float, ", int(C::Int), " = int)");
  return {};
}

// ---- tensors over memory someone else owns ---------------------------------------------------

// The allocator of one external buffer: allocate() hands out the buffer, deallocate() lets go of
// its owner (a DLPack producer's array) under the GIL, and of itself.
class ExternalMemory final : public mt::Allocator {
 public:
  ExternalMemory(void* data, nb::object owner) : data_(data), owner_(std::move(owner)) {}
  void* allocate(size_t) override { return data_; }
  void deallocate(void*, size_t) noexcept override {
    {
      nb::gil_scoped_acquire gil;
      owner_.reset();
    }
    delete this;
  }
  mt::MemoryStats stats() const override { return {}; }
  void reset_peak() override {}
  void empty_cache() override {}

 private:
  void* data_;
  nb::object owner_;
};

// A tensor viewing an ndarray's memory (no copy); `as` reinterprets its dtype (same size).
// CPU or CUDA memory (a CUDA producer's pending work is its own: PyTorch synchronizes its stream
// before it exports, as the DLPack protocol asks).
mt::Tensor tensor_over(const nb::ndarray<nb::ro>& a, std::optional<mt::DType> as = {}) {
  const bool cuda = a.device_type() == nb::device::cuda::value;
  MT_CHECK(a.device_type() == nb::device::cpu::value || cuda,
           "from_dlpack: memory of DLPack device type ", a.device_type(),
           " cannot be shared; only the CPU's and CUDA's");
  const mt::Device device = cuda ? mt::Device::cuda(a.device_id()) : mt::Device::cpu();
  const mt::DType dtype = as ? *as : dtype_of(a.dtype());
  MT_CHECK(mt::dtype_size(dtype) * 8 == a.dtype().bits, "cannot view ", int(a.dtype().bits),
           "-bit elements as ", mt::dtype_name(dtype));
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  int64_t lo = 0, hi = 0;  // the element offsets reached, from the data pointer
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = int64_t(a.shape(i));
    strides[i] = a.stride(i);
    if (shape[i] == 0) continue;
    (strides[i] < 0 ? lo : hi) += strides[i] * (shape[i] - 1);
  }
  const size_t esize = mt::dtype_size(dtype);
  char* base = static_cast<char*>(const_cast<void*>(a.data())) + lo * int64_t(esize);
  const size_t bytes = size_t(hi - lo + 1) * esize;
  auto* memory = new ExternalMemory(base, nb::cast(a));
  auto impl = std::make_shared<mt::TensorImpl>();
  impl->storage = std::make_shared<mt::Storage>(bytes, device, *memory);
  impl->shape = mt::Shape(shape);
  impl->strides = mt::Shape(strides);
  impl->offset = -lo;
  impl->dtype = dtype;
  return mt::Tensor(impl);
}

// An ndarray viewing a tensor's memory; the capsule keeps the tensor's storage alive. A CUDA
// tensor's queued work is finished first (the consumer may read it on any stream).
nb::ndarray<> array_of(const mt::Tensor& t, std::optional<nb::dlpack::dtype> as = {}) {
  const bool cuda = t.device().is_cuda();
  if (cuda) mt::cuda::synchronize(t.device().index);
  auto* keep = new mt::Tensor(t.detach());
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<mt::Tensor*>(p); });
  std::vector<size_t> shape(size_t(t.dim()));
  std::vector<int64_t> strides(size_t(t.dim()));
  for (int i = 0; i < t.dim(); ++i) {
    shape[size_t(i)] = size_t(t.size(i));
    strides[size_t(i)] = t.stride(i);
  }
  return nb::ndarray<>(t.data_ptr(), shape.size(), shape.data(), owner, strides.data(),
                       as.value_or(dlpack_dtype(t.dtype())),
                       cuda ? nb::device::cuda::value : nb::device::cpu::value,
                       cuda ? t.device().index : 0);
}

// ---- Ctrl-C during a long call ----------------------------------------------------------------

std::atomic<int> g_stop{0};
void on_sigint(int sig) {
  g_stop.store(sig);
}

// While alive: SIGINT sets g_stop (the Trainer stops after the step under way) instead of
// Python's handler, which cannot run while the GIL is released; on a signal stack of its own,
// never on a compute thread (mantissa/core/stop_signals.h).
class CatchSigint {
 public:
  CatchSigint() : signals_((g_stop = 0, on_sigint), /*sigterm_too=*/false) {}

 private:
  mt::StopSignals signals_;
};

// ---- Autocast as a context manager -----------------------------------------------------------

struct AutocastContext {
  mt::DeviceType device;
  std::optional<mt::DType> dtype;
  bool enabled;
  std::optional<mt::amp::Autocast> region;
};

struct NoGradContext {
  std::optional<mt::NoGrad> region;
};

// ---- the Trainer from a dict -----------------------------------------------------------------

// A dict of run-config keys (the options' names; underscores allowed), read as a run config
// is: the same checks and messages, the model's defaults (train::defaults_for) under them.
mt::train::TrainConfig config_of(const nb::dict& d) {
  nb::module_ json = nb::module_::import_("json");
  nb::module_ math = nb::module_::import_("math");
  std::string object = "{";
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(nb::str(k));
    std::string value;
    if (nb::isinstance<nb::bool_>(v) || nb::isinstance<nb::str>(v) || nb::isinstance<nb::int_>(v)) {
      value = nb::cast<std::string>(json.attr("dumps")(v));
    } else if (nb::isinstance<nb::float_>(v)) {
      // JSON has no inf or nan: they go as text, which a number option refuses by name.
      const bool finite = nb::cast<bool>(math.attr("isfinite")(v));
      value = nb::cast<std::string>(json.attr("dumps")(finite ? v : nb::str(v)));
    } else {
      MT_CHECK(false, "Trainer config: '", key, "' must be a bool, int, float or str, not ",
               nb::cast<std::string>(nb::str(v.type().attr("__name__"))));
    }
    object += (object.size() > 1 ? "," : "") + nb::cast<std::string>(json.attr("dumps")(key)) +
              ":" + value;
  }
  mt::config::ConfigSources sources;
  sources.command_line = mt::config::read_json_options(object + "}", "Trainer config");
  return mt::config::resolve(sources, mt::train::defaults_for);
}

nb::dict eval_dict(const mt::train::EvalResult& r) {
  nb::dict d;
  d["loss"] = r.loss;
  d["accuracy"] = r.accuracy;
  d["samples"] = r.samples;
  d["perplexity"] = r.perplexity();
  d["seconds"] = r.seconds;
  return d;
}

// ---- Tensor ------------------------------------------------------------------------------------
void bind_tensor(nb::module_& m) {
  nb::class_<mt::Tensor>(m, "Tensor")
      .def_prop_ro("shape", [](const mt::Tensor& t) { return dims_tuple(t, &mt::Tensor::size); })
      .def_prop_ro("dtype",
                   [](const mt::Tensor& t) { return std::string(mt::dtype_name(t.dtype())); })
      .def_prop_ro("device", [](const mt::Tensor& t) { return t.device().str(); })
      .def_prop_ro("ndim", &mt::Tensor::dim)
      .def("numel", &mt::Tensor::numel)
      .def("data_ptr", [](const mt::Tensor& t) { return uintptr_t(t.data_ptr()); })
      .def_prop_rw("requires_grad", &mt::Tensor::requires_grad,
                   [](mt::Tensor& t, bool on) { t.set_requires_grad(on); })
      .def(
          "requires_grad_", [](mt::Tensor& t, bool on) { return t.set_requires_grad(on); },
          "requires_grad"_a = true)
      .def_prop_ro("grad",
                   [](const mt::Tensor& t) -> std::optional<mt::Tensor> {
                     const mt::Tensor g = t.grad();
                     return g.defined() ? std::optional(g) : std::nullopt;
                   })
      .def_prop_ro("is_leaf", &mt::Tensor::is_leaf)
      .def(
          "backward",
          [](const mt::Tensor& t, std::optional<mt::Tensor> gradient, bool retain_graph) {
            nb::gil_scoped_release release;
            t.backward(gradient.value_or(mt::Tensor()), retain_graph);
          },
          "gradient"_a = nb::none(), "retain_graph"_a = false)
      .def("item", [](const mt::Tensor& t) { return t.item(); })
      .def("detach", &mt::Tensor::detach)
      .def("clone", &mt::Tensor::clone)
      .def(
          "contiguous",
          [](const mt::Tensor& t, const std::string& memory_format) {
            return t.contiguous(memory_format_of(memory_format));
          },
          "memory_format"_a = "contiguous")
      .def(
          "is_contiguous",
          [](const mt::Tensor& t, const std::string& memory_format) {
            return t.is_contiguous(memory_format_of(memory_format));
          },
          "memory_format"_a = "contiguous")
      .def_prop_ro("strides",
                   [](const mt::Tensor& t) { return dims_tuple(t, &mt::Tensor::stride); })
      .def("to",
           [](const mt::Tensor& t, const std::string& to) {
             if (const auto d = mt::parse_dtype(to)) return t.to(*d);
             return t.to(mt::parse_device(to));
           })
      .def("reshape",
           [](const mt::Tensor& t, std::vector<int64_t> s) { return t.reshape(mt::Shape(s)); })
      .def("transpose", &mt::Tensor::transpose)
      .def("__repr__",
           [](const mt::Tensor& t) {
             std::ostringstream os;
             os << t;
             return os.str();
           })
      .def("__len__", [](const mt::Tensor& t) { return t.dim() ? t.size(0) : 0; })
      .def("__add__", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::add(a, b); })
      .def("__add__", [](const mt::Tensor& a, double b) { return mt::add(a, b); })
      .def("__radd__", [](const mt::Tensor& a, double b) { return mt::add(a, b); })
      .def("__sub__", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::sub(a, b); })
      .def("__sub__", [](const mt::Tensor& a, double b) { return mt::sub(a, b); })
      .def("__mul__", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::mul(a, b); })
      .def("__mul__", [](const mt::Tensor& a, double b) { return mt::mul(a, b); })
      .def("__rmul__", [](const mt::Tensor& a, double b) { return mt::mul(a, b); })
      .def("__truediv__", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::div(a, b); })
      .def("__truediv__", [](const mt::Tensor& a, double b) { return mt::div(a, b); })
      .def("__neg__", [](const mt::Tensor& a) { return mt::mul(a, -1.0); })
      .def("__matmul__", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::matmul(a, b); })
      // DLPack, the producer's side: torch.from_dlpack(t), numpy.from_dlpack(t) share the memory.
      .def("__dlpack__",
           [](const mt::Tensor& t, nb::kwargs) {
             // A "dltensor" capsule. The consumer's stream needs no event: array_of waited for a
             // CUDA tensor's work to finish.
             return nb::cast(array_of(t));
           })
      .def("__dlpack_device__",
           [](const mt::Tensor& t) {
             return t.device().is_cuda()
                        ? nb::make_tuple(int(nb::device::cuda::value), t.device().index)
                        : nb::make_tuple(int(nb::device::cpu::value), 0);
           })
      // The raw view NumPy reads (mantissa/__init__.py gives half and fp8 their ml_dtypes):
      // same-size unsigned integers for bf16/f16/fp8, which NumPy's DLPack import refuses.
      .def("_numpy_view", [](const mt::Tensor& t) {
        MT_CHECK(t.device().is_cpu(), "NumPy reads CPU memory: this tensor is on ",
                 t.device().str(), "; .to(\"cpu\") first");
        using C = nb::dlpack::dtype_code;
        std::optional<nb::dlpack::dtype> as;
        if (t.dtype() == mt::DType::BF16 || t.dtype() == mt::DType::F16)
          as = nb::dlpack::dtype{uint8_t(C::UInt), 16, 1};
        if (t.dtype() == mt::DType::FP8_E4M3 || t.dtype() == mt::DType::FP8_E5M2)
          as = nb::dlpack::dtype{uint8_t(C::UInt), 8, 1};
        return nb::ndarray<nb::numpy>(array_of(t, as));
      });
}

// ---- tensor factories ------------------------------------------------------------------------
void bind_factories(nb::module_& m) {
  m.def(
      "from_dlpack", [](nb::ndarray<nb::ro> a) { return tensor_over(a); }, "array"_a,
      "A tensor sharing the memory of any DLPack producer (NumPy, PyTorch), CPU or CUDA");
  m.def("_from_dlpack_as", [](nb::ndarray<nb::ro> a, const std::string& dtype) {
    return tensor_over(a, dtype_of(dtype));
  });
  m.def(
      "zeros",
      [](std::vector<int64_t> s, const std::string& dtype) {
        return mt::Tensor::zeros(mt::Shape(s), dtype_of(dtype));
      },
      "shape"_a, "dtype"_a = "f32");
  m.def(
      "ones",
      [](std::vector<int64_t> s, const std::string& dtype) {
        return mt::Tensor::ones(mt::Shape(s), dtype_of(dtype));
      },
      "shape"_a, "dtype"_a = "f32");
  m.def(
      "normal",
      [](std::vector<int64_t> s, double mean, double std, uint64_t seed, const std::string& dtype) {
        return mt::Tensor::normal(mt::Shape(s), mean, std, seed, dtype_of(dtype));
      },
      "shape"_a, "mean"_a = 0.0, "std"_a = 1.0, "seed"_a = 0, "dtype"_a = "f32");
  m.def("manual_seed", &mt::manual_seed);
  m.def("set_num_threads", &mt::set_num_threads, "n"_a, "Compute threads of the CPU kernels");
}

// ---- ops ---------------------------------------------------------------------------------------
void bind_ops(nb::module_& m) {
  m.def("matmul", &mt::matmul);
  m.def(
      "linear",
      [](const mt::Tensor& x, const mt::Tensor& w, std::optional<mt::Tensor> b) {
        return mt::linear(x, w, b.value_or(mt::Tensor()));
      },
      "x"_a, "weight"_a, "bias"_a = nb::none());
  m.def("relu", &mt::relu);
  m.def(
      "gelu",
      [](const mt::Tensor& x, const std::string& approximate) {
        return mt::gelu(
            x, approximate == "tanh" ? mt::GeluApproximation::Tanh : mt::GeluApproximation::None);
      },
      "x"_a, "approximate"_a = "none");
  m.def("softmax", &mt::softmax, "x"_a, "dim"_a);
  m.def("sum", [](const mt::Tensor& x) { return mt::sum(x); });
  m.def("mean", [](const mt::Tensor& x) { return mt::mean(x); });
  m.def(
      "argmax", [](const mt::Tensor& x, int64_t dim) { return mt::argmax(x, dim); }, "x"_a,
      "dim"_a);
  m.def("eq", [](const mt::Tensor& a, const mt::Tensor& b) { return mt::eq(a, b); });
  m.def(
      "cross_entropy",
      [](const mt::Tensor& logits, const mt::Tensor& target) {
        return mt::cross_entropy(logits, target);
      },
      "logits"_a, "target"_a);
  nb::class_<NoGradContext>(m, "no_grad")
      .def(nb::init<>())
      .def("__enter__", [](NoGradContext& c) { c.region.emplace(); })
      .def("__exit__", [](NoGradContext& c, nb::args) {
        c.region.reset();
        return false;
      });
}

// ---- numerics ----------------------------------------------------------------------------------
void bind_numerics(nb::module_& m) {
  m.def("_round_in_place",
        [](nb::ndarray<float, nb::c_contig, nb::device::cpu> a, const std::string& format,
           const std::string& rounding, const std::string& overflow, uint64_t seed) {
          const std::optional<mt::Format> f = mt::parse_format(format);
          MT_CHECK(f.has_value(), "unknown format '", format, "'; use ", mt::format_names());
          const std::optional<mt::RoundingMode> r = mt::parse_rounding(rounding);
          MT_CHECK(r.has_value(), "unknown rounding '", rounding,
                   "'; use nearest, truncate or stochastic");
          MT_CHECK(overflow == "inf" || overflow == "saturate", "unknown overflow '", overflow,
                   "'; use inf or saturate");
          mt::RoundingOptions o;
          o.mode = *r;
          o.overflow = overflow == "saturate" ? mt::Overflow::Saturate : mt::Overflow::Infinity;
          o.seed = seed;
          float* data = a.data();
          const size_t n = a.size();
          nb::gil_scoped_release release;
          mt::round_in_place(*f, data, n, o);
        });
  m.def("_convert", [](nb::ndarray<const float, nb::c_contig, nb::device::cpu> src,
                       nb::ndarray<nb::c_contig, nb::device::cpu> dst, const std::string& format,
                       const std::string& rounding, bool saturate, uint64_t seed) {
    MT_CHECK(src.size() == dst.size(), "convert: ", src.size(), " values into ", dst.size());
    const std::optional<mt::Format> f = mt::parse_format(format);
    MT_CHECK(f.has_value(), "unknown format '", format, "'; use ", mt::format_names());
    const std::optional<mt::RoundingMode> r = mt::parse_rounding(rounding);
    MT_CHECK(r.has_value(), "unknown rounding '", rounding, "'");
    mt::RoundingOptions o;
    o.mode = *r;
    o.overflow = saturate ? mt::Overflow::Saturate : mt::Overflow::Infinity;
    o.seed = seed;
    const float* s = src.data();
    void* d = dst.data();
    const size_t n = src.size();
    nb::gil_scoped_release release;
    // The storage type whose format this is (fp32 and tf32 have none).
    const bool stored = [&]<typename... T>(std::tuple<T...>*) {
      return ((T::format == *f && (mt::convert(s, static_cast<T*>(d), n, o), true)) || ...);
    }(static_cast<mt::SmallFloats*>(nullptr));
    MT_CHECK(stored, "convert: ", format, " has no storage type; use round() for it");
  });
  m.def("_inspect", [](const std::string& text, const std::string& rounding, bool saturate) {
    const auto x = mt::parse_number(text);
    MT_CHECK(x.has_value(), "inspect: '", text, "' is not a number");
    const auto r = mt::parse_rounding(rounding);
    MT_CHECK(r.has_value(), "unknown rounding '", rounding, "'");
    nb::dict out;
    for (int i = 0; i < mt::kNumFormats; ++i) {
      const auto f = mt::Format(i);
      const mt::FormatReport rep =
          mt::inspect(f, *x, *r, saturate ? mt::Overflow::Saturate : mt::Overflow::Infinity);
      nb::dict d;
      d["bits"] = rep.bits;
      d["hex"] = rep.hex;
      d["sign"] = rep.sign_bits;
      d["exponent"] = rep.exponent_bits;
      d["mantissa"] = rep.mantissa_bits;
      d["value"] = rep.value;
      d["abs_error"] = rep.abs_error;
      d["rel_error"] = rep.rel_error;
      d["class"] = std::string(mt::value_class_name(rep.value_class));
      d["overflow"] = rep.overflow;
      d["underflow"] = rep.underflow;
      out[std::string(mt::format_name(f)).c_str()] = d;
    }
    return out;
  });
}

// ---- nn ----------------------------------------------------------------------------------------
void bind_nn(nb::module_& m) {
  nb::class_<mt::nn::Module>(m, "Module")
      .def("__call__", [](mt::nn::Module& mod, const mt::Tensor& x) { return mod(x); })
      .def("parameters", &mt::nn::Module::parameters)
      .def("named_parameters", &mt::nn::Module::named_parameters)
      .def(
          "train", [](mt::nn::Module& mod, bool on) { mod.train(on); }, "mode"_a = true)
      .def("eval", [](mt::nn::Module& mod) { mod.eval(); })
      .def("to",
           [](mt::nn::Module& mod, const std::string& to) {
             if (const auto d = mt::parse_dtype(to)) {
               mod.to(*d);
             } else {
               mod.to(mt::parse_device(to));
             }
           })
      .def("zero_grad", [](mt::nn::Module& mod) {
        for (mt::Tensor p : mod.parameters())
          p.set_grad(mt::Tensor());
      });
  m.def(
      "make_model",
      [](const std::string& name, uint64_t seed, int64_t num_classes, double dropout) {
        mt::nn::ModelConfig c;
        c.seed = seed;
        c.num_classes = num_classes;
        c.dropout = dropout;
        return mt::nn::make_model(name, c);
      },
      "name"_a, "seed"_a = 0, "num_classes"_a = 10, "dropout"_a = 0.0);
  m.def("model_names", &mt::nn::model_names);
  m.def(
      "Linear",
      [](int64_t in, int64_t out, uint64_t seed, bool bias) -> std::shared_ptr<mt::nn::Module> {
        return std::make_shared<mt::nn::Linear>(in, out, seed,
                                                bias ? mt::nn::Bias::Yes : mt::nn::Bias::No);
      },
      "in_features"_a, "out_features"_a, "seed"_a = 0, "bias"_a = true);
}

// ---- optim -------------------------------------------------------------------------------------
void bind_optim(nb::module_& m) {
  nb::class_<mt::optim::Optimizer>(m, "Optimizer")
      .def("step",
           [](mt::optim::Optimizer& o) {
             nb::gil_scoped_release release;
             o.step();
           })
      .def("zero_grad", &mt::optim::Optimizer::zero_grad, "set_to_none"_a = true)
      .def_prop_rw(
          "lr", [](const mt::optim::Optimizer& o) { return o.lr(); },
          [](mt::optim::Optimizer& o, double lr) { o.set_lr(lr); })
      .def("set_master_weights", &mt::optim::Optimizer::set_master_weights)
      .def(
          "set_compensation",
          [](mt::optim::Optimizer& o, const std::string& c) {
            o.set_compensation(mt::parse_word<mt::optim::Compensation>(c, "compensation"));
          },
          "compensation"_a)
      .def("state_nbytes", &mt::optim::Optimizer::state_nbytes)
      .def("params", &mt::optim::Optimizer::params);
  // A state format by its name ("fp32", "bf16", "fp8", "8bit": optim/state_format.h).
  auto format = [](const std::string& name, const char* what) {
    return mt::parse_word<mt::optim::StateFormat>(name, what);
  };
  nb::class_<mt::optim::SGD, mt::optim::Optimizer>(m, "SGD").def(
      "__init__",
      [format](mt::optim::SGD* self, std::vector<mt::Tensor> params, double lr, double momentum,
               double weight_decay, bool nesterov, const std::string& momentum_format,
               int64_t state_block) {
        new (self) mt::optim::SGD(std::move(params),
                                  {.lr = lr,
                                   .momentum = momentum,
                                   .weight_decay = weight_decay,
                                   .nesterov = nesterov,
                                   .momentum_format = format(momentum_format, "momentum_format"),
                                   .blocks = {.block = state_block}});
      },
      "params"_a, "lr"_a = 0.01, "momentum"_a = 0.0, "weight_decay"_a = 0.0, "nesterov"_a = false,
      "momentum_format"_a = "fp32", "state_block"_a = 256);
  nb::class_<mt::optim::AdamW, mt::optim::Optimizer>(m, "AdamW")
      .def(
          "__init__",
          [format](mt::optim::AdamW* self, std::vector<mt::Tensor> params, double lr,
                   std::pair<double, double> betas, double eps, double weight_decay,
                   const std::string& exp_avg_format, const std::string& exp_avg_sq_format,
                   int64_t state_block) {
            new (self) mt::optim::AdamW(
                std::move(params),
                {.lr = lr,
                 .beta1 = betas.first,
                 .beta2 = betas.second,
                 .eps = eps,
                 .weight_decay = weight_decay,
                 .exp_avg_format = format(exp_avg_format, "exp_avg_format"),
                 .exp_avg_sq_format = format(exp_avg_sq_format, "exp_avg_sq_format"),
                 .blocks = {.block = state_block}});
          },
          "params"_a, "lr"_a = 1e-3, "betas"_a = std::pair(0.9, 0.999), "eps"_a = 1e-8,
          "weight_decay"_a = 0.01, "exp_avg_format"_a = "fp32", "exp_avg_sq_format"_a = "fp32",
          "state_block"_a = 256);
}

// ---- amp ---------------------------------------------------------------------------------------
void bind_amp(nb::module_& m) {
  nb::class_<AutocastContext>(m, "autocast")
      .def(
          "__init__",
          [](AutocastContext* self, const std::string& device_type,
             std::optional<std::string> dtype, bool enabled) {
            const mt::Device d = mt::parse_device(device_type);
            new (self)
                AutocastContext{d.type, dtype ? std::optional(dtype_of(*dtype)) : std::nullopt,
                                enabled, std::nullopt};
          },
          "device_type"_a = "cpu", "dtype"_a = nb::none(), "enabled"_a = true)
      .def(
          "__enter__",
          [](AutocastContext& a) -> AutocastContext& {
            MT_CHECK(!a.region, "this autocast region is already entered");
            a.region.emplace(a.device, a.dtype, a.enabled);
            return a;
          },
          nb::rv_policy::reference)
      .def("__exit__", [](AutocastContext& a, nb::args) {
        a.region.reset();
        return false;
      });
  nb::class_<mt::amp::GradScaler>(m, "GradScaler")
      .def(
          "__init__",
          [](mt::amp::GradScaler* self, double init_scale, double growth_factor,
             double backoff_factor, int64_t growth_interval, bool enabled) {
            mt::amp::GradScalerOptions o;
            o.init_scale = init_scale;
            o.growth_factor = growth_factor;
            o.backoff_factor = backoff_factor;
            o.growth_interval = growth_interval;
            o.max_scale = std::max(o.max_scale, init_scale);
            if (!enabled) o.mode = mt::amp::ScaleMode::Disabled;
            new (self) mt::amp::GradScaler(o);
          },
          "init_scale"_a = 65536.0, "growth_factor"_a = 2.0, "backoff_factor"_a = 0.5,
          "growth_interval"_a = 2000, "enabled"_a = true)
      .def("scale", &mt::amp::GradScaler::scale)
      .def("unscale_", &mt::amp::GradScaler::unscale_)
      .def("step",
           [](mt::amp::GradScaler& s, mt::optim::Optimizer& o) {
             nb::gil_scoped_release release;
             return !s.step(o)
                         .skipped();  // PyTorch returns the optimizer's result; we say if it ran
           })
      .def(
          "update",
          [](mt::amp::GradScaler& s, std::optional<double> new_scale) {
            if (new_scale) {
              s.update(*new_scale);
            } else {
              s.update();
            }
          },
          "new_scale"_a = nb::none())
      .def("get_scale", &mt::amp::GradScaler::get_scale)
      .def("found_inf", &mt::amp::GradScaler::found_inf)
      .def_prop_ro("skipped_steps", &mt::amp::GradScaler::skipped_steps);
}

// ---- the Trainer -------------------------------------------------------------------------------
void bind_trainer(nb::module_& m) {
  nb::class_<mt::train::Trainer>(m, "Trainer")
      .def(
          "__init__",
          [](mt::train::Trainer* self, nb::dict config) {
            const mt::train::TrainConfig c = config_of(config);
            nb::gil_scoped_release release;
            new (self) mt::train::Trainer(c);
          },
          "config"_a)
      .def(
          "fit",
          [](mt::train::Trainer& t, std::optional<nb::callable> callback) {
            if (callback) {
              nb::module_ json = nb::module_::import_("json");
              nb::callable cb = *callback, loads = json.attr("loads");
              t.set_record_callback([cb, loads](const std::string& record) {
                nb::gil_scoped_acquire gil;
                cb(loads(record));
              });
            }
            mt::train::TrainResult r;
            {
              CatchSigint sigint;
              t.set_stop_flag(&g_stop);
              nb::gil_scoped_release release;
              r = t.fit();
            }
            t.set_stop_flag(nullptr);
            t.set_record_callback(nullptr);
            if (r.interrupted != 0) {
              PyErr_SetNone(PyExc_KeyboardInterrupt);
              throw nb::python_error();
            }
            nb::module_ json = nb::module_::import_("json");
            nb::dict d = nb::cast<nb::dict>(json.attr("loads")(t.summary_json(r)));
            d["diverged"] = r.diverged;
            return d;
          },
          "callback"_a = nb::none())
      .def("evaluate",
           [](mt::train::Trainer& t) {
             mt::train::EvalResult r;
             {
               nb::gil_scoped_release release;
               r = t.evaluate();
             }
             return eval_dict(r);
           })
      .def_prop_ro(
          "model", [](mt::train::Trainer& t) { return &t.model(); },
          nb::rv_policy::reference_internal)
      .def_prop_ro("config",
                   [](const mt::train::Trainer& t) { return mt::config::to_toml(t.config()); })
      .def_prop_ro("step", [](const mt::train::Trainer& t) { return t.state().step; })
      .def("step_losses", &mt::train::Trainer::step_losses)
      .def("next_batch",
           [](mt::train::Trainer& t) -> std::optional<std::pair<mt::Tensor, mt::Tensor>> {
             std::optional<mt::data::Batch> b;
             {
               nb::gil_scoped_release release;
               b = t.next_batch();
             }
             if (!b) return std::nullopt;
             return std::pair(b->x(), b->y());
           })
      .def("save", &mt::train::Trainer::save, "path"_a);
  m.def("config_toml", [](nb::dict config) { return mt::config::to_toml(config_of(config)); });
}

}  // namespace

NB_MODULE(_mantissa, m) {
  m.doc() = "Mantissa: mixed-precision training (the C++ engine's Python module)";
  m.attr("__version__") = MANTISSA_VERSION;

  // C++ errors: a user's mistake is a ValueError, an internal fault a RuntimeError.
  static nb::object error = nb::exception<mt::Error>(m, "Error", PyExc_ValueError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mt::Error& e) {
      if (e.internal()) {
        PyErr_SetString(PyExc_RuntimeError, e.message().c_str());
      } else {
        PyErr_SetString(error.ptr(), e.message().c_str());
      }
    }
  });

  bind_tensor(m);
  bind_factories(m);
  bind_ops(m);
  bind_numerics(m);
  bind_nn(m);
  bind_optim(m);
  bind_amp(m);
  bind_trainer(m);
}
