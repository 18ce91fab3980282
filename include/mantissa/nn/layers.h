// Layers: thin Modules over the public ops, with PyTorch's parameter names, shapes and default
// initialisation (the same distributions; the numbers come from Mantissa's seeded Philox
// generator, so a model is reproducible from its seed on every machine and thread count).
//
// Seeds: every layer with random initial values takes an optional seed; each of its tensors draws
// from init::derive_seed(seed, k) for its own k. A layer built without one takes a fresh seed
// from the default generator (mantissa::draw_seed), as PyTorch layers draw from the generator
// torch.manual_seed seeds: two layers get different values, and mantissa::manual_seed(s) before
// building a model makes it reproducible. Reference models give each layer
// derive_seed(model_seed, layer_index), so they depend on their config's seed alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/autocast/fp8.h"
#include "mantissa/nn/module.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn {

class KVCache;  // causal_lm.h

// ---- initialisation (in place, no graph; values drawn in the tensor's own dtype) --------------
namespace init {

enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, Sigmoid, Tanh, ReLU, LeakyReLU };

// While a NoInit lives (per thread), random initialisation is skipped: layers allocate their
// tensors without drawing values, and uniform_/normal_/kaiming_*/xavier_* do nothing. For models
// whose values come from a checkpoint anyway, and for sizing big models. Constant inits (norm
// weights 1, biases 0) still run.
class NoInit {
 public:
  NoInit();
  ~NoInit();
  NoInit(const NoInit&) = delete;
  NoInit& operator=(const NoInit&) = delete;

 private:
  bool prev_;
};
bool random_init_enabled();

// A well-mixed seed for the index-th tensor of something seeded with `seed` (splitmix64).
uint64_t derive_seed(uint64_t seed, uint64_t index);
// `seed` when given, else a fresh one from the default generator (mantissa::draw_seed).
uint64_t seed_or_draw(std::optional<uint64_t> seed);
// (fan_in, fan_out) of a weight: (out, in, k...) has fan_in = in * prod(k), fan_out = out * ...
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight);
// torch.nn.init.calculate_gain; `param` is LeakyReLU's negative slope.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

void uniform_(const Tensor& t, double low, double high, uint64_t seed);
void normal_(const Tensor& t, double mean, double stddev, uint64_t seed);
void constant_(const Tensor& t, double value);
void zeros_(const Tensor& t);
void ones_(const Tensor& t);
// U(-b, b) with b = gain * sqrt(3 / fan); a = sqrt(5) gives PyTorch's Linear/Conv default
// b = 1 / sqrt(fan_in).
void kaiming_uniform_(const Tensor& t, uint64_t seed, double a = 0.0, FanMode mode = FanMode::FanIn,
                      Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// N(0, gain / sqrt(fan)); torchvision's ResNets use FanOut with ReLU.
void kaiming_normal_(const Tensor& t, uint64_t seed, double a = 0.0, FanMode mode = FanMode::FanIn,
                     Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(const Tensor& t, uint64_t seed, double gain = 1.0);
void xavier_normal_(const Tensor& t, uint64_t seed, double gain = 1.0);

}  // namespace init

// ---- losses (the ops live with the tensor ops; here so that nn::cross_entropy reads as in
//      PyTorch) ---------------------------------------------------------------------------------
using ::mantissa::cross_entropy;
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Whether a layer has an additive bias (an enum, not a bool, per the style guide).
enum class Bias : bool { No = false, Yes = true };

// ---- affine layers -----------------------------------------------------------------------------

// y = x W^T + b over the last dim. weight (out, in) ~ U(+-1/sqrt(in)), bias ~ U(+-1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, std::optional<uint64_t> seed = {},
         Bias bias = Bias::Yes);
  // Over existing tensors (weight (out, in), bias (out) or undefined), e.g. GPT-2's output layer
  // tied to the token embedding: the same leaf registered in two modules.
  explicit Linear(const Tensor& weight, const Tensor& bias = Tensor());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }  // (out, in)
  Tensor& bias() { return *bias_; }      // (out), undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // With a state (amp::prepare_fp8), forward runs amp::fp8_linear inside an amp::Fp8Autocast
  // region; null turns fp8 off for this layer.
  void set_fp8_state(std::shared_ptr<amp::Fp8LinearState> state) { fp8_ = std::move(state); }
  const std::shared_ptr<amp::Fp8LinearState>& fp8_state() const { return fp8_; }

 private:
  int64_t in_, out_;
  std::shared_ptr<amp::Fp8LinearState> fp8_;
  Tensor none_;
  Tensor* weight_;
  Tensor* bias_ = &none_;
};

struct Conv2dConfig {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  Bias bias = Bias::Yes;
};

// NCHW convolution with a square kernel. weight (out, in/groups, k, k), same init as Linear with
// fan_in = in/groups * k * k.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
         const Conv2dConfig& config = {}, std::optional<uint64_t> seed = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }  // undefined without bias

 private:
  int64_t in_, out_, kernel_;
  Conv2dConfig config_;
  Tensor none_;
  Tensor* weight_;
  Tensor* bias_ = &none_;
};

struct ConvTranspose2dConfig {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  int64_t dilation = 1;
  Bias bias = Bias::Yes;
};

// torch.nn.ConvTranspose2d with a square kernel: weight (in, out/groups, k, k). PyTorch's init:
// kaiming_uniform_(a = sqrt(5)) with the fan of that weight shape, fan_in = out/groups * k * k
// (its dim 1, not the layer's input channels), so weight and bias are U(+-1/sqrt(fan_in)).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  const ConvTranspose2dConfig& config = {}, std::optional<uint64_t> seed = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }  // undefined without bias

 private:
  int64_t in_, out_, kernel_;
  ConvTranspose2dConfig config_;
  Tensor none_;
  Tensor* weight_;
  Tensor* bias_ = &none_;
};

// ---- normalisation -----------------------------------------------------------------------------

// Batch statistics in training (updating running_mean/var with `momentum` and counting
// num_batches_tracked, an I64 scalar), running statistics in eval. weight 1, bias 0.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }
  Tensor& running_mean() { return *running_mean_; }
  Tensor& running_var() { return *running_var_; }
  Tensor& num_batches_tracked() { return *num_batches_tracked_; }

 protected:
  BatchNorm(std::string type_name, int64_t num_features, double eps, double momentum,
            std::vector<int> input_dims);

 private:
  int64_t features_;
  double eps_, momentum_;
  std::vector<int> input_dims_;
  Tensor *weight_, *bias_, *running_mean_, *running_var_, *num_batches_tracked_;
};

// Input (N, C) or (N, C, L).
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
};

// Input (N, C, H, W).
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
};

// Normalises the trailing dims; weight 1, bias 0 of shape normalized_shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }

 private:
  std::vector<int64_t> shape_;
  double eps_;
  Tensor *weight_, *bias_;
};

// Whether a module is a batch norm (for to(dtype, include): Apex O2 keeps them in fp32).
bool is_batch_norm(const Module& m);

// ---- lookup, regularisation, pooling, activations ----------------------------------------------

// weight (num, dim) ~ N(0, 1); forward takes integer indices of any shape -> (..., dim).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<uint64_t> seed = {});
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }

 private:
  int64_t num_, dim_;
  Tensor* weight_;
};

// Zeroes elements with probability p (scaling the rest by 1/(1-p)) in training, drawing from the
// default generator (mantissa::manual_seed); the identity in eval or with p = 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
};

// stride 0 means stride = kernel_size.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  Pool2dOptions options_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  Pool2dOptions options_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t output_size) : AdaptiveAvgPool2d(output_size, output_size) {}
  AdaptiveAvgPool2d(int64_t output_h, int64_t output_w);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  std::vector<int64_t> size_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01)
      : Module("LeakyReLU"), negative_slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override { return leaky_relu(x, negative_slope_); }
  std::string extra_repr() const override;

 private:
  double negative_slope_;
};

class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::None)
      : Module("GELU"), approximate_(approximate) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate_); }
  std::string extra_repr() const override;

 private:
  GeluApproximation approximate_;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return silu(x); }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return tanh(x); }
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

// DCN's cross layer (Wang et al. 2017, v1): forward_list({x0, xl}) -> {x0 * (xl . w) + b + xl},
// x0 and xl (B, dim). weight (dim) ~ U(+-1/sqrt(dim)), bias (dim) zero. One rank-one feature
// crossing per layer: dim * 2 parameters, the product xl . w a (B, dim) x (dim, 1) GEMM.
class CrossLayer : public Module {
 public:
  explicit CrossLayer(int64_t dim, std::optional<uint64_t> seed = {});
  TensorList forward_list(const TensorList& inputs) override;
  std::string extra_repr() const override;
  Tensor& weight() { return *weight_; }  // (dim)
  Tensor& bias() { return *bias_; }      // (dim)

 private:
  int64_t dim_;
  Tensor* weight_;
  Tensor* bias_;
};

// Flattens dims start..end (default: everything but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_, end_); }
  std::string extra_repr() const override;

 private:
  int64_t start_, end_;
};

// ---- attention and transformer blocks ----------------------------------------------------------

struct AttentionConfig {
  bool causal = false;   // each position sees itself and the ones before it (GPT)
  double dropout = 0.0;  // on the output projection (the residual branch)
  Bias bias = Bias::Yes;
};

// Multi-head self-attention over batch-first x (B, T, C): one fused Linear qkv (C -> 3C, split
// as q | k | v, each head a contiguous D = C / heads slice), scaled_dot_product_attention per
// head, output Linear proj (C -> C), dropout.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t dim, int64_t num_heads, std::optional<uint64_t> seed = {},
                     const AttentionConfig& config = {});
  Tensor forward(const Tensor& x) override;
  // With a mask broadcastable to (B, heads, T, T): Bool (true = attend) or additive float.
  Tensor attend(const Tensor& x, const Tensor& mask);
  // Incremental decoding (inference, under NoGrad): x (B, T_new, C) are the positions that follow
  // the cache's length(). Their keys and values are written into `cache` at `layer` (the model
  // advances the cache once all its layers have run), and their queries attend to every cached
  // position and, causally, to the new ones: a whole prompt in one call gives the rows of
  // forward(prompt), and one token per call then costs O(length) instead of a full forward.
  Tensor attend_cached(const Tensor& x, KVCache& cache, int64_t layer);
  std::string extra_repr() const override;
  int64_t num_heads() const { return heads_; }
  int64_t head_dim() const { return dim_ / heads_; }

  std::shared_ptr<Linear> qkv;   // (3C, C)
  std::shared_ptr<Linear> proj;  // (C, C)

 private:
  int64_t dim_, heads_;
  AttentionConfig config_;
};

// fc1 (dim -> hidden), GELU, fc2 (hidden -> dim), dropout.
class Mlp : public Module {
 public:
  Mlp(int64_t dim, int64_t hidden, std::optional<uint64_t> seed = {},
      GeluApproximation approximate = GeluApproximation::None, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<GELU> act;
  std::shared_ptr<Dropout> drop;
};

struct TransformerConfig {
  double mlp_ratio = 4.0;
  double dropout = 0.0;
  bool causal = false;
  GeluApproximation gelu = GeluApproximation::None;  // GPT-2: Tanh
  double eps = 1e-5;                                 // of both LayerNorms (timm ViT: 1e-6)
};

// Pre-LN block (GPT-2 / ViT): x + attn(norm1(x)), then x + mlp(norm2(x)). Names follow timm:
// norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t dim, int64_t num_heads, std::optional<uint64_t> seed = {},
                   const TransformerConfig& config = {});
  Tensor forward(const Tensor& x) override;
  // The same block over the positions that follow `cache` (MultiheadAttention::attend_cached).
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer);
  // PerBlock: forward keeps only x and recomputes the block in backward. The recomputation
  // reads the parameters at backward time, so they must not be swapped in between (as
  // functional_call does) or updated before backward.
  void set_activation_checkpointing(ActivationCheckpointing mode) { checkpointing_ = mode; }
  ActivationCheckpointing activation_checkpointing() const { return checkpointing_; }

  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<MultiheadAttention> attn;
  std::shared_ptr<Mlp> mlp;

 private:
  ActivationCheckpointing checkpointing_ = ActivationCheckpointing::Off;
};

// ---- recurrent
// -----------------------------------------------------------------------------------

struct LSTMState {
  Tensor h;  // (B, H)
  Tensor c;  // (B, H)
};

// One LSTM step with torch.nn.LSTMCell's parameters and gate order (i, f, g, o):
// gates = x W_ih^T + b_ih + h W_hh^T + b_hh; c' = f*c + i*g; h' = o*tanh(c'). All weights and
// biases ~ U(+-1/sqrt(hidden)).
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, std::optional<uint64_t> seed = {});
  // x (B, in); an undefined state starts from zeros.
  LSTMState step(const Tensor& x, const LSTMState& state = {});
  Tensor forward(const Tensor& x) override { return step(x).h; }
  // {x} or {x, h, c} -> {h', c'}, as torch.nn.LSTMCell's (h, c) = cell(x, (h, c)).
  TensorList forward_list(const TensorList& inputs) override;
  std::string extra_repr() const override;
  int64_t hidden_size() const { return hidden_; }
  Tensor& weight_ih() { return *w_ih_; }  // (4H, in)
  Tensor& weight_hh() { return *w_hh_; }  // (4H, H)
  Tensor& bias_ih() { return *b_ih_; }    // (4H)
  Tensor& bias_hh() { return *b_hh_; }    // (4H)

 private:
  int64_t input_, hidden_;
  Tensor *w_ih_, *w_hh_, *b_ih_, *b_hh_;
};

// Stacked LSTM over batch-first x (B, T, in); parameters named as torch.nn.LSTM's (weight_ih_l0,
// weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._l1, ...). Each layer runs time-major: the input
// projection of all steps is one GEMM (with both biases, added once), the recurrence one
// lstm_sequence op (one autograd node for all T steps). Dropout between layers in training.
class LSTM : public Module {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1,
       std::optional<uint64_t> seed = {}, double dropout = 0.0);
  // (B, T, H): the last layer's hidden state at every step.
  Tensor forward(const Tensor& x) override;
  // As torch.nn.LSTM's y, (h_n, c_n) = lstm(x, (h0, c0)): {x} or {x, h0, c0} with h0 and c0
  // (layers, B, H) -> {y (B, T, H), h_n (layers, B, H), c_n (layers, B, H)}.
  TensorList forward_list(const TensorList& inputs) override;
  // The same, from given initial states (one per layer, or empty for zeros); `final` receives
  // each layer's last state when not null.
  Tensor run(const Tensor& x, const std::vector<LSTMState>& initial,
             std::vector<LSTMState>* final = nullptr);
  std::string extra_repr() const override;
  int64_t hidden_size() const { return hidden_; }
  int64_t num_layers() const { return layers_; }
  // PerBlock: each layer is checkpointed on its own (its input sequence and initial state are
  // kept, its T steps recomputed in backward); the same caveats as TransformerBlock's.
  void set_activation_checkpointing(ActivationCheckpointing mode) { checkpointing_ = mode; }
  ActivationCheckpointing activation_checkpointing() const { return checkpointing_; }

 private:
  // One layer over the whole sequence, time-major: {seq (T, B, in), h0, c0 (B, H) or
  // undefined} -> {y (T, B, H), h_n, c_n}.
  TensorList run_layer(int64_t layer, const TensorList& inputs);

  int64_t input_, hidden_, layers_;
  double dropout_;
  ActivationCheckpointing checkpointing_ = ActivationCheckpointing::Off;
  std::vector<std::vector<Tensor*>> weights_;  // per layer: w_ih, w_hh, b_ih, b_hh
};

// Sets the mode on every TransformerBlock and LSTM in `model` (ViT, GPT, the LSTM models);
// returns how many it set (0: the model has no block to checkpoint).
int64_t set_activation_checkpointing(Module& model, ActivationCheckpointing mode);

}  // namespace mantissa::nn
