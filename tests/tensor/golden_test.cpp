// Mantissa's ops against PyTorch: each case replays a golden file written by
// tools/reference/make_tensor_golden.py (its docstring has the naming convention) and compares
// every stored output, updated buffer and gradient elementwise:
//   |mantissa - torch| <= 1e-5 * (|torch| + mean |torch|)
// The files were computed in float64 and rounded once to float32, so the bound is Mantissa's
// own float32 error, measured against the tensor's scale where single values cancel to ~0.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/tensor/ops.h"

#ifndef MANTISSA_GOLDEN_DIR
#error "tests/CMakeLists.txt passes MANTISSA_GOLDEN_DIR, the folder of the golden files"
#endif

namespace mantissa {
namespace {

constexpr double kRelTol = 1e-5;

using Outputs = std::map<std::string, Tensor>;

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": Mantissa produced no tensor";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << what;
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> b = expected.to_vector<double>();
  double mean_abs = 0;
  for (double v : b)
    mean_abs += std::abs(v);
  if (!b.empty()) mean_abs /= double(b.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double tol = kRelTol * (std::abs(b[i]) + mean_abs);
    const double err = std::abs(a[i] - b[i]);
    if (!(err <= tol)) {  // NaN fails too
      ++bad;
      const double ratio = tol > 0 ? err / tol : INFINITY;
      if (!(ratio <= worst_ratio)) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << b.size()
                     << " elements differ from PyTorch; worst at flat index " << worst << ": got "
                     << a[worst] << ", want " << b[worst] << " (error " << worst_ratio
                     << "x the tolerance)";
}

// One golden file: its tensors, the leaves Mantissa differentiates, and the checks.
class Golden {
 public:
  explicit Golden(const std::string& name)
      : name_(name),
        file_(load_safetensors(std::string(MANTISSA_GOLDEN_DIR) + "/" + name + ".safetensors")) {}

  const std::string& name() const { return name_; }
  bool has(const std::string& key) const { return file_.find(key) != nullptr; }
  const Tensor& stored(const std::string& key) const { return file_.at(key); }

  // in.<x> / param.<x> as a fresh leaf that requires grad (float) or a plain copy (targets, masks).
  Tensor leaf(const std::string& key) {
    Tensor t = stored(key).clone();
    if (t.is_floating_point() && has("grad." + key.substr(key.find('.') + 1))) {
      t.set_requires_grad(true);
      leaves_[key] = t;
    }
    return t;
  }
  Tensor in(const std::string& name) { return leaf("in." + name); }
  Tensor param(const std::string& name) { return leaf("param." + name); }
  // buffer.<b> as a tensor the op may update in place (compared with after.<b> by check()).
  Tensor buffer(const std::string& name) {
    Tensor t = stored("buffer." + name).clone();
    buffers_[name] = t;
    return t;
  }

  bool has_meta(const std::string& key) const { return file_.metadata.count(key) != 0; }
  std::string meta(const std::string& key) const {
    const auto it = file_.metadata.find(key);
    MT_CHECK(it != file_.metadata.end(), "golden file ", name_, " has no metadata '", key, "'");
    return it->second;
  }
  double meta_double(const std::string& key) const { return std::stod(meta(key)); }
  int64_t meta_int(const std::string& key) const { return std::stoll(meta(key)); }
  bool meta_bool(const std::string& key) const { return meta(key) == "true"; }
  std::vector<int64_t> meta_ints(const std::string& key) const {
    std::vector<int64_t> v;
    std::stringstream ss(meta(key));
    for (std::string item; std::getline(ss, item, ',');)
      v.push_back(std::stoll(item));
    return v;
  }

  // Backward from every output that has a gout.<y>, then every out.*, after.* and grad.* of the
  // file is compared: a golden tensor that no check reaches is a failure, not a skip.
  void backward_and_check(const Outputs& outputs) {
    std::vector<std::pair<Tensor, Tensor>> roots;
    for (const auto& [y, t] : outputs) {
      if (has("gout." + y)) roots.emplace_back(t, stored("gout." + y));
    }
    ASSERT_FALSE(roots.empty()) << name_ << ": no output has an upstream gradient";
    for (size_t i = 0; i < roots.size(); ++i) {
      roots[i].first.backward(roots[i].second, /*retain_graph=*/i + 1 < roots.size());
    }
    for (const auto& [key, expected] : file_.tensors) {
      const std::string prefix = key.substr(0, key.find('.'));
      const std::string rest = key.substr(key.find('.') + 1);
      const std::string what = name_ + " " + key;
      if (prefix == "out") {
        const auto it = outputs.find(rest);
        if (it == outputs.end()) {
          ADD_FAILURE() << what << ": the test computes no such output";
        } else {
          expect_close(it->second, expected, what);
        }
      } else if (prefix == "after") {
        const auto it = buffers_.find(rest);
        if (it == buffers_.end()) {
          ADD_FAILURE() << what << ": the test passes no such buffer";
        } else {
          expect_close(it->second, expected, what);
        }
      } else if (prefix == "grad") {
        auto it = leaves_.find("in." + rest);
        if (it == leaves_.end()) it = leaves_.find("param." + rest);
        if (it == leaves_.end()) {
          ADD_FAILURE() << what << ": the test uses no such input or parameter";
        } else {
          expect_close(it->second.grad(), expected, what);
        }
      }
    }
  }

 private:
  std::string name_;
  SafetensorsFile file_;
  std::map<std::string, Tensor> leaves_;
  std::map<std::string, Tensor> buffers_;
};

// Runs one case; an op that throws (not implemented yet, a wrong shape) fails just that case.
void run_case(const std::string& name, const std::function<Outputs(Golden&)>& compute) {
  SCOPED_TRACE("golden case " + name);
  try {
    Golden g(name);
    const Outputs outputs = compute(g);
    g.backward_and_check(outputs);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "golden case " << name << " threw: " << e.what();
  }
}

TEST(GoldenTorch, Matmul) {
  for (const char* name : {"matmul_2d", "matmul_batched", "matmul_mat_vec", "matmul_vec_mat"}) {
    run_case(name, [](Golden& g) { return Outputs{{"y", matmul(g.in("a"), g.in("b"))}}; });
  }
}

TEST(GoldenTorch, Linear) {
  run_case("linear", [](Golden& g) {
    return Outputs{{"y", linear(g.in("x"), g.param("weight"), g.param("bias"))}};
  });
}

TEST(GoldenTorch, Conv2d) {
  for (const char* name : {"conv2d", "conv2d_stride_pad", "conv2d_dilation_groups"}) {
    run_case(name, [](Golden& g) {
      Conv2dOptions o;
      o.stride = g.meta_ints("stride");
      o.padding = g.meta_ints("padding");
      o.dilation = g.meta_ints("dilation");
      o.groups = g.meta_int("groups");
      const Tensor bias = g.meta_bool("bias") ? g.param("bias") : Tensor();
      return Outputs{{"y", conv2d(g.in("x"), g.param("weight"), bias, o)}};
    });
  }
}

TEST(GoldenTorch, ConvTranspose2d) {
  for (const char* name :
       {"conv_transpose2d", "conv_transpose2d_outpad_groups", "conv_transpose2d_dilation"}) {
    run_case(name, [](Golden& g) {
      ConvTranspose2dOptions o;
      o.stride = g.meta_ints("stride");
      o.padding = g.meta_ints("padding");
      o.output_padding = g.meta_ints("output_padding");
      o.dilation = g.meta_ints("dilation");
      o.groups = g.meta_int("groups");
      const Tensor bias = g.meta_bool("bias") ? g.param("bias") : Tensor();
      return Outputs{{"y", conv_transpose2d(g.in("x"), g.param("weight"), bias, o)}};
    });
  }
}

TEST(GoldenTorch, BatchNorm) {
  for (const char* name : {"batch_norm_train", "batch_norm_train_2d", "batch_norm_eval"}) {
    run_case(name, [](Golden& g) {
      const Tensor y =
          batch_norm(g.in("x"), g.param("weight"), g.param("bias"), g.buffer("running_mean"),
                     g.buffer("running_var"), g.meta_bool("training"), g.meta_double("momentum"),
                     g.meta_double("eps"));
      return Outputs{{"y", y}};
    });
  }
}

TEST(GoldenTorch, LayerNorm) {
  for (const char* name : {"layer_norm", "layer_norm_2d_noaffine"}) {
    run_case(name, [](Golden& g) {
      const bool affine = g.meta_bool("affine");
      const Tensor w = affine ? g.param("weight") : Tensor();
      const Tensor b = affine ? g.param("bias") : Tensor();
      return Outputs{{"y", layer_norm(g.in("x"), g.meta_ints("normalized_shape"), w, b,
                                      g.meta_double("eps"))}};
    });
  }
}

TEST(GoldenTorch, Softmax) {
  for (const char* name : {"softmax", "softmax_dim1", "log_softmax"}) {
    run_case(name, [](Golden& g) {
      const int64_t dim = g.meta_int("dim");
      const Tensor x = g.in("x");
      return Outputs{{"y", g.meta("op") == "softmax" ? softmax(x, dim) : log_softmax(x, dim)}};
    });
  }
}

TEST(GoldenTorch, CrossEntropy) {
  for (const char* name : {"cross_entropy", "cross_entropy_smooth_ignore",
                           "cross_entropy_spatial_sum", "cross_entropy_none"}) {
    run_case(name, [](Golden& g) {
      CrossEntropyOptions o;
      o.ignore_index = g.meta_int("ignore_index");
      o.label_smoothing = g.meta_double("label_smoothing");
      const std::string r = g.meta("reduction");
      o.reduction = r == "mean" ? Reduction::Mean : r == "sum" ? Reduction::Sum : Reduction::None;
      return Outputs{{"loss", cross_entropy(g.in("logits"), g.in("target"), o)}};
    });
  }
}

TEST(GoldenTorch, ScaledDotProductAttention) {
  for (const char* name : {"sdpa", "sdpa_causal", "sdpa_bool_mask_scale", "sdpa_additive_mask"}) {
    run_case(name, [](Golden& g) {
      const Tensor mask = g.has("in.mask") ? g.in("mask") : Tensor();
      std::optional<double> scale;
      if (g.has_meta("scale")) scale = g.meta_double("scale");
      const Tensor y = scaled_dot_product_attention(g.in("q"), g.in("k"), g.in("v"), mask,
                                                    g.meta_bool("causal"), scale);
      return Outputs{{"y", y}};
    });
  }
}

TEST(GoldenTorch, CompositeMlp) {
  run_case("composite_mlp", [](Golden& g) {
    const Tensor h1 = linear(g.in("x"), g.param("fc1.weight"), g.param("fc1.bias"));
    const Tensor h2 = gelu(h1);
    const Tensor h3 = layer_norm(h2, {h2.size(-1)}, g.param("ln.weight"), g.param("ln.bias"),
                                 g.meta_double("eps"));
    const Tensor logits = linear(h3, g.param("fc2.weight"), g.param("fc2.bias"));
    CrossEntropyOptions o;
    o.label_smoothing = g.meta_double("label_smoothing");
    const Tensor loss = cross_entropy(logits, g.in("target"), o);
    return Outputs{{"h1", h1}, {"h2", h2}, {"h3", h3}, {"logits", logits}, {"loss", loss}};
  });
}

// The golden files themselves: present, and each case names its op.
TEST(GoldenTorch, FilesAreWellFormed) {
  for (const char* name : {"matmul_2d", "conv2d", "batch_norm_train", "layer_norm", "softmax",
                           "cross_entropy_smooth_ignore", "sdpa_causal", "composite_mlp"}) {
    const SafetensorsFile f =
        load_safetensors(std::string(MANTISSA_GOLDEN_DIR) + "/" + name + ".safetensors");
    EXPECT_EQ(f.metadata.at("case"), name);
    EXPECT_FALSE(f.metadata.at("op").empty());
    for (const auto& [key, t] : f.tensors) {
      EXPECT_TRUE(key.starts_with("in.") || key.starts_with("param.") ||
                  key.starts_with("buffer.") || key.starts_with("after.") ||
                  key.starts_with("out.") || key.starts_with("gout.") || key.starts_with("grad."))
          << name << ": " << key;
    }
  }
}

}  // namespace
}  // namespace mantissa
