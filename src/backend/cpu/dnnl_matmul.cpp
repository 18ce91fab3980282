// The CPU's GEMM: (B, M, K) @ (B, K, N) through oneDNN's matmul (dnnl_support.h says which
// dtypes it computes and how the others are emulated), f64 on the cache-blocked loops below.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/dnnl_support.h"
#include "backend/shapes.h"

namespace mantissa::backend::cpu {
namespace {

using namespace onednn;

// ---- matmul through oneDNN ----------------------------------------------------------------------

// The dims and strides of a (batch, rows, cols) operand for oneDNN's optimized matmul: each
// matrix row- or column-major (unit stride on one side, leading dimension at least the other
// side), batches not overlapping; a broadcast batch (size 1 or stride 0) becomes batch 1.
// Returns false when the layout needs a copy. Strides of size-1 dims are normalized so that a
// vector is always one of the two plain layouts.
bool plain_layout(const Tensor& t, memory::dims& dims, memory::dims& strides) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t nb = t.size(0) == 1 || t.stride(0) == 0 ? 1 : t.size(0);
  int64_t sr = t.stride(1), sc = t.stride(2);
  if (rows == 1) sr = sc == 1 ? cols : 1;
  if (cols == 1) sc = sr == 1 ? rows : 1;
  const bool row_major = sc == 1 && sr >= cols, col_major = sr == 1 && sc >= rows;
  if (!row_major && !col_major) return false;
  const int64_t extent = row_major ? sr * rows : sc * cols;
  const int64_t sb = nb == 1 ? extent : t.stride(0);
  if (sb < extent) return false;
  dims = {nb, rows, cols};
  strides = {sb, sr, sc};
  return true;
}

// oneDNN's GEMM packs the operand that is strided along K (a transposed A, a row-major B) in
// panels that step K times over its leading dimension. When that step is a multiple of 4 KiB,
// the rows of a panel share one set of the L1 cache (4K aliasing) and the GEMM runs at about half
// speed. Measured with oneDNN 2.6 on AVX2, one thread: a weight gradient (1024 x 8192)^T @
// (8192 x 256) took 125 ms with a leading dimension of 1024 floats and 63 ms with 1040 (the
// copy: 6 ms); an LSTM step's (128 x 256) @ (256 x 1024), 1.55 ms and 0.73 ms. The cure is a
// copy whose leading dimension is 64 bytes longer: one pass over the operand.
constexpr int64_t kAliasingBytes = 4096, kPaddingBytes = 64;

bool aliased_along_k(int64_t k_stride, int64_t k, DType d) {
  return k > 16 && k_stride > 1 && (k_stride * int64_t(dtype_size(d))) % kAliasingBytes == 0;
}

// A copy of `lines` rows of `width` elements (row stride `ld`, batch stride `sb`, `nb` batches)
// of t's storage, as a contiguous (nb, lines, width + padding) tensor.
Tensor padded_lines(const Tensor& t, int64_t nb, int64_t sb, int64_t lines, int64_t ld,
                    int64_t width) {
  const int64_t es = int64_t(t.element_size());
  const int64_t padded = width + kPaddingBytes / es;
  Tensor out = Tensor::empty({nb, lines, padded}, t.dtype(), t.device());
  const auto* src = static_cast<const char*>(t.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t rows = nb * lines;
#pragma omp parallel for schedule(static) if (rows * width * es >= (int64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / lines, line = r % lines;
    std::memcpy(dst + r * padded * es, src + (b * sb + line * ld) * es, size_t(width * es));
  }
  return out;
}

// dst(B, M, N) = scale * (a @ b) [+ bias], all in oneDNN-native dtypes; dst contiguous; bias f32
// when scale is not 1. oneDNN 2.6 adds its bias argument before the output scale, so a scaled
// product takes its bias as a binary post-op, which runs after the scale (both in fp32 before the
// one rounding into dst; checked against a separate add by Fp8Gemm's tests).
void dnnl_matmul(CpuBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& dst,
                 const float& scale) {
  memory::dims ad, as, bd, bs;
  const bool a_plain = plain_layout(a, ad, as), b_plain = plain_layout(b, bd, bs);
  if (!a_plain || !b_plain) {
    const Tensor ac = a_plain ? a : converted(be, a, a.dtype());
    const Tensor bc = b_plain ? b : converted(be, b, b.dtype());
    dnnl_matmul(be, ac, bc, bias, dst, scale);
    return;
  }
  const int64_t k = ad[2];
  if (aliased_along_k(as[2], k, a.dtype())) {  // a column-major (B, M, K): K lines of M
    const Tensor lines = padded_lines(a, ad[0], as[0], k, as[2], ad[1]);
    dnnl_matmul(be, lines.narrow(2, 0, ad[1]).transpose(1, 2), b, bias, dst, scale);
    return;
  }
  if (aliased_along_k(bs[1], k, b.dtype())) {  // b row-major (B, K, N): K lines of N
    const Tensor lines = padded_lines(b, bd[0], bs[0], k, bs[1], bd[2]);
    dnnl_matmul(be, a, lines.narrow(2, 0, bd[2]), bias, dst, scale);
    return;
  }
  const bool scaled = scale != 1.0f;
  MT_ASSERT(!scaled || !bias || bias->dtype() == DType::F32, "a scaled matmul takes an f32 bias");
  const memory::dims dd = {dst.size(0), dst.size(1), dst.size(2)};
  const int64_t n = dd[2];
  Key key;
  key.add('M').add(ad).add(as).add(bd).add(bs).add(dd);
  key.add(int64_t(a.dtype())).add(int64_t(b.dtype())).add(int64_t(dst.dtype()));
  key.add(bias ? int64_t(bias->dtype()) : -1).add(int64_t(scaled));
  const bool copies_help = !(a.is_contiguous() && b.is_contiguous());
  auto entry = cached(key, [&] {
    Entry e;
    const memory::desc a_md(ad, dnnl_type(a.dtype()), as), b_md(bd, dnnl_type(b.dtype()), bs);
    const memory::desc d_md(dd, dnnl_type(dst.dtype()), memory::dims{dd[1] * n, n, 1});
    const memory::desc bias_md =
        bias ? memory::desc({1, 1, n}, dnnl_type(bias->dtype()), memory::dims{n, n, 1})
             : memory::desc();
    const memory::desc scale_md({1}, mdt::f32, memory::dims{1});
    constexpr int kBiasPostOp = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
    dnnl::primitive_attr attr = user_scratchpad();
    if (scaled) {
      attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
      if (bias) {
        dnnl::post_ops po;
        po.append_binary(dnnl::algorithm::binary_add, bias_md);
        attr.set_post_ops(po);
      }
    }
    const bool bias_arg = bias && !scaled;
    const dnnl::matmul::desc desc = bias_arg ? dnnl::matmul::desc(a_md, b_md, bias_md, d_md)
                                             : dnnl::matmul::desc(a_md, b_md, d_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine(), true);
    if (!pd || (copies_help && is_reference(pd))) {
      e.rejected = true;
      return e;
    }
    e.prim = dnnl::matmul(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, a_md, a_md));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, b_md, b_md));
    if (bias) {
      const int arg = bias_arg ? DNNL_ARG_BIAS : kBiasPostOp;
      e.args.push_back(plan_arg(arg, false, bias_md, bias_md));
    }
    if (scaled) e.args.push_back(plan_arg(DNNL_ARG_ATTR_OUTPUT_SCALES, false, scale_md, scale_md));
    e.args.push_back(plan_arg(DNNL_ARG_DST, true, d_md, d_md));
    finish_entry(e);
    return e;
  });
  if (entry->rejected) {
    MT_ASSERT(copies_help, "oneDNN has no matmul for ", a.describe(), " @ ", b.describe());
    dnnl_matmul(be, converted(be, a, a.dtype()), converted(be, b, b.dtype()), bias, dst, scale);
    return;
  }
  const void* bias_ptr = bias ? bias->data_ptr() : nullptr;
  if (bias && scaled) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), bias_ptr, &scale, dst.data_ptr()});
  } else if (bias) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), bias_ptr, dst.data_ptr()});
  } else if (scaled) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), &scale, dst.data_ptr()});
  } else {
    execute(*entry, {a.data_ptr(), b.data_ptr(), dst.data_ptr()});
  }
}

void matmul_f64(CpuBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out);

// A batch dim that only broadcasts (stride 0) becomes size 1: no copy ever repeats it.
Tensor unbroadcast_batch(const Tensor& t) {
  return t.size(0) > 1 && t.stride(0) == 0 ? t.detach().narrow(0, 0, 1) : t;
}

// Cache-blocked: a tile of 64 rows of C stays in L2 while a 256 x 256 panel of B streams
// through; the innermost loop runs along contiguous rows of B and C and vectorizes.
void matmul_f64(CpuBackend& be, const Tensor& a_in, const Tensor& b_in, const Tensor* bias,
                Tensor& out) {
  auto unit_rows = [](const Tensor& t) {
    return t.dtype() == DType::F64 && (t.stride(2) == 1 || t.size(2) == 1);
  };
  const Tensor a = unit_rows(a_in) ? a_in : converted(be, a_in, DType::F64);
  const Tensor b = unit_rows(b_in) ? b_in : converted(be, b_in, DType::F64);
  Tensor c = out.dtype() == DType::F64 ? out : Tensor::empty(out.shape(), DType::F64, out.device());
  const int64_t nbatch = c.size(0), M = c.size(1), N = c.size(2), K = a.size(2);
  const double* A = a.data<double>();
  const double* B = b.data<double>();
  double* C = c.data<double>();
  const int64_t sab = a.size(0) == 1 ? 0 : a.stride(0), sam = a.stride(1);
  const int64_t sbb = b.size(0) == 1 ? 0 : b.stride(0), sbk = b.stride(1);
  if (bias) {
    const Tensor bv = as_f64(be, *bias);
    const double* bp = bv.data<double>();
    for (int64_t r = 0; r < nbatch * M; ++r)
      std::copy(bp, bp + N, C + r * N);
  } else {
    std::fill(C, C + nbatch * M * N, 0.0);
  }
  constexpr int64_t kMB = 64, kKB = 256, kNB = 256;
  const int64_t mblocks = (M + kMB - 1) / kMB, tiles = nbatch * mblocks;
#pragma omp parallel for schedule(dynamic) if (tiles > 1 && worth_threads(nbatch * M * N * K))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t bi = t / mblocks, i0 = (t % mblocks) * kMB, i1 = std::min(M, i0 + kMB);
    const double* Ab = A + bi * sab;
    const double* Bb = B + bi * sbb;
    double* Cb = C + bi * M * N;
    for (int64_t k0 = 0; k0 < K; k0 += kKB) {
      const int64_t k1 = std::min(K, k0 + kKB);
      for (int64_t j0 = 0; j0 < N; j0 += kNB) {
        const int64_t j1 = std::min(N, j0 + kNB);
        for (int64_t i = i0; i < i1; ++i) {
          double* crow = Cb + i * N;
          const double* arow = Ab + i * sam;
          for (int64_t k = k0; k < k1; ++k) {
            const double aik = arow[k];
            const double* brow = Bb + k * sbk;
            for (int64_t j = j0; j < j1; ++j)
              crow[j] += aik * brow[j];
          }
        }
      }
    }
  }
  if (!c.is_same(out)) be.copy(c, out);
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
                        const MatmulOptions& options) {
  scaled_matmul(*this, a, b, bias, out, options, 1.0f);
}

void scaled_matmul(CpuBackend& be, const Tensor& a_in, const Tensor& b_in, const Tensor* bias,
                   Tensor& out, const MatmulOptions& options, float scale) {
  const auto [nbatch, M, N, K] = check_matmul(a_in, b_in, bias, out);
  if (out.numel() == 0) return;
  if (K == 0) {
    if (bias) {
      be.copy(*bias, out);
    } else {
      be.fill(out, 0.0);
    }
    return;
  }
  const Tensor a = unbroadcast_batch(a_in), b = unbroadcast_batch(b_in);
  if (nbatch > 1 && a.size(0) == 1 && b.size(0) == 1) {
    // Every batch is the same product: compute it once.
    Tensor one = Tensor::empty({1, M, N}, out.dtype(), out.device());
    scaled_matmul(be, a, b, bias, one, options, scale);
    be.copy(one, out);
    return;
  }
  const bool scaled = scale != 1.0f;
  if (a.dtype() == DType::F64 || b.dtype() == DType::F64) {
    MT_ASSERT(!scaled, "matmul: an output scale is for f32/bf16/f16 operands, got f64");
    matmul_f64(be, a, b, bias, out);
    return;
  }
  const DType kd = kernel_dtype(a.dtype(), options.input_rounding);
  const Tensor ak = prepare(be, a, kd, options.input_rounding);
  const Tensor bk = prepare(be, b, kd, options.input_rounding);
  Tensor bias_k;
  if (bias) {
    const bool ok =
        bias->is_contiguous() && (bias->dtype() == DType::F32 || (bias->dtype() == kd && !scaled));
    bias_k = ok ? *bias : converted(be, *bias, DType::F32);
  }
  Tensor dst = native_output(out.dtype(), kd) ? out : Tensor::empty(out.shape(), DType::F32);
  with_dnnl("matmul", [&] { dnnl_matmul(be, ak, bk, bias ? &bias_k : nullptr, dst, scale); });
  if (!dst.is_same(out)) be.copy(dst, out);  // the one rounding into f16 / fp8
}

}  // namespace mantissa::backend::cpu
