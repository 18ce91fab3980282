// CPU fp8 GEMMs, emulated exactly (the contracts are in backend_ops.h): the codes' values (exact
// in bf16) through oneDNN's bf16 GEMM with fp32 sums. Per tensor, one GEMM whose epilogue scales
// the sums by the scales' product and adds the bias (scaled_matmul, dnnl_matmul.cpp); with block
// scales, one GEMM per K slice, each slice's sums times its scales, summed in fp32 a chunk of
// output rows at a time.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
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

// Several slices or several scales: the output a chunk of rows at a time, the chunk's slice sums
// (one batched GEMM where the operands are transposed views, else a GEMM per slice), at most 1
// MiB of them so that they stay in the cache, then each row summed over its slices and rounded
// into the output at once. (A pass per slice over all M x N sums, read and written from memory
// each time, took 7 % of a blockwise step, and a last pass rounded them.)
void sliced_gemm(CpuBackend& be, const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                 const Tensor& b, const Tensor& b_scales, int64_t b_rows, int64_t bk,
                 const Tensor* bias, Tensor& out) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const int64_t slices = a_scales.size(1), whole = K / bk;
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
    if (whole > 1) {
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
  sliced_gemm(*this, a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
}

void CpuBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                          const Tensor& b_scale_inv, Tensor& out) {
  check_fp8_gemm(a, a_scale_inv, b, b_scale_inv, out);
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  if (out.numel() == 0) return;
  // The codes as bf16 (exact), then the per-tensor emulation.
  Tensor ab = Tensor::empty({M, K}, DType::BF16), bb = Tensor::empty({N, K}, DType::BF16);
  copy(a, ab);
  copy(b, bb);
  block_scaled_gemm(ab, a_scale_inv.view({1, 1}), std::max<int64_t>(M, 1), bb,
                    b_scale_inv.view({1, 1}), std::max<int64_t>(N, 1), std::max<int64_t>(K, 1),
                    nullptr, out);
}

}  // namespace mantissa::backend::cpu
