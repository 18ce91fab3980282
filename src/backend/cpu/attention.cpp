// Fused attention on the CPU (flash-attention style): blocks of queries against blocks of keys
// with an online softmax, so memory is O(T) per task, never the (Tq, Tk) score matrix. Inputs are
// loaded into fp32 blocks (f64 for f64), every product and sum happens there, and each output is
// rounded once. The backward recomputes the probabilities from the forward's log-sum-exp.
// These are the plain loops every CPU runs (and f64's); x86-64 with AVX2 + FMA runs the same
// blocks on the vectorized kernels of cpu/attention_x86.cpp (cpu/attention.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vector_isa.h"
#include "backend/shapes.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu {

namespace {

using fused_attention::kBlockK;
using fused_attention::kBlockQ;
using fused_attention::visible_keys;

// s (nq, nk) = scale * q (nq, d) . kt (d, nk): kt is the key block transposed, so the inner loop
// runs over contiguous keys and vectorizes.
template <typename C>
void scores_block(const C* q, const C* kt, int64_t nq, int64_t nk, int64_t d, C scale, C* s) {
  for (int64_t i = 0; i < nq; ++i) {
    C* row = s + i * kBlockK;
    std::fill(row, row + nk, C(0));
    for (int64_t e = 0; e < d; ++e) {
      const C qe = q[i * d + e];
      const C* kr = kt + e * kBlockK;
#pragma omp simd
      for (int64_t j = 0; j < nk; ++j)
        row[j] += qe * kr[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j)
      row[j] *= scale;
  }
}

// Loads rows [r0, r0 + n) of a contiguous (T, d) matrix into dst (n, d) and, when kt is given,
// its transpose (d, kBlockK).
template <typename T, typename C>
void load_rows(const T* src, int64_t r0, int64_t n, int64_t d, C* dst, C* kt) {
  load_contiguous<T, C>(src + r0 * d, dst, n * d);
  if (!kt) return;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = 0; e < d; ++e)
      kt[e * kBlockK + j] = dst[j * d + e];
}

template <typename T>
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionDims& n, const AttentionParams& p) {
  using C = compute_t<T>;
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  C* lp = static_cast<C*>(lse.data_ptr());
  const int64_t d = n.d, qblocks = (n.tq + kBlockQ - 1) / kBlockQ;
  const C scale = static_cast<C>(p.scale);
  // Per thread: q and o (kBlockQ, d), k (kBlockK, d) and its transpose, v, the scores, m and l.
  const int64_t scratch = 2 * kBlockQ * d + 3 * kBlockK * d + kBlockQ * kBlockK + 2 * kBlockQ;
  parallel_rows<C>(n.bh * qblocks, n.bh * n.tq * n.tk * d, scratch, [&](int64_t task, C* buf) {
    const int64_t bh = task / qblocks, i0 = (task % qblocks) * kBlockQ;
    const int64_t nq = std::min(kBlockQ, n.tq - i0);
    C* qb = buf;
    C* ob = qb + kBlockQ * d;
    C* kb = ob + kBlockQ * d;
    C* kt = kb + kBlockK * d;
    C* vb = kt + kBlockK * d;
    C* s = vb + kBlockK * d;
    C* m = s + kBlockQ * kBlockK;
    C* l = m + kBlockQ;
    load_rows<T, C>(qp + bh * n.tq * d, i0, nq, d, qb, nullptr);
    std::fill(ob, ob + nq * d, C(0));
    std::fill(m, m + nq, -std::numeric_limits<C>::infinity());
    std::fill(l, l + nq, C(0));
    // Causal: the block's last query sees keys up to its own index, later key blocks not at all.
    const int64_t key_end = p.causal ? std::min(n.tk, i0 + nq) : n.tk;
    for (int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
      const int64_t nk = std::min(kBlockK, n.tk - j0);
      load_rows<T, C>(kp + bh * n.tk * d, j0, nk, d, kb, kt);
      load_rows<T, C>(vp + bh * n.tk * d, j0, nk, d, vb, nullptr);
      scores_block(qb, kt, nq, nk, d, scale, s);
      for (int64_t i = 0; i < nq; ++i) {
        C* row = s + i * kBlockK;
        const int64_t seen = visible_keys(p.causal, i0 + i, j0, nk);
        if (seen == 0) continue;
        C mx = m[i];
        for (int64_t j = 0; j < seen; ++j)
          mx = std::max(mx, row[j]);
        // A row whose scores are all -inf so far has nothing to rescale and adds nothing.
        if (mx == -std::numeric_limits<C>::infinity()) continue;
        const C alpha = std::exp(m[i] - mx);
        C sum = 0;
        for (int64_t j = 0; j < seen; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        l[i] = l[i] * alpha + sum;
        m[i] = mx;
        C* o = ob + i * d;
#pragma omp simd
        for (int64_t e = 0; e < d; ++e)
          o[e] *= alpha;
        for (int64_t j = 0; j < seen; ++j) {
          const C pj = row[j];
          const C* vr = vb + j * d;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e)
            o[e] += pj * vr[e];
        }
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      const C inv = C(1) / l[i];
      C* o = ob + i * d;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e)
        o[e] *= inv;
      lp[bh * n.tq + i0 + i] = m[i] + std::log(l[i]);
    }
    store_contiguous<C, T>(ob, op + (bh * n.tq + i0) * d, nq * d);
  });
}

// One (query block, key block) pair of the backward: p = exp(s - lse) and
// ds = p * (dO . v - delta), both (nq, nk) in p and ds. Masked entries get p = ds = 0.
template <typename C>
void probabilities_block(const C* qb, const C* dob, const C* kt, const C* vt, const C* lse,
                         const C* delta, int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t d,
                         C scale, bool causal, C* pb, C* ds) {
  scores_block(qb, kt, nq, nk, d, scale, pb);
  scores_block(dob, vt, nq, nk, d, C(1), ds);
  for (int64_t i = 0; i < nq; ++i) {
    C* prow = pb + i * kBlockK;
    C* drow = ds + i * kBlockK;
    const int64_t seen = visible_keys(causal, i0 + i, j0, nk);
    const C li = lse[i], di = delta[i];
    for (int64_t j = 0; j < seen; ++j) {
      prow[j] = std::exp(prow[j] - li);
      drow[j] = prow[j] * (drow[j] - di);
    }
    std::fill(prow + seen, prow + nk, C(0));
    std::fill(drow + seen, drow + nk, C(0));
  }
}

template <typename T>
void attention_backward_impl(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& grad_q,
                             Tensor& grad_k, Tensor& grad_v, const AttentionDims& n,
                             const AttentionParams& p) {
  using C = compute_t<T>;
  const T* gp = static_cast<const T*>(grad_out.data_ptr());
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  const T* op = static_cast<const T*>(out.data_ptr());
  const C* lp = static_cast<const C*>(lse.data_ptr());
  const int64_t d = n.d, rows = n.bh * n.tq;
  const C scale = static_cast<C>(p.scale);
  const int64_t work = rows * n.tk * d;

  // delta_i = rowsum(dO_i * O_i): the softmax backward's per-row term, O(T) memory.
  std::vector<C> delta(static_cast<size_t>(rows));
  parallel_rows<C>(rows, rows * d, 2 * d, [&](int64_t r, C* buf) {
    load_contiguous<T, C>(gp + r * d, buf, d);
    load_contiguous<T, C>(op + r * d, buf + d, d);
    C acc = 0;
    for (int64_t e = 0; e < d; ++e)
      acc += buf[e] * buf[d + e];
    delta[size_t(r)] = acc;
  });

  // Per thread: q and dO blocks, k and v blocks with their transposes, p and ds, and two
  // accumulators (kBlockQ or kBlockK rows of d).
  const int64_t blk = std::max(kBlockQ, kBlockK);
  const int64_t scratch = 2 * kBlockQ * d + 4 * kBlockK * d + 2 * kBlockQ * kBlockK + 2 * blk * d;
  auto carve = [&](C* buf) {
    struct {
      C *qb, *dob, *kb, *kt, *vb, *vt, *pb, *ds, *acc0, *acc1;
    } b;
    b.qb = buf;
    b.dob = b.qb + kBlockQ * d;
    b.kb = b.dob + kBlockQ * d;
    b.kt = b.kb + kBlockK * d;
    b.vb = b.kt + kBlockK * d;
    b.vt = b.vb + kBlockK * d;
    b.pb = b.vt + kBlockK * d;
    b.ds = b.pb + kBlockQ * kBlockK;
    b.acc0 = b.ds + kBlockQ * kBlockK;
    b.acc1 = b.acc0 + blk * d;
    return b;
  };

  // Pass 1, one task per key block: dV = P^T dO and dK = scale * dS^T Q, each key block's
  // gradients owned by one task (no races).
  const int64_t kblocks = (n.tk + kBlockK - 1) / kBlockK;
  T* gkp = static_cast<T*>(grad_k.data_ptr());
  T* gvp = static_cast<T*>(grad_v.data_ptr());
  parallel_rows<C>(n.bh * kblocks, work, scratch, [&](int64_t task, C* buf) {
    const auto b = carve(buf);
    const int64_t bh = task / kblocks, j0 = (task % kblocks) * kBlockK;
    const int64_t nk = std::min(kBlockK, n.tk - j0);
    load_rows<T, C>(kp + bh * n.tk * d, j0, nk, d, b.kb, b.kt);
    load_rows<T, C>(vp + bh * n.tk * d, j0, nk, d, b.vb, b.vt);
    C* dk = b.acc0;
    C* dv = b.acc1;
    std::fill(dk, dk + nk * d, C(0));
    std::fill(dv, dv + nk * d, C(0));
    // Causal: queries before j0 see none of these keys.
    const int64_t first_q = p.causal ? (std::min(j0, n.tq) / kBlockQ) * kBlockQ : 0;
    for (int64_t i0 = first_q; i0 < n.tq; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, n.tq - i0);
      load_rows<T, C>(qp + bh * n.tq * d, i0, nq, d, b.qb, nullptr);
      load_rows<T, C>(gp + bh * n.tq * d, i0, nq, d, b.dob, nullptr);
      probabilities_block(b.qb, b.dob, b.kt, b.vt, lp + bh * n.tq + i0,
                          delta.data() + bh * n.tq + i0, i0, nq, j0, nk, d, scale, p.causal, b.pb,
                          b.ds);
      for (int64_t i = 0; i < nq; ++i) {
        const C* qr = b.qb + i * d;
        const C* gr = b.dob + i * d;
        for (int64_t j = 0; j < nk; ++j) {
          const C pij = b.pb[i * kBlockK + j], dsij = b.ds[i * kBlockK + j];
          C* dvr = dv + j * d;
          C* dkr = dk + j * d;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) {
            dvr[e] += pij * gr[e];
            dkr[e] += dsij * qr[e];
          }
        }
      }
    }
    for (int64_t e = 0; e < nk * d; ++e)
      dk[e] *= scale;
    store_contiguous<C, T>(dk, gkp + (bh * n.tk + j0) * d, nk * d);
    store_contiguous<C, T>(dv, gvp + (bh * n.tk + j0) * d, nk * d);
  });

  // Pass 2, one task per query block: dQ = scale * dS K, recomputing dS.
  const int64_t qblocks = (n.tq + kBlockQ - 1) / kBlockQ;
  T* gqp = static_cast<T*>(grad_q.data_ptr());
  parallel_rows<C>(n.bh * qblocks, work, scratch, [&](int64_t task, C* buf) {
    const auto b = carve(buf);
    const int64_t bh = task / qblocks, i0 = (task % qblocks) * kBlockQ;
    const int64_t nq = std::min(kBlockQ, n.tq - i0);
    load_rows<T, C>(qp + bh * n.tq * d, i0, nq, d, b.qb, nullptr);
    load_rows<T, C>(gp + bh * n.tq * d, i0, nq, d, b.dob, nullptr);
    C* dq = b.acc0;
    std::fill(dq, dq + nq * d, C(0));
    const int64_t key_end = p.causal ? std::min(n.tk, i0 + nq) : n.tk;
    for (int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
      const int64_t nk = std::min(kBlockK, n.tk - j0);
      load_rows<T, C>(kp + bh * n.tk * d, j0, nk, d, b.kb, b.kt);
      load_rows<T, C>(vp + bh * n.tk * d, j0, nk, d, b.vb, b.vt);
      probabilities_block(b.qb, b.dob, b.kt, b.vt, lp + bh * n.tq + i0,
                          delta.data() + bh * n.tq + i0, i0, nq, j0, nk, d, scale, p.causal, b.pb,
                          b.ds);
      for (int64_t i = 0; i < nq; ++i) {
        C* dqr = dq + i * d;
        for (int64_t j = 0; j < nk; ++j) {
          const C dsij = b.ds[i * kBlockK + j];
          const C* kr = b.kb + j * d;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e)
            dqr[e] += dsij * kr[e];
        }
      }
    }
    for (int64_t e = 0; e < nq * d; ++e)
      dq[e] *= scale;
    store_contiguous<C, T>(dq, gqp + (bh * n.tq + i0) * d, nq * d);
  });
}

// t where its head-dim elements are adjacent (any layout of B, H and T: the vectorized kernels
// read such rows in place), else a contiguous copy.
Tensor unit_stride_rows(const Tensor& t) {
  return t.size(3) <= 1 || t.stride(3) == 1 ? t.detach() : t.detach().contiguous();
}

#if defined(__x86_64__)
fused_attention::Heads heads_of(const Tensor& t) {
  return {t.size(1), t.stride(0), t.stride(1), t.stride(2)};
}
#endif

}  // namespace

void CpuBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, Tensor& out,
                           Tensor& lse, const AttentionParams& p) {
  const AttentionDims n = check_attention(q_in, k_in, v_in, out, lse);
  if (out.numel() == 0) return;
  MT_ASSERT(n.tk > 0, "attention needs at least one key");
  dispatch_float(q_in.dtype(), "attention", [&]<typename T>() {
#if defined(__x86_64__)
    if constexpr (std::is_same_v<compute_t<T>, float>) {
      if (backend::cpu_fused_attention_vectorized()) {
        const Tensor q = unit_stride_rows(q_in), k = unit_stride_rows(k_in),
                     v = unit_stride_rows(v_in);
        auto in = [](const Tensor& t) { return static_cast<const T*>(t.data_ptr()); };
        fused_attention::forward_x86<T>(in(q), heads_of(q), in(k), heads_of(k), in(v), heads_of(v),
                                        static_cast<T*>(out.data_ptr()), heads_of(out),
                                        static_cast<float*>(lse.data_ptr()), n, p);
        return;
      }
    }
#endif
    const Tensor q = contiguous_input(q_in), k = contiguous_input(k_in), v = contiguous_input(v_in);
    Tensor dst = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
    attention_forward<T>(q, k, v, dst, lse, n, p);
    if (!dst.is_same(out)) copy(dst, out);
  });
}

void CpuBackend::attention_backward(const Tensor& grad_out_in, const Tensor& q_in,
                                    const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                    const Tensor& lse_in, Tensor& grad_q, Tensor& grad_k,
                                    Tensor& grad_v, const AttentionParams& p) {
  const AttentionDims n = check_attention_backward(grad_out_in, q_in, k_in, v_in, out_in, lse_in,
                                                   grad_q, grad_k, grad_v);
  if (grad_k.numel() == 0 && grad_q.numel() == 0) return;
  const Tensor lse = contiguous_input(lse_in);
  dispatch_float(q_in.dtype(), "attention_backward", [&]<typename T>() {
#if defined(__x86_64__)
    if constexpr (std::is_same_v<compute_t<T>, float>) {
      if (backend::cpu_fused_attention_vectorized()) {
        const Tensor g = unit_stride_rows(grad_out_in), q = unit_stride_rows(q_in),
                     k = unit_stride_rows(k_in), v = unit_stride_rows(v_in),
                     out = unit_stride_rows(out_in);
        auto in = [](const Tensor& t) { return static_cast<const T*>(t.data_ptr()); };
        auto to = [](Tensor& t) { return static_cast<T*>(t.data_ptr()); };
        fused_attention::backward_x86<T>(
            in(g), heads_of(g), in(q), heads_of(q), in(k), heads_of(k), in(v), heads_of(v), in(out),
            heads_of(out), static_cast<const float*>(lse.data_ptr()), to(grad_q), heads_of(grad_q),
            to(grad_k), to(grad_v), heads_of(grad_k), n, p);
        return;
      }
    }
#endif
    const Tensor g = contiguous_input(grad_out_in), q = contiguous_input(q_in),
                 k = contiguous_input(k_in), v = contiguous_input(v_in),
                 out = contiguous_input(out_in);
    attention_backward_impl<T>(g, q, k, v, out, lse, grad_q, grad_k, grad_v, n, p);
  });
}

}  // namespace mantissa::backend::cpu

namespace mantissa::backend {

bool cpu_fused_attention_vectorized() {
#if defined(__x86_64__)
  static const bool fma_f16c = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0 && __builtin_cpu_supports("f16c") != 0;
  }();
  return fma_f16c && cpu::vector_isa() != cpu::VectorIsa::Baseline;
#else
  return false;
#endif
}

}  // namespace mantissa::backend
