// Internal: the window arithmetic of the CUDA pooling kernels (pool.cu), host and device, so
// that the host tests can check it against brute force. The rules are the CPU backend's
// (src/backend/cpu/pool.cpp), which are PyTorch's.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MT_POOL_HD __host__ __device__ __forceinline__
#else
#define MT_POOL_HD inline
#endif

namespace mantissa::backend::cuda {

struct PoolRange {
  int64_t begin, end;
};

// The input window of output index o along one axis of size n, clipped to [0, n).
MT_POOL_HD PoolRange pool_window(int64_t o, int64_t stride, int64_t pad, int64_t kernel,
                                 int64_t n) {
  const int64_t start = o * stride - pad;
  return {start > 0 ? start : 0, start + kernel < n ? start + kernel : n};
}

// The divisor of average pooling's output (oh, ow): with count_include_pad the padded window,
// cut to input + padding at the bottom/right edge; otherwise the clipped window's area.
MT_POOL_HD int64_t pool_avg_divisor(int64_t oh, int64_t ow, int64_t H, int64_t W, int64_t kh,
                                    int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                    bool count_include_pad) {
  if (!count_include_pad) {
    const PoolRange wh = pool_window(oh, sh, ph, kh, H), ww = pool_window(ow, sw, pw, kw, W);
    return (wh.end - wh.begin) * (ww.end - ww.begin);
  }
  const int64_t hs = oh * sh - ph, ws = ow * sw - pw;
  const int64_t he = hs + kh < H + ph ? hs + kh : H + ph;
  const int64_t we = ws + kw < W + pw ? ws + kw : W + pw;
  return (he - hs) * (we - ws);
}

// Adaptive pooling's window of output i (of m) over n inputs: [floor(i*n/m), ceil((i+1)*n/m)).
MT_POOL_HD PoolRange adaptive_pool_window(int64_t i, int64_t n, int64_t m) {
  return {(i * n) / m, ((i + 1) * n + m - 1) / m};
}

// The outputs (of n_out) whose windows cover input index i, ascending: the o with
// o * stride - pad <= i < o * stride - pad + kernel. Empty when none does.
MT_POOL_HD PoolRange pool_covering(int64_t i, int64_t stride, int64_t pad, int64_t kernel,
                                   int64_t n_out) {
  const int64_t hi = (i + pad) / stride + 1;    // one past the last o starting at or before i
  const int64_t lo_num = i + pad - kernel + 1;  // o * stride >= lo_num
  const int64_t lo = lo_num <= 0 ? 0 : (lo_num + stride - 1) / stride;
  const int64_t end = hi < n_out ? hi : n_out;
  return {lo, end > lo ? end : lo};
}

// The outputs whose adaptive windows cover input index i, ascending (windows are monotone in the
// output index, and the one at floor(i * m / n) always covers i).
MT_POOL_HD PoolRange adaptive_pool_covering(int64_t i, int64_t n, int64_t m) {
  const int64_t o0 = (i * m) / n;
  int64_t lo = o0, hi = o0 + 1;
  while (lo > 0 && adaptive_pool_window(lo - 1, n, m).end > i)
    --lo;
  while (hi < m && adaptive_pool_window(hi, n, m).begin <= i)
    ++hi;
  return {lo, hi};
}

}  // namespace mantissa::backend::cuda
