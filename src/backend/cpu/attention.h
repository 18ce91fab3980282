// Internal: what the CPU's fused attention shares between its two files: cpu/attention.cpp (the
// plain loops every CPU runs, and the dispatch) and cpu/attention_x86.cpp (the vectorized kernels
// of x86-64). Not part of the backend's interface.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/backend.h"
#include "backend/shapes.h"

namespace mantissa::backend::cpu::fused_attention {

constexpr int64_t kBlockQ = 64;  // query rows per block
constexpr int64_t kBlockK = 64;  // keys per block

// Keys [j0, j0 + nk) that query row i (absolute) may see: the causal limit is key i.
inline int64_t visible_keys(bool causal, int64_t i, int64_t j0, int64_t nk) {
  return causal ? std::clamp<int64_t>(i - j0 + 1, 0, nk) : nk;
}

// Where the rows of a (B, H, T, D) operand are: element strides of B, H and T (D's is 1). The
// kernels read q, k, v, dO and O, and write O, in any such layout: the heads of a fused qkv
// projection's output, (B, T, 3, H, D), are read where they are, and O is written straight
// into (B, T, H, D), the layout the output projection reads (the copies in between were a
// twentieth of a ViT step).
struct Heads {
  int64_t heads, sb, sh, st;
  int64_t row(int64_t bh, int64_t r) const {
    return (bh / heads) * sb + (bh % heads) * sh + r * st;
  }
};

// The vectorized kernels (x86-64 with AVX2, FMA and F16C; 16 lanes where vector_isa() is
// AVX-512; bf16's two bf16 x bf16 products on vdpbf16ps with avx512_bf16), for T float and the
// storage types computed in float (bfloat16, half, the fp8 formats): out (lo) and lse from q, k
// and v; the gradients gq (lgq), gk and gv (lkv) from dO (lg), q, k, v, the forward's output
// and its lse.
template <typename T>
void forward_x86(const T* qp, const Heads& lq, const T* kp, const Heads& lk, const T* vp,
                 const Heads& lv, T* op, const Heads& lo, float* lp, const AttentionDims& n,
                 const AttentionParams& p);
template <typename T>
void backward_x86(const T* gp, const Heads& lg, const T* qp, const Heads& lq, const T* kp,
                  const Heads& lk, const T* vp, const Heads& lv, const T* op, const Heads& lo,
                  const float* lp, T* gqp, const Heads& lgq, T* gkp, T* gvp, const Heads& lkv,
                  const AttentionDims& n, const AttentionParams& p);

}  // namespace mantissa::backend::cpu::fused_attention
