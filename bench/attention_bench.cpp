// scaled_dot_product_attention on the CPU: the composed path (oneDNN GEMMs, softmax, masks
// as separate ops; AttentionPath::Composed) against the fused flash-style kernel
// (AttentionPath::Fused), forward alone and forward + backward, on the reference models'
// attention shapes and a longer sequence. The two paths run interleaved, one call each in turn
// (load on a shared machine hits both alike); prints the median ms of each and composed/fused.
//   build/bench/bench_attention [--threads 1] [--reps 20] [--case vit|gpt2_tiny|long]
//                               [--path both|composed|fused]   (one case or path: for a profiler)
//                               [--dtype f32|bf16|f16]         (q, k, v and the gradient's dtype)
//                               [--shape B,H,T,D[,causal]]     (this shape instead of the cases)
//                               [--layout heads|qkv]           (q, k and v contiguous, or the
//                                                               heads of one (B, T, 3, H, D)
//                                                               projection, as models read them)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/dtype.h"
#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;

struct Case {
  const char* name;
  int64_t b, h, t, d;
  bool causal;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 20;
  std::string only_case, only_path = "both", layout = "heads";
  DType dtype = DType::F32;
  std::vector<Case> cases = {
      {"vit (128x4 heads, T 50, d 16)", 128, 4, 50, 16, false},
      {"gpt2_tiny (128x4 heads, T 64, d 32, causal)", 128, 4, 64, 32, true},
      {"long (4x4 heads, T 256, d 32, causal)", 4, 4, 256, 32, true},
      {"long (2x4 heads, T 1024, d 64, causal)", 2, 4, 1024, 64, true},
  };
  std::string shape_name;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (k == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (k == "--case") {
      only_case = argv[i + 1];
    } else if (k == "--path") {
      only_path = argv[i + 1];
    } else if (k == "--shape") {
      Case c{nullptr, 0, 0, 0, 0, false};
      char causal[16] = "";
      const int got =
          std::sscanf(argv[i + 1], "%ld,%ld,%ld,%ld,%15s", &c.b, &c.h, &c.t, &c.d, causal);
      if (got < 4 || c.b < 1 || c.h < 1 || c.t < 1 || c.d < 1 ||
          (got == 5 && std::string(causal) != "causal")) {
        std::fprintf(stderr, "bench_attention: --shape %s is not B,H,T,D or B,H,T,D,causal\n",
                     argv[i + 1]);
        return 2;
      }
      c.causal = got == 5;
      shape_name = argv[i + 1];
      c.name = shape_name.c_str();
      cases = {c};
    } else if (k == "--layout") {
      layout = argv[i + 1];
      if (layout != "heads" && layout != "qkv") {
        std::fprintf(stderr, "bench_attention: --layout %s is not heads or qkv\n", argv[i + 1]);
        return 2;
      }
    } else if (k == "--dtype") {
      const std::optional<DType> dt = parse_dtype(argv[i + 1]);
      if (!dt || !is_floating(*dt)) {
        std::fprintf(stderr,
                     "bench_attention: --dtype %s is not a floating dtype (f32, bf16, f16)\n",
                     argv[i + 1]);
        return 2;
      }
      dtype = *dt;
    } else {
      std::fprintf(stderr,
                   "bench_attention: unknown option %s (--threads N, --reps N, --case NAME, "
                   "--path both|composed|fused, --dtype f32|bf16|f16, --shape B,H,T,D[,causal], "
                   "--layout heads|qkv)\n",
                   k.c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  std::printf("%d thread(s), %s, median of %d interleaved runs, ms\n", threads,
              std::string(dtype_name(dtype)).c_str(), reps);
  std::printf("%-46s %-12s %9s %9s %9s\n", "shape", "pass", "composed", "fused", "ratio");
  for (const Case& c : cases) {
    if (!only_case.empty() && std::string(c.name).rfind(only_case + " ", 0) != 0) continue;
    const Shape s{c.b, c.h, c.t, c.d};
    // Leaves: q, k and v, or the projection whose heads they are (viewed anew for every call,
    // as a model does).
    const bool qkv = layout == "qkv";
    auto leaf = [&](const Shape& shape, uint64_t seed) {
      return Tensor::uniform(shape, -1, 1, seed).to(dtype).set_requires_grad();
    };
    Tensor proj, q, k, v;
    if (qkv) {
      proj = leaf({c.b, c.t, 3, c.h, c.d}, 1);
    } else {
      q = leaf(s, 1);
      k = leaf(s, 2);
      v = leaf(s, 3);
    }
    auto attend = [&](bool causal) {
      if (!qkv) return scaled_dot_product_attention(q, k, v, Tensor(), causal);
      // (3, B, H, T, D), unbound as MultiheadAttention does (one node for the three gradients)
      const std::vector<Tensor> heads = unbind(proj.permute({2, 0, 3, 1, 4}), 0);
      return scaled_dot_product_attention(heads[0], heads[1], heads[2], Tensor(), causal);
    };
    const Tensor g = Tensor::uniform(s, -1, 1, 4).to(dtype);
    for (bool backward : {false, true}) {
      std::vector<double> t[2];
      for (int r = 0; r < reps + 2; ++r) {
        for (int path = 0; path < 2; ++path) {
          if (only_path != "both" && only_path != (path == 0 ? "composed" : "fused")) continue;
          set_attention_path(path == 0 ? AttentionPath::Composed : AttentionPath::Fused);
          const auto t0 = std::chrono::steady_clock::now();
          if (backward) {
            attend(c.causal).backward(g);
          } else {
            const autograd::NoGrad no_grad;
            attend(c.causal);
          }
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          if (r >= 2) t[path].push_back(ms);  // two warm-up calls each
        }
      }
      const double tc = t[0].empty() ? 0 : median(t[0]), tf = t[1].empty() ? 0 : median(t[1]);
      std::printf("%-46s %-12s %9.2f %9.2f %8.2fx\n", c.name, backward ? "fwd + bwd" : "forward",
                  tc, tf, tc / tf);
    }
  }
  set_attention_path(AttentionPath::Auto);
  return 0;
}
