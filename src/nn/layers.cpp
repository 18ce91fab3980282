#include "mantissa/nn/layers.h"

#include <cmath>
#include <sstream>

#include "mantissa/autograd/checkpoint.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/causal_lm.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::nn {

namespace {

std::string shape_list(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << v[i];
  os << (v.size() == 1 ? ",)" : ")");
  return os.str();
}

// Fresh tensors with their initial values drawn (no copy), or only allocated under NoInit.
Tensor draw_uniform(const Shape& shape, double low, double high, uint64_t seed) {
  return init::random_init_enabled() ? Tensor::uniform(shape, low, high, seed)
                                     : Tensor::empty(shape);
}

Tensor draw_normal(const Shape& shape, double mean, double stddev, uint64_t seed) {
  return init::random_init_enabled() ? Tensor::normal(shape, mean, stddev, seed)
                                     : Tensor::empty(shape);
}

}  // namespace

// ---- init --------------------------------------------------------------------------------------

namespace init {

namespace {
thread_local bool g_random_init = true;
}  // namespace

NoInit::NoInit() : prev_(g_random_init) {
  g_random_init = false;
}
NoInit::~NoInit() {
  g_random_init = prev_;
}
bool random_init_enabled() {
  return g_random_init;
}

uint64_t derive_seed(uint64_t seed, uint64_t index) {
  return mix_seed(seed, index);
}

uint64_t seed_or_draw(std::optional<uint64_t> seed) {
  return seed ? *seed : draw_seed();
}

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight) {
  MT_CHECK(weight.defined() && weight.dim() >= 2,
           "fan_in_and_fan_out: needs a weight with at least 2 dims (out, in, ...), got a ",
           weight.describe());
  int64_t receptive = 1;
  for (int d = 2; d < weight.dim(); ++d)
    receptive *= weight.size(d);
  return {weight.size(1) * receptive, weight.size(0) * receptive};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

namespace {

void fill_from(const Tensor& t, const Tensor& values) {
  MT_CHECK(t.defined(), "nn::init: the tensor is undefined");
  NoGrad ng;
  Tensor dst = t;
  dst.copy_(values);
}

double fan_of(const Tensor& t, FanMode mode) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const int64_t fan = mode == FanMode::FanIn ? fan_in : fan_out;
  MT_CHECK(fan > 0, "nn::init: a zero fan for a ", t.describe());
  return double(fan);
}

}  // namespace

void uniform_(const Tensor& t, double low, double high, uint64_t seed) {
  MT_CHECK(t.defined() && t.is_floating_point(), "nn::init::uniform_ needs a floating tensor");
  if (!g_random_init) return;
  fill_from(t, Tensor::uniform(t.shape(), low, high, seed, t.dtype(), t.device()));
}

void normal_(const Tensor& t, double mean, double stddev, uint64_t seed) {
  MT_CHECK(t.defined() && t.is_floating_point(), "nn::init::normal_ needs a floating tensor");
  if (!g_random_init) return;
  fill_from(t, Tensor::normal(t.shape(), mean, stddev, seed, t.dtype(), t.device()));
}

void constant_(const Tensor& t, double value) {
  MT_CHECK(t.defined(), "nn::init::constant_: the tensor is undefined");
  NoGrad ng;
  Tensor dst = t;
  dst.fill_(value);
}

void zeros_(const Tensor& t) {
  constant_(t, 0.0);
}

void ones_(const Tensor& t) {
  constant_(t, 1.0);
}

void kaiming_uniform_(const Tensor& t, uint64_t seed, double a, FanMode mode,
                      Nonlinearity nonlinearity) {
  const double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / fan_of(t, mode));
  uniform_(t, -bound, bound, seed);
}

void kaiming_normal_(const Tensor& t, uint64_t seed, double a, FanMode mode,
                     Nonlinearity nonlinearity) {
  normal_(t, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan_of(t, mode)), seed);
}

void xavier_uniform_(const Tensor& t, uint64_t seed, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / double(fan_in + fan_out));
  uniform_(t, -bound, bound, seed);
}

void xavier_normal_(const Tensor& t, uint64_t seed, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / double(fan_in + fan_out)), seed);
}

}  // namespace init

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  MT_CHECK(input.shape() == target.shape(), "mse_loss: input ", input.describe(), " and target ",
           target.describe(), " must have the same shape");
  const Tensor sq = square(sub(input, target));
  switch (reduction) {
    case Reduction::Mean:
      return mean(sq);
    case Reduction::Sum:
      return sum(sq);
    case Reduction::None:
      return sq;
  }
  return sq;
}

// ---- Linear, Conv2d ----------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, std::optional<uint64_t> seed_arg,
               Bias bias)
    : Module("Linear"), in_(in_features), out_(out_features) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(in_features > 0 && out_features > 0,
           "Linear: features must be positive, got in=", in_features, ", out=", out_features);
  // kaiming_uniform_(a = sqrt(5)) is U(+-1/sqrt(fan_in)), the bias's bound too.
  const double bound = 1.0 / std::sqrt(double(in_features));
  weight_ = &register_parameter("weight", draw_uniform({out_features, in_features}, -bound, bound,
                                                       init::derive_seed(seed, 0)));
  if (bias == Bias::Yes) {
    bias_ = &register_parameter(
        "bias", draw_uniform({out_features}, -bound, bound, init::derive_seed(seed, 1)));
  }
}

Linear::Linear(const Tensor& weight, const Tensor& bias) : Module("Linear"), in_(0), out_(0) {
  MT_CHECK(weight.defined() && weight.dim() == 2 && weight.is_floating_point(),
           "Linear: the weight must be a floating (out, in) tensor, got a ", weight.describe());
  out_ = weight.size(0);
  in_ = weight.size(1);
  weight_ = &register_parameter("weight", weight);
  if (bias.defined()) {
    MT_CHECK(bias.dim() == 1 && bias.size(0) == out_, "Linear: the bias must be (", out_,
             "), got a ", bias.describe());
    bias_ = &register_parameter("bias", bias);
  }
}

Tensor Linear::forward(const Tensor& x) {
  MT_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear(", in_, " -> ", out_,
           "): the input's last dim must be ", in_, ", got a ", x.describe());
  if (fp8_) {
    if (amp::Fp8Context* f8 = amp::fp8_context())
      return amp::fp8_linear(x, *weight_, *bias_, *fp8_, f8->options());
  }
  return linear(x, *weight_, *bias_);
}

std::string Linear::extra_repr() const {
  return "in=" + std::to_string(in_) + ", out=" + std::to_string(out_) +
         (bias_->defined() ? "" : ", bias=false") + (fp8_ ? ", fp8" : "");
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
               const Conv2dConfig& config, std::optional<uint64_t> seed_arg)
    : Module("Conv2d"),
      in_(in_channels),
      out_(out_channels),
      kernel_(kernel_size),
      config_(config) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0,
           "Conv2d: channels and kernel_size must be positive, got in=", in_channels,
           ", out=", out_channels, ", kernel_size=", kernel_size);
  MT_CHECK(
      config.groups > 0 && in_channels % config.groups == 0 && out_channels % config.groups == 0,
      "Conv2d: groups=", config.groups, " must divide in=", in_channels, " and out=", out_channels);
  const int64_t fan_in = in_channels / config.groups * kernel_size * kernel_size;
  const double bound = 1.0 / std::sqrt(double(fan_in));
  weight_ = &register_parameter(
      "weight", draw_uniform({out_channels, in_channels / config.groups, kernel_size, kernel_size},
                             -bound, bound, init::derive_seed(seed, 0)));
  if (config.bias == Bias::Yes) {
    bias_ = &register_parameter(
        "bias", draw_uniform({out_channels}, -bound, bound, init::derive_seed(seed, 1)));
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  Conv2dOptions o;
  o.stride = {config_.stride, config_.stride};
  o.padding = {config_.padding, config_.padding};
  o.dilation = {config_.dilation, config_.dilation};
  o.groups = config_.groups;
  return conv2d(x, *weight_, *bias_, o);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_) + ", " + std::to_string(out_) +
                  ", kernel_size=" + std::to_string(kernel_);
  if (config_.stride != 1) s += ", stride=" + std::to_string(config_.stride);
  if (config_.padding != 0) s += ", padding=" + std::to_string(config_.padding);
  if (config_.dilation != 1) s += ", dilation=" + std::to_string(config_.dilation);
  if (config_.groups != 1) s += ", groups=" + std::to_string(config_.groups);
  if (config_.bias == Bias::No) s += ", bias=false";
  return s;
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                                 const ConvTranspose2dConfig& config,
                                 std::optional<uint64_t> seed_arg)
    : Module("ConvTranspose2d"),
      in_(in_channels),
      out_(out_channels),
      kernel_(kernel_size),
      config_(config) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0,
           "ConvTranspose2d: channels and kernel_size must be positive, got in=", in_channels,
           ", out=", out_channels, ", kernel_size=", kernel_size);
  MT_CHECK(
      config.groups > 0 && in_channels % config.groups == 0 && out_channels % config.groups == 0,
      "ConvTranspose2d: groups=", config.groups, " must divide in=", in_channels,
      " and out=", out_channels);
  // PyTorch's fan of the (in, out/groups, k, k) weight: its dim 1 times the kernel.
  const int64_t fan_in = out_channels / config.groups * kernel_size * kernel_size;
  const double bound = 1.0 / std::sqrt(double(fan_in));
  weight_ = &register_parameter(
      "weight", draw_uniform({in_channels, out_channels / config.groups, kernel_size, kernel_size},
                             -bound, bound, init::derive_seed(seed, 0)));
  if (config.bias == Bias::Yes) {
    bias_ = &register_parameter(
        "bias", draw_uniform({out_channels}, -bound, bound, init::derive_seed(seed, 1)));
  }
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  ConvTranspose2dOptions o;
  o.stride = {config_.stride, config_.stride};
  o.padding = {config_.padding, config_.padding};
  o.output_padding = {config_.output_padding, config_.output_padding};
  o.dilation = {config_.dilation, config_.dilation};
  o.groups = config_.groups;
  return conv_transpose2d(x, *weight_, *bias_, o);
}

std::string ConvTranspose2d::extra_repr() const {
  std::string s = std::to_string(in_) + ", " + std::to_string(out_) +
                  ", kernel_size=" + std::to_string(kernel_);
  if (config_.stride != 1) s += ", stride=" + std::to_string(config_.stride);
  if (config_.padding != 0) s += ", padding=" + std::to_string(config_.padding);
  if (config_.output_padding != 0)
    s += ", output_padding=" + std::to_string(config_.output_padding);
  if (config_.dilation != 1) s += ", dilation=" + std::to_string(config_.dilation);
  if (config_.groups != 1) s += ", groups=" + std::to_string(config_.groups);
  if (config_.bias == Bias::No) s += ", bias=false";
  return s;
}

// ---- normalisation -----------------------------------------------------------------------------

BatchNorm::BatchNorm(std::string type_name, int64_t num_features, double eps, double momentum,
                     std::vector<int> input_dims)
    : Module(std::move(type_name)),
      features_(num_features),
      eps_(eps),
      momentum_(momentum),
      input_dims_(std::move(input_dims)) {
  MT_CHECK(num_features > 0, name(), ": num_features must be positive, got ", num_features);
  MT_CHECK(momentum >= 0 && momentum <= 1, name(), ": momentum must be in [0, 1], got ", momentum);
  weight_ = &register_parameter("weight", Tensor::ones({num_features}));
  bias_ = &register_parameter("bias", Tensor::zeros({num_features}));
  running_mean_ = &register_buffer("running_mean", Tensor::zeros({num_features}));
  running_var_ = &register_buffer("running_var", Tensor::ones({num_features}));
  num_batches_tracked_ = &register_buffer("num_batches_tracked", Tensor::zeros({}, DType::I64));
}

Tensor BatchNorm::forward(const Tensor& x) {
  bool dims_ok = false;
  std::string expected;
  for (int d : input_dims_) {
    dims_ok = dims_ok || x.dim() == d;
    expected += (expected.empty() ? "" : " or ") + std::to_string(d) + "-D";
  }
  MT_CHECK(dims_ok, name(), "(", features_, "): expected a ", expected,
           " input (N, C, ...), got a ", x.describe());
  if (is_training()) {
    NoGrad ng;
    num_batches_tracked_->add_(Tensor::ones({}, DType::I64, num_batches_tracked_->device()));
  }
  return batch_norm(x, *weight_, *bias_, *running_mean_, *running_var_, is_training(), momentum_,
                    eps_);
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << features_ << ", eps=" << eps_ << ", momentum=" << momentum_;
  return os.str();
}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, double momentum)
    : BatchNorm("BatchNorm1d", num_features, eps, momentum, {2, 3}) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum)
    : BatchNorm("BatchNorm2d", num_features, eps, momentum, {4}) {}

bool is_batch_norm(const Module& m) {
  return dynamic_cast<const BatchNorm*>(&m) != nullptr;
}

LayerNorm::LayerNorm(int64_t dim, double eps) : LayerNorm(std::vector<int64_t>{dim}, eps) {}

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps)
    : Module("LayerNorm"), shape_(std::move(normalized_shape)), eps_(eps) {
  MT_CHECK(!shape_.empty(), "LayerNorm: normalized_shape is empty");
  for (int64_t d : shape_)
    MT_CHECK(d > 0, "LayerNorm: normalized_shape ", shape_list(shape_), " must be positive");
  weight_ = &register_parameter("weight", Tensor::ones(Shape(shape_)));
  bias_ = &register_parameter("bias", Tensor::zeros(Shape(shape_)));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, shape_, *weight_, *bias_, eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_list(shape_) << ", eps=" << eps_;
  return os.str();
}

// ---- Embedding, Dropout, pooling, activations --------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                     std::optional<uint64_t> seed_arg)
    : Module("Embedding"), num_(num_embeddings), dim_(embedding_dim) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(num_embeddings > 0 && embedding_dim > 0,
           "Embedding: sizes must be positive, got num_embeddings=", num_embeddings,
           ", embedding_dim=", embedding_dim);
  weight_ = &register_parameter(
      "weight", draw_normal({num_embeddings, embedding_dim}, 0.0, 1.0, init::derive_seed(seed, 0)));
}

Tensor Embedding::forward(const Tensor& indices) {
  MT_CHECK(!indices.is_floating_point(), "Embedding(", num_, ", ", dim_,
           "): expects integer indices, got a ", indices.describe());
  return embedding(*weight_, indices);
}

std::string Embedding::extra_repr() const {
  return std::to_string(num_) + ", " + std::to_string(dim_);
}

Dropout::Dropout(double p) : Module("Dropout"), p_(p) {
  MT_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (p_ == 0.0 || !is_training()) return x;
  return dropout(x, p_, true);
}

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p_;
  return os.str();
}

namespace {

Pool2dOptions pool_options(int64_t kernel, int64_t stride, int64_t padding) {
  Pool2dOptions o;
  o.kernel_size = {kernel, kernel};
  o.stride = {stride == 0 ? kernel : stride, stride == 0 ? kernel : stride};
  o.padding = {padding, padding};
  return o;
}

std::string pool_repr(const Pool2dOptions& o) {
  return "kernel_size=" + std::to_string(o.kernel_size[0]) +
         ", stride=" + std::to_string(o.stride[0]) +
         (o.padding[0] ? ", padding=" + std::to_string(o.padding[0]) : "");
}

}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : Module("MaxPool2d"), options_(pool_options(kernel_size, stride, padding)) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, options_);
}

std::string MaxPool2d::extra_repr() const {
  return pool_repr(options_);
}

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : Module("AvgPool2d"), options_(pool_options(kernel_size, stride, padding)) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, options_);
}

std::string AvgPool2d::extra_repr() const {
  return pool_repr(options_);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t output_h, int64_t output_w)
    : Module("AdaptiveAvgPool2d"), size_{output_h, output_w} {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return adaptive_avg_pool2d(x, size_);
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + shape_list(size_);
}

std::string LeakyReLU::extra_repr() const {
  std::ostringstream s;
  s << "negative_slope=" << negative_slope_;
  return s.str();
}

std::string GELU::extra_repr() const {
  return approximate_ == GeluApproximation::Tanh ? "approximate=tanh" : "";
}

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_) + ", end_dim=" + std::to_string(end_);
}

// ---- attention and transformer blocks ----------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t dim, int64_t num_heads,
                                       std::optional<uint64_t> seed_arg,
                                       const AttentionConfig& config)
    : Module("MultiheadAttention"), dim_(dim), heads_(num_heads), config_(config) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(dim > 0 && num_heads > 0 && dim % num_heads == 0, "MultiheadAttention: dim=", dim,
           " must be a positive multiple of num_heads=", num_heads);
  qkv = register_module(
      "qkv", std::make_shared<Linear>(dim, 3 * dim, init::derive_seed(seed, 0), config.bias));
  proj = register_module(
      "proj", std::make_shared<Linear>(dim, dim, init::derive_seed(seed, 1), config.bias));
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  return attend(x, Tensor());
}

Tensor MultiheadAttention::attend(const Tensor& x, const Tensor& mask) {
  MT_CHECK(x.dim() == 3 && x.size(2) == dim_, "MultiheadAttention(dim=", dim_,
           "): expected a batch-first input (B, T, ", dim_, "), got a ", x.describe());
  const int64_t b = x.size(0), t = x.size(1), d = dim_ / heads_;
  // (B, T, 3C) -> (3, B, heads, T, D) -> q, k, v. unbind, not three selects: one node, whose
  // backward writes the three gradients into one tensor laid out as the projection's output. Each
  // select's backward would write its part into a zero tensor of the full size, then add them.
  const std::vector<Tensor> qkv_heads =
      unbind((*qkv)(x).reshape({b, t, 3, heads_, d}).permute({2, 0, 3, 1, 4}), 0);
  const Tensor y =
      scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], mask, config_.causal);
  // (B, heads, T, D) -> (B, T, C)
  Tensor out = (*proj)(y.transpose(1, 2).reshape({b, t, dim_}));
  if (config_.dropout > 0.0 && is_training()) out = dropout(out, config_.dropout, true);
  return out;
}

Tensor MultiheadAttention::attend_cached(const Tensor& x, KVCache& cache, int64_t layer) {
  MT_CHECK(!autograd::grad_enabled(), "MultiheadAttention::attend_cached is for inference: no ",
           "gradient flows through the cache, so run it under NoGrad");
  MT_CHECK(x.dim() == 3 && x.size(2) == dim_, "MultiheadAttention(dim=", dim_,
           "): expected a batch-first input (B, T_new, ", dim_, "), got a ", x.describe());
  const int64_t b = x.size(0), t = x.size(1), d = dim_ / heads_;
  MT_CHECK(cache.heads() == heads_ && cache.head_dim() == d, "MultiheadAttention(heads=", heads_,
           ", head_dim=", d, "): a KVCache of ", cache.heads(), " heads of ", cache.head_dim());
  const int64_t past = cache.length();
  // (B, T_new, 3C) -> (3, B, heads, T_new, D), as in attend.
  const Tensor qkv_heads = (*qkv)(x).reshape({b, t, 3, heads_, d}).permute({2, 0, 3, 1, 4});
  const auto [k, v] = cache.append(layer, qkv_heads.select(0, 1), qkv_heads.select(0, 2));
  Tensor mask;  // (T_new, past + T_new) Bool
  bool causal = false;
  if (t > 1 && past == 0) {
    causal = config_.causal;  // a prompt: exactly forward's attention
  } else if (t > 1 && config_.causal) {
    // New query i is position past + i: it sees keys 0 .. past + i (bottom-right aligned; the
    // op's causal flag aligns top-left, which is right only without a past).
    const Tensor cols = Tensor::arange(past + t, DType::I64, x.device());
    mask = le(cols.reshape({1, past + t}), cols.narrow(0, past, t).reshape({t, 1}));
  }
  const Tensor y =
      scaled_dot_product_attention(qkv_heads.select(0, 0).to(k.dtype()), k, v, mask, causal);
  // (B, heads, T_new, D) -> (B, T_new, C)
  Tensor out = (*proj)(y.transpose(1, 2).reshape({b, t, dim_}));
  if (config_.dropout > 0.0 && is_training()) out = dropout(out, config_.dropout, true);
  return out;
}

std::string MultiheadAttention::extra_repr() const {
  std::ostringstream os;
  os << "dim=" << dim_ << ", heads=" << heads_ << (config_.causal ? ", causal" : "");
  if (config_.dropout > 0) os << ", dropout=" << config_.dropout;
  return os.str();
}

Mlp::Mlp(int64_t dim, int64_t hidden, std::optional<uint64_t> seed_arg,
         GeluApproximation approximate, double dropout_p)
    : Module("Mlp") {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, init::derive_seed(seed, 0)));
  act = register_module("act", std::make_shared<GELU>(approximate));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, dim, init::derive_seed(seed, 1)));
  drop = register_module("drop", std::make_shared<Dropout>(dropout_p));
}

Tensor Mlp::forward(const Tensor& x) {
  return (*drop)((*fc2)((*act)((*fc1)(x))));
}

TransformerBlock::TransformerBlock(int64_t dim, int64_t num_heads, std::optional<uint64_t> seed_arg,
                                   const TransformerConfig& config)
    : Module("TransformerBlock") {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(config.mlp_ratio > 0, "TransformerBlock: mlp_ratio must be positive, got ",
           config.mlp_ratio);
  AttentionConfig ac;
  ac.causal = config.causal;
  ac.dropout = config.dropout;
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(dim, config.eps));
  attn = register_module(
      "attn", std::make_shared<MultiheadAttention>(dim, num_heads, init::derive_seed(seed, 0), ac));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(dim, config.eps));
  const auto hidden = int64_t(std::llround(double(dim) * config.mlp_ratio));
  mlp = register_module("mlp", std::make_shared<Mlp>(dim, hidden, init::derive_seed(seed, 1),
                                                     config.gelu, config.dropout));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  // The segment holds the sublayers themselves (not this block), so the graph keeps them alive.
  auto segment = [norm1 = norm1, attn = attn, norm2 = norm2, mlp = mlp](const Tensor& in) {
    const Tensor h = add(in, (*attn)((*norm1)(in)));
    return add(h, (*mlp)((*norm2)(h)));
  };
  if (checkpointing_ == ActivationCheckpointing::PerBlock) return autograd::checkpoint(segment, x);
  return segment(x);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer) {
  const Tensor h = add(x, attn->attend_cached((*norm1)(x), cache, layer));
  return add(h, (*mlp)((*norm2)(h)));
}

// ---- recurrent ---------------------------------------------------------------------------------

namespace {

// gates (B, 4H) in torch's order i, f, g, o: the step's pointwise math in one kernel.
LSTMState lstm_gates(const Tensor& gates, const Tensor& c) {
  const std::vector<Tensor> hc = lstm_pointwise(gates, c);
  return {hc[0], hc[1]};
}

Tensor& lstm_param(Module& m, const std::string& name, const Shape& shape, double bound,
                   uint64_t seed) {
  return m.register_parameter(name, draw_uniform(shape, -bound, bound, seed));
}

}  // namespace

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, std::optional<uint64_t> seed_arg)
    : Module("LSTMCell"), input_(input_size), hidden_(hidden_size) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(input_size > 0 && hidden_size > 0,
           "LSTMCell: sizes must be positive, got input=", input_size, ", hidden=", hidden_size);
  const double k = 1.0 / std::sqrt(double(hidden_size));
  w_ih_ =
      &lstm_param(*this, "weight_ih", {4 * hidden_size, input_size}, k, init::derive_seed(seed, 0));
  w_hh_ = &lstm_param(*this, "weight_hh", {4 * hidden_size, hidden_size}, k,
                      init::derive_seed(seed, 1));
  b_ih_ = &lstm_param(*this, "bias_ih", {4 * hidden_size}, k, init::derive_seed(seed, 2));
  b_hh_ = &lstm_param(*this, "bias_hh", {4 * hidden_size}, k, init::derive_seed(seed, 3));
}

TensorList LSTMCell::forward_list(const TensorList& inputs) {
  MT_CHECK(inputs.size() == 1 || inputs.size() == 3, "LSTMCell takes {x} or {x, h, c}, got ",
           inputs.size(), " tensors");
  const LSTMState next =
      inputs.size() == 3 ? step(inputs[0], {inputs[1], inputs[2]}) : step(inputs[0]);
  return {next.h, next.c};
}

LSTMState LSTMCell::step(const Tensor& x, const LSTMState& state) {
  MT_CHECK(x.dim() == 2 && x.size(1) == input_, "LSTMCell(", input_, ", ", hidden_,
           "): expected an input (B, ", input_, "), got a ", x.describe());
  Tensor gates = linear(x, *w_ih_, *b_ih_);
  if (state.h.defined()) {
    MT_CHECK(state.h.dim() == 2 && state.h.size(0) == x.size(0) && state.h.size(1) == hidden_,
             "LSTMCell: the hidden state must be (B, ", hidden_, "), got a ", state.h.describe());
    gates = add(gates, linear(state.h, *w_hh_, *b_hh_));
  } else {
    gates = add(gates, *b_hh_);
  }
  return lstm_gates(gates, state.c);
}

std::string LSTMCell::extra_repr() const {
  return std::to_string(input_) + ", " + std::to_string(hidden_);
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers,
           std::optional<uint64_t> seed_arg, double dropout_p)
    : Module("LSTM"),
      input_(input_size),
      hidden_(hidden_size),
      layers_(num_layers),
      dropout_(dropout_p) {
  const uint64_t seed = init::seed_or_draw(seed_arg);
  MT_CHECK(input_size > 0 && hidden_size > 0 && num_layers > 0,
           "LSTM: sizes must be positive, got input=", input_size, ", hidden=", hidden_size,
           ", layers=", num_layers);
  MT_CHECK(dropout_p >= 0 && dropout_p < 1, "LSTM: dropout must be in [0, 1), got ", dropout_p);
  const double k = 1.0 / std::sqrt(double(hidden_size));
  for (int64_t l = 0; l < num_layers; ++l) {
    const std::string sfx = "_l" + std::to_string(l);
    const int64_t in = l == 0 ? input_size : hidden_size;
    const uint64_t s = init::derive_seed(seed, uint64_t(l));
    weights_.push_back({
        &lstm_param(*this, "weight_ih" + sfx, {4 * hidden_size, in}, k, init::derive_seed(s, 0)),
        &lstm_param(*this, "weight_hh" + sfx, {4 * hidden_size, hidden_size}, k,
                    init::derive_seed(s, 1)),
        &lstm_param(*this, "bias_ih" + sfx, {4 * hidden_size}, k, init::derive_seed(s, 2)),
        &lstm_param(*this, "bias_hh" + sfx, {4 * hidden_size}, k, init::derive_seed(s, 3)),
    });
  }
}

Tensor LSTM::forward(const Tensor& x) {
  return run(x, {});
}

TensorList LSTM::forward_list(const TensorList& inputs) {
  MT_CHECK(inputs.size() == 1 || inputs.size() == 3, "LSTM takes {x} or {x, h0, c0}, got ",
           inputs.size(), " tensors");
  std::vector<LSTMState> initial;
  if (inputs.size() == 3) {
    const Tensor &h0 = inputs[1], &c0 = inputs[2];
    for (const Tensor* s : {&h0, &c0}) {
      MT_CHECK(s->dim() == 3 && s->size(0) == layers_ && s->size(2) == hidden_, "LSTM(", input_,
               ", ", hidden_, ", layers=", layers_, "): h0 and c0 are (", layers_, ", B, ", hidden_,
               "), got a ", s->describe());
    }
    for (int64_t l = 0; l < layers_; ++l)
      initial.push_back({h0.select(0, l), c0.select(0, l)});
  }
  std::vector<LSTMState> final;
  const Tensor y = run(inputs[0], initial, &final);
  std::vector<Tensor> h, c;
  for (const LSTMState& st : final) {
    h.push_back(st.h);
    c.push_back(st.c);
  }
  return {y, stack(h, 0), stack(c, 0)};
}

Tensor LSTM::run(const Tensor& x, const std::vector<LSTMState>& initial,
                 std::vector<LSTMState>* final) {
  MT_CHECK(x.dim() == 3 && x.size(2) == input_, "LSTM(", input_, ", ", hidden_,
           "): expected a batch-first input (B, T, ", input_, "), got a ", x.describe());
  MT_CHECK(initial.empty() || int64_t(initial.size()) == layers_, "LSTM: ", initial.size(),
           " initial states for ", layers_, " layers (give one per layer, or none)");
  MT_CHECK(x.size(1) > 0, "LSTM: the input has no time steps: ", x.describe());
  if (final) final->clear();
  // The layers run time-major, (T, B, features), so that every step's slice is one contiguous
  // block for the recurrence's GEMMs: one transpose in, one out.
  Tensor seq = x.transpose(0, 1).contiguous();
  for (int64_t l = 0; l < layers_; ++l) {
    const LSTMState state = initial.empty() ? LSTMState{} : initial[size_t(l)];
    const TensorList inputs{seq, state.h, state.c};
    TensorList out;
    if (checkpointing_ == ActivationCheckpointing::PerBlock) {
      // The recomputation in backward reads the weights through this module, which the model
      // keeps alive as long as its graph.
      out = autograd::checkpoint(
          [this, l](const std::vector<Tensor>& in) { return run_layer(l, in); }, inputs);
    } else {
      out = run_layer(l, inputs);
    }
    if (final) final->push_back({out[1], out[2]});
    seq = out[0];
  }
  return seq.transpose(0, 1).contiguous();
}

TensorList LSTM::run_layer(int64_t layer, const TensorList& inputs) {
  const std::vector<Tensor*>& w = weights_[size_t(layer)];
  Tensor seq = inputs[0];  // (T, B, in)
  if (layer > 0 && dropout_ > 0.0 && is_training()) seq = dropout(seq, dropout_, true);
  // The input projection of every step at once, (T, B, 4H), with both biases: b_ih + b_hh is
  // added once here rather than b_hh in every step's recurrent GEMM, so backward takes both
  // biases' gradient in the projection's one column sum instead of one sum per step.
  const Tensor projected = linear(seq, *w[0], add(*w[2], *w[3]));
  return lstm_sequence(projected, *w[1], inputs[1], inputs[2]);  // (T, B, H), (B, H), (B, H)
}

std::string LSTM::extra_repr() const {
  std::ostringstream os;
  os << input_ << ", " << hidden_ << ", num_layers=" << layers_;
  if (dropout_ > 0) os << ", dropout=" << dropout_;
  return os.str();
}

int64_t set_activation_checkpointing(Module& model, ActivationCheckpointing mode) {
  int64_t n = 0;
  for (const auto& [path, m] : model.named_modules()) {
    if (auto* block = dynamic_cast<TransformerBlock*>(m)) {
      block->set_activation_checkpointing(mode);
      ++n;
    } else if (auto* lstm = dynamic_cast<LSTM*>(m)) {
      lstm->set_activation_checkpointing(mode);
      ++n;
    }
  }
  return n;
}

}  // namespace mantissa::nn
