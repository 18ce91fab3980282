// CPU multi-tensor kernels: the fused optimizer steps (SGD, AdamW, row-sparse AdamW), the global
// gradient norm and the in-place scale that clipping needs. Each call is one pass over all its
// tensors: the work is cut into (tensor, chunk) items of kChunk elements, numbered across tensors,
// and the items are spread over one OpenMP parallel region. An item loads its parameter chunk from
// storage into compute-type buffers (or works on the parameter's fp32 master copy), updates it
// together with the state (kept in the compute type), and rounds it once on store (to nearest even
// or stochastically). No element depends on another, and the norm's per-chunk partial sums are
// combined in item order, so results do not depend on the thread count.
#include <omp.h>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/multi_tensor.h"
#include "backend/multi_tensor_check.h"
#include "backend/state_math.h"
#include "backend/step_math.h"

namespace mantissa::backend::cpu {
namespace {

std::atomic<int64_t> g_multi_tensor_calls{0};

static_assert(kChunk % kMaxStateBlockElements == 0, "a chunk holds whole state blocks");

// Calls f.template operator()<T>() for the float storage types an optimizer handles.
template <typename F>
void dispatch_param(DType dtype, F&& f) {
  dispatch_float(dtype, "an optimizer step", std::forward<F>(f));
}

// Loads elements [start, start + n) of a contiguous float tensor of any dtype into dst.
template <typename C>
void load_any(const void* base, DType dtype, int64_t start, int64_t n, C* dst) {
  dispatch_float(dtype, "an optimizer step", [&]<typename G>() {
    load_contiguous<G, C>(static_cast<const G*>(base) + start, dst, n);
  });
}

// The values one chunk of a parameter's update reads and writes: the fp32 master (the parameter
// then receives its rounding), the parameter itself (f32/f64: in place, nothing to round), or a
// compute-type copy of a narrower parameter (rounded back on store).
template <typename T>
class ParamChunk {
 public:
  using C = compute_t<T>;
  ParamChunk(const Tensor& param, const Tensor* master, const Tensor* compensation, int64_t start,
             int64_t n)
      : store_(static_cast<T*>(param.data_ptr()) + start),
        compensation_(compensation == nullptr ? nullptr
                                              : static_cast<T*>(compensation->data_ptr()) + start),
        start_(start),
        n_(n) {
    if constexpr (std::is_same_v<T, C>) {
      MT_ASSERT(master == nullptr, "a master copy of a ", dtype_name(param.dtype()), " parameter");
      data_ = store_;
    } else {
      if (master != nullptr) {
        data_ = static_cast<float*>(master->data_ptr()) + start;
      } else {
        data_ = buf_;
        load_contiguous<T, C>(store_, buf_, n);
      }
    }
  }
  C* data() { return data_; }

  // Writes the updated values into the parameter (rounded as `o` says; tensor `t` of the call,
  // at its update number `step`).
  void store(const MultiTensorOptions& o, size_t t, int64_t step) {
    if constexpr (!std::is_same_v<T, C>) {
      if (compensation_ != nullptr) {
        // Kahan: y = x + c; p = round(y); c = round(y - p), what this store lost.
        alignas(64) C y[kChunk], back[kChunk];
        load_contiguous<T, C>(compensation_, y, n_);
        for (int64_t i = 0; i < n_; ++i)
          y[i] = data_[i] + y[i];
        store_contiguous<C, T>(y, store_, n_);
        load_contiguous<T, C>(store_, back, n_);
        for (int64_t i = 0; i < n_; ++i)
          back[i] = y[i] - back[i];
        store_contiguous<C, T>(back, compensation_, n_);
      } else if (o.store_rounding != RoundingMode::NearestEven) {  // stochastic or truncation
        RoundingOptions r;
        r.mode = o.store_rounding;
        r.seed = o.seed;
        r.offset = uint64_t(step);
        const uint64_t first = o.element_offsets.empty() ? 0 : o.element_offsets[t];
        r.index = (o.ids[t] << 40) + first + uint64_t(start_);
        convert(data_, store_, size_t(n_), r);
      } else {
        store_contiguous<C, T>(data_, store_, n_);
      }
    } else {
      (void)o;
      (void)t;
      (void)step;
    }
  }

 private:
  T* store_;
  T* compensation_;
  int64_t start_, n_;
  C* data_ = nullptr;
  alignas(64) C buf_[std::is_same_v<T, C> ? 1 : kChunk];
};

// Whether the loss scaler's flag says to skip this call (read on the host: it is CPU memory).
bool skipped(const MultiTensorOptions& o) {
  return o.found_inf != nullptr && *static_cast<const float*>(o.found_inf->data_ptr()) != 0.0f;
}

// Advances the step count of every tensor of the call by one and returns the new counts: each
// tensor's t for this update (1 on its first).
std::vector<int64_t> advance_steps(const MultiTensorOptions& o) {
  int64_t* counts = static_cast<int64_t*>(o.step_counts->data_ptr());
  std::vector<int64_t> t(o.ids.size());
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = ++counts[o.ids[i]];
  return t;
}

const Tensor* master_of(const MultiTensorOptions& o, size_t t) {
  return t < o.masters.size() && o.masters[t].defined() ? &o.masters[t] : nullptr;
}

const Tensor* compensation_of(const MultiTensorOptions& o, size_t t) {
  return t < o.compensations.size() && o.compensations[t].defined() ? &o.compensations[t] : nullptr;
}

// The block scales of state `s` of tensor t of a call with `tensors` tensors, or null.
const Tensor* scales_of(const MultiTensorOptions& o, size_t s, size_t t, size_t tensors) {
  if (o.state_scales.empty()) return nullptr;
  const Tensor& x = o.state_scales[s * tensors + t];
  return x.defined() ? &x : nullptr;
}

// Which moment a state is: the block-scaled formats code the two differently (backend.h).
enum class Moment { First, Second };

// One chunk of a state tensor in the compute type: the tensor itself when it holds the compute
// type, else a buffer decoded from its format (bf16, or fp8 / 8-bit codes under block scales)
// and encoded back by store(). A first update neither reads the state (it may hold anything)
// nor needs it zeroed: the update writes every element before reading it.
template <typename C>
class StateChunk {
 public:
  StateChunk(const Tensor& state, const Tensor* scales, Moment moment, int64_t block, int64_t start,
             int64_t n, bool first)
      : dtype_(state.dtype()),
        base_(static_cast<char*>(state.data_ptr())),
        scales_(scales == nullptr ? nullptr : static_cast<float*>(scales->data_ptr())),
        moment_(moment),
        block_(block),
        start_(start),
        n_(n) {
    if (dtype_ == dtype_of_v<C>) {
      data_ = reinterpret_cast<C*>(base_) + start;
      return;
    }
    data_ = buf_;
    if (first) return;
    switch (dtype_) {
      case DType::BF16:
        load_contiguous<bfloat16, C>(reinterpret_cast<const bfloat16*>(base_) + start, buf_, n);
        return;
      case DType::FP8_E4M3:
      case DType::U8:
        decode(reinterpret_cast<const uint8_t*>(base_) + start);
        return;
      default:
        MT_ASSERT(false, "optimizer state of dtype ", dtype_name(dtype_));
    }
  }
  C* data() { return data_; }

  // Encodes the buffer back into the state (nothing to do when the state is the compute type).
  void store() {
    if (data_ != buf_) return;
    if (dtype_ == DType::BF16) {
      store_contiguous<C, bfloat16>(buf_, reinterpret_cast<bfloat16*>(base_) + start_, n_);
      return;
    }
    uint8_t* codes = reinterpret_cast<uint8_t*>(base_) + start_;
    if (dtype_ == DType::FP8_E4M3 && moment_ == Moment::Second) {
      for (int64_t i = 0; i < n_; ++i)
        buf_[i] = std::sqrt(buf_[i]);  // fp8 keeps v's root
    }
    const DynamicMap& map = dynamic_map_of(moment_ == Moment::First);
    // The chunk starts on a block boundary (chunks hold whole blocks; kChunk % block == 0).
    for (int64_t b0 = 0; b0 < n_; b0 += block_) {
      const int64_t len = std::min(block_, n_ - b0);
      const C* x = buf_ + b0;
      const float absmax = block_absmax(x, len);
      scales_[(start_ + b0) / block_] = absmax;
      if (dtype_ == DType::U8) {
        for (int64_t i = 0; i < len; ++i)
          codes[b0 + i] = state_q8_encode(float(x[i]), absmax, map);
      } else if (!(absmax > 0.0f) || absmax == std::numeric_limits<float>::infinity()) {
        for (int64_t i = 0; i < len; ++i)  // zeros, inf or NaN: the definition's own cases
          codes[b0 + i] = state_fp8_encode(float(x[i]), absmax);
      } else {
        // state_fp8_encode in bulk: x * (448 / absmax), to nearest even, saturating.
        alignas(64) float y[kMaxStateBlockElements];
        const float inv = kStateFp8Max / absmax;
        for (int64_t i = 0; i < len; ++i)
          y[i] = float(x[i]) * inv;
        convert(y, reinterpret_cast<float8_e4m3*>(codes + b0), size_t(len),
                {.mode = RoundingMode::NearestEven, .overflow = Overflow::Saturate});
      }
    }
  }

  // Block by block: code * absmax (8-bit: the map's value), squared for fp8's second moment.
  void decode(const uint8_t* codes) {
    const DynamicMap& map = dynamic_map_of(moment_ == Moment::First);
    for (int64_t b0 = 0; b0 < n_; b0 += block_) {
      const int64_t len = std::min(block_, n_ - b0);
      const float absmax = scales_[(start_ + b0) / block_];
      C* out = buf_ + b0;
      if (dtype_ == DType::U8) {
        for (int64_t i = 0; i < len; ++i)
          out[i] = C(state_q8_decode(codes[b0 + i], absmax, map));
        continue;
      }
      // state_fp8_decode in bulk: the exact widening, times absmax / 448.
      alignas(64) float y[kMaxStateBlockElements];
      convert(reinterpret_cast<const float8_e4m3*>(codes + b0), y, size_t(len));
      const float scale = absmax / kStateFp8Max;
      for (int64_t i = 0; i < len; ++i) {
        const C r = C(y[i] * scale);
        out[i] = moment_ == Moment::Second ? r * r : r;
      }
    }
  }

 private:
  DType dtype_;
  char* base_;
  float* scales_;
  Moment moment_;
  int64_t block_, start_, n_;
  C* data_ = nullptr;
  alignas(64) C buf_[kChunk];
};

// ---- SGD ---------------------------------------------------------------------------------------

template <typename T>
void sgd_chunk(size_t t, const Tensor& param, const Tensor& grad, const Tensor* buf_t,
               const Tensor* buf_scales, int64_t step, int64_t start, int64_t n, const SgdStep& h) {
  const bool first = step == 1;
  using C = compute_t<T>;
  const MultiTensorOptions& o = h.options;
  ParamChunk<T> chunk(param, master_of(o, t), compensation_of(o, t), start, n);
  C* p = chunk.data();
  alignas(64) C g[kChunk];
  load_any<C>(grad.data_ptr(), grad.dtype(), start, n, g);

  const C lr = C(h.lr), wd = C(h.weight_decay), mom = C(h.momentum);
  const C keep = C(1.0 - h.dampening);
  if (h.weight_decay != 0) {
    for (int64_t i = 0; i < n; ++i)
      g[i] = g[i] + wd * p[i];
  }
  const C* d = g;  // the direction p moves against
  std::optional<StateChunk<C>> state;
  if (h.momentum != 0) {
    state.emplace(*buf_t, buf_scales, Moment::First, o.state_block, start, n, first);
    C* buf = state->data();
    if (first) {
      std::copy(g, g + n, buf);  // PyTorch: buf = clone(grad), no dampening on the first step
    } else {
      for (int64_t i = 0; i < n; ++i)
        buf[i] = buf[i] * mom + keep * g[i];
    }
    if (h.nesterov) {
      for (int64_t i = 0; i < n; ++i)
        g[i] = g[i] + mom * buf[i];
    } else {
      d = buf;
    }
  }
  for (int64_t i = 0; i < n; ++i)
    p[i] = p[i] - lr * d[i];
  if (state) state->store();
  chunk.store(o, t, step);
}

// ---- AdamW -------------------------------------------------------------------------------------

// x = sqrt(x). Vector instructions where the compiler cannot use them itself: std::sqrt may set
// errno, which keeps the loops around it scalar. IEEE sqrt is correctly rounded either way.
inline void sqrt_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__SSE__)
  for (; i + 4 <= n; i += 4)
    _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i)
    x[i] = std::sqrt(x[i]);
}

inline void sqrt_inplace(double* x, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  for (; i + 2 <= n; i += 2)
    _mm_storeu_pd(x + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i)
    x[i] = std::sqrt(x[i]);
}

// m = lerp(m, g, w); v = beta2 * v + (1 - beta2) * g^2; v_out = v (its square root comes next).
template <bool kLerpLow, typename C>
void adamw_moments(C* m, C* v, const C* g, C* v_out, int64_t n, C w, C b2, C omb2) {
  for (int64_t i = 0; i < n; ++i) {
    const C mo = m[i], gi = g[i];
    m[i] = kLerpLow ? mo + w * (gi - mo) : gi - (gi - mo) * (C(1) - w);
    const C vn = v[i] * b2 + omb2 * gi * gi;
    v[i] = vn;
    v_out[i] = vn;
  }
}

// AdamW's update of n elements at one step count (PyTorch's torch.optim.AdamW, backend.h): the
// parameters p (compute type, updated in place), their gradients g and moments m, v. The one
// element formula of the dense and the row-sparse step.
template <typename C>
void adamw_update(C* p, const C* g, C* m, C* v, int64_t n, bool first, const AdamWBiasCorrection& k,
                  const AdamWStep& h) {
  const C decay = C(1.0 - h.lr * h.weight_decay);
  const C w = C(1.0 - h.beta1);  // lerp weight
  const C b2 = C(h.beta2), omb2 = C(1.0 - h.beta2), eps = C(h.eps);
  const C neg_step = C(-k.step_size), bc2_sqrt = C(k.bc2_sqrt);
  // The state starts at zero (PyTorch's zeros_like): on a first update it was never written.
  if (first) {
    std::fill(m, m + n, C(0));
    std::fill(v, v + n, C(0));
  }
  // torch.lerp's two formulas (the second is exact at weight 1), chosen as PyTorch does.
  alignas(64) C denom[kChunk];
  if (w < C(0.5)) {
    adamw_moments<true>(m, v, g, denom, n, w, b2, omb2);
  } else {
    adamw_moments<false>(m, v, g, denom, n, w, b2, omb2);
  }
  sqrt_inplace(denom, n);
  for (int64_t i = 0; i < n; ++i)
    p[i] = p[i] * decay + neg_step * m[i] / (denom[i] / bc2_sqrt + eps);
}

template <typename T>
void adamw_chunk(size_t t, size_t tensors, const Tensor& param, const Tensor& grad,
                 const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step,
                 const AdamWBiasCorrection& k, int64_t start, int64_t n, const AdamWStep& h) {
  using C = compute_t<T>;
  const MultiTensorOptions& o = h.options;
  const bool first = step == 1;
  ParamChunk<T> chunk(param, master_of(o, t), compensation_of(o, t), start, n);
  alignas(64) C g[kChunk];
  load_any<C>(grad.data_ptr(), grad.dtype(), start, n, g);
  StateChunk<C> m(exp_avg, scales_of(o, 0, t, tensors), Moment::First, o.state_block, start, n,
                  first);
  StateChunk<C> v(exp_avg_sq, scales_of(o, 1, t, tensors), Moment::Second, o.state_block, start, n,
                  first);
  adamw_update(chunk.data(), g, m.data(), v.data(), n, first, k, h);
  m.store();
  v.store();
  chunk.store(o, t, step);
}

// One listed row of a table (sparse_adamw_step): its u-th gradient row, at the row's count.
template <typename T>
void sparse_adamw_row(size_t t, const Tensor& table, const Tensor* master, const Tensor& grad,
                      const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t u, int64_t row,
                      int64_t step, const AdamWStep& h) {
  using C = compute_t<T>;
  const int64_t dim = table.size(1);
  const AdamWBiasCorrection k =
      adamw_bias_correction(h.lr, h.beta1, h.beta2, step, [](double x) { return std::sqrt(x); });
  for (int64_t j0 = 0; j0 < dim; j0 += kChunk) {
    const int64_t n = std::min(kChunk, dim - j0), start = row * dim + j0;
    ParamChunk<T> chunk(table, master, nullptr, start, n);
    alignas(64) C g[kChunk];
    load_any<C>(grad.data_ptr(), grad.dtype(), u * dim + j0, n, g);
    C* m = static_cast<C*>(exp_avg.data_ptr()) + start;
    C* v = static_cast<C*>(exp_avg_sq.data_ptr()) + start;
    adamw_update(chunk.data(), g, m, v, n, step == 1, k, h);
    chunk.store(h.options, t, step);
  }
}

// ---- norm and scale ----------------------------------------------------------------------------

enum class NormKind { Two, One, Inf, P };

// The partial of one chunk: sum of |x|^p (or max |x| for inf, NaN winning).
template <typename C>
double chunk_norm_partial(const C* x, int64_t n, NormKind kind, double p) {
  switch (kind) {
    case NormKind::Two: {
      C s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i)
        s += x[i] * x[i];
      return double(s);
    }
    case NormKind::One: {
      C s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i)
        s += std::abs(x[i]);
      return double(s);
    }
    case NormKind::Inf: {
      C best = 0;
      for (int64_t i = 0; i < n; ++i) {
        const C a = std::abs(x[i]);
        if (a != a) return std::numeric_limits<double>::quiet_NaN();
        best = a > best ? a : best;
      }
      return double(best);
    }
    case NormKind::P: {
      const C pc = C(p);
      C s = 0;
      for (int64_t i = 0; i < n; ++i)
        s += std::pow(std::abs(x[i]), pc);
      return double(s);
    }
  }
  return 0;
}

}  // namespace

int64_t multi_tensor_calls() {
  return g_multi_tensor_calls.load(std::memory_order_relaxed);
}

void CpuBackend::sgd_step(std::span<Tensor> params, std::span<const Tensor> grads,
                          std::span<Tensor> momentum_bufs, const SgdStep& hyper) {
  g_multi_tensor_calls.fetch_add(1, std::memory_order_relaxed);
  const bool with_momentum = hyper.momentum != 0;
  MT_ASSERT(with_momentum || momentum_bufs.empty(), "sgd_step: momentum buffers without momentum");
  if (with_momentum) {
    check_step_call("sgd_step", Device::cpu(), params, grads, {momentum_bufs}, hyper.options);
  } else {
    check_step_call("sgd_step", Device::cpu(), params, grads, {}, hyper.options);
  }
  if (skipped(hyper.options)) return;
  const std::vector<int64_t> steps = advance_steps(hyper.options);
  const ChunkPlan plan(params);
  for_each_item(plan, [&](int64_t, size_t t, int64_t start, int64_t n) {
    const Tensor* buf = with_momentum ? &momentum_bufs[t] : nullptr;
    const Tensor* scales = with_momentum ? scales_of(hyper.options, 0, t, params.size()) : nullptr;
    dispatch_param(params[t].dtype(), [&]<typename T>() {
      sgd_chunk<T>(t, params[t], grads[t], buf, scales, steps[t], start, n, hyper);
    });
  });
}

void CpuBackend::adamw_step(std::span<Tensor> params, std::span<const Tensor> grads,
                            std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs,
                            const AdamWStep& hyper) {
  g_multi_tensor_calls.fetch_add(1, std::memory_order_relaxed);
  check_step_call("adamw_step", Device::cpu(), params, grads, {exp_avgs, exp_avg_sqs},
                  hyper.options);
  if (skipped(hyper.options)) return;
  const std::vector<int64_t> steps = advance_steps(hyper.options);
  // The bias corrections in double, per tensor (a tensor's step count is its own, as PyTorch).
  std::vector<AdamWBiasCorrection> consts(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    consts[t] = adamw_bias_correction(hyper.lr, hyper.beta1, hyper.beta2, steps[t],
                                      [](double x) { return std::sqrt(x); });
  }
  const ChunkPlan plan(params);
  for_each_item(plan, [&](int64_t, size_t t, int64_t start, int64_t n) {
    dispatch_param(params[t].dtype(), [&]<typename T>() {
      adamw_chunk<T>(t, params.size(), params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], steps[t],
                     consts[t], start, n, hyper);
    });
  });
}

void CpuBackend::sparse_adamw_step(std::span<Tensor> tables, std::span<const Tensor> rows,
                                   std::span<const Tensor> grads, std::span<Tensor> exp_avgs,
                                   std::span<Tensor> exp_avg_sqs, std::span<Tensor> row_steps,
                                   const AdamWStep& hyper) {
  g_multi_tensor_calls.fetch_add(1, std::memory_order_relaxed);
  check_sparse_step_call("sparse_adamw_step", Device::cpu(), tables, rows, grads, exp_avgs,
                         exp_avg_sqs, row_steps, hyper.options);
  if (skipped(hyper.options)) return;
  // Every (table, listed row) pair is an item; the rows of a table are distinct, so no two
  // items touch the same elements.
  std::vector<std::pair<size_t, int64_t>> items;
  int64_t elements = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    for (int64_t u = 0; u < rows[t].numel(); ++u)
      items.emplace_back(t, u);
    elements += rows[t].numel() * tables[t].size(1);
  }
  auto body = [&](int64_t i) {
    const auto [t, u] = items[size_t(i)];
    const int64_t row = static_cast<const int64_t*>(rows[t].data_ptr())[u];
    const int64_t step = ++static_cast<int64_t*>(row_steps[t].data_ptr())[row];
    const Tensor* master = master_of(hyper.options, t);
    dispatch_param(tables[t].dtype(), [&]<typename T>() {
      sparse_adamw_row<T>(t, tables[t], master, grads[t], exp_avgs[t], exp_avg_sqs[t], u, row, step,
                          hyper);
    });
  };
  const auto n = int64_t(items.size());
  if (elements < kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i)
      body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    body(i);
}

void CpuBackend::multi_tensor_norm(std::span<const Tensor> tensors, double norm_type, Tensor& out) {
  g_multi_tensor_calls.fetch_add(1, std::memory_order_relaxed);
  MT_ASSERT(out.dtype() == DType::F64 && out.numel() == 1 && out.device().is_cpu(),
            "multi_tensor_norm writes one f64 element, got ", out.describe());
  MT_CHECK(norm_type > 0, "a gradient norm needs norm_type > 0 (or inf), got ", norm_type);
  check_plain_tensors("multi_tensor_norm", Device::cpu(), tensors);
  const NormKind kind = std::isinf(norm_type) ? NormKind::Inf
                        : norm_type == 2      ? NormKind::Two
                        : norm_type == 1      ? NormKind::One
                                              : NormKind::P;
  const ChunkPlan plan(tensors);
  std::vector<double> partial(size_t(plan.chunks()), 0.0);
  for_each_item(plan, [&](int64_t c, size_t t, int64_t start, int64_t n) {
    const Tensor& x = tensors[t];
    dispatch_float(x.dtype(), "multi_tensor_norm", [&]<typename T>() {
      using C = compute_t<T>;
      alignas(64) C buf[kChunk];
      const T* src = static_cast<const T*>(x.data_ptr()) + start;
      const C* p = buf;
      if constexpr (std::is_same_v<T, C>) {
        p = src;
      } else {
        load_contiguous<T, C>(src, buf, n);
      }
      partial[size_t(c)] = chunk_norm_partial<C>(p, n, kind, norm_type);
    });
  });
  double total = 0;
  if (kind == NormKind::Inf) {
    for (double v : partial) {
      if (v != v) {
        total = v;
        break;
      }
      total = std::max(total, v);
    }
  } else {
    for (double v : partial)
      total += v;
    total = kind == NormKind::Two   ? std::sqrt(total)
            : kind == NormKind::One ? total
                                    : std::pow(total, 1.0 / norm_type);
  }
  *static_cast<double*>(out.data_ptr()) = total;
}

void CpuBackend::multi_tensor_scale(std::span<Tensor> tensors, const Tensor& factor_t) {
  g_multi_tensor_calls.fetch_add(1, std::memory_order_relaxed);
  check_plain_tensors("multi_tensor_scale", Device::cpu(), tensors);
  MT_ASSERT(factor_t.dtype() == DType::F64 && factor_t.numel() == 1 && factor_t.device().is_cpu(),
            "multi_tensor_scale: the factor is one f64 element, got ", factor_t.describe());
  const double factor = *static_cast<const double*>(factor_t.data_ptr());
  if (factor == 1.0) return;  // x * 1 == x for every x: nothing to write
  const ChunkPlan plan(tensors);
  for_each_item(plan, [&](int64_t, size_t t, int64_t start, int64_t n) {
    const Tensor& x = tensors[t];
    dispatch_float(x.dtype(), "multi_tensor_scale", [&]<typename T>() {
      using C = compute_t<T>;
      const C f = C(factor);
      alignas(64) C buf[kChunk];
      T* dst = static_cast<T*>(x.data_ptr()) + start;
      C* p = buf;
      if constexpr (std::is_same_v<T, C>) {
        p = dst;
      } else {
        load_contiguous<T, C>(dst, buf, n);
      }
      for (int64_t i = 0; i < n; ++i)
        p[i] = p[i] * f;
      if constexpr (!std::is_same_v<T, C>) store_contiguous<C, T>(p, dst, n);
    });
  });
}

}  // namespace mantissa::backend::cpu
