// Fused attention on CUDA (flash-attention style, fp32 accumulators, no tensor cores).
//
// Forward: one block per (b*h, 16 query rows); each warp owns 4 query rows, each lane one key of
// the 32-key tile staged in shared memory (scores), and d = lane + 32c of the output (the
// weighted sum), with an online softmax across tiles. Causal blocks stop at their last query.
// Backward: a per-row delta = rowsum(dO * O); then one block per (b*h, 32 keys) walks the query
// tiles, recomputes p = exp(s - lse), accumulates dK and dV in registers and adds its share of
// dQ atomically into an fp32 (f64 for f64) buffer, which a last pass rounds into grad_q.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/shapes.h"

namespace mantissa::backend::cuda {

namespace {

constexpr int kMaxHeadDim = 128;  // 4 values of a row per lane
constexpr int kTile = 32;         // keys per forward tile, queries per backward tile: a warp
constexpr int kFwdWarps = 4;
constexpr int kFwdRowsPerWarp = 4;
constexpr int kFwdRows = kFwdWarps * kFwdRowsPerWarp;  // query rows per forward block
constexpr int kBwdWarps = 8;
constexpr int kBwdKeysPerWarp = 4;
constexpr int kBwdKeys = kBwdWarps * kBwdKeysPerWarp;  // keys per backward block (== kTile)
static_assert(kBwdKeys == kTile, "the dQ pass indexes ds as (key, query) tiles of kTile");
constexpr size_t kDefaultSmem = 48 * 1024;

// Rows [r0, r0 + n) of a contiguous (T, d) matrix into shared memory (row stride ld) in the
// compute type; rows n..rows-1 become zeros. vec: 2-byte data with d % 8 == 0 and a 16-byte
// aligned base, read 8 values per 16-byte load.
template <typename S, typename C>
__device__ void load_tile(C* dst, int ld, const S* src, int64_t r0, int n, int rows, int d,
                          bool vec) {
  if constexpr (sizeof(S) == 2) {
    if (vec) {
      const int per_row = d / 8;
      for (int idx = threadIdx.x; idx < rows * per_row; idx += blockDim.x) {
        const int r = idx / per_row, c = (idx % per_row) * 8;
        C* out = dst + r * ld + c;
        if (r < n) {
          const uint4 raw = *reinterpret_cast<const uint4*>(src + (r0 + r) * d + c);
          const S* h = reinterpret_cast<const S*>(&raw);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            out[e] = static_cast<C>(load(h + e));
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            out[e] = C(0);
        }
      }
      return;
    }
  }
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d, c = idx % d;
    dst[r * ld + c] = r < n ? static_cast<C>(load(src + (r0 + r) * d + c)) : C(0);
  }
}

template <typename C>
__device__ __forceinline__ C dot(const C* a, const C* b, int d) {
  C acc = 0;
  for (int e = 0; e < d; ++e)
    acc += a[e] * b[e];
  return acc;
}

struct AttnShape {
  int64_t tq, tk;
  int d;
  bool causal, vec;
};

// Shared memory: q (kFwdRows, d), k (kTile, d + 1: lanes read different keys at one e without
// bank conflicts), v (kTile, d).
template <typename C>
size_t forward_smem(int d) {
  return sizeof(C) * size_t(kFwdRows * d + kTile * (d + 1) + kTile * d);
}

template <typename S, int NC>
__global__ void __launch_bounds__(kFwdWarps * 32)
    attention_forward_kernel(const S* __restrict__ q, const S* __restrict__ k,
                             const S* __restrict__ v, S* __restrict__ out,
                             compute_t<S>* __restrict__ lse, AttnShape sh, compute_t<S> scale) {
  using C = compute_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = sh.d;
  C* qs = reinterpret_cast<C*>(smem_raw);
  C* ks = qs + kFwdRows * d;
  C* vs = ks + kTile * (d + 1);
  // blockIdx.x = bh * query tiles + tile (one flat grid dim: B * H may exceed gridDim.y's 65535).
  const int64_t ntiles = (sh.tq + kFwdRows - 1) / kFwdRows;
  const int64_t bh = int64_t(blockIdx.x) / ntiles, i0 = (int64_t(blockIdx.x) % ntiles) * kFwdRows;
  const int nq = int(min(int64_t(kFwdRows), sh.tq - i0));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const C neg_inf = C(-INFINITY);
  load_tile(qs, d, q + bh * sh.tq * d, i0, nq, kFwdRows, d, sh.vec);

  C m[kFwdRowsPerWarp], l[kFwdRowsPerWarp], o[kFwdRowsPerWarp][NC];
#pragma unroll
  for (int r = 0; r < kFwdRowsPerWarp; ++r) {
    m[r] = neg_inf;
    l[r] = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      o[r][c] = 0;
  }
  // Causal: the block's last query sees keys up to its own index, later tiles not at all.
  const int64_t key_end = sh.causal ? min(sh.tk, i0 + nq) : sh.tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    const int nk = int(min(int64_t(kTile), sh.tk - j0));
    __syncthreads();  // the previous tile is consumed
    load_tile(ks, d + 1, k + bh * sh.tk * d, j0, nk, kTile, d, sh.vec);
    load_tile(vs, d, v + bh * sh.tk * d, j0, nk, kTile, d, sh.vec);
    __syncthreads();
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kFwdRowsPerWarp; ++r) {
      const int qi = warp * kFwdRowsPerWarp + r;
      if (qi >= nq) continue;  // warp-uniform
      const int64_t i = i0 + qi;
      C s = neg_inf;
      if (lane < nk && (!sh.causal || j <= i)) s = dot(qs + qi * d, ks + lane * (d + 1), d) * scale;
      const C mx = fmax(m[r], warp_max(s));
      // Nothing seen yet: nothing to rescale or add (mx is the same in every lane).
      if (mx == neg_inf) continue;
      const C alpha = m_exp(m[r] - mx);
      const C p = m_exp(s - mx);
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = mx;
#pragma unroll
      for (int c = 0; c < NC; ++c)
        o[r][c] *= alpha;
      for (int jj = 0; jj < nk; ++jj) {
        const C pj = __shfl_sync(0xffffffffu, p, jj);
        const C* vr = vs + jj * d;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e = lane + 32 * c;
          if (e < d) o[r][c] += pj * vr[e];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kFwdRowsPerWarp; ++r) {
    const int qi = warp * kFwdRowsPerWarp + r;
    if (qi >= nq) continue;
    const int64_t row = bh * sh.tq + i0 + qi;
    const C inv = C(1) / l[r];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e = lane + 32 * c;
      if (e < d) store(out + row * d + e, o[r][c] * inv);
    }
    if (lane == 0) lse[row] = m[r] + m_log(l[r]);
  }
}

// delta[r] = sum_e dO[r, e] * O[r, e], one warp per row.
template <typename S>
__global__ void attention_delta_kernel(const S* __restrict__ grad_out, const S* __restrict__ out,
                                       compute_t<S>* __restrict__ delta, int64_t rows, int d) {
  using C = compute_t<S>;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together
  C acc = 0;
  for (int e = lane; e < d; e += 32)
    acc += static_cast<C>(load(grad_out + row * d + e)) * static_cast<C>(load(out + row * d + e));
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// Shared memory: q and dO tiles (kTile, d + 1: lane = query reads its own row), k and v of the
// block's keys (kBwdKeys, d), ds (key, query), and the tile's lse and delta.
template <typename C>
size_t backward_smem(int d) {
  return sizeof(C) * size_t(2 * kTile * (d + 1) + 2 * kBwdKeys * d + kBwdKeys * kTile + 2 * kTile);
}

template <typename S, int NC>
__global__ void __launch_bounds__(kBwdWarps * 32)
    attention_backward_kernel(const S* __restrict__ grad_out, const S* __restrict__ q,
                              const S* __restrict__ k, const S* __restrict__ v,
                              const compute_t<S>* __restrict__ lse,
                              const compute_t<S>* __restrict__ delta,
                              compute_t<S>* __restrict__ dq_acc, S* __restrict__ grad_k,
                              S* __restrict__ grad_v, AttnShape sh, compute_t<S> scale) {
  using C = compute_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = sh.d, ld = d + 1;
  C* qs = reinterpret_cast<C*>(smem_raw);
  C* dos = qs + kTile * ld;
  C* ks = dos + kTile * ld;
  C* vs = ks + kBwdKeys * d;
  C* dss = vs + kBwdKeys * d;
  C* lse_s = dss + kBwdKeys * kTile;
  C* delta_s = lse_s + kTile;
  // blockIdx.x = bh * key tiles + tile (one flat grid dim: B * H may exceed gridDim.y's 65535).
  const int64_t ntiles = (sh.tk + kBwdKeys - 1) / kBwdKeys;
  const int64_t bh = int64_t(blockIdx.x) / ntiles, j0 = (int64_t(blockIdx.x) % ntiles) * kBwdKeys;
  const int nk = int(min(int64_t(kBwdKeys), sh.tk - j0));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  load_tile(ks, d, k + bh * sh.tk * d, j0, nk, kBwdKeys, d, sh.vec);
  load_tile(vs, d, v + bh * sh.tk * d, j0, nk, kBwdKeys, d, sh.vec);

  C dk[kBwdKeysPerWarp][NC], dv[kBwdKeysPerWarp][NC];
#pragma unroll
  for (int r = 0; r < kBwdKeysPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < NC; ++c)
      dk[r][c] = dv[r][c] = 0;
  }
  // Causal: queries before j0 see none of these keys.
  const int64_t first_q = sh.causal ? (min(j0, sh.tq) / kTile) * kTile : 0;
  for (int64_t i0 = first_q; i0 < sh.tq; i0 += kTile) {
    const int nq = int(min(int64_t(kTile), sh.tq - i0));
    __syncthreads();  // the previous tile (q, dO, ds) is consumed
    load_tile(qs, ld, q + bh * sh.tq * d, i0, nq, kTile, d, sh.vec);
    load_tile(dos, ld, grad_out + bh * sh.tq * d, i0, nq, kTile, d, sh.vec);
    if (threadIdx.x < kTile) {
      const int t = threadIdx.x;
      lse_s[t] = t < nq ? lse[bh * sh.tq + i0 + t] : C(0);
      delta_s[t] = t < nq ? delta[bh * sh.tq + i0 + t] : C(0);
    }
    __syncthreads();
    const int64_t i = i0 + lane;
#pragma unroll
    for (int r = 0; r < kBwdKeysPerWarp; ++r) {
      const int kj = warp * kBwdKeysPerWarp + r;
      C p = 0, ds = 0;
      if (kj < nk && lane < nq && (!sh.causal || j0 + kj <= i)) {
        const C s = dot(qs + lane * ld, ks + kj * d, d) * scale;
        const C dp = dot(dos + lane * ld, vs + kj * d, d);
        p = m_exp(s - lse_s[lane]);
        ds = p * (dp - delta_s[lane]);
      }
      dss[kj * kTile + lane] = ds;
      if (kj >= nk) continue;  // warp-uniform
      for (int ii = 0; ii < nq; ++ii) {
        const C pi = __shfl_sync(0xffffffffu, p, ii);
        const C dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e = lane + 32 * c;
          if (e < d) {
            dv[r][c] += pi * dos[ii * ld + e];
            dk[r][c] += dsi * qs[ii * ld + e];
          }
        }
      }
    }
    __syncthreads();
    // This block's share of dQ for the tile: one atomic per (query, e), summed over its keys.
    for (int idx = threadIdx.x; idx < nq * d; idx += blockDim.x) {
      const int qi = idx / d, e = idx % d;
      C acc = 0;
      for (int kj = 0; kj < nk; ++kj)
        acc += dss[kj * kTile + qi] * ks[kj * d + e];
      atomicAdd(dq_acc + (bh * sh.tq + i0 + qi) * d + e, acc * scale);
    }
  }
#pragma unroll
  for (int r = 0; r < kBwdKeysPerWarp; ++r) {
    const int kj = warp * kBwdKeysPerWarp + r;
    if (kj >= nk) continue;
    const int64_t row = bh * sh.tk + j0 + kj;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e = lane + 32 * c;
      if (e < d) {
        store(grad_k + row * d + e, dk[r][c] * scale);
        store(grad_v + row * d + e, dv[r][c]);
      }
    }
  }
}

template <typename S>
__global__ void attention_cast_kernel(const compute_t<S>* __restrict__ src, S* __restrict__ dst,
                                      int64_t n) {
  MT_GRID_STRIDE_LOOP(i, n) {
    store(dst + i, src[i]);
  }
}

// The kernel instance for the head dim's number of 32-wide chunks per lane.
template <template <typename, int> class K, typename S, typename F>
void with_chunks(int d, F&& f) {
  switch ((d + 31) / 32) {
    case 1:
      return f(K<S, 1>{});
    case 2:
      return f(K<S, 2>{});
    case 3:
      return f(K<S, 3>{});
    default:
      return f(K<S, 4>{});
  }
}

template <typename S, int NC>
struct ForwardKernel {
  static constexpr auto fn = attention_forward_kernel<S, NC>;
};
template <typename S, int NC>
struct BackwardKernel {
  static constexpr auto fn = attention_backward_kernel<S, NC>;
};

// Allows more than the default 48 KiB of dynamic shared memory when a launch needs it.
template <typename Fn>
void reserve_smem(Fn fn, size_t bytes) {
  if (bytes > kDefaultSmem) {
    MT_CUDA_CHECK(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  }
}

// The CUDA kernels' own limit on top of the interface's contract (backend/shapes.h).
void check_head_dim(const AttentionDims& n, const char* op) {
  MT_CHECK(n.d <= kMaxHeadDim, op, " on cuda supports head dims up to ", kMaxHeadDim, ", got ", n.d,
           "; use scaled_dot_product_attention, which takes the composed path for larger "
           "heads");
}

// The blocks of a (tiles x bh) launch, flattened into gridDim.x (at most 2^31 - 1).
unsigned flat_grid(int64_t tiles, int64_t bh, const char* op) {
  const int64_t blocks = tiles * bh;
  MT_CHECK(blocks <= int64_t(INT32_MAX), op, " on cuda: ", tiles, " tiles x ", bh,
           " batch-heads exceed the grid's 2^31 - 1 blocks");
  return unsigned(blocks);
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// 16-byte loads of half data need whole 8-value groups per row and aligned bases.
bool vector_loads(std::initializer_list<const Tensor*> ts, int64_t d) {
  if (dtype_size((*ts.begin())->dtype()) != 2 || d % 8 != 0) return false;
  for (const Tensor* t : ts)
    if (!aligned16(*t)) return false;
  return true;
}

}  // namespace

void CudaBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, Tensor& out,
                            Tensor& lse, const AttentionParams& p) {
  DeviceGuard guard(device_);
  const AttentionDims n = check_attention(q_in, k_in, v_in, out, lse);
  MT_ASSERT(out.is_contiguous(), "attention output: contiguous on CUDA");
  check_head_dim(n, "attention");
  if (out.numel() == 0) return;
  MT_ASSERT(n.tk > 0, "attention needs at least one key");
  const Tensor q = contiguous_input(q_in), k = contiguous_input(k_in), v = contiguous_input(v_in);
  const AttnShape sh{n.tq, n.tk, int(n.d), p.causal, vector_loads({&q, &k, &v}, n.d)};
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(q.dtype(), "attention", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    with_chunks<ForwardKernel, S>(sh.d, [&](auto kernel) {
      const auto fn = decltype(kernel)::fn;
      const size_t smem = forward_smem<C>(sh.d);
      reserve_smem(fn, smem);
      const dim3 grid(flat_grid((n.tq + kFwdRows - 1) / kFwdRows, n.bh, "attention"));
      fn<<<grid, kFwdWarps * 32, smem, stream>>>(device_ptr<const S>(q), device_ptr<const S>(k),
                                                 device_ptr<const S>(v), device_ptr<S>(out),
                                                 device_ptr<C>(lse), sh, C(p.scale));
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::attention_backward(const Tensor& grad_out_in, const Tensor& q_in,
                                     const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                     const Tensor& lse_in, Tensor& grad_q, Tensor& grad_k,
                                     Tensor& grad_v, const AttentionParams& p) {
  DeviceGuard guard(device_);
  const AttentionDims n = check_attention_backward(grad_out_in, q_in, k_in, v_in, out_in, lse_in,
                                                   grad_q, grad_k, grad_v);
  check_head_dim(n, "attention_backward");
  if (grad_k.numel() == 0 && grad_q.numel() == 0) return;
  const Tensor g = contiguous_input(grad_out_in), q = contiguous_input(q_in),
               k = contiguous_input(k_in), v = contiguous_input(v_in),
               out = contiguous_input(out_in), lse = contiguous_input(lse_in);
  const AttnShape sh{n.tq, n.tk, int(n.d), p.causal, vector_loads({&g, &q, &k, &v}, n.d)};
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(q.dtype(), "attention_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const int64_t rows = n.bh * n.tq, elems = rows * n.d;
    // delta (rows) and the dQ accumulator (rows, d) in the compute type; kept alive until the
    // kernels using them are queued.
    const Tensor buf = scratch(int64_t(sizeof(C)) * (rows + elems), device_);
    C* delta = static_cast<C*>(buf.data_ptr());
    C* dq_acc = delta + rows;
    if (elems > 0) {
      MT_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, sizeof(C) * size_t(elems), stream));
      constexpr int warps = kThreads / 32;
      attention_delta_kernel<S><<<unsigned((rows + warps - 1) / warps), kThreads, 0, stream>>>(
          device_ptr<const S>(g), device_ptr<const S>(out), delta, rows, sh.d);
      MT_CUDA_CHECK_LAUNCH();
    }
    if (n.tk > 0) {
      with_chunks<BackwardKernel, S>(sh.d, [&](auto kernel) {
        const auto fn = decltype(kernel)::fn;
        const size_t smem = backward_smem<C>(sh.d);
        reserve_smem(fn, smem);
        const dim3 grid(flat_grid((n.tk + kBwdKeys - 1) / kBwdKeys, n.bh, "attention_backward"));
        fn<<<grid, kBwdWarps * 32, smem, stream>>>(
            device_ptr<const S>(g), device_ptr<const S>(q), device_ptr<const S>(k),
            device_ptr<const S>(v), device_ptr<const C>(lse), delta, dq_acc, device_ptr<S>(grad_k),
            device_ptr<S>(grad_v), sh, C(p.scale));
        MT_CUDA_CHECK_LAUNCH();
      });
    }
    if (elems > 0) {
      attention_cast_kernel<S>
          <<<grid_for(elems), kThreads, 0, stream>>>(dq_acc, device_ptr<S>(grad_q), elems);
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace mantissa::backend::cuda
