// The per-op sweep of the CUDA backend: every public op of mantissa/tensor/ops.h in f32, f16 and
// bf16, run through the op layer on the CPU (the reference semantics) and on the GPU with the
// same random inputs, forward and backward (the gradients of sum(out * w) for a random w). The
// GPU runs once with contiguous inputs and once with the same values in strided layouts, and
// finds its caching allocator's blocks filled with NaN, so that an element a kernel forgets to
// write shows.
//
// Tolerance (the harness's rule, tests/harness/op_harness.h): |gpu - cpu| <= k * eps(dtype) *
// (|cpu| + mean |cpu|), with k = k_fwd or k_bwd times sqrt(len) for ops that sum `len` products
// (GEMMs, convolutions, reductions, norms, attention): both sides round differently inside the
// sum, and that error grows like its square root. Data movement, comparisons and casts must
// agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "harness/op_harness.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::all_close;
using testing::eps_of;
using testing::random_f64;
using testing::strided_copy;

struct Input {
  enum Kind { Float, Index, Bool };
  Shape shape;
  Kind kind = Float;
  double lo = -1, hi = 1;  // Float: U(lo, hi); Index: integers in [0, hi)
  bool grad = true;        // Float inputs only
  bool keep_f32 = false;   // stays f32 in every sweep dtype (batch norm's running statistics)
  bool ignored = false;    // Index: every fourth target is -100 (cross_entropy's ignore_index)
};

Input floats(Shape s, double lo = -1, double hi = 1) {
  return {std::move(s), Input::Float, lo, hi};
}
Input constant(Shape s, double lo = -1, double hi = 1) {
  Input in = floats(std::move(s), lo, hi);
  in.grad = false;
  return in;
}
Input indices(Shape s, int64_t n) {
  Input in{std::move(s), Input::Index, 0, double(n)};
  in.grad = false;
  return in;
}
Input mask(Shape s) {
  Input in{std::move(s), Input::Bool};
  in.grad = false;
  return in;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct SweepCase {
  std::string name;
  std::vector<Input> inputs;
  Fn fn;
  int64_t len = 1;  // terms summed per output element (tolerance grows with sqrt(len))
  double k_fwd = 4, k_bwd = 8;
  bool exact = false;  // bit-identical results expected
};

SweepCase unary(const std::string& name, Tensor (*f)(const Tensor&), double lo = -2,
                double hi = 2) {
  return {name, {floats({7, 33}, lo, hi)}, [f](const auto& x) { return f(x[0]); }};
}

SweepCase binary(const std::string& name, Tensor (*f)(const Tensor&, const Tensor&), double lo = -1,
                 double hi = 1, double blo = -1, double bhi = 1) {
  // Broadcast both ways: (5, 1, 9) with (4, 9).
  return {name, {floats({5, 1, 9}, lo, hi), floats({4, 9}, blo, bhi)}, [f](const auto& x) {
            return f(x[0], x[1]);
          }};
}

SweepCase moved(SweepCase c) {
  c.exact = true;
  return c;
}

std::vector<SweepCase> make_cases() {
  std::vector<SweepCase> c;
  // ---- elementwise, unary
  c.push_back(moved(unary("neg", neg)));
  c.push_back(moved(unary("abs", abs)));
  c.push_back(moved(unary("relu", relu)));
  c.push_back(unary("exp", exp));
  c.push_back(unary("log", log, 0.1, 3));
  c.push_back(unary("sqrt", sqrt, 0.1, 3));
  c.push_back(unary("rsqrt", rsqrt, 0.1, 3));
  c.push_back(unary("square", square));
  c.push_back(unary("reciprocal", reciprocal, 0.2, 3));
  c.push_back(unary("silu", silu, -4, 4));
  c.push_back(unary("sigmoid", sigmoid, -4, 4));
  c.push_back(unary("tanh", tanh, -3, 3));
  c.push_back({"gelu", {floats({7, 33}, -4, 4)}, [](const auto& x) { return gelu(x[0]); }});
  c.push_back({"gelu_tanh", {floats({7, 33}, -4, 4)}, [](const auto& x) {
                 return gelu(x[0], GeluApproximation::Tanh);
               }});
  c.push_back({"clamp", {floats({7, 33})}, [](const auto& x) { return clamp(x[0], -0.5, 0.4); }});
  c.push_back({"clamp_min", {floats({7, 33})}, [](const auto& x) {
                 return clamp(x[0], 0.1, std::nullopt);
               }});
  // ---- elementwise with a Python-style scalar
  c.push_back({"add_scalar", {floats({7, 33})}, [](const auto& x) { return add(x[0], 0.75); }});
  c.push_back({"sub_scalar", {floats({7, 33})}, [](const auto& x) { return sub(x[0], 0.3); }});
  c.push_back({"rsub_scalar", {floats({7, 33})}, [](const auto& x) { return rsub(x[0], 2.0); }});
  c.push_back({"mul_scalar", {floats({7, 33})}, [](const auto& x) { return mul(x[0], 1.7); }});
  c.push_back({"div_scalar", {floats({7, 33})}, [](const auto& x) { return div(x[0], 3.0); }});
  c.push_back(
      {"pow_scalar", {floats({7, 33}, 0.2, 2)}, [](const auto& x) { return pow(x[0], 2.5); }});
  // ---- elementwise, binary with broadcasting
  c.push_back(binary("add", add));
  c.push_back(binary("sub", sub));
  c.push_back(binary("mul", mul));
  c.push_back(binary("div", div, -1, 1, 0.5, 2));
  c.push_back(binary("pow", pow, 0.5, 2, -1.5, 1.5));
  c.push_back(binary("maximum", maximum));
  c.push_back(binary("minimum", minimum));
  c.push_back({"where", {mask({4, 9}), floats({5, 1, 9}), floats({4, 9})}, [](const auto& x) {
                 return where(x[0], x[1], x[2]);
               }});
  // ---- comparisons (Bool, no gradient): against a rounded copy, so that ties occur
  const std::vector<std::pair<std::string, Tensor (*)(const Tensor&, const Tensor&)>> compares = {
      {"eq", eq}, {"ne", ne}, {"lt", lt}, {"le", le}, {"gt", gt}, {"ge", ge}};
  for (const auto& [name, f] : compares) {
    c.push_back(moved({name, {constant({5, 1, 9}), constant({4, 9})}, [f = f](const auto& x) {
                         return f(x[0],
                                  where(gt(x[1], x[0].select(0, 0)), x[0].select(0, 0), x[1]));
                       }}));
  }
  // ---- casts (RNE on both devices: bit-identical)
  for (DType to : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    c.push_back(moved({"cast_to_" + std::string(dtype_name(to)),
                       {floats({7, 33}, -300, 300)},
                       [to](const auto& x) { return cast(x[0], to); }}));
  }
  // ---- reductions
  c.push_back({"sum_all", {floats({13, 37})}, [](const auto& x) { return sum(x[0]); }, 481});
  c.push_back({"sum_dim1", {floats({6, 29, 5})}, [](const auto& x) { return sum(x[0], {1}); }, 29});
  c.push_back({"sum_dims02_keepdim",
               {floats({6, 7, 11})},
               [](const auto& x) {
                 return sum(x[0], {0, 2}, true);
               },
               66});
  c.push_back({"mean_all", {floats({13, 37})}, [](const auto& x) { return mean(x[0]); }, 481});
  c.push_back(
      {"mean_last", {floats({6, 7, 41})}, [](const auto& x) { return mean(x[0], {-1}); }, 41});
  c.push_back({"var_dim1", {floats({5, 33, 3})}, [](const auto& x) { return var(x[0], {1}); }, 33});
  c.push_back({"var_biased_all",
               {floats({5, 33})},
               [](const auto& x) {
                 return var(x[0], {0, 1}, 0);
               },
               165});
  c.push_back(moved({"max_all", {floats({13, 37})}, [](const auto& x) { return max(x[0]); }}));
  c.push_back(
      moved({"max_dim", {floats({6, 17, 5})}, [](const auto& x) { return max(x[0], 1).values; }}));
  c.push_back(moved({"min_dim0_keepdim", {floats({6, 17})}, [](const auto& x) {
                       return min(x[0], 0, true).values;
                     }}));
  // argmax may pick either of two equal values; the values it points at must agree.
  c.push_back(moved({"argmax_gather", {floats({6, 17})}, [](const auto& x) {
                       return gather(x[0], 1, argmax(x[0], 1, true));
                     }}));
  c.push_back({"sum_to_shape",
               {floats({4, 5, 6})},
               [](const auto& x) {
                 return sum_to_shape(x[0], {1, 5, 1});
               },
               24});
  // ---- linear algebra
  c.push_back({"matmul_2d",
               {floats({17, 33}), floats({33, 9})},
               [](const auto& x) { return matmul(x[0], x[1]); },
               33});
  c.push_back({"matmul_batched_broadcast",
               {floats({2, 3, 8, 16}), floats({16, 5})},
               [](const auto& x) { return matmul(x[0], x[1]); },
               16});
  c.push_back({"matmul_batched",
               {floats({3, 7, 20}), floats({3, 20, 11})},
               [](const auto& x) { return matmul(x[0], x[1]); },
               20});
  c.push_back({"matmul_vector",
               {floats({9, 40}), floats({40})},
               [](const auto& x) { return matmul(x[0], x[1]); },
               40});
  c.push_back({"linear_bias",
               {floats({4, 7, 32}), floats({24, 32}), floats({24})},
               [](const auto& x) { return linear(x[0], x[1], x[2]); },
               32});
  c.push_back({"linear_no_bias",
               {floats({5, 48}), floats({10, 48})},
               [](const auto& x) { return linear(x[0], x[1]); },
               48});
  // ---- convolution and pooling
  c.push_back({"conv2d_pad1",
               {floats({2, 3, 9, 9}), floats({4, 3, 3, 3}), floats({4})},
               [](const auto& x) {
                 Conv2dOptions o;
                 o.padding = {1, 1};
                 return conv2d(x[0], x[1], x[2], o);
               },
               27});
  c.push_back({"conv2d_stride2_groups2",
               {floats({2, 4, 10, 10}), floats({6, 2, 3, 3})},
               [](const auto& x) {
                 Conv2dOptions o;
                 o.stride = {2, 2};
                 o.padding = {1, 1};
                 o.groups = 2;
                 return conv2d(x[0], x[1], Tensor(), o);
               },
               18});
  c.push_back({"conv2d_dilation2",
               {floats({1, 3, 11, 11}), floats({5, 3, 3, 3}), floats({5})},
               [](const auto& x) {
                 Conv2dOptions o;
                 o.dilation = {2, 2};
                 return conv2d(x[0], x[1], x[2], o);
               },
               27});
  c.push_back({"conv2d_patch16",
               {floats({2, 3, 32, 32}), floats({8, 3, 16, 16}), floats({8})},
               [](const auto& x) {
                 Conv2dOptions o;
                 o.stride = {16, 16};
                 return conv2d(x[0], x[1], x[2], o);
               },
               768});
  c.push_back({"max_pool2d", {floats({2, 3, 8, 8})}, [](const auto& x) {
                 return max_pool2d(x[0], {.kernel_size = {2, 2},
                                          .stride = {2, 2},
                                          .padding = {0, 0},
                                          .count_include_pad = true});
               }});
  c.push_back({"max_pool2d_pad_overlap", {floats({2, 3, 9, 9})}, [](const auto& x) {
                 return max_pool2d(x[0], {.kernel_size = {3, 3},
                                          .stride = {2, 2},
                                          .padding = {1, 1},
                                          .count_include_pad = true});
               }});
  c.push_back({"avg_pool2d",
               {floats({2, 3, 9, 9})},
               [](const auto& x) {
                 return avg_pool2d(x[0], {.kernel_size = {3, 3},
                                          .stride = {2, 2},
                                          .padding = {1, 1},
                                          .count_include_pad = true});
               },
               9});
  c.push_back({"avg_pool2d_exclude_pad",
               {floats({2, 3, 9, 9})},
               [](const auto& x) {
                 return avg_pool2d(x[0], {.kernel_size = {3, 3},
                                          .stride = {2, 2},
                                          .padding = {1, 1},
                                          .count_include_pad = false});
               },
               9});
  c.push_back({"adaptive_avg_pool2d_3x3",
               {floats({2, 3, 8, 8})},
               [](const auto& x) {
                 return adaptive_avg_pool2d(x[0], {3, 3});
               },
               16});
  c.push_back({"adaptive_avg_pool2d_1x1",
               {floats({2, 5, 7, 7})},
               [](const auto& x) {
                 return adaptive_avg_pool2d(x[0], {1, 1});
               },
               49});
  // ---- recurrent: the fused LSTM step, with and without a previous cell state
  c.push_back({"lstm_pointwise", {floats({6, 40}, -3, 3), floats({6, 10})}, [](const auto& x) {
                 const std::vector<Tensor> hc = lstm_pointwise(x[0], x[1]);
                 return cat({hc[0], hc[1]}, 1);
               }});
  c.push_back({"lstm_pointwise_zero_state", {floats({6, 40}, -3, 3)}, [](const auto& x) {
                 const std::vector<Tensor> hc = lstm_pointwise(x[0], Tensor());
                 return cat({hc[0], hc[1]}, 1);
               }});
  // A layer's recurrence (lstm_sequence: its per-step GEMMs, the kernel's float gates_add and
  // dh_add), from given states and from a zero state.
  c.push_back({"lstm_sequence",
               {floats({5, 3, 16}, -2, 2), floats({16, 4}), floats({3, 4}), floats({3, 4})},
               [](const auto& x) {
                 const std::vector<Tensor> o = lstm_sequence(x[0], x[1], x[2], x[3]);
                 return cat({o[0].reshape({-1}), o[1].reshape({-1}), o[2].reshape({-1})}, 0);
               },
               8});
  c.push_back({"lstm_sequence_zero_state",
               {floats({5, 3, 16}, -2, 2), floats({16, 4})},
               [](const auto& x) {
                 const std::vector<Tensor> o = lstm_sequence(x[0], x[1]);
                 return cat({o[0].reshape({-1}), o[1].reshape({-1}), o[2].reshape({-1})}, 0);
               },
               8});
  // ---- normalization and softmax
  c.push_back({"layer_norm_affine",
               {floats({6, 40}), floats({40}), floats({40})},
               [](const auto& x) { return layer_norm(x[0], {40}, x[1], x[2]); },
               40});
  c.push_back({"layer_norm_plain_2d",
               {floats({3, 5, 4, 6})},
               [](const auto& x) {
                 return layer_norm(x[0], {4, 6});
               },
               24});
  c.push_back({"batch_norm_train",
               {floats({4, 3, 5, 5}), floats({3}), floats({3})},
               [](const auto& x) { return batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), true); },
               100});
  {
    Input rm = constant({3}), rv = constant({3}, 0.5, 2);
    rm.keep_f32 = rv.keep_f32 = true;
    // Training with running statistics: the output followed by the updated statistics (updated
    // in place, so fn copies them first: each run starts from the same values).
    c.push_back({"batch_norm_train_running",
                 {floats({4, 3, 5, 5}), floats({3}), floats({3}), rm, rv},
                 [](const auto& x) {
                   Tensor m = x[3].clone(), v = x[4].clone();
                   const Tensor y = batch_norm(x[0], x[1], x[2], m, v, true, 0.1);
                   return cat({cast(y, DType::F32).flatten(), m, v});
                 },
                 100});
    c.push_back({"batch_norm_eval",
                 {floats({4, 3, 5, 5}), floats({3}), floats({3}), rm, rv},
                 [](const auto& x) { return batch_norm(x[0], x[1], x[2], x[3], x[4], false); }});
  }
  c.push_back({"softmax_last",
               {floats({5, 37}, -4, 4)},
               [](const auto& x) { return softmax(x[0], -1); },
               37});
  c.push_back({"softmax_dim0",
               {floats({23, 6}, -4, 4)},
               [](const auto& x) { return softmax(x[0], 0); },
               23});
  c.push_back({"log_softmax_last",
               {floats({5, 37}, -4, 4)},
               [](const auto& x) { return log_softmax(x[0], -1); },
               37});
  c.push_back({"log_softmax_middle",
               {floats({3, 19, 4}, -4, 4)},
               [](const auto& x) { return log_softmax(x[0], 1); },
               19});
  // ---- losses
  c.push_back({"cross_entropy_mean",
               {floats({9, 21}, -3, 3), indices({9}, 21)},
               [](const auto& x) { return cross_entropy(x[0], x[1]); },
               21 * 9});
  {
    Input t = indices({13}, 21);
    t.ignored = true;
    c.push_back({"cross_entropy_ignore_smooth_sum",
                 {floats({13, 21}, -3, 3), t},
                 [](const auto& x) {
                   return cross_entropy(
                       x[0], x[1],
                       {.ignore_index = -100, .label_smoothing = 0.1, .reduction = Reduction::Sum});
                 },
                 21 * 13});
  }
  c.push_back({"cross_entropy_spatial_none",
               {floats({2, 5, 3, 3}, -3, 3), indices({2, 3, 3}, 5)},
               [](const auto& x) {
                 return cross_entropy(
                     x[0], x[1],
                     {.ignore_index = -100, .label_smoothing = 0.0, .reduction = Reduction::None});
               },
               5});
  c.push_back({"binary_cross_entropy",
               {floats({6, 11}, 0.05, 0.95), constant({6, 11}, 0, 1)},
               [](const auto& x) { return binary_cross_entropy(x[0], x[1]); },
               66});
  c.push_back(
      {"bce_with_logits_sum",
       {floats({6, 11}, -4, 4), constant({6, 11}, 0, 1)},
       [](const auto& x) { return binary_cross_entropy_with_logits(x[0], x[1], Reduction::Sum); },
       66});
  // ---- embedding, dropout, indexing, joining
  c.push_back({"embedding",
               {floats({50, 16}), indices({3, 17}, 50)},
               [](const auto& x) { return embedding(x[0], x[1]); },
               51});
  c.push_back({"index_select",
               {floats({7, 9}), indices({12}, 9)},
               [](const auto& x) { return index_select(x[0], 1, x[1]); },
               12});
  c.push_back({"gather",
               {floats({6, 8}), indices({6, 11}, 8)},
               [](const auto& x) { return gather(x[0], 1, x[1]); },
               11});
  c.push_back(moved({"cat", {floats({3, 4, 5}), floats({3, 2, 5})}, [](const auto& x) {
                       return cat({x[0], x[1]}, 1);
                     }}));
  c.push_back(moved({"stack", {floats({3, 5}), floats({3, 5})}, [](const auto& x) {
                       return stack({x[0], x[1]}, 1);
                     }}));
  c.push_back(
      moved({"split", {floats({4, 10})}, [](const auto& x) { return split(x[0], 3, 1)[1]; }}));
  c.push_back(
      moved({"chunk", {floats({7, 4})}, [](const auto& x) { return chunk(x[0], 3, 0)[2]; }}));
  // The same seed draws the same Philox mask on both devices; the kept values are scaled by
  // 1 / (1 - p), one rounding.
  c.push_back({"dropout_seeded",
               {floats({9, 37})},
               [](const auto& x) { return dropout(x[0], 0.3, true, 1234); },
               1,
               2,
               2});
  // ---- attention
  c.push_back({"sdpa",
               {floats({2, 3, 17, 16}), floats({2, 3, 17, 16}), floats({2, 3, 17, 16})},
               [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
               33,
               8,
               16});
  c.push_back(
      {"sdpa_causal",
       {floats({2, 3, 17, 16}), floats({2, 3, 17, 16}), floats({2, 3, 17, 16})},
       [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true); },
       33,
       8,
       16});
  c.push_back({"sdpa_cross_scaled",
               {floats({2, 9, 8}), floats({2, 13, 8}), floats({2, 13, 8})},
               [](const auto& x) {
                 return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), false, 0.2);
               },
               21,
               8,
               16});
  c.push_back({"sdpa_additive_mask",
               {floats({2, 2, 11, 8}), floats({2, 2, 11, 8}), floats({2, 2, 11, 8}),
                constant({11, 11}, -2, 0)},
               [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
               19,
               8,
               16});
  c.push_back(
      {"sdpa_bool_mask",
       {floats({2, 2, 11, 8}), floats({2, 2, 11, 8}), floats({2, 2, 11, 8}), mask({1, 1, 11, 11})},
       [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
       19,
       8,
       16});
  return c;
}

const std::vector<SweepCase>& cases() {
  static const std::vector<SweepCase> all = make_cases();
  return all;
}

// The inputs of a case in `dtype`, on the CPU (the same values for both devices).
std::vector<Tensor> make_inputs(const SweepCase& c, DType dtype) {
  std::vector<Tensor> xs;
  uint64_t seed = std::hash<std::string>{}(c.name);
  for (const Input& in : c.inputs) {
    ++seed;
    if (in.kind == Input::Float) {
      xs.push_back(random_f64(in.shape, seed, in.lo, in.hi).to(in.keep_f32 ? DType::F32 : dtype));
    } else if (in.kind == Input::Bool) {
      // About 80% true: an attention row then keeps at least one key (all 11 masked: 1e-8).
      xs.push_back(gt(random_f64(in.shape, seed), Tensor::scalar(-0.6, DType::F64)));
    } else {
      std::mt19937_64 rng(seed);
      std::vector<int64_t> v(size_t(in.shape.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = in.ignored && i % 4 == 1 ? -100 : int64_t(rng() % uint64_t(in.hi));
      xs.push_back(Tensor::from_vector(v, in.shape));
    }
  }
  return xs;
}

// Fills the device's cached blocks with NaN: outputs allocated from them next show every
// element that a kernel does not write.
void poison_device_cache() {
  std::vector<Tensor> blocks;
  for (int64_t n = 64; n <= (int64_t(1) << 22); n *= 4)
    blocks.push_back(
        Tensor::full({n}, std::numeric_limits<double>::quiet_NaN(), DType::F32, Device::cuda()));
}

struct Result {
  Tensor out;
  std::vector<Tensor> grads;  // per input; undefined where none is taken
};

// fn on `device`, then the gradients of sum(out * w); everything copied back to the CPU.
Result run(const SweepCase& c, const std::vector<Tensor>& inputs, Device device, bool strided) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].to(device);
    if (strided) t = strided_copy(t);
    t = t.detach();
    if (c.inputs[i].kind == Input::Float && c.inputs[i].grad) t.set_requires_grad(true);
    leaves.push_back(t);
  }
  if (device.is_cuda()) poison_device_cache();
  Result r;
  r.out = c.fn(leaves);
  if (r.out.is_floating_point() && r.out.requires_grad()) {
    const Tensor w = random_f64(r.out.shape(), 4242).to(r.out.dtype()).to(device);
    r.out.backward(w);
  }
  r.out = r.out.detach().to(Device::cpu());
  for (const Tensor& leaf : leaves)
    r.grads.push_back(leaf.requires_grad() && leaf.grad().defined() ? leaf.grad().to(Device::cpu())
                                                                    : Tensor());
  return r;
}

::testing::AssertionResult same_bits(const Tensor& got, const Tensor& ref,
                                     const std::string& what) {
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.describe() << " vs " << ref.describe();
  }
  const std::vector<double> g = got.to_vector<double>(), r = ref.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool both_nan = std::isnan(g[i]) && std::isnan(r[i]);
    if (!both_nan && g[i] != r[i]) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << g[i] << " on cuda, " << r[i] << " on cpu";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Param {
  size_t index;
  DType dtype;
  bool strided;
};

// gtest prints a test's parameter when it fails or is skipped: the case, not its 16 bytes.
void PrintTo(const Param& p, std::ostream* os) {
  *os << cases()[p.index].name << ' ' << dtype_name(p.dtype) << (p.strided ? " strided" : "");
}

class CudaOps : public ::testing::TestWithParam<Param> {};

TEST_P(CudaOps, MatchesTheCpuBackend) {
  MT_REQUIRE_CUDA();
  const auto [index, dtype, strided] = GetParam();
  const SweepCase& c = cases()[index];
  set_matmul_precision(MatmulPrecision::Highest);
  const std::vector<Tensor> inputs = make_inputs(c, dtype);
  const Result cpu = run(c, inputs, Device::cpu(), false);
  const Result gpu = run(c, inputs, Device::cuda(), strided);

  const double eps = eps_of(dtype), grow = std::sqrt(double(c.len));
  auto compare = [&](const Tensor& got, const Tensor& ref, double k, const std::string& what) {
    ASSERT_EQ(got.defined(), ref.defined()) << what << ": defined on one device only";
    if (!ref.defined()) return;
    EXPECT_EQ(got.dtype(), ref.dtype()) << what;
    if (c.exact || !ref.is_floating_point()) {
      EXPECT_TRUE(same_bits(got, ref, what));
    } else {
      EXPECT_TRUE(all_close(got, ref, eps, k * grow, what));
    }
  };
  compare(gpu.out, cpu.out, c.k_fwd, "forward");
  for (size_t i = 0; i < inputs.size(); ++i)
    compare(gpu.grads[i], cpu.grads[i], c.k_bwd, "gradient of input " + std::to_string(i));
}

std::vector<Param> all_params() {
  std::vector<Param> p;
  for (size_t i = 0; i < cases().size(); ++i) {
    for (DType d : {DType::F32, DType::F16, DType::BF16}) {
      p.push_back({i, d, false});
      p.push_back({i, d, true});
    }
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, CudaOps, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return cases()[p.param.index].name + "_" +
                                  std::string(dtype_name(p.param.dtype)) +
                                  (p.param.strided ? "_strided" : "");
                         });

// The sweep's table itself, checked everywhere: every case builds its inputs and runs forward
// and backward on the CPU in every dtype (a broken case would otherwise only show on a GPU).
TEST(CudaOpsTable, EveryCaseRunsOnTheCpu) {
  std::vector<std::string> names;
  for (const SweepCase& c : cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(std::count(names.begin(), names.end(), c.name), 0) << "duplicate case name";
    names.push_back(c.name);
    for (DType d : {DType::F32, DType::F16, DType::BF16}) {
      const Result r = run(c, make_inputs(c, d), Device::cpu(), true);
      ASSERT_TRUE(r.out.defined());
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        if (c.inputs[i].kind == Input::Float && c.inputs[i].grad && r.out.is_floating_point()) {
          EXPECT_TRUE(r.grads[i].defined()) << "no gradient reached input " << i;
        }
      }
    }
  }
  EXPECT_GE(names.size(), 80u);
}

}  // namespace
}  // namespace mantissa
