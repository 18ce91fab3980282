// The public op functions. Each checks its arguments (a mistake gets a message naming shapes and
// dtypes), promotes dtypes, runs the device's kernel and records autograd.
//
// Dtype rules: floating inputs of different dtypes promote to the wider (f64 > f32 > bf16/f16;
// bf16 with f16 gives f32); an integer tensor with a floating one takes the floating dtype;
// Python-style scalars (double) never change a tensor's dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mantissa/numerics/convert.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa {

// The dtype two tensors compute in; throws naming both if they cannot be combined.
DType promote_types(DType a, DType b);

// ---- casts
// ---------------------------------------------------------------------------------------
// Differentiable: the gradient comes back in x's dtype. Narrowing float casts round to nearest
// even.
Tensor cast(const Tensor& x, DType dtype);
// The same with a rounding mode for the narrowing store (stochastic rounding, truncation,
// saturation): element i of x (row-major) draws random_bits(seed, offset, index + i). Widening
// and same-dtype casts are exact; integer results truncate as cast does. The gradient comes back
// in x's dtype, rounded to nearest even.
Tensor cast(const Tensor& x, DType dtype, const RoundingOptions& rounding);

// ---- elementwise
// ---------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

enum class GeluApproximation { None, Tanh };
Tensor relu(const Tensor& x);
// x > 0 ? x : negative_slope * x (torch.nn.functional.leaky_relu; PyTorch's default slope).
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::None);
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

// Comparisons give Bool tensors and no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator-(const Tensor& x);

// ---- reductions (fp32 accumulation for half types)
// ------------------------------------------------
Tensor sum(const Tensor& x);  // all elements
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Variance with `correction` (1: unbiased, as torch.var's default).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction = 1,
           bool keepdim = false);
Tensor max(const Tensor& x);  // all elements
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // I64
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (the inverse of broadcasting).
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

// ---- linear algebra
// ------------------------------------------------------------------------------ torch.matmul
// semantics: 1-D, 2-D and batched with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., in) @ weight(out, in)^T + bias(out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling (NCHW)
// --------------------------------------------------------------
struct Conv2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
};
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dOptions& options = {});

// torch.nn.functional.conv_transpose2d: the adjoint of conv2d (its gradient with respect to the
// input), weight (in_channels, out_channels / groups, kH, kW). Output size per spatial dim:
// (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1. output_padding must
// be smaller than the stride (PyTorch also allows it below the dilation; not here).
struct ConvTranspose2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> output_padding = {0, 0};
  int64_t groups = 1;
  std::vector<int64_t> dilation = {1, 1};
};
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& options = {});

struct Pool2dOptions {
  std::vector<int64_t> kernel_size;
  std::vector<int64_t> stride;  // empty: = kernel_size
  std::vector<int64_t> padding = {0, 0};
  bool count_include_pad = true;  // avg_pool2d
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size);

// ---- normalization, softmax, losses
// -------------------------------------------------------------- x (N, C, ...). Training mode uses
// batch statistics and updates the running ones in place.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { Mean, Sum, None };
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};
// logits (N, C) or (N, C, d1, ...) with I64 targets (N) or (N, d1, ...). The loss is F32 for
// half inputs (computed in fp32), F64 for f64.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options = {});
// -(y log p + (1 - y) log(1 - p)) for probabilities p in [0, 1] and (soft) targets y of p's
// shape; the logs are clamped at -100 (PyTorch's rule) so p = 0 or 1 gives a finite loss. F32 for
// half inputs (computed in fp32), F64 for f64. Unsafe under fp16 autocast (its gradient
// underflows there): an fp16 region refuses it, pointing to the logits form.
Tensor binary_cross_entropy(const Tensor& probabilities, const Tensor& targets,
                            Reduction reduction = Reduction::Mean);
// binary_cross_entropy(sigmoid(logits), targets) computed stably (log-sum-exp form): safe in
// every precision.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        Reduction reduction = Reduction::Mean);

// ---- embedding, dropout, indexing, joining
// -------------------------------------------------------
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Seeded from the default generator unless `seed` is given; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training = true,
               std::optional<uint64_t> seed = std::nullopt);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// split, chunk and unbind return views of x (one node for all parts in the graph: backward joins
// their gradients once). Like PyTorch's, the parts must not be written in place while x needs
// a gradient.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// The slices x.select(dim, i) for every i.
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);

// ---- recurrent --------------------------------------------------------------------------------
// One LSTM step's pointwise part in one kernel (forward and backward): gates (B, 4H) before their
// activations, in torch's order i, f, g, o, and the cell state c (B, H), undefined for a zero
// state. Returns {h, c_next}: i f o = sigmoid, g = tanh, c_next = f c + i g, h = o tanh(c_next).
// Computed in float (double for f64) and stored in the wider of the gates' and c's dtypes.
std::vector<Tensor> lstm_pointwise(const Tensor& gates, const Tensor& c);
// One LSTM layer's recurrence over a whole sequence as one op (one autograd node; forward and
// backward loop over the steps inside it), time-major: gates_x (T, B, 4H) is every step's input
// projection x_t W_ih^T + b_ih + b_hh, w_hh (4H, H) the recurrent weight, h0 and c0 (B, H) the
// initial state (undefined: zero). Step t: z = gates_x[t] + h_{t-1} W_hh^T, the GEMM's float
// output added in float (not rounded to the storage dtype first), then lstm_pointwise's math.
// Returns {y (T, B, H): every step's h, h_T, c_T}. Backward returns the gates' gradient (which
// the projection's own backward turns into W_ih's, the biases' and x's) and W_hh's in a GEMM per
// block of steps, accumulated in float. Under autocast a lower-precision op (PyTorch lists its
// LSTM cells there), so its GEMMs run in bf16/f16 with float accumulation.
std::vector<Tensor> lstm_sequence(const Tensor& gates_x, const Tensor& w_hh,
                                  const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());

// ---- attention
// ----------------------------------------------------------------------------------- softmax(q k^T
// * scale + mask) v over (..., T, D); mask is additive (float) or Bool (true = keep), broadcast to
// (..., Tq, Tk); causal masks keys after each query. scale defaults to 1/sqrt(D).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool causal = false,
                                    std::optional<double> scale = std::nullopt);

// Which kernel scaled_dot_product_attention runs when there is no explicit mask. Auto takes the
// fused (flash) kernel on CUDA, and on the CPU where its vectorized kernels run (x86-64 with
// AVX2 and FMA; f32, bf16, f16), the batch x heads give every thread a task and there are at
// least 16 queries (a decode step against a KV cache stays composed): there it is the
// faster path and never holds the O(T^2) scores (bench/attention_bench.cpp, one AVX2 thread,
// forward + backward, over several runs: 1.2-1.3x the composed path at ViT's T=50 d=16,
// 1.3-1.4x at T=64 d=32 causal, 2.1-2.8x at T=256-1024). Elsewhere (f64, other CPUs, fewer pairs
// than threads) Auto takes the composed path (oneDNN GEMMs + softmax). Fused forces the fused
// kernel, Composed the composed path. Explicit masks always take the composed path.
enum class AttentionPath { Auto, Fused, Composed };
void set_attention_path(AttentionPath path);
AttentionPath get_attention_path();

// ---- matmul precision
// ---------------------------------------------------------------------------- PyTorch's
// torch.set_float32_matmul_precision: "highest" computes f32 GEMMs and convolutions in full fp32;
// "high" rounds their f32 inputs to tf32 first (what NVIDIA tensor cores do in TF32 mode; on the
// CPU an exact emulation), accumulating in fp32. Other dtypes are unaffected.
enum class MatmulPrecision { Highest, High };
void set_matmul_precision(MatmulPrecision precision);
void set_matmul_precision(const std::string& precision);  // "highest" | "high"
MatmulPrecision get_matmul_precision();

// ---- threads and random numbers
// ------------------------------------------------------------------
void set_num_threads(int n);
int get_num_threads();
// The default generator behind dropout, the initial values of layers built without a seed,
// and other unseeded randomness (PyTorch's torch.manual_seed): one seed makes a run
// reproducible. Each draw takes the generator's next stream (seed, offset), so two draws differ.
void manual_seed(uint64_t seed);
// A fresh 64-bit seed from the default generator's next stream (advances it by one): what a
// layer built without an explicit seed initialises its tensors from.
uint64_t draw_seed();
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
GeneratorState generator_state();
void set_generator_state(const GeneratorState& state);

}  // namespace mantissa
