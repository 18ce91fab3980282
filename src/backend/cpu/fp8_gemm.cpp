// CPU fp8 GEMMs, emulated exactly (the contracts are in backend_ops.h): the codes' values (exact
// in bf16) through oneDNN's bf16 GEMM with fp32 sums. Per tensor, one GEMM whose epilogue scales
// the sums by the scales' product and adds the bias (scaled_matmul, dnnl_matmul.cpp); with block
// scales, one GEMM per K slice, each slice's sums times its scales, summed in fp32 a chunk of
// output rows at a time.
#include <omp.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "backend/cpu/avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_isa.h"
#include "backend/fp8_math.h"
#include "mantissa/numerics/convert.h"

namespace mantissa::backend::cpu {
namespace {

// The scale of each of n rows in K slice k, from scales s (contiguous (row blocks, slices)) of
// blocks of `block` rows.
std::vector<float> row_scales(const Tensor& s, int64_t block, int64_t k, int64_t n) {
  const int64_t slices = s.size(1);
  const float* p = s.data<float>();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t r0 = 0, rb = 0; r0 < n; r0 += block, ++rb)
    std::fill(out.begin() + r0, out.begin() + std::min(n, r0 + block), p[rb * slices + k]);
  return out;
}

// One output row from its K slices' fp32 sums (S rows, `stride` apart in parts): ar = part_0 *
// f_0, then ar + part_s * f_s for s = 1 .. S-1, with f_s = fa[s] * sb[s][n], each product and
// sum rounded to fp32 in that order (what the GPU's kernels compute), then + bias[n]. Compiled
// for AVX-512 too (x86-64-v4), picked at load time: the loops are the same IEEE operations in
// the same order in both builds (no contraction: the library builds with -ffp-contract=off), so
// the bits are the same.
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

// The fast accumulator's slice sums of one output row (fast_accumulate_gemm): out[n] for n in
// [0, N) = fast_accumulate_sum over a[k0 + k] * bt[k0 + k, n], a the row (f32, contiguous)
// and bt the other operand transposed (K, N; f32, contiguous). The vector loop adds in the same
// order with the instruction's own rounding toward zero, which the scalar add_toward_zero
// computes exactly: the bits are the same.
void fast_row_scalar(const float* a, const float* bt, int64_t N, int64_t k0, int64_t kl,
                     int64_t promote, float* out) {
  for (int64_t n = 0; n < N; ++n)
    out[n] = fast_accumulate_sum(kl, promote,
                                 [&](int64_t k) { return a[k0 + k] * bt[(k0 + k) * N + n]; });
}

#if defined(__x86_64__)
// fast_accumulate on 16 lanes: the sum rounded toward zero by the instruction itself.
MT_AVX512 inline __m512 fast_accumulate16(__m512 acc, __m512 p) {
  const __m512 s = _mm512_add_round_ps(acc, p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  return _mm512_castsi512_ps(
      _mm512_andnot_si512(_mm512_set1_epi32(int(kFastAccumulatorDrop)), _mm512_castps_si512(s)));
}

// Eight vectors of 16 outputs at a time (independent chains hide the additions' latency).
MT_AVX512 void fast_row_avx512(const float* a, const float* bt, int64_t N, int64_t k0, int64_t kl,
                               int64_t promote, float* out) {
  constexpr int64_t kVectors = 8, kWidth = 16 * kVectors;
  for (int64_t n0 = 0; n0 < N; n0 += kWidth) {
    __mmask16 mask[kVectors];
    for (int64_t v = 0; v < kVectors; ++v) {
      const int64_t left = std::clamp<int64_t>(N - n0 - 16 * v, 0, 16);
      mask[v] = __mmask16((uint32_t(1) << left) - 1);
    }
    __m512 total[kVectors], acc[kVectors];
    for (int64_t v = 0; v < kVectors; ++v)
      total[v] = acc[v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kl; ++k) {
      const __m512 av = _mm512_set1_ps(a[k0 + k]);
      const float* row = bt + (k0 + k) * N + n0;
      for (int64_t v = 0; v < kVectors; ++v) {
        const __m512 bv = _mm512_maskz_loadu_ps(mask[v], row + 16 * v);
        acc[v] = fast_accumulate16(acc[v], _mm512_mul_ps(av, bv));
      }
      if (promote > 0 && (k + 1) % promote == 0) {
        for (int64_t v = 0; v < kVectors; ++v) {
          total[v] = _mm512_add_ps(total[v], acc[v]);
          acc[v] = _mm512_setzero_ps();
        }
      }
    }
    for (int64_t v = 0; v < kVectors; ++v)
      _mm512_mask_storeu_ps(out + n0 + 16 * v, mask[v], _mm512_add_ps(total[v], acc[v]));
  }
}
#endif

// The fast accumulator's slice sums of rows [m0, m0 + rows) into parts (S, rows, N): a (f32,
// (M, K) contiguous) and bt (f32, (K, N) contiguous).
void fast_parts(const float* a, const float* bt, int64_t K, int64_t N, int64_t m0, int64_t rows,
                int64_t bk, int64_t promote, float* parts) {
  const int64_t S = std::max<int64_t>((K + bk - 1) / bk, 1);
#if defined(__x86_64__)
  const bool avx512 = vector_isa() == VectorIsa::Avx512;
#endif
#pragma omp parallel for schedule(static) if (rows * N * K >= (int64_t(1) << 16) && \
                                              !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + (m0 + r) * K;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t k0 = s * bk, kl = std::max<int64_t>(std::min(bk, K - k0), 0);
      float* out = parts + (s * rows + r) * N;
#if defined(__x86_64__)
      if (avx512) {
        fast_row_avx512(ar, bt, N, k0, kl, promote, out);
        continue;
      }
#endif
      fast_row_scalar(ar, bt, N, k0, kl, promote, out);
    }
  }
}

// Several slices or several scales: the output a chunk of rows at a time, the chunk's slice sums
// (one batched GEMM where the operands are transposed views, else a GEMM per slice), at most 1
// MiB of them so that they stay in the cache, then each row summed over its slices and rounded
// into the output at once. (A pass per slice over all M x N sums, read and written from memory
// each time, took 7 % of a blockwise step, and a last pass rounded them.)
// With `fast_promote` the slice sums are the fast accumulator's (fast_parts) instead.
void sliced_gemm(CpuBackend& be, const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                 const Tensor& b, const Tensor& b_scales, int64_t b_rows, int64_t bk,
                 const Tensor* bias, Tensor& out, std::optional<int64_t> fast_promote) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const int64_t slices = a_scales.size(1), whole = K / bk;
  Tensor a_f32, bt_f32;  // fast: the operands as fast_parts reads them
  if (fast_promote) {
    a_f32 = Tensor::empty({M, K}, DType::F32);
    bt_f32 = Tensor::empty({K, N}, DType::F32);
    be.copy(a, a_f32);
    be.copy(b.t(), bt_f32);
  }
  constexpr int64_t kChunkBytes = int64_t(1) << 20;
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / (slices * N * 4), 1, M);
  const bool rounded_here = out.dtype() != DType::F32;
  Tensor bias_f32;
  if (bias) {
    bias_f32 = Tensor::empty({N}, DType::F32);
    be.copy(*bias, bias_f32);
  }
  const float* bias_p = bias ? bias_f32.data<float>() : nullptr;
  const Tensor sa_c = a_scales.contiguous(), sb_c = b_scales.contiguous();
  std::vector<std::vector<float>> sa, sb;
  std::vector<const float*> sbp;
  for (int64_t k = 0; k < slices; ++k) {
    sa.push_back(row_scales(sa_c, a_rows, k, M));
    sb.push_back(row_scales(sb_c, b_rows, k, N));
    sbp.push_back(sb.back().data());
  }
  Tensor storage = Tensor::empty({slices * chunk * N}, DType::F32);
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t rows = std::min(chunk, M - m0);
    const Tensor ac = a.narrow(0, m0, rows);
    Tensor parts = storage.narrow(0, 0, slices * rows * N).view({slices, rows, N});
    int64_t s = 0;
    if (fast_promote) {
      fast_parts(a_f32.data<float>(), bt_f32.data<float>(), K, N, m0, rows, bk, *fast_promote,
                 parts.data<float>());
      s = slices;
    }
    if (whole > 1 && s == 0) {
      const Tensor a3 = slice_batch(ac, 0, whole, bk), b3 = slice_batch(b, 0, whole, bk);
      if (a3.defined() && b3.defined()) {
        Tensor p = parts.narrow(0, 0, whole);
        be.matmul(a3, b3.transpose(1, 2), nullptr, p, MatmulOptions{});
        s = whole;
      }
    }
    for (; s < slices; ++s) {
      const int64_t k0 = s * bk, kl = std::min(bk, K - k0);
      Tensor p = parts.narrow(0, s, 1);
      be.matmul(ac.narrow(1, k0, kl).unsqueeze(0), b.narrow(1, k0, kl).t().unsqueeze(0), nullptr, p,
                MatmulOptions{});
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
        if (out.dtype() == DType::BF16) {
          convert(ar, out.data<bfloat16>() + m * N, size_t(N));
        } else if (out.dtype() == DType::F16) {
          convert(ar, out.data<half>() + m * N, size_t(N));
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::block_scaled_gemm(const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                                   const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                                   int64_t bk, const Tensor* bias, Tensor& out) {
  check_block_scaled_gemm(a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  if (out.numel() == 0) return;
  if (a_scales.numel() == 1 && b_scales.numel() == 1) {
    // Per tensor: one GEMM scaled by the scales' product (in fp32) in its epilogue, which adds
    // the bias (widened to f32) and rounds once into out's dtype.
    const float scale = *a_scales.data<float>() * *b_scales.data<float>();
    Tensor bias_f32;
    if (bias && (bias->dtype() != DType::F32 || !bias->is_contiguous())) {
      bias_f32 = Tensor::empty({N}, DType::F32);
      copy(*bias, bias_f32);
    }
    const Tensor* bias_arg = bias ? (bias_f32.defined() ? &bias_f32 : bias) : nullptr;
    Tensor out3 = out.view({1, M, N});
    scaled_matmul(*this, a.unsqueeze(0), b.t().unsqueeze(0), bias_arg, out3, MatmulOptions{},
                  scale);
    return;
  }
  if (K == 0) {
    // No slice: the sums are 0, the output the bias.
    Tensor zeros_f32 = Tensor::zeros({M, N}, DType::F32);
    if (bias) {
      Tensor b2 = Tensor::empty({1, N}, DType::F32);
      copy(bias->view({1, N}), b2);
      binary(BinaryOp::Add, zeros_f32, b2, zeros_f32);
    }
    copy(zeros_f32, out);
    return;
  }
  sliced_gemm(*this, a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out, std::nullopt);
}

void CpuBackend::fast_accumulate_gemm(const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                                      const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                                      int64_t bk, int64_t promote, const Tensor* bias,
                                      Tensor& out) {
  check_block_scaled_gemm(a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
  MT_ASSERT(promote >= 0, "fast_accumulate_gemm: promote must be >= 0, got ", promote);
  if (out.numel() == 0) return;
  // No product (K = 0): the sums are 0 and there is nothing to accumulate narrowly.
  if (a.size(1) == 0)
    return block_scaled_gemm(a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
  sliced_gemm(*this, a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out, promote);
}

void CpuBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                          const Tensor& b_scale_inv, bool fast_accumulate, Tensor& out) {
  check_fp8_gemm(a, a_scale_inv, b, b_scale_inv, out);
  if (out.numel() == 0) return;
  // The emulation (the CPU has no fast accumulator of its own: fast is the model's).
  emulated_fp8_gemm(*this, a, a_scale_inv, b, b_scale_inv, fast_accumulate, out);
}

}  // namespace mantissa::backend::cpu
