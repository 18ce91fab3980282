// Threads, the default random generator, and dropout (the op that draws from it).
#include <omp.h>

#include <atomic>
#include <mutex>

#include "backend/backend.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {

namespace {
std::atomic<MatmulPrecision> g_matmul_precision{MatmulPrecision::Highest};
std::atomic<AttentionPath> g_attention_path{AttentionPath::Auto};
}  // namespace

void set_attention_path(AttentionPath path) {
  g_attention_path.store(path);
}

AttentionPath get_attention_path() {
  return g_attention_path.load();
}

void set_matmul_precision(MatmulPrecision precision) {
  g_matmul_precision.store(precision);
}

void set_matmul_precision(const std::string& precision) {
  if (precision == "highest") return set_matmul_precision(MatmulPrecision::Highest);
  if (precision == "high") return set_matmul_precision(MatmulPrecision::High);
  MT_CHECK(false, "unknown matmul precision '", precision,
           "'; use highest (fp32) or high (tf32 inputs, fp32 accumulation)");
}

MatmulPrecision get_matmul_precision() {
  return g_matmul_precision.load();
}

void set_num_threads(int n) {
  MT_CHECK(n >= 1, "the number of threads must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int get_num_threads() {
  return omp_get_max_threads();
}

namespace {

std::mutex g_gen_mutex;
GeneratorState g_gen{0x6d616e7469737361ull /* "mantissa" */, 0};

// A fresh stream of the default generator: its seed and a new offset.
GeneratorState take_stream() {
  std::lock_guard lock(g_gen_mutex);
  GeneratorState s = g_gen;
  ++g_gen.offset;
  return s;
}

}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard lock(g_gen_mutex);
  g_gen = {seed, 0};
}

uint64_t draw_seed() {
  const GeneratorState s = take_stream();
  return mix_seed(s.seed, s.offset);
}

GeneratorState generator_state() {
  std::lock_guard lock(g_gen_mutex);
  return g_gen;
}

void set_generator_state(const GeneratorState& state) {
  std::lock_guard lock(g_gen_mutex);
  g_gen = state;
}

Tensor dropout(const Tensor& x, double p, bool training, std::optional<uint64_t> seed) {
  MT_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  MT_CHECK(x.is_floating_point(), "dropout needs a floating tensor, got a ", x.describe());
  if (!training || p == 0.0) return x;
  const GeneratorState s = seed ? GeneratorState{*seed, 0} : take_stream();
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mask = Tensor::empty(x.shape(), DType::Bool, x.device());
  backend::backend_for(x.device()).dropout(xc.detach(), p, s.seed, s.offset, out, mask);
  if (autograd::needs_grad({&x})) {
    const double scale = 1.0 / (1.0 - p);
    autograd::record("dropoutBackward", {x}, {out}, [mask, scale](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
      return std::vector<Tensor>{where(mask, mul(g[0], scale), zero)};
    });
  }
  return out;
}

}  // namespace mantissa
