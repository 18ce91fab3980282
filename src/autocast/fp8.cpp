// FP8 training's op layer (mantissa/autocast/fp8.h): the recipes' scalings, the quantize/GEMM
// emulation on the backends' kernels (fp8_quantize, a bf16 matmul with fp32 output), the
// differentiable fp8_linear, the delayed-scaling state and the thread's fp8 region.
#include "mantissa/autocast/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/format.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

namespace {

thread_local Fp8Context* t_context = nullptr;

constexpr std::string_view kRecipeNames[] = {"delayed", "current", "mxfp8", "blockwise"};
constexpr std::string_view kFormatNames[] = {"hybrid", "e4m3"};
constexpr std::string_view kRoleNames[] = {"input", "weight", "grad_output"};

float fp8_max_of(DType d) {
  return float(format_info(*dtype_format(d)).max_finite);
}

// max that lets a NaN win (a non-finite amax must not hide behind a finite one).
float nan_max(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(a, b);
}

// The scaling of `role` in the GEMM whose reduction runs along the columns of the quantized
// matrix. Weights in the blockwise recipe are 128 x 128 blocks; everything else 1 x width.
Fp8Scaling scaling_for(const Fp8Options& o, Fp8Role role, const Fp8TensorMeta& meta) {
  switch (o.recipe) {
    case Fp8Recipe::Delayed:
      return {0, 0, Fp8ScaleRule::Given, meta.scale};
    case Fp8Recipe::Current:
      return {0, 0, Fp8ScaleRule::Amax, 1};
    case Fp8Recipe::MXFP8:
      return {1, 32, Fp8ScaleRule::AmaxPow2, 1};
    case Fp8Recipe::Blockwise:
      return role == Fp8Role::Weight ? Fp8Scaling{128, 128, Fp8ScaleRule::Amax, 1}
                                     : Fp8Scaling{1, 128, Fp8ScaleRule::Amax, 1};
  }
  return {};
}

bool per_tensor(Fp8Recipe r) {
  return r == Fp8Recipe::Delayed || r == Fp8Recipe::Current;
}

// What gives an Fp8Tensor's shape and device: its codes, or its values where the codes were not
// written (fp8_linear's quantizations on the CPU).
const Tensor& layout_of(const Fp8Tensor& t) {
  return t.codes.defined() ? t.codes : t.values;
}

// The transposed view of a quantized matrix: its blocks follow.
Fp8Tensor transposed(const Fp8Tensor& t) {
  Fp8Tensor r = t;
  r.codes = t.codes.defined() ? t.codes.t() : Tensor();
  r.scale_inv = t.scale_inv.t();
  r.amax = t.amax.defined() ? t.amax.t() : Tensor();
  r.values = t.values.defined() ? t.values.t() : Tensor();
  std::swap(r.block_rows, r.block_cols);
  return r;
}

// Each block's scale_inv repeated over its elements: (R, C) f32.
Tensor expand_blocks(const Tensor& s, int64_t br, int64_t bc, int64_t R, int64_t C) {
  const int64_t nbr = s.size(0), nbc = s.size(1);
  return s.contiguous()
      .view({nbr, 1, nbc, 1})
      .expand({nbr, br, nbc, bc})
      .reshape({nbr * br, nbc * bc})
      .narrow(0, 0, R)
      .narrow(1, 0, C);
}

// fp8 codes as bf16 values (exact), in the layout they have: the table conversion runs on the
// contiguous storage of a matrix or of its transpose.
Tensor codes_bf16(const Tensor& codes) {
  if (codes.is_contiguous()) return codes.to(DType::BF16);
  if (codes.t().is_contiguous()) return codes.t().to(DType::BF16).t();
  return codes.contiguous().to(DType::BF16);
}

// a (M, K) @ b (N, K)^T in f32 from bf16 operands: the backend's GEMM with fp32 accumulation.
Tensor gemm_f32(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty({1, a.size(0), b.size(0)}, DType::F32, a.device());
  backend::backend_for(a.device())
      .matmul(a.unsqueeze(0), b.t().unsqueeze(0), nullptr, out, backend::MatmulOptions{});
  return out.view({a.size(0), b.size(0)});
}

// out (M, N) in out_dtype = scale * (a (M, K) @ b (N, K)^T) + bias, bf16 operands, in one CPU
// GEMM: fp32 sums, scaled and rounded to fp32, the bias added in fp32, one rounding into
// out_dtype, all in oneDNN's epilogue (MatmulOptions::output_scale) instead of passes of their
// own.
Tensor gemm_epilogue(const Tensor& a, const Tensor& b, const Tensor& bias, DType out_dtype,
                     float scale) {
  backend::MatmulOptions options;
  options.output_scale = scale;
  Tensor out = Tensor::empty({1, a.size(0), b.size(0)}, out_dtype, a.device());
  // (The backend widens a bias to f32 where the epilogue needs it.)
  backend::backend_for(out.device())
      .matmul(a.unsqueeze(0), b.t().unsqueeze(0), bias.defined() ? &bias : nullptr, out, options);
  return out.view({a.size(0), b.size(0)});
}

// The scale_inv of each of t's n rows in K slice k, as a vector (CPU), from its scales s made
// contiguous (row blocks, K blocks).
std::vector<float> block_scales(const Fp8Tensor& t, const Tensor& s, int64_t k, int64_t n) {
  const int64_t nbc = s.size(1);
  const float* p = s.data<float>();
  std::vector<float> out(static_cast<size_t>(n));
  if (t.block_rows == 1) {  // a scale per row (the 1 x 128 tiles)
    for (int64_t r = 0; r < n; ++r)
      out[size_t(r)] = p[r * nbc + k];
    return out;
  }
  for (int64_t r0 = 0, rb = 0; r0 < n; r0 += t.block_rows, ++rb)
    std::fill(out.begin() + r0, out.begin() + std::min(n, r0 + t.block_rows), p[rb * nbc + k]);
  return out;
}

// One output row of a block-scaled CPU GEMM from its K slices' fp32 sums (S rows, `stride`
// apart in parts): ar = part_0 * f_0, then ar + part_s * f_s for s = 1 .. S-1, with f_s = fa[s] *
// sb[s][n], each product and sum rounded to fp32 in that order (the tensor ops' arithmetic, which
// the GPU runs), then + bias[n]. Compiled for AVX-512 too (x86-64-v4), picked at load time: the
// loops are the same IEEE operations in the same order in both builds (no contraction: the
// library builds with -ffp-contract=off), so the bits are the same.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
void sum_row(const float* parts, int64_t S, int64_t stride, int64_t N, const float* fa,
             const float* const* sb, float* ar, const float* bias) {
  for (int64_t s = 0; s < S; ++s) {
    const float f = fa[s];
    const float* sbp = sb[s];
    const float* pr = parts + s * stride;
    if (s == 0) {
      for (int64_t n = 0; n < N; ++n)
        ar[n] = pr[n] * (f * sbp[n]);
    } else {
      for (int64_t n = 0; n < N; ++n)
        ar[n] = ar[n] + pr[n] * (f * sbp[n]);
    }
  }
  if (bias) {
    for (int64_t n = 0; n < N; ++n)
      ar[n] = ar[n] + bias[n];
  }
}

// The K slices [k0, k0 + S * w) of a (rows, K) operand as a batch (S, rows, w) of views, where
// K is its outer dimension (a transposed operand, as in the weight gradient); undefined
// otherwise (the slices' rows would interleave).
Tensor slice_batch(const Tensor& t, int64_t k0, int64_t S, int64_t w) {
  if (t.stride(0) != 1 || t.stride(1) < t.size(0)) return Tensor();
  return t.narrow(1, k0, S * w).t().view({S, w, t.size(0)}).transpose(1, 2);
}

// fp8_gemm with block scales on the CPU: the codes' values ab (M, K) and bb (N, K) (exact in
// bf16) through one GEMM per K slice of bk, each slice's fp32 sums times its scales, summed in
// fp32 (sum_row). The output is made a chunk of rows at a time: the chunk's slice sums (one
// batched GEMM where the operands are transposed views, else a GEMM per slice), at most 1 MiB
// of them so that they stay in the cache, then each row summed over its slices and rounded
// into the output at once. (A pass per slice over all M x N sums, read and written from memory
// each time, took 7 % of a blockwise step, and a last pass rounded them.)
Tensor block_scaled_gemm_cpu(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& ab,
                             const Tensor& bb, const Tensor& bias, DType out_dtype, int64_t bk) {
  const int64_t M = ab.size(0), K = ab.size(1), N = bb.size(0);
  const int64_t slices = (K + bk - 1) / bk, whole = K / bk;
  constexpr int64_t kChunkBytes = int64_t(1) << 20;
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / (slices * N * 4), 1, M);
  const bool rounded_here = out_dtype == DType::BF16 || out_dtype == DType::F16;
  Tensor out = Tensor::empty({M, N}, rounded_here ? out_dtype : DType::F32);
  const Tensor bias_f32 = bias.defined() ? bias.to(DType::F32).contiguous() : Tensor();
  const float* bias_p = bias.defined() ? bias_f32.data<float>() : nullptr;
  // Each slice's scales per row of a and of b. (A transposed operand's scales are a transposed
  // view: made contiguous once.)
  const Tensor a_scales = a.scale_inv.contiguous(), b_scales = b.scale_inv.contiguous();
  std::vector<std::vector<float>> sa, sb;
  std::vector<const float*> sbp;
  for (int64_t k = 0; k < slices; ++k) {
    sa.push_back(block_scales(a, a_scales, k, M));
    sb.push_back(block_scales(b, b_scales, k, N));
    sbp.push_back(sb.back().data());
  }
  backend::Backend& be = backend::backend_for(ab.device());
  Tensor storage = Tensor::empty({slices * chunk * N}, DType::F32);
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t rows = std::min(chunk, M - m0);
    const Tensor ac = ab.narrow(0, m0, rows);
    Tensor parts = storage.narrow(0, 0, slices * rows * N).view({slices, rows, N});
    int64_t s = 0;
    if (whole > 1) {
      const Tensor a3 = slice_batch(ac, 0, whole, bk), b3 = slice_batch(bb, 0, whole, bk);
      if (a3.defined() && b3.defined()) {
        Tensor p = parts.narrow(0, 0, whole);
        be.matmul(a3, b3.transpose(1, 2), nullptr, p, backend::MatmulOptions{});
        s = whole;
      }
    }
    for (; s < slices; ++s) {
      const int64_t k0 = s * bk, kl = std::min(bk, K - k0);
      Tensor p = parts.narrow(0, s, 1);
      be.matmul(ac.narrow(1, k0, kl).unsqueeze(0), bb.narrow(1, k0, kl).t().unsqueeze(0), nullptr,
                p, backend::MatmulOptions{});
    }
    const float* pp = parts.data<float>();
#pragma omp parallel if (rows * N >= (int64_t(1) << 16) && !omp_in_parallel())
    {
      std::vector<float> row(rounded_here ? static_cast<size_t>(N) : 0);
      std::vector<float> fa(static_cast<size_t>(slices));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t m = m0 + r;
        for (int64_t k = 0; k < slices; ++k)
          fa[size_t(k)] = sa[size_t(k)][size_t(m)];
        float* ar = rounded_here ? row.data() : out.data<float>() + m * N;
        sum_row(pp + r * N, slices, rows * N, N, fa.data(), sbp.data(), ar, bias_p);
        if (out_dtype == DType::BF16) {
          convert(ar, out.data<bfloat16>() + m * N, size_t(N));
        } else if (out_dtype == DType::F16) {
          convert(ar, out.data<half>() + m * N, size_t(N));
        }
      }
    }
  }
  return out.to(out_dtype);
}

// The one value of a per-tensor scale on the CPU.
float scalar_of(const Tensor& t) {
  MT_ASSERT(t.numel() == 1 && t.dtype() == DType::F32 && t.device().is_cpu(),
            "fp8: a per-tensor scale is one f32 value on the CPU, got ", t.describe());
  return *static_cast<const float*>(t.data_ptr());
}

// Records one quantization of `role` into the layer's state (amaxes into the history only while
// training: evaluation must not move the scales).
void observe(Fp8LinearState& st, Fp8Role role, const Fp8Tensor& q, const Fp8Options& o,
             bool training) {
  Fp8TensorMeta& m = st[role];
  float amax = 0, max_scale_inv = 0;
  for (float a : q.amax.to_vector<float>())
    amax = nan_max(amax, a);
  for (float s : q.scale_inv.to_vector<float>())
    max_scale_inv = nan_max(max_scale_inv, s);
  ++m.quantizations;
  m.last_amax = amax;
  m.last_scale = 1.0f / max_scale_inv;
  if (!std::isfinite(amax)) {
    ++m.nonfinite;
    warn("fp8:nonfinite", "fp8: the " + std::string(fp8_role_name(role)) + " of layer '" + st.name +
                              "' holds inf or NaN; its GEMM gives NaN, so the loss scaler skips "
                              "the step (the amax is not recorded)");
    return;
  }
  if (training && o.recipe == Fp8Recipe::Delayed && !m.amax_history.empty())
    m.amax_history[0] = std::max(m.amax_history[0], amax);
}

}  // namespace

// ---- names ---------------------------------------------------------------------------------

namespace {
template <typename E, size_t N>
std::optional<E> parse_name(const std::string_view (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return E(i);
  return std::nullopt;
}
}  // namespace

std::string_view fp8_role_name(Fp8Role r) {
  return kRoleNames[size_t(r)];
}

DType fp8_dtype(Fp8Format format, Fp8Role role) {
  return format == Fp8Format::Hybrid && role == Fp8Role::GradOutput ? DType::FP8_E5M2
                                                                    : DType::FP8_E4M3;
}

// ---- the context ---------------------------------------------------------------------------

Fp8Context::Fp8Context(const Fp8Options& options) : options_(options) {
  MT_CHECK(options.amax_history_len >= 1, "fp8: the amax history needs at least one entry, got ",
           options.amax_history_len);
  MT_CHECK(options.margin >= 0 && options.margin < 64, "fp8: the margin must be in [0, 64), got ",
           options.margin);
}

std::shared_ptr<Fp8LinearState> Fp8Context::add_layer(const std::string& name) {
  for (const auto& l : layers_)
    MT_CHECK(l->name != name, "fp8: layer '", name, "' has a state already");
  auto st = std::make_shared<Fp8LinearState>();
  st->name = name;
  if (options_.recipe == Fp8Recipe::Delayed) {
    for (Fp8TensorMeta& m : st->meta)
      m.amax_history.assign(size_t(options_.amax_history_len), 0.0f);
  }
  layers_.push_back(st);
  return st;
}

void Fp8Context::update(const AmaxReduce& reduce) {
  if (options_.recipe != Fp8Recipe::Delayed) return;
  if (reduce) {
    std::vector<float> amaxes;
    amaxes.reserve(layers_.size() * kNumFp8Roles);
    for (const auto& l : layers_)
      for (const Fp8TensorMeta& m : l->meta)
        amaxes.push_back(m.amax_history[0]);
    reduce(amaxes);
    size_t i = 0;
    for (const auto& l : layers_)
      for (Fp8TensorMeta& m : l->meta)
        m.amax_history[0] = amaxes[i++];
  }
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      Fp8TensorMeta& m = l->meta[size_t(r)];
      const float amax = options_.amax_compute == AmaxCompute::Max
                             ? *std::max_element(m.amax_history.begin(), m.amax_history.end())
                             : m.amax_history[0];
      // Transformer Engine's formula, in fp32: (fp8_max / amax) / 2^margin.
      const float fp8_max = fp8_max_of(fp8_dtype(options_.format, Fp8Role(r)));
      if (amax > 0.0f && std::isfinite(amax)) {
        const float s = (fp8_max / amax) / std::ldexp(1.0f, options_.margin);
        if (std::isfinite(s)) m.scale = s;
      }
      std::rotate(m.amax_history.begin(), m.amax_history.begin() + 1, m.amax_history.end());
      m.amax_history[0] = 0.0f;
    }
  }
}

std::map<std::string, Tensor> Fp8Context::state_dict() const {
  std::map<std::string, Tensor> out;
  if (options_.recipe != Fp8Recipe::Delayed) return out;
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      const Fp8TensorMeta& m = l->meta[size_t(r)];
      const std::string key = "fp8." + l->name + "." + std::string(kRoleNames[r]);
      out[key + ".scale"] = Tensor::from_vector(std::vector<float>{m.scale}, {1});
      out[key + ".amax_history"] =
          Tensor::from_vector(m.amax_history, {int64_t(m.amax_history.size())});
    }
  }
  return out;
}

void Fp8Context::load_state_dict(const std::map<std::string, Tensor>& state) {
  if (options_.recipe != Fp8Recipe::Delayed) return;
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      Fp8TensorMeta& m = l->meta[size_t(r)];
      const std::string key = "fp8." + l->name + "." + std::string(kRoleNames[r]);
      const auto s = state.find(key + ".scale");
      const auto h = state.find(key + ".amax_history");
      MT_CHECK(s != state.end() && h != state.end(), "fp8: the checkpoint has no '", key,
               ".scale' and '.amax_history': it was not written by a delayed-scaling fp8 run of "
               "this model; resume with the precision it was trained in");
      MT_CHECK(s->second.numel() == 1 && h->second.numel() == int64_t(m.amax_history.size()),
               "fp8: '", key, ".amax_history' holds ", h->second.numel(),
               " entries but this run's history has ", m.amax_history.size(),
               "; resume with the same --fp8-amax-history");
      m.scale = s->second.to(DType::F32).to_vector<float>()[0];
      m.amax_history = h->second.to(DType::F32).to_vector<float>();
    }
  }
}

// ---- the region ----------------------------------------------------------------------------

Fp8Autocast::Fp8Autocast(Fp8Context& context, bool enabled) : prev_(t_context) {
  t_context = enabled ? &context : nullptr;
}
Fp8Autocast::~Fp8Autocast() {
  t_context = prev_;
}
Fp8Context* fp8_context() {
  return t_context;
}

// ---- quantize, dequantize, GEMM ------------------------------------------------------------

namespace {

// fp8_quantize, or with codes false (CPU only) its values and scales without the codes, which
// the CPU's emulated GEMMs do not read: a quarter less time a value.
Fp8Tensor quantize(const Tensor& x_arg, DType dtype, const Fp8Scaling& s, bool codes) {
  MT_CHECK(dtype == DType::FP8_E4M3 || dtype == DType::FP8_E5M2,
           "fp8_quantize: the target must be fp8_e4m3 or fp8_e5m2, got ", dtype_name(dtype));
  MT_CHECK(x_arg.defined() && x_arg.dim() == 2 && x_arg.is_floating_point() &&
               x_arg.dtype() != DType::F64,
           "fp8_quantize: x must be a 2-D f32, bf16 or f16 matrix, got ",
           x_arg.defined() ? x_arg.describe() : std::string("an undefined tensor"));
  MT_CHECK(s.block_rows >= 0 && s.block_cols >= 0, "fp8_quantize: block sizes must be >= 0");
  MT_CHECK(s.rule != Fp8ScaleRule::Given || (s.block_rows == 0 && s.block_cols == 0),
           "fp8_quantize: a given scale is for a whole tensor (block 0 x 0)");
  MT_CHECK(s.rule != Fp8ScaleRule::Given || (std::isfinite(s.scale) && s.scale > 0),
           "fp8_quantize: the scale must be finite and positive, got ", s.scale);
  NoGrad ng;
  const Tensor x = x_arg.contiguous();
  const int64_t R = x.size(0), C = x.size(1);
  Fp8Tensor q;
  q.block_rows = s.block_rows == 0 ? std::max<int64_t>(R, 1) : s.block_rows;
  q.block_cols = s.block_cols == 0 ? std::max<int64_t>(C, 1) : s.block_cols;
  const int64_t nbr = (R + q.block_rows - 1) / q.block_rows;
  const int64_t nbc = (C + q.block_cols - 1) / q.block_cols;
  MT_ASSERT(codes || x.device().is_cpu(), "fp8: values without codes are the CPU's");
  Tensor written = Tensor::empty(codes ? Shape{R, C} : Shape{0}, dtype, x.device());
  if (codes) q.codes = written;
  q.scale_inv = Tensor::empty({nbr, nbc}, DType::F32, x.device());
  q.amax = Tensor::empty({nbr, nbc}, DType::F32, x.device());
  q.power_of_two_scales = s.rule == Fp8ScaleRule::AmaxPow2;
  q.values = Tensor::empty({R, C}, DType::BF16, x.device());
  if (x.numel() == 0) return q;
  backend::Fp8QuantizeParams p;
  p.block_rows = q.block_rows;
  p.block_cols = q.block_cols;
  p.rule = backend::Fp8ScaleRule(int(s.rule));
  p.scale = s.scale;
  p.values_only = !codes;
  backend::backend_for(x.device()).fp8_quantize(x, p, written, q.scale_inv, q.amax, &q.values);
  return q;
}

Fp8Tensor quantize_transposed(const Tensor& x, DType dtype, const Fp8Scaling& s, bool codes) {
  MT_CHECK(x.defined() && x.dim() == 2, "fp8_quantize_transposed: x must be a 2-D matrix, got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  if (!x.device().is_cpu()) return quantize(x.t(), dtype, s, codes);
  // A block of x^T (br rows, bc columns) is a block of x (bc rows, br columns); 0 still means
  // the whole dimension.
  Fp8Scaling swapped = s;
  std::swap(swapped.block_rows, swapped.block_cols);
  return transposed(quantize(x, dtype, swapped, codes));
}

}  // namespace

Fp8Tensor fp8_quantize(const Tensor& x, DType dtype, const Fp8Scaling& s) {
  return quantize(x, dtype, s, true);
}

Fp8Tensor fp8_quantize_transposed(const Tensor& x, DType dtype, const Fp8Scaling& s) {
  return quantize_transposed(x, dtype, s, true);
}

Tensor fp8_dequantize(const Fp8Tensor& t) {
  NoGrad ng;
  const int64_t R = t.codes.size(0), C = t.codes.size(1);
  return mul(t.codes.to(DType::F32), expand_blocks(t.scale_inv, t.block_rows, t.block_cols, R, C));
}

Tensor fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& bias, DType out_dtype) {
  MT_CHECK(layout_of(a).defined() && layout_of(b).defined(),
           "fp8_gemm: an operand has neither codes nor values");
  const Tensor &la = layout_of(a), &lb = layout_of(b);
  MT_CHECK(la.dim() == 2 && lb.dim() == 2 && la.size(1) == lb.size(1),
           "fp8_gemm: a (M, K) and b (N, K) must share K, got ", la.describe(), " and ",
           lb.describe());
  NoGrad ng;
  const int64_t M = la.size(0), K = la.size(1), N = lb.size(0);
  const int64_t bka = std::min(a.block_cols, K), bkb = std::min(b.block_cols, K);
  MT_CHECK(bka == bkb, "fp8_gemm: the blocks of a and b along K differ (", a.block_cols, " and ",
           b.block_cols, "); quantize both with the same block width");
  Tensor acc;
  const bool both_e5m2 = a.codes.defined() && b.codes.defined() &&
                         a.codes.dtype() == DType::FP8_E5M2 && b.codes.dtype() == DType::FP8_E5M2;
  if (!la.device().is_cpu() && a.block_rows >= M && b.block_rows >= N && bka >= K && !both_e5m2) {
    // Per-tensor scales on a device: the backend's fp8 GEMM (cuBLASLt's on fp8 tensor cores),
    // its operands with K innermost (a transposed view in backward is copied, a byte a value).
    auto k_inner = [](const Tensor& c) { return c.stride(1) == 1 ? c : c.contiguous(); };
    Tensor out = Tensor::empty({M, N}, bias.defined() ? DType::F32 : out_dtype, la.device());
    backend::backend_for(out.device())
        .fp8_gemm(k_inner(a.codes), a.scale_inv, k_inner(b.codes), b.scale_inv, out);
    return bias.defined() ? add(out, bias.to(DType::F32)).to(out_dtype) : out;
  }
  if (la.device().is_cpu() && a.block_rows >= M && b.block_rows >= N && bka >= K) {
    // Per-tensor scales on the CPU: one GEMM of the codes' values (exact in bf16) scaled by the
    // scales' product in its epilogue. (Power-of-two scales' values are already scaled: their
    // codes are taken instead.)
    auto code_values = [](const Fp8Tensor& t) {
      return t.values.defined() && !t.power_of_two_scales ? t.values : codes_bf16(t.codes);
    };
    return gemm_epilogue(code_values(a), code_values(b), bias, out_dtype,
                         scalar_of(a.scale_inv) * scalar_of(b.scale_inv));
  }
  if (a.power_of_two_scales && b.power_of_two_scales) {
    // Power-of-two scales (MXFP8): code * 2^e is exact in bf16 (unless a block's amax is below
    // 2^-118, where it would be a bf16 subnormal), so the scaled operands go through one GEMM
    // whose fp32 sums are those of the scaled products.
    auto scaled_bf16 = [](const Fp8Tensor& t) {
      return t.values.defined() ? t.values : fp8_dequantize(t).to(DType::BF16);
    };
    if (la.device().is_cpu()) {
      return gemm_epilogue(scaled_bf16(a), scaled_bf16(b), bias, out_dtype, 1.0f);
    }
    acc = gemm_f32(scaled_bf16(a), scaled_bf16(b));
  } else {
    // The codes (exact in bf16) through one GEMM per K slice; each slice's fp32 sums times its
    // scales, accumulated in fp32 (per tensor: one slice, one factor).
    const bool va = a.values.defined() && !a.power_of_two_scales;
    const bool vb = b.values.defined() && !b.power_of_two_scales;
    const Tensor ab = va ? a.values : codes_bf16(a.codes), bb = vb ? b.values : codes_bf16(b.codes);
    const int64_t slices = (K + bka - 1) / bka;
    if (la.device().is_cpu() && slices > 0) {
      return block_scaled_gemm_cpu(a, b, ab, bb, bias, out_dtype, bka);
    }
    for (int64_t k = 0; k < slices; ++k) {
      const int64_t k0 = k * bka, kl = std::min(bka, K - k0);
      const Tensor part = gemm_f32(ab.narrow(1, k0, kl), bb.narrow(1, k0, kl));
      // a's scales of slice k per row of a, b's per row of b: factor = sa (M | 1, 1) sb (1, N | 1),
      // a single number for per-tensor scales.
      const Tensor sa = a.block_rows >= M
                            ? a.scale_inv.narrow(1, k, 1)
                            : expand_blocks(a.scale_inv.narrow(1, k, 1), a.block_rows, 1, M, 1);
      const Tensor sb = b.block_rows >= N
                            ? b.scale_inv.narrow(1, k, 1)
                            : expand_blocks(b.scale_inv.narrow(1, k, 1), b.block_rows, 1, N, 1);
      const Tensor scaled = mul(part, mul(sa, sb.t()));
      acc = acc.defined() ? add(acc, scaled) : scaled;
    }
    if (!acc.defined()) acc = Tensor::zeros({M, N}, DType::F32, la.device());
  }
  if (bias.defined()) acc = add(acc, bias.to(DType::F32));
  return acc.to(out_dtype);
}

// ---- the op --------------------------------------------------------------------------------

Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& b, Fp8LinearState& state,
                  const Fp8Options& o) {
  MT_CHECK(x.defined() && w.defined() && w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
           "fp8_linear: x (..., in) and weight (out, in) do not fit: ",
           x.defined() ? x.describe() : "undefined", " and ",
           w.defined() ? w.describe() : "undefined");
  MT_CHECK(x.is_floating_point() && w.is_floating_point() && x.dtype() != DType::F64 &&
               w.dtype() != DType::F64,
           "fp8_linear takes f32, bf16 or f16 tensors, got ", x.describe(), " and ", w.describe());
  MT_CHECK(x.device() == w.device() && (!b.defined() || b.device() == x.device()),
           "fp8_linear: the tensors are on different devices");
  MT_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "fp8_linear: bias ",
           b.defined() ? b.describe() : "", " does not match weight ", w.describe());
  if (!x.device().is_cpu() && !per_tensor(o.recipe)) {
    warn("fp8:emulated:" + std::string(name_of(o.recipe)),
         "fp8 on " + x.device().str() + ": the " + std::string(name_of(o.recipe)) +
             " recipe's GEMMs run emulated (fp8 codes through a bf16 GEMM with fp32 sums, the "
             "CPU's numbers); cuBLASLt's block-scaled fp8 GEMMs are not wired (the per-tensor "
             "recipes, delayed and current, use its fp8 GEMM)");
  }
  const int64_t in = w.size(1), out_features = w.size(0);
  DType out_dtype = promote_types(x.dtype(), w.dtype());
  if (b.defined()) out_dtype = promote_types(out_dtype, b.dtype());
  if (autocast_active() && is_autocast_enabled(x.device().type))
    out_dtype = autocast_dtype(x.device().type);
  const bool training = autograd::needs_grad({&x, &w, &b});
  const DType fwd_dtype = fp8_dtype(o.format, Fp8Role::Input);
  const DType grad_dtype = fp8_dtype(o.format, Fp8Role::GradOutput);

  // Per-tensor scales serve every GEMM, so the codes are what backward keeps (a byte per value);
  // block scales run along the reduction dimension, which differs in each GEMM, so the block
  // recipes keep the inputs and quantize them again along the other dimension.
  const bool keep_codes = per_tensor(o.recipe);
  // The CPU's GEMMs read the values only: codes are written where a GPU reads them or backward
  // keeps them.
  const bool on_cpu = x.device().is_cpu();
  const bool fwd_codes = !on_cpu || (keep_codes && training);
  const Tensor x2 = x.reshape({-1, in}).contiguous();  // (M, in)
  Fp8Tensor qx =
      quantize(x2, fwd_dtype, scaling_for(o, Fp8Role::Input, state[Fp8Role::Input]), fwd_codes);
  Fp8Tensor qw =
      quantize(w, fwd_dtype, scaling_for(o, Fp8Role::Weight, state[Fp8Role::Weight]), fwd_codes);
  observe(state, Fp8Role::Input, qx, o, training);
  observe(state, Fp8Role::Weight, qw, o, training);
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  Tensor y = fp8_gemm(qx, qw, b, out_dtype).view(out_shape);
  if (!training) return y;

  // The codes only (a byte a value): backward converts them again.
  auto codes_only = [keep_codes](Fp8Tensor t) {
    if (!keep_codes) return Fp8Tensor{};
    t.amax = t.values = Tensor();
    return t;
  };
  const Fp8Tensor kx = codes_only(qx), kw = codes_only(qw);
  const autograd::SavedTensor saved_x(keep_codes ? Tensor() : x2.detach());
  const autograd::SavedTensor saved_w(keep_codes ? Tensor() : w.detach());
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype(), b_dtype = b.defined() ? b.dtype() : w_dtype;
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  Fp8LinearState* st = &state;
  autograd::record(
      "fp8LinearBackward", {x, w, b}, {y},
      [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor& g = grads[0];
        if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
        const Tensor g2 = g.reshape({-1, out_features}).contiguous();  // (M, out)
        Fp8Tensor qg =
            quantize(g2, grad_dtype,
                     scaling_for(o, Fp8Role::GradOutput, (*st)[Fp8Role::GradOutput]), !on_cpu);
        observe(*st, Fp8Role::GradOutput, qg, o, true);
        Tensor dx, dw, db;
        if (keep_codes) {
          if (gx) dx = fp8_gemm(qg, transposed(kw), Tensor(), x_dtype);
          if (gw) dw = fp8_gemm(transposed(qg), transposed(kx), Tensor(), w_dtype);
        } else {
          const Tensor xv = saved_x.unpack(), wv = saved_w.unpack();
          const Fp8Scaling sw = scaling_for(o, Fp8Role::Weight, (*st)[Fp8Role::Weight]);
          const Fp8Scaling sg = scaling_for(o, Fp8Role::GradOutput, (*st)[Fp8Role::GradOutput]);
          const Fp8Scaling sx = scaling_for(o, Fp8Role::Input, (*st)[Fp8Role::Input]);
          if (gx) {  // dx (M, in) = g (M, out) . w^T (in, out): reduction along out
            dx = fp8_gemm(qg, quantize_transposed(wv, fwd_dtype, sw, !on_cpu), Tensor(), x_dtype);
          }
          if (gw) {  // dw (out, in) = g^T (out, M) . x^T (in, M): reduction along M
            dw = fp8_gemm(quantize_transposed(g2, grad_dtype, sg, !on_cpu),
                          quantize_transposed(xv, fwd_dtype, sx, !on_cpu), Tensor(), w_dtype);
          }
        }
        if (gb) {
          // fp32 sums rounded once into the bias's dtype; a gradient in that dtype is read as it
          // is (and should autocast widen the sum, the result is cast back).
          db = (g2.dtype() == b_dtype ? sum(g2, {0}) : sum(g2.to(DType::F32), {0})).to(b_dtype);
        }
        return {gx ? dx.reshape(x_shape) : Tensor(), dw, db};
      });
  return y;
}

}  // namespace mantissa::amp
