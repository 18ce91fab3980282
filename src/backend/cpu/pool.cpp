// CPU pooling kernels (NCHW): max, average and adaptive average pooling and their gradients.
// Every (n, c) plane is independent: planes are spread over OpenMP threads, each plane is loaded
// into a compute-type buffer (float for half types, double for f64), pooled there, and rounded
// once on store. No plane is shared between threads, so results do not depend on the thread
// count. Gradients are accumulated per plane in the compute type, then rounded once.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vector_isa.h"
#include "backend/shapes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mantissa::backend::cpu {
namespace {

// The sizes of one pooling call: `planes` = N * C planes of (h, w) in, (oh, ow) out.
struct PoolGeometry {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t in_plane() const { return h * w; }
  int64_t out_plane() const { return oh * ow; }
};

PoolGeometry geometry(const Tensor& in, const Tensor& out) {
  MT_ASSERT(in.dim() == 4 && out.dim() == 4, "pooling kernels take (N, C, H, W) tensors, got ",
            in.describe(), " and ", out.describe());
  MT_ASSERT(in.size(0) == out.size(0) && in.size(1) == out.size(1),
            "pooling planes differ: ", in.describe(), " vs ", out.describe());
  return {in.size(0) * in.size(1), in.size(2), in.size(3), out.size(2), out.size(3)};
}

// The input window of output index o along one axis of size n, clipped to [0, n).
struct Window {
  int64_t begin, end;
};

inline Window window(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t n) {
  const int64_t start = o * stride - pad;
  return {std::max<int64_t>(start, 0), std::min(start + kernel, n)};
}

// The divisor of an average-pool window: PyTorch's rule, where the padded window may extend
// past the padding at the bottom/right edge and is then cut to input + padding.
inline int64_t avg_divisor(int64_t oh, int64_t ow, const PoolGeometry& g, const Pool2dParams& p) {
  if (!p.count_include_pad) {
    const Window wh = window(oh, p.stride[0], p.padding[0], p.kernel[0], g.h);
    const Window ww = window(ow, p.stride[1], p.padding[1], p.kernel[1], g.w);
    return (wh.end - wh.begin) * (ww.end - ww.begin);
  }
  const int64_t hs = oh * p.stride[0] - p.padding[0], ws = ow * p.stride[1] - p.padding[1];
  const int64_t he = std::min(hs + p.kernel[0], g.h + p.padding[0]);
  const int64_t we = std::min(ws + p.kernel[1], g.w + p.padding[1]);
  return (he - hs) * (we - ws);
}

// PyTorch's adaptive window along one axis: [floor(i*n/m), ceil((i+1)*n/m)).
inline Window adaptive_window(int64_t i, int64_t n, int64_t m) {
  return {(i * n) / m, ((i + 1) * n + m - 1) / m};
}

}  // namespace

// take ? a : b through bit masks, so the compiler cannot turn the select into a branch (it did,
// and the unpredictable comparisons of max pooling then cost most of its time).
template <typename C>
inline void select_max(C v, int64_t i, C& best, int64_t& at) {
  using Bits = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
  const bool take = (v > best) | ((v != v) & (best == best));  // first max; first NaN wins
  const Bits m = Bits(0) - Bits(take);
  best = std::bit_cast<C>(Bits((std::bit_cast<Bits>(v) & m) | (std::bit_cast<Bits>(best) & ~m)));
  const uint64_t m64 = uint64_t(0) - uint64_t(take);
  at = int64_t((uint64_t(i) & m64) | (uint64_t(at) & ~m64));
}

// Every window inside the plane (no padding): fixed loop bounds, no clipping.
template <typename C>
void max_pool_unpadded(const C* in, C* res, int64_t* best_at, int64_t W, int64_t OH, int64_t OW,
                       int64_t KH, int64_t KW, int64_t SH, int64_t SW) {
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int64_t ow = 0; ow < OW; ++ow) {
      const int64_t base = oh * SH * W + ow * SW;
      int64_t at = base;
      C best = in[base];
      for (int64_t h = 0; h < KH; ++h) {
        for (int64_t w = 0; w < KW; ++w) {
          const int64_t i = base + h * W + w;
          select_max(in[i], i, best, at);
        }
      }
      res[oh * OW + ow] = best;
      best_at[oh * OW + ow] = at;
    }
  }
}

// The floats past a plane max_pool_2x2's last vector of a row may read.
constexpr int64_t kPool2Margin = 16;

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2")
// The 2 x 2, stride-2 windows of every CNN's pooling, 8 outputs of a row at a time in AVX2
// registers: the window's four elements are the even and odd lanes of its two input rows, and
// the selects are blends, in (h, w) order as in max_pool_unpadded (the first maximum and the
// first NaN win). One window after another, with a dependent select per element, the scalar
// loop ran at about 4 ns an input element: 12-16 % of the cnn's training step. A row's last
// vector reads up to kPool2Margin floats past the plane, which the caller provides (its lanes
// past the row are not stored).
void max_pool_2x2(const float* in, float* res, int64_t* best_at, int64_t W, int64_t OH,
                  int64_t OW) {
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  // The even (0x88) or odd (0xdd) elements of 16 floats at p, in order.
  auto half = [](const float* p, auto odd) {
    const __m256 lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8);
    const __m256 h = odd ? _mm256_shuffle_ps(lo, hi, 0xdd) : _mm256_shuffle_ps(lo, hi, 0x88);
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xd8));
  };
  alignas(32) float best_v[8];
  alignas(32) int32_t at_v[8];
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int64_t ow = 0; ow < OW; ow += 8) {
      const int64_t base = 2 * oh * W + 2 * ow;
      const float* r0 = in + base;
      __m256 best = half(r0, std::false_type{});
      __m256i at = _mm256_add_epi32(_mm256_set1_epi32(int32_t(base)), lane2);
      auto select = [&](__m256 v, int32_t off) {
        const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                                         _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q),
                                                       _mm256_cmp_ps(best, best, _CMP_ORD_Q)));
        best = _mm256_blendv_ps(best, v, take);
        const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(int32_t(base) + off), lane2);
        at = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(pos), take));
      };
      select(half(r0, std::true_type{}), 1);
      select(half(r0 + W, std::false_type{}), int32_t(W));
      select(half(r0 + W, std::true_type{}), int32_t(W) + 1);
      _mm256_store_ps(best_v, best);
      _mm256_store_si256(reinterpret_cast<__m256i*>(at_v), at);
      const int64_t n = std::min<int64_t>(8, OW - ow);
      for (int64_t j = 0; j < n; ++j) {
        res[oh * OW + ow + j] = best_v[j];
        best_at[oh * OW + ow + j] = at_v[j];
      }
    }
  }
}
#pragma GCC pop_options
#endif

namespace {

// Max pooling of a channels-last input, one image per task: the image converted once into the
// compute type, then each output pixel's window, every channel at once, with select_max's rule
// (the first maximum; the first NaN wins). indices hold positions in the plane (h * W + w), as
// the row-major kernels', laid out channels-last like out. P, the type positions are selected
// in: int32_t (as wide as a float lane, so the selects vectorize) where the plane allows.
template <typename T, typename C, typename P>
void max_pool_nhwc(const T* xp, T* op, int64_t* idx, const PoolGeometry& g, int64_t n, int64_t c,
                   const Pool2dParams& p) {
  const int64_t in_image = g.in_plane() * c, out_row = g.ow * c;
  parallel_rows<C>(n, n * in_image, in_image + out_row, [&](int64_t b, C* buf) {
    const C* in = buf;
    C* res = buf + in_image;
    std::vector<P> positions(static_cast<size_t>(c));
    P* pos = positions.data();
    load_contiguous<T, C>(xp + b * in_image, buf, in_image);
    for (int64_t oh = 0; oh < g.oh; ++oh) {
      const Window wh = window(oh, p.stride[0], p.padding[0], p.kernel[0], g.h);
      int64_t* at = idx + (b * g.oh + oh) * out_row;
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        const Window ww = window(ow, p.stride[1], p.padding[1], p.kernel[1], g.w);
        C* best = res + ow * c;
        std::fill(best, best + c, -std::numeric_limits<C>::infinity());
        std::fill(pos, pos + c, P(wh.begin * g.w + ww.begin));
        for (int64_t h = wh.begin; h < wh.end; ++h) {
          for (int64_t w = ww.begin; w < ww.end; ++w) {
            const C* v = in + (h * g.w + w) * c;
            const P here = P(h * g.w + w);
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) {
              const bool take = (v[k] > best[k]) | ((v[k] != v[k]) & (best[k] == best[k]));
              best[k] = take ? v[k] : best[k];
              pos[k] = take ? here : pos[k];
            }
          }
        }
        for (int64_t k = 0; k < c; ++k)
          at[ow * c + k] = pos[k];
      }
      store_contiguous<C, T>(res, op + (b * g.oh + oh) * out_row, out_row);
    }
  });
}

}  // namespace

void CpuBackend::max_pool2d(const Tensor& x_in, Tensor& out, Tensor& indices,
                            const Pool2dParams& p) {
  if (channels_last_only(x_in)) {
    MT_ASSERT(out.is_contiguous(MemoryFormat::ChannelsLast) && indices.strides() == out.strides() &&
                  indices.dtype() == DType::I64 && indices.shape() == out.shape(),
              "max_pool2d outputs of a channels-last input");
    const PoolGeometry g = geometry(x_in, out);
    const bool narrow = g.in_plane() <= std::numeric_limits<int32_t>::max();
    dispatch_float(x_in.dtype(), "max_pool2d", [&]<typename T>() {
      const T* xp = static_cast<const T*>(x_in.data_ptr());
      T* op = static_cast<T*>(out.data_ptr());
      int64_t* ip = static_cast<int64_t*>(indices.data_ptr());
      if (narrow) {
        max_pool_nhwc<T, compute_t<T>, int32_t>(xp, op, ip, g, x_in.size(0), x_in.size(1), p);
      } else {
        max_pool_nhwc<T, compute_t<T>, int64_t>(xp, op, ip, g, x_in.size(0), x_in.size(1), p);
      }
    });
    return;
  }
  MT_ASSERT(out.is_contiguous() && indices.is_contiguous() && indices.dtype() == DType::I64 &&
                indices.shape() == out.shape(),
            "max_pool2d outputs");
  const Tensor x = contiguous_input(x_in);
  const PoolGeometry g = geometry(x, out);
  int64_t* idx = static_cast<int64_t*>(indices.data_ptr());
  // Locals, not struct fields: the index stores below could alias an int64_t field otherwise.
  const int64_t W = g.w, OH = g.oh, OW = g.ow, KH = p.kernel[0], KW = p.kernel[1];
  const int64_t SH = p.stride[0], SW = p.stride[1];
  const bool unpadded = p.padding[0] == 0 && p.padding[1] == 0 && (OH - 1) * SH + KH <= g.h &&
                        (OW - 1) * SW + KW <= g.w;
  // 2 x 2 windows, stride 2, inside the plane: max_pool_2x2 where the kernels run AVX2 or more.
  const bool two_by_two = unpadded && KH == 2 && KW == 2 && SH == 2 && SW == 2 &&
                          g.in_plane() <= std::numeric_limits<int32_t>::max() &&
                          vector_isa() != VectorIsa::Baseline;
  dispatch_float(x.dtype(), "max_pool2d", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const int64_t margin = kPool2Margin;  // past the plane (zeros), for max_pool_2x2
    parallel_rows<C>(
        g.planes, x.numel(), g.in_plane() + margin + g.out_plane(), [&](int64_t pl, C* buf) {
          C* in = buf;
          C* res = buf + g.in_plane() + margin;
          int64_t* best_at = idx + pl * g.out_plane();
          load_contiguous<T, C>(xp + pl * g.in_plane(), in, g.in_plane());
#if defined(__x86_64__)
          if constexpr (std::is_same_v<C, float>) {
            if (two_by_two) {
              std::fill(in + g.in_plane(), res, 0.0f);
              max_pool_2x2(in, res, best_at, W, OH, OW);
              store_contiguous<C, T>(res, op + pl * g.out_plane(), g.out_plane());
              return;
            }
          }
#endif
          if (unpadded) {
            max_pool_unpadded(in, res, best_at, W, OH, OW, KH, KW, SH, SW);
            store_contiguous<C, T>(res, op + pl * g.out_plane(), g.out_plane());
            return;
          }
          for (int64_t oh = 0; oh < g.oh; ++oh) {
            const Window wh = window(oh, p.stride[0], p.padding[0], p.kernel[0], g.h);
            for (int64_t ow = 0; ow < g.ow; ++ow) {
              const Window ww = window(ow, p.stride[1], p.padding[1], p.kernel[1], g.w);
              // The first maximum wins; the first NaN wins over everything. Branch-free: the
              // comparisons are unpredictable, and a mispredicted branch per element cost 4x here.
              int64_t at = wh.begin * g.w + ww.begin;
              C best = -std::numeric_limits<C>::infinity();
              for (int64_t h = wh.begin; h < wh.end; ++h) {
                for (int64_t w = ww.begin; w < ww.end; ++w) {
                  select_max(in[h * g.w + w], h * g.w + w, best, at);
                }
              }
              res[oh * g.ow + ow] = in[at];
              best_at[oh * g.ow + ow] = at;
            }
          }
          store_contiguous<C, T>(res, op + pl * g.out_plane(), g.out_plane());
        });
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& grad_out_in, const Tensor& indices_in,
                                     Tensor& grad_x) {
  if (channels_last_only(grad_x)) {
    // Channels-last indices (a channels-last forward's); the gradient in their layout.
    MT_ASSERT(indices_in.is_contiguous(MemoryFormat::ChannelsLast) &&
                  indices_in.dtype() == DType::I64 && indices_in.shape() == grad_out_in.shape() &&
                  grad_x.dtype() == grad_out_in.dtype(),
              "max_pool2d_backward: a channels-last grad_x needs channels-last indices");
    const Tensor go = grad_out_in.strides() == indices_in.strides()
                          ? grad_out_in.detach()
                          : grad_out_in.detach().contiguous(MemoryFormat::ChannelsLast);
    const PoolGeometry g = geometry(grad_x, go);
    const int64_t n = grad_x.size(0), c = grad_x.size(1), in_image = g.in_plane() * c,
                  out_image = g.out_plane() * c;
    const int64_t* idx = static_cast<const int64_t*>(indices_in.data_ptr());
    dispatch_float(go.dtype(), "max_pool2d_backward", [&]<typename T>() {
      using C = compute_t<T>;
      const T* gp = static_cast<const T*>(go.data_ptr());
      T* gxp = static_cast<T*>(grad_x.data_ptr());
      parallel_rows<C>(n, n * in_image, in_image + out_image, [&](int64_t b, C* buf) {
        C* acc = buf;
        C* gin = buf + in_image;
        std::fill(acc, acc + in_image, C(0));
        load_contiguous<T, C>(gp + b * out_image, gin, out_image);
        const int64_t* at = idx + b * out_image;
        for (int64_t o = 0; o < g.out_plane(); ++o) {
          for (int64_t k = 0; k < c; ++k)
            acc[at[o * c + k] * c + k] += gin[o * c + k];
        }
        store_contiguous<C, T>(acc, gxp + b * in_image, in_image);
      });
    });
    return;
  }
  MT_ASSERT(grad_x.is_contiguous() && grad_x.dtype() == grad_out_in.dtype() &&
                indices_in.dtype() == DType::I64 && indices_in.shape() == grad_out_in.shape(),
            "max_pool2d_backward arguments");
  const Tensor go = contiguous_input(grad_out_in);
  const Tensor ix = contiguous_input(indices_in);
  const PoolGeometry g = geometry(grad_x, go);
  const int64_t* idx = static_cast<const int64_t*>(ix.data_ptr());
  dispatch_float(go.dtype(), "max_pool2d_backward", [&]<typename T>() {
    using C = compute_t<T>;
    const T* gp = static_cast<const T*>(go.data_ptr());
    T* gxp = static_cast<T*>(grad_x.data_ptr());
    parallel_rows<C>(g.planes, grad_x.numel(), g.in_plane() + g.out_plane(),
                     [&](int64_t pl, C* buf) {
                       C* acc = buf;
                       C* gin = buf + g.in_plane();
                       std::fill(acc, acc + g.in_plane(), C(0));
                       load_contiguous<T, C>(gp + pl * g.out_plane(), gin, g.out_plane());
                       const int64_t* at = idx + pl * g.out_plane();
                       for (int64_t o = 0; o < g.out_plane(); ++o)
                         acc[at[o]] += gin[o];
                       store_contiguous<C, T>(acc, gxp + pl * g.in_plane(), g.in_plane());
                     });
  });
}

namespace {

// Average pooling over windows given by windows(g, oh, ow, wh, ww), which sets output (oh, ow)'s
// window and returns its divisor: the same function drives the forward and the backward pass.
template <typename Windows>
void mean_pool(const Tensor& x_in, Tensor& out, const char* op, Windows windows) {
  MT_ASSERT(out.is_contiguous(), op, " output must be contiguous");
  const Tensor x = contiguous_input(x_in);
  const PoolGeometry g = geometry(x, out);
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op_data = static_cast<T*>(out.data_ptr());
    parallel_rows<C>(g.planes, x.numel(), g.in_plane() + g.out_plane(), [&](int64_t pl, C* buf) {
      C* in = buf;
      C* res = buf + g.in_plane();
      load_contiguous<T, C>(xp + pl * g.in_plane(), in, g.in_plane());
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          Window wh, ww;
          const int64_t divisor = windows(g, oh, ow, wh, ww);
          C s = 0;
          for (int64_t h = wh.begin; h < wh.end; ++h) {
            for (int64_t w = ww.begin; w < ww.end; ++w)
              s += in[h * g.w + w];
          }
          res[oh * g.ow + ow] = s / C(divisor);
        }
      }
      store_contiguous<C, T>(res, op_data + pl * g.out_plane(), g.out_plane());
    });
  });
}

// The backward of average pooling: each output gradient spread evenly over its input window.
template <typename Windows>
void spread_pool_gradient(const Tensor& grad_out_in, Tensor& grad_x, const char* op,
                          Windows windows) {
  MT_ASSERT(grad_x.is_contiguous() && grad_x.dtype() == grad_out_in.dtype(), op, " arguments");
  const Tensor go = contiguous_input(grad_out_in);
  const PoolGeometry g = geometry(grad_x, go);
  dispatch_float(go.dtype(), op, [&]<typename T>() {
    using C = compute_t<T>;
    const T* gp = static_cast<const T*>(go.data_ptr());
    T* gxp = static_cast<T*>(grad_x.data_ptr());
    parallel_rows<C>(g.planes, grad_x.numel(), g.in_plane() + g.out_plane(),
                     [&](int64_t pl, C* buf) {
                       C* acc = buf;
                       C* gin = buf + g.in_plane();
                       std::fill(acc, acc + g.in_plane(), C(0));
                       load_contiguous<T, C>(gp + pl * g.out_plane(), gin, g.out_plane());
                       for (int64_t oh = 0; oh < g.oh; ++oh) {
                         for (int64_t ow = 0; ow < g.ow; ++ow) {
                           Window wh, ww;
                           const int64_t divisor = windows(g, oh, ow, wh, ww);
                           const C share = gin[oh * g.ow + ow] / C(divisor);
                           for (int64_t h = wh.begin; h < wh.end; ++h) {
                             for (int64_t w = ww.begin; w < ww.end; ++w)
                               acc[h * g.w + w] += share;
                           }
                         }
                       }
                       store_contiguous<C, T>(acc, gxp + pl * g.in_plane(), g.in_plane());
                     });
  });
}

// avg_pool2d's windows (kernel, stride, padding) and divisors.
auto avg_windows(const Pool2dParams& p) {
  return [&p](const PoolGeometry& g, int64_t oh, int64_t ow, Window& wh, Window& ww) {
    wh = window(oh, p.stride[0], p.padding[0], p.kernel[0], g.h);
    ww = window(ow, p.stride[1], p.padding[1], p.kernel[1], g.w);
    return avg_divisor(oh, ow, g, p);
  };
}

// adaptive_avg_pool2d's windows: PyTorch's start/end rule, divided by the window's area.
int64_t adaptive_windows(const PoolGeometry& g, int64_t oh, int64_t ow, Window& wh, Window& ww) {
  wh = adaptive_window(oh, g.h, g.oh);
  ww = adaptive_window(ow, g.w, g.ow);
  return (wh.end - wh.begin) * (ww.end - ww.begin);
}

}  // namespace

void CpuBackend::avg_pool2d(const Tensor& x_in, Tensor& out, const Pool2dParams& p) {
  mean_pool(x_in, out, "avg_pool2d", avg_windows(p));
}

void CpuBackend::avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x,
                                     const Pool2dParams& p) {
  spread_pool_gradient(grad_out, grad_x, "avg_pool2d_backward", avg_windows(p));
}

void CpuBackend::adaptive_avg_pool2d(const Tensor& x_in, Tensor& out) {
  mean_pool(x_in, out, "adaptive_avg_pool2d", adaptive_windows);
}

void CpuBackend::adaptive_avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x) {
  spread_pool_gradient(grad_out, grad_x, "adaptive_avg_pool2d_backward", adaptive_windows);
}

}  // namespace mantissa::backend::cpu
