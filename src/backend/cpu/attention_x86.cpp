// The CPU's fused attention on x86-64 (cpu/attention.h): the blocks and online softmax of
// cpu/attention.cpp's plain loops, on register-tiled micro-kernels in intrinsics.
#if defined(__x86_64__)
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

// GCC 12's AVX-512 headers pass _mm512_undefined_*() as don't-care operands, which its own
// -Wmaybe-uninitialized then flags at every inlined use: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/vector_isa.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"
#include "numerics/x86_lanes.h"

namespace mantissa::backend::cpu::fused_attention {

// ---- the fp32-compute kernels on AVX2 + FMA ----------------------------------------------------
//
// The same blocks and the same online softmax, with every block product on a register-tiled
// micro-kernel (6 rows x 16 columns in twelve ymm accumulators, products summed in k order with
// fused multiply-adds) and the exponentials vectorized (vec_math.h). Operands a kernel reads as
// its 16-wide right-hand side are kept with rows padded to a multiple of 16 floats (zeros past
// the head dim, or past the keys of a block), so every tile reads and writes whole vectors.
// The backward is one task per (batch, head): each probability block is computed once and feeds
// dV, dK and dQ (dQ accumulated over the key blocks in the task's own buffer), where the plain
// loops of cpu/attention.cpp compute it twice. Measured against the composed path with
// bench_attention.

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

constexpr int64_t kPanel = 16;  // columns of one micro-kernel tile: two ymm
constexpr int kTileRows = 6;
constexpr int kLanes = 8;  // one ymm of floats

int64_t padded(int64_t n) {
  return (n + kPanel - 1) / kPanel * kPanel;
}

// n rounded up to whole ymm vectors of floats.
int64_t whole_vectors(int64_t n) {
  return (n + kLanes - 1) / kLanes * kLanes;
}

// c (rows x 16) = (or +=) a (rows x k) . b (k x 16), rows <= 6: a(i, kk) at a[i * ars + kk * acs],
// b's rows ldb floats apart, c's ldc apart. Rows past `rows` read the last row and are not
// written. The six rows are spelled out: as an array of accumulators indexed in a loop, GCC 12
// stored them to the stack every iteration and the tile ran at half the speed (measured).
template <bool Accumulate>
void tile(const float* a, int64_t ars, int64_t acs, int rows, const float* b, int64_t ldb,
          int64_t k, float* c, int64_t ldc) {
  const int64_t o1 = std::min(1, rows - 1) * ars, o2 = std::min(2, rows - 1) * ars,
                o3 = std::min(3, rows - 1) * ars, o4 = std::min(4, rows - 1) * ars,
                o5 = std::min(5, rows - 1) * ars;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * ldb), b1 = _mm256_loadu_ps(b + kk * ldb + 8);
    const float* ak = a + kk * acs;
    __m256 av = _mm256_broadcast_ss(ak);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(ak + o1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(ak + o2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(ak + o3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(ak + o4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(ak + o5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  const __m256 acc[kTileRows][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                    {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m256 lo = acc[r][0], hi = acc[r][1];
    if constexpr (Accumulate) {
      lo = _mm256_add_ps(_mm256_loadu_ps(cr), lo);
      hi = _mm256_add_ps(_mm256_loadu_ps(cr + 8), hi);
    }
    _mm256_storeu_ps(cr, lo);
    _mm256_storeu_ps(cr + 8, hi);
  }
}

// ---- the same kernels in 16 lanes, where vector_isa() is AVX-512 ------------------------------
//
// A tile of 12 rows x 16 columns in twelve zmm accumulators (one per row), the same fused
// multiply-adds in the same k order as tile's, so the same values to the bit; the exponentials and
// the softmax rows below likewise (FusedAttention.WideKernelsAreTheAvx2KernelsBitForBit). On a
// core with 512-bit FMA units (Zen 5) a tile does twice the AVX2 tile's work a cycle; on Zen 4,
// which splits each 512-bit operation in two, it loads half the broadcasts per multiply-add.
// (tile_dp, below, keeps its 6 rows: at ViT's 8 pairs a 12-row form measured 2-5 % slower.)
#define MT_WIDE __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))

constexpr int kWideRows = 12;

bool wide_kernels() {
  return vector_isa() == VectorIsa::Avx512;
}

template <bool Accumulate>
MT_WIDE void tile_wide(const float* a, int64_t ars, int64_t acs, int rows, const float* b,
                       int64_t ldb, int64_t k, float* c, int64_t ldc) {
  const int64_t o1 = std::min(1, rows - 1) * ars, o2 = std::min(2, rows - 1) * ars,
                o3 = std::min(3, rows - 1) * ars, o4 = std::min(4, rows - 1) * ars,
                o5 = std::min(5, rows - 1) * ars, o6 = std::min(6, rows - 1) * ars,
                o7 = std::min(7, rows - 1) * ars, o8 = std::min(8, rows - 1) * ars,
                o9 = std::min(9, rows - 1) * ars, o10 = std::min(10, rows - 1) * ars,
                o11 = std::min(11, rows - 1) * ars;
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
         c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 bv = _mm512_loadu_ps(b + kk * ldb);
    const float* ak = a + kk * acs;
    c0 = _mm512_fmadd_ps(_mm512_set1_ps(ak[0]), bv, c0);
    c1 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o1]), bv, c1);
    c2 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o2]), bv, c2);
    c3 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o3]), bv, c3);
    c4 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o4]), bv, c4);
    c5 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o5]), bv, c5);
    c6 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o6]), bv, c6);
    c7 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o7]), bv, c7);
    c8 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o8]), bv, c8);
    c9 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o9]), bv, c9);
    c10 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o10]), bv, c10);
    c11 = _mm512_fmadd_ps(_mm512_set1_ps(ak[o11]), bv, c11);
  }
  const __m512 acc[kWideRows] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 x = acc[r];
    if constexpr (Accumulate) x = _mm512_add_ps(_mm512_loadu_ps(cr), x);
    _mm512_storeu_ps(cr, x);
  }
}

// c (rows x 64) = (or +=) a (rows x k) . b (k x 64), rows <= 6: four zmm a row, 24 accumulators.
// Per k it loads 4 vectors of b and broadcasts 6 of a for 24 multiply-adds, where tile_wide's 12
// rows x 16 columns take 13 loads for 12 (those loads, not the FMA units, bounded the scores
// product at ViT's head dim 16). The same sums in the same order as tile and tile_wide.
template <bool Accumulate>
MT_WIDE void tile_wide4(const float* a, int64_t ars, int64_t acs, int rows, const float* b,
                        int64_t ldb, int64_t k, float* c, int64_t ldc) {
  const int64_t o1 = std::min(1, rows - 1) * ars, o2 = std::min(2, rows - 1) * ars,
                o3 = std::min(3, rows - 1) * ars, o4 = std::min(4, rows - 1) * ars,
                o5 = std::min(5, rows - 1) * ars;
  const __m512 z = _mm512_setzero_ps();
  __m512 c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z,
         c22 = z, c23 = z, c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z,
         c50 = z, c51 = z, c52 = z, c53 = z;
#define MT_ROW4(r, o)                           \
  {                                             \
    const __m512 av = _mm512_set1_ps(ak[o]);    \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0); \
    c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1); \
    c##r##2 = _mm512_fmadd_ps(av, b2, c##r##2); \
    c##r##3 = _mm512_fmadd_ps(av, b3, c##r##3); \
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* bk = b + kk * ldb;
    const __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16),
                 b2 = _mm512_loadu_ps(bk + 32), b3 = _mm512_loadu_ps(bk + 48);
    const float* ak = a + kk * acs;
    MT_ROW4(0, 0)
    MT_ROW4(1, o1)
    MT_ROW4(2, o2)
    MT_ROW4(3, o3)
    MT_ROW4(4, o4)
    MT_ROW4(5, o5)
  }
#undef MT_ROW4
  const __m512 acc[kTileRows][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13},
                                    {c20, c21, c22, c23}, {c30, c31, c32, c33},
                                    {c40, c41, c42, c43}, {c50, c51, c52, c53}};
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    for (int q = 0; q < 4; ++q) {
      __m512 x = acc[r][q];
      if constexpr (Accumulate) x = _mm512_add_ps(_mm512_loadu_ps(cr + 16 * q), x);
      _mm512_storeu_ps(cr + 16 * q, x);
    }
  }
}

// Which part of a block product a causal mask leaves, for row i of c and an offset `off` between
// the block's query and key indices: None, all of it; ColumnsUpTo, the columns j <= i + off (the
// scores of query i against keys j); KUpTo, the terms kk <= i + off (query i summing over keys
// kk: P.V and dS.K); KFrom, the terms kk >= i + off (key i summing over queries kk: P^T dO and
// dS^T Q). The terms left out multiply masked probabilities, which are zero; the columns left out
// are masked before anything reads them. In a causal block on the diagonal that is half the work.
enum class Band { None, ColumnsUpTo, KUpTo, KFrom };

// c (m x n) = (or +=) a (m x k) . b (k x n) for n a multiple of 16, strides as in tile, over the
// part `band` leaves of each 6-row tile (the union of its rows' parts).
// Wide: the 12-row tiles of tile_wide.
template <bool Accumulate, Band B = Band::None, bool Wide = false>
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b,
          int64_t ldb, float* c, int64_t ldc, int64_t off = 0) {
  constexpr int kRows = Wide ? kWideRows : kTileRows;
  if constexpr (Wide && B == Band::None) {
    // 64-column panels: the scores and dP of a whole key block, the products into head dims of 64
    if (n % (4 * kPanel) == 0) {
      for (int64_t j = 0; j < n; j += 4 * kPanel) {
        for (int64_t i = 0; i < m; i += kTileRows) {
          tile_wide4<Accumulate>(a + i * ars, ars, acs, int(std::min<int64_t>(kTileRows, m - i)),
                                 b + j, ldb, k, c + i * ldc + j, ldc);
        }
      }
      return;
    }
  }
  for (int64_t j = 0; j < n; j += kPanel) {  // one 16-column panel of b stays in L1
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = int(std::min<int64_t>(kRows, m - i));
      int64_t k0 = 0, k1 = k;
      if constexpr (B == Band::ColumnsUpTo) {
        if (j > i + rows - 1 + off) continue;
      } else if constexpr (B == Band::KUpTo) {
        k1 = std::clamp<int64_t>(i + rows + off, 0, k);
      } else if constexpr (B == Band::KFrom) {
        k0 = std::clamp<int64_t>(i + off, 0, k);
      }
      if (k1 <= k0) {
        if constexpr (Accumulate) continue;
        k1 = k0;  // a product of nothing: zeros
      }
      const float* at = a + i * ars + k0 * acs;
      if constexpr (Wide) {
        tile_wide<Accumulate>(at, ars, acs, rows, b + k0 * ldb + j, ldb, k1 - k0, c + i * ldc + j,
                              ldc);
      } else {
        tile<Accumulate>(at, ars, acs, rows, b + k0 * ldb + j, ldb, k1 - k0, c + i * ldc + j, ldc);
      }
    }
  }
}

// The causal forms of the block products, or the whole products without a mask; in the wide
// tiles where `wide`.
template <bool Accumulate, Band B>
void block_product(bool wide, bool causal, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c, int64_t ldc,
                   int64_t off) {
  if (wide) {
    if (causal) {
      gemm<Accumulate, B, true>(m, n, k, a, ars, acs, b, ldb, c, ldc, off);
    } else {
      gemm<Accumulate, Band::None, true>(m, n, k, a, ars, acs, b, ldb, c, ldc);
    }
  } else if (causal) {
    gemm<Accumulate, B>(m, n, k, a, ars, acs, b, ldb, c, ldc, off);
  } else {
    gemm<Accumulate>(m, n, k, a, ars, acs, b, ldb, c, ldc);
  }
}

// fp32 rows ld floats apart, each at least dp long (zeros past d).
struct Rows {
  const float* p;
  int64_t ld;
};

// A row of n elements of T as fp32: bf16 and fp16 widened in registers (x86_lanes.h), 8 at a
// time. A call to convert() per row of a head (16 to 64 elements, hundreds of rows a head) cost
// more than the conversion: bf16 attention ran at 1.5x fp32's time.
template <typename T>
void row_to_f32(const T* src, float* dst, int64_t n) {
  int64_t e = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; e + kLanes <= n; e += kLanes)
      _mm256_storeu_ps(dst + e, _mm256_loadu_ps(src + e));
  } else if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) {
    const auto* bits = reinterpret_cast<const uint16_t*>(src);
    for (; e + kLanes <= n; e += kLanes) {
      _mm256_storeu_ps(dst + e, std::is_same_v<T, bfloat16> ? detail::x86::load_bf16x8(bits + e)
                                                            : detail::x86::load_f16x8(bits + e));
    }
  }
  if (e < n) load_contiguous<T, float>(src + e, dst + e, n - e);
}

// dst (n elements of T) = scale * src, rounded to T (nearest even) in registers.
template <typename T>
void row_from_f32(const float* src, float scale, T* dst, int64_t n) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t e = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; e + kLanes <= n; e += kLanes)
      _mm256_storeu_ps(dst + e, _mm256_mul_ps(_mm256_loadu_ps(src + e), sc));
  } else if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) {
    auto* bits = reinterpret_cast<uint16_t*>(dst);
    for (; e + kLanes <= n; e += kLanes) {
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + e), sc);
      if constexpr (std::is_same_v<T, bfloat16>) {
        detail::x86::store_bf16x8(x, bits + e);
      } else {
        detail::x86::store_f16x8(x, bits + e);
      }
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    for (; e < n; ++e)
      dst[e] = src[e] * scale;
  } else {
    float tail[kLanes];
    for (int64_t k = e; k < n; ++k)
      tail[k - e] = src[k] * scale;
    if (e < n) store_contiguous<float, T>(tail, dst + e, n - e);
  }
}

// Rows [0, n) of an (n, d) matrix with rows ld apart as fp32 rows of dp: the matrix itself where
// it is read (f32 with d a multiple of 16, any row stride: the tiles take it), else a copy in dst
// with rows dp apart.
template <typename T>
Rows padded_rows(const T* src, int64_t ld, int64_t n, int64_t d, int64_t dp, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    if (d == dp) return {src, ld};
  }
  for (int64_t i = 0; i < n; ++i) {
    row_to_f32(src + i * ld, dst + i * dp, d);
    std::fill(dst + i * dp + d, dst + (i + 1) * dp, 0.0f);
  }
  return {dst, dp};
}

// dst rows 0..8 (ldd apart) = the transpose of the 8 x 8 block at src (rows lds apart). Spelled
// out, like the tile: as arrays in a loop GCC kept the rows on the stack.
__attribute__((always_inline)) inline void transpose8(const float* src, int64_t lds, float* dst,
                                                      int64_t ldd) {
  const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds),
               r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds),
               r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds),
               r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
               t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
               t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

// The transpose of an (n, d) matrix with rows ld apart into dst (d, kBlockK), zeros from n up to
// the 16-key panel the block products read. In 8 x 8 blocks where d allows (element by element,
// the two transposes of a backward block were a tenth of its time at ViT's shapes); bf16 and
// fp16 rows are widened 8 at a time into `rows` (8 x d floats) first.
template <typename T>
void load_transposed(const T* src, int64_t ld, int64_t n, int64_t d, float* rows, float* dst) {
  int64_t j = 0;
  if (d % kLanes == 0) {
    for (; j + kLanes <= n; j += kLanes) {
      const float* block = rows;
      int64_t lb = d;
      if constexpr (std::is_same_v<T, float>) {
        block = src + j * ld;
        lb = ld;
      } else {
        for (int64_t r = 0; r < kLanes; ++r)
          row_to_f32(src + (j + r) * ld, rows + r * d, d);
      }
      for (int64_t e = 0; e < d; e += kLanes)
        transpose8(block + e, lb, dst + e * kBlockK + j, kBlockK);
    }
  }
  for (; j < n; ++j) {
    const float* r = rows;
    if constexpr (std::is_same_v<T, float>) {
      r = src + j * ld;  // read in place
    } else {
      row_to_f32(src + j * ld, rows, d);
    }
    for (int64_t e = 0; e < d; ++e)
      dst[e * kBlockK + j] = r[e];
  }
  for (int64_t e = 0; e < d; ++e)
    std::fill(dst + e * kBlockK + n, dst + e * kBlockK + padded(n), 0.0f);
}

// dst rows (ld apart) = scale * src rows (dp apart), the first d of each.
template <typename T>
void store_rows(const float* src, int64_t n, int64_t d, int64_t dp, float scale, T* dst,
                int64_t ld) {
  for (int64_t i = 0; i < n; ++i)
    row_from_f32(src + i * dp, scale, dst + i * ld, d);
}

// ---- bf16 x bf16 block products on vdpbf16ps ------------------------------------------------
//
// The scores q.k^T and dP = dO.v^T multiply two bf16 operands, whose products are exact in fp32.
// vdpbf16ps does two fused multiply-adds per lane, the odd element of a pair first (Intel's
// definition; on this project's Zen 4 it matched two std::fma in that order bit for bit over 3.2
// million random lanes), so with each pair's halves swapped it sums the head dim in the order 0,
// 1, 2, ... as the fp32 tiles do, and gives their values: the bf16 kernels stay the f32 kernel on
// the same values (FusedAttention.HalfDtypesAreTheF32KernelRoundedOnce fails with the halves
// unswapped). It treats subnormals as zeros (inputs and sums below 2^-126, which attention's
// scores do not reach). One instruction does 32 multiply-adds, an fp32 FMA 16; used where the
// kernels run AVX-512 on a CPU with avx512_bf16 and the head dim is even.

bool bf16_dot_products(int64_t d) {
  return d % 2 == 0 && cpu_features().avx512_bf16 && vector_isa() == VectorIsa::Avx512;
}

// The 32-bit pair of bf16 elements (2p, 2p + 1) at p, halves swapped: 2p in the high half, which
// vdpbf16ps takes first.
inline __m256i swapped_pairs(const uint16_t* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_or_si256(_mm256_slli_epi32(x, 16), _mm256_srli_epi32(x, 16));
}

inline uint32_t swapped_pair(const uint16_t* p) {
  return (uint32_t(p[0]) << 16) | uint32_t(p[1]);
}

// Rows [0, n) of a bf16 (n, d) matrix with rows ld apart as rows of d / 2 swapped pairs, d / 2
// apart. (T is bfloat16 wherever bf16_dot_products holds; the other instances are never called.)
template <typename T>
void pair_rows(const T* src, int64_t ld, int64_t n, int64_t d, uint32_t* dst) {
  MT_ASSERT((std::is_same_v<T, bfloat16>), "bf16 pairs of a ", sizeof(T), "-byte dtype");
  const int64_t pairs = d / 2;
  for (int64_t i = 0; i < n; ++i) {
    const auto* s = reinterpret_cast<const uint16_t*>(src + i * ld);
    uint32_t* o = dst + i * pairs;
    int64_t p = 0;
    for (; p + 8 <= pairs; p += 8)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + p), swapped_pairs(s + 2 * p));
    for (; p < pairs; ++p)
      o[p] = swapped_pair(s + 2 * p);
  }
}

// The transpose of pair_rows' (n, d / 2) rows into dst (d / 2, kBlockK), zeros from n up to the
// 16-key panel; in 8 x 8 blocks of 32-bit lanes where d allows (moves only: any bits pass).
template <typename T>
void pair_transposed(const T* src, int64_t ld, int64_t n, int64_t d, uint32_t* rows,
                     uint32_t* dst) {
  const int64_t pairs = d / 2;
  pair_rows(src, ld, n, d, rows);
  int64_t j = 0;
  if (pairs % kLanes == 0) {
    for (; j + kLanes <= n; j += kLanes) {
      for (int64_t e = 0; e < pairs; e += kLanes) {
        transpose8(reinterpret_cast<const float*>(rows + j * pairs + e), pairs,
                   reinterpret_cast<float*>(dst + e * kBlockK + j), kBlockK);
      }
    }
  }
  for (; j < n; ++j)
    for (int64_t e = 0; e < pairs; ++e)
      dst[e * kBlockK + j] = rows[j * pairs + e];
  for (int64_t e = 0; e < pairs; ++e)
    std::fill(dst + e * kBlockK + n, dst + e * kBlockK + padded(n), 0u);
}

// c (rows x 16) = a (rows x pairs) . b (pairs x 16), rows <= 6, in pairs of bf16: a's rows ars
// apart, b's rows ldb apart, c's ldc apart; as tile<false> (rows past `rows` read the last row).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void tile_dp(
    const uint32_t* a, int64_t ars, int rows, const uint32_t* b, int64_t ldb, int64_t pairs,
    float* c, int64_t ldc) {
  const int64_t o1 = std::min(1, rows - 1) * ars, o2 = std::min(2, rows - 1) * ars,
                o3 = std::min(3, rows - 1) * ars, o4 = std::min(4, rows - 1) * ars,
                o5 = std::min(5, rows - 1) * ars;
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
#define MT_PAIR(x) (__m512bh) _mm512_set1_epi32(int(x))
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh bv = (__m512bh)_mm512_loadu_si512(b + p * ldb);
    const uint32_t* ap = a + p;
    c0 = _mm512_dpbf16_ps(c0, MT_PAIR(ap[0]), bv);
    c1 = _mm512_dpbf16_ps(c1, MT_PAIR(ap[o1]), bv);
    c2 = _mm512_dpbf16_ps(c2, MT_PAIR(ap[o2]), bv);
    c3 = _mm512_dpbf16_ps(c3, MT_PAIR(ap[o3]), bv);
    c4 = _mm512_dpbf16_ps(c4, MT_PAIR(ap[o4]), bv);
    c5 = _mm512_dpbf16_ps(c5, MT_PAIR(ap[o5]), bv);
  }
#undef MT_PAIR
  const __m512 acc[kTileRows] = {c0, c1, c2, c3, c4, c5};
  for (int r = 0; r < rows; ++r)
    _mm512_storeu_ps(c + r * ldc, acc[r]);
}

// The scores (or dP) block: c (m x n) = a (m x pairs) . b (pairs x n) for n a multiple of 16,
// the tiles a causal mask leaves (Band::ColumnsUpTo, as block_product<false, ColumnsUpTo>).
void scores_dp(bool causal, int64_t m, int64_t n, int64_t pairs, const uint32_t* a, int64_t ars,
               const uint32_t* b, int64_t ldb, float* c, int64_t ldc, int64_t off) {
  for (int64_t j = 0; j < n; j += kPanel) {
    for (int64_t i = 0; i < m; i += kTileRows) {
      const int rows = int(std::min<int64_t>(kTileRows, m - i));
      if (causal && j > i + rows - 1 + off) continue;
      tile_dp(a + i * ars, ars, rows, b + j, ldb, pairs, c + i * ldc + j, ldc);
    }
  }
}

// The swapped pairs the two bf16 products read, per thread: a block's (or a head's) rows of q
// and dO, and the transposed pairs of k and v.
std::vector<uint32_t>& pair_scratch(size_t n) {
  thread_local std::vector<uint32_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// e^x in 8 lanes: vm::exp's operations, fused multiply-adds included, so its values
// (vm::ExpConstants: 0 below -104, inf above ln(FLT_MAX), NaN through).
inline __m256 exp8(__m256 x) {
  using E = vm::ExpConstants;
  const __m256 lo = _mm256_cmp_ps(x, _mm256_set1_ps(E::kLow), _CMP_LT_OQ);
  const __m256 hi = _mm256_cmp_ps(x, _mm256_set1_ps(E::kHigh), _CMP_GT_OQ);
  x = _mm256_andnot_ps(_mm256_or_ps(lo, hi), x);
  const __m256 round = _mm256_set1_ps(E::kRound);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(E::kLog2e), round);
  const __m256 k = _mm256_sub_ps(t, round);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(E::kLn2Hi), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(E::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(E::kPoly[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(E::kPoly[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i ki = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
  const __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 y = _mm256_mul_ps(
      _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23))),
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23)));
  return _mm256_blendv_ps(_mm256_andnot_ps(lo, y),
                          _mm256_set1_ps(std::numeric_limits<float>::infinity()), hi);
}

// exp8's operations in 16 lanes, so its values.
MT_WIDE inline __m512 exp16(__m512 x) {
  using E = vm::ExpConstants;
  const __mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(E::kLow), _CMP_LT_OQ);
  const __mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(E::kHigh), _CMP_GT_OQ);
  x = _mm512_maskz_mov_ps(__mmask16(~(lo | hi)), x);
  const __m512 round = _mm512_set1_ps(E::kRound);
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(E::kLog2e), round);
  const __m512 k = _mm512_sub_ps(t, round);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(E::kLn2Hi), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(E::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(E::kPoly[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(E::kPoly[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i ki = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
  const __m512i k1 = _mm512_srai_epi32(ki, 1), k2 = _mm512_sub_epi32(ki, k1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 y = _mm512_mul_ps(
      _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23))),
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23)));
  return _mm512_mask_blend_ps(hi, _mm512_maskz_mov_ps(__mmask16(~lo), y),
                              _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

inline float lanes_sum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

inline float lanes_max8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// All ones in the lanes j0 + lane < seen.
inline __m256 visible_lanes(int64_t j0, int64_t seen) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(seen - j0)), lane));
}

// One key block of the online softmax for query rows i0 .. i0 + nq: s (nq, kBlockK) holds
// q . k^T for keys j0 .. j0 + nk. Each row is scaled, its running max m and sum l updated, its
// output row rescaled by e^(m_old - m_new), and left in s as e^(s - m) (zeros where masked) for
// the P.V product. Whole vectors throughout (a row's keys rounded up to 8 within kBlockK): the
// loops that stopped at the visible keys ran their last keys and the rescale's e^x one at a
// time, and those scalar exponentials were most of the forward's time at ViT's 50 keys.
void online_softmax_block(float* s, int64_t nq, int64_t nk, bool causal, int64_t i0, int64_t j0,
                          float scale, float* m, float* l, float* ob, int64_t dp) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 sc = _mm256_set1_ps(scale);
  const int64_t nk8 = whole_vectors(nk);
  for (int64_t i = 0; i < nq; ++i) {
    float* si = s + i * kBlockK;
    const int64_t seen = visible_keys(causal, i0 + i, j0, nk);
    const int64_t seen8 = whole_vectors(seen);  // vectors past it: all masked
    std::fill(si + seen8, si + nk8, 0.0f);
    __m256 vmax = _mm256_set1_ps(m[i]);
    for (int64_t j = 0; j < seen8; j += kLanes) {
      const __m256 x = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(_mm256_loadu_ps(si + j), sc),
                                        visible_lanes(j, seen));
      _mm256_storeu_ps(si + j, x);
      vmax = _mm256_max_ps(x, vmax);  // a NaN score is passed over, as by the plain loops
    }
    const float mx = lanes_max8(vmax);
    // Nothing seen, or only -inf so far: the row adds nothing (its p are zeros).
    if (mx == -std::numeric_limits<float>::infinity()) {
      std::fill(si, si + seen8, 0.0f);
      continue;
    }
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < seen8; j += kLanes) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(si + j), vmx));
      _mm256_storeu_ps(si + j, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    // The row's first visible block has no running sum to rescale: e^-inf is 0.
    const float alpha = m[i] == -std::numeric_limits<float>::infinity()
                            ? 0.0f
                            : _mm256_cvtss_f32(exp8(_mm256_set1_ps(m[i] - mx)));
    l[i] = l[i] * alpha + lanes_sum8(vsum);
    m[i] = mx;
    float* o = ob + i * dp;
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t e = 0; e < dp; e += kLanes)
      _mm256_storeu_ps(o + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), va));
  }
}

// online_softmax_block in 16 lanes, with its values: the maximum is exact in any order, the
// row's sum adds each 16-lane vector's two halves in turn to an 8-lane sum, which is
// online_softmax_block's order, and the lanes past its last whole 8 add zeros. Four rows go
// through each step before the next step starts: a row alone is a chain of dependent steps
// (its maximum, then its exponentials, then their sum), and at ViT's 50 keys the core waited on
// that chain; four independent chains side by side keep it busy.
MT_WIDE void online_softmax_block_wide(float* s, int64_t nq, int64_t nk, bool causal, int64_t i0,
                                       int64_t j0, float scale, float* m, float* l, float* ob,
                                       int64_t dp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int64_t kGroup = 4;
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __m512 sc = _mm512_set1_ps(scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int64_t nk16 = padded(nk);
  for (int64_t g = 0; g < nq; g += kGroup) {
    const int64_t rows = std::min(kGroup, nq - g);
    int64_t seen[kGroup], seen16[kGroup];
    float mx[kGroup], sum[kGroup];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = g + r;
      float* si = s + i * kBlockK;
      seen[r] = visible_keys(causal, i0 + i, j0, nk);
      seen16[r] = padded(seen[r]);  // vectors past it: all masked
      std::fill(si + seen16[r], si + nk16, 0.0f);
      __m512 vmax = _mm512_set1_ps(m[i]);
      for (int64_t j = 0; j < seen16[r]; j += kPanel) {
        const __mmask16 visible =
            _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(int32_t(seen[r] - j)), lane);
        const __m512 x =
            _mm512_mask_blend_ps(visible, neg_inf, _mm512_mul_ps(_mm512_loadu_ps(si + j), sc));
        _mm512_storeu_ps(si + j, x);
        vmax = _mm512_max_ps(x, vmax);  // a NaN score is passed over, as by the plain loops
      }
      mx[r] = _mm512_reduce_max_ps(vmax);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* si = s + (g + r) * kBlockK;
      // Nothing seen, or only -inf so far: the row adds nothing (its p are zeros).
      if (mx[r] == kNegInf) {
        std::fill(si, si + seen16[r], 0.0f);
        continue;
      }
      const __m512 vmx = _mm512_set1_ps(mx[r]);
      __m256 vsum = _mm256_setzero_ps();
      for (int64_t j = 0; j < seen16[r]; j += kPanel) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(si + j), vmx));
        _mm512_storeu_ps(si + j, e);
        vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
        vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps(e, 1));
      }
      sum[r] = lanes_sum8(vsum);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = g + r;
      if (mx[r] == kNegInf) continue;
      // The row's first visible block has no running sum to rescale: e^-inf is 0.
      const float alpha =
          m[i] == kNegInf ? 0.0f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[i] - mx[r])));
      l[i] = l[i] * alpha + sum[r];
      m[i] = mx[r];
      float* o = ob + i * dp;
      const __m512 va = _mm512_set1_ps(alpha);
      for (int64_t e = 0; e < dp; e += kPanel)
        _mm512_storeu_ps(o + e, _mm512_mul_ps(_mm512_loadu_ps(o + e), va));
    }
  }
}

// The backward's p = e^(scale s - lse) and dS = p (dP - delta) for rows [0, nq) of the blocks p
// (scores in, probabilities out) and ds (dP in, dS out), zeros where masked; whole vectors, as in
// the forward: in 8 lanes, or in 16 where `wide` (the same values).
void probabilities_and_ds(float* pb, float* ds, int64_t nq, int64_t nk, bool causal, int64_t i0,
                          int64_t j0, float scale, const float* lse, const float* delta) {
  const int64_t nk8 = whole_vectors(nk);
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < nq; ++i) {
    float* pr = pb + i * kBlockK;
    float* dr = ds + i * kBlockK;
    const int64_t seen = visible_keys(causal, i0 + i, j0, nk);
    const int64_t seen8 = whole_vectors(seen);
    std::fill(pr + seen8, pr + nk8, 0.0f);
    std::fill(dr + seen8, dr + nk8, 0.0f);
    const __m256 li = _mm256_set1_ps(lse[i]), di = _mm256_set1_ps(delta[i]);
    for (int64_t j = 0; j < seen8; j += kLanes) {
      const __m256 visible = visible_lanes(j, seen);
      const __m256 pj = _mm256_and_ps(
          visible, exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(pr + j), sc), li)));
      _mm256_storeu_ps(pr + j, pj);
      _mm256_storeu_ps(
          dr + j,
          _mm256_and_ps(visible, _mm256_mul_ps(pj, _mm256_sub_ps(_mm256_loadu_ps(dr + j), di))));
    }
  }
}

MT_WIDE void probabilities_and_ds_wide(float* pb, float* ds, int64_t nq, int64_t nk, bool causal,
                                       int64_t i0, int64_t j0, float scale, const float* lse,
                                       const float* delta) {
  const int64_t nk16 = padded(nk);
  const __m512 sc = _mm512_set1_ps(scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < nq; ++i) {
    float* pr = pb + i * kBlockK;
    float* dr = ds + i * kBlockK;
    const int64_t seen = visible_keys(causal, i0 + i, j0, nk);
    const int64_t seen16 = padded(seen);
    std::fill(pr + seen16, pr + nk16, 0.0f);
    std::fill(dr + seen16, dr + nk16, 0.0f);
    const __m512 li = _mm512_set1_ps(lse[i]), di = _mm512_set1_ps(delta[i]);
    for (int64_t j = 0; j < seen16; j += kPanel) {
      const __mmask16 visible = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(int32_t(seen - j)), lane);
      const __m512 pj = _mm512_maskz_mov_ps(
          visible, exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(pr + j), sc), li)));
      _mm512_storeu_ps(pr + j, pj);
      _mm512_storeu_ps(dr + j,
                       _mm512_maskz_mov_ps(
                           visible, _mm512_mul_ps(pj, _mm512_sub_ps(_mm512_loadu_ps(dr + j), di))));
    }
  }
}

}  // namespace

template <typename T>
void forward_x86(const T* qp, const Heads& lq, const T* kp, const Heads& lk, const T* vp,
                 const Heads& lv, T* op, const Heads& lo, float* lp, const AttentionDims& n,
                 const AttentionParams& p) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t d = n.d, dp = padded(d), qblocks = (n.tq + kBlockQ - 1) / kBlockQ;
  const float scale = static_cast<float>(p.scale);
  // Per thread: q and o (kBlockQ, dp), k transposed (d, kBlockK), v (kBlockK, dp), the scores,
  // m, l, and eight rows for the transpose's conversions.
  const int64_t scratch =
      2 * kBlockQ * dp + d * kBlockK + kBlockK * dp + kBlockQ * kBlockK + 2 * kBlockQ + kLanes * dp;
  // bf16 on bf16 dot products: q's and k's swapped pairs (and k's pair rows) instead.
  const bool dot = std::is_same_v<T, bfloat16> && bf16_dot_products(d);
  const bool wide = wide_kernels();
  const int64_t pairs = d / 2;
  parallel_rows<float>(
      n.bh * qblocks, n.bh * n.tq * n.tk * d, scratch, [&](int64_t task, float* buf) {
        const int64_t bh = task / qblocks, i0 = (task % qblocks) * kBlockQ;
        const int64_t nq = std::min(kBlockQ, n.tq - i0);
        float* qbuf = buf;
        float* ob = qbuf + kBlockQ * dp;
        float* kt = ob + kBlockQ * dp;
        float* vbuf = kt + d * kBlockK;
        float* s = vbuf + kBlockK * dp;
        float* m = s + kBlockQ * kBlockK;
        float* l = m + kBlockQ;
        float* conv = l + kBlockQ;
        uint32_t *qpairs = nullptr, *kpairs = nullptr, *prows = nullptr;
        Rows qb{nullptr, 0};
        if (dot) {
          qpairs = pair_scratch(size_t((kBlockQ + 2 * kBlockK) * pairs)).data();
          kpairs = qpairs + kBlockQ * pairs;
          prows = kpairs + pairs * kBlockK;
          pair_rows(qp + lq.row(bh, i0), lq.st, nq, d, qpairs);
        } else {
          qb = padded_rows(qp + lq.row(bh, i0), lq.st, nq, d, dp, qbuf);
        }
        std::fill(ob, ob + nq * dp, 0.0f);
        std::fill(m, m + nq, kNegInf);
        std::fill(l, l + nq, 0.0f);
        const int64_t key_end = p.causal ? std::min(n.tk, i0 + nq) : n.tk;
        for (int64_t j0 = 0; j0 < key_end; j0 += kBlockK) {
          const int64_t nk = std::min(kBlockK, n.tk - j0);
          if (dot) {
            pair_transposed(kp + lk.row(bh, j0), lk.st, nk, d, prows, kpairs);
            scores_dp(p.causal, nq, padded(nk), pairs, qpairs, pairs, kpairs, kBlockK, s, kBlockK,
                      i0 - j0);
          } else {
            load_transposed(kp + lk.row(bh, j0), lk.st, nk, d, conv, kt);
            block_product<false, Band::ColumnsUpTo>(wide, p.causal, nq, padded(nk), d, qb.p, qb.ld,
                                                    1, kt, kBlockK, s, kBlockK, i0 - j0);
          }
          const Rows vb = padded_rows(vp + lv.row(bh, j0), lv.st, nk, d, dp, vbuf);
          if (wide) {
            online_softmax_block_wide(s, nq, nk, p.causal, i0, j0, scale, m, l, ob, dp);
          } else {
            online_softmax_block(s, nq, nk, p.causal, i0, j0, scale, m, l, ob, dp);
          }
          block_product<true, Band::KUpTo>(wide, p.causal, nq, dp, nk, s, kBlockK, 1, vb.p, vb.ld,
                                           ob, dp, i0 - j0);
        }
        float* lse = lp + bh * n.tq + i0;
#pragma omp simd
        for (int64_t i = 0; i < nq; ++i)
          lse[i] = m[i] + vm::log(l[i]);
        for (int64_t i = 0; i < nq; ++i)
          store_rows(ob + i * dp, 1, d, dp, 1.0f / l[i], op + lo.row(bh, i0 + i), lo.st);
      });
}

// The gradients are contiguous (B, H, T, D): gq, gk and gv with their layouts lgq and lkv.
template <typename T>
void backward_x86(const T* gp, const Heads& lg, const T* qp, const Heads& lq, const T* kp,
                  const Heads& lk, const T* vp, const Heads& lv, const T* op, const Heads& lo,
                  const float* lp, T* gqp, const Heads& lgq, T* gkp, T* gvp, const Heads& lkv,
                  const AttentionDims& n, const AttentionParams& p) {
  const int64_t d = n.d, dp = padded(d), tq = n.tq;
  const float scale = static_cast<float>(p.scale);
  // Per thread: the head's q, dO and dQ (tq, dp) and delta; k (kBlockK, dp); k and v
  // transposed (d, kBlockK); p and dS; dK and dV (kBlockK, dp); eight rows for conversions (the
  // transposes', and four of O for delta).
  const int64_t scratch =
      3 * tq * dp + tq + 3 * kBlockK * dp + 2 * d * kBlockK + 2 * kBlockQ * kBlockK + kLanes * dp;
  // bf16 on bf16 dot products: the scores and dP from the swapped pairs of the head's q and dO
  // and of the block's k and v, not from kt and vt.
  const bool dot = std::is_same_v<T, bfloat16> && bf16_dot_products(d);
  const bool wide = wide_kernels();
  const int64_t pairs = d / 2;
  parallel_rows<float>(n.bh, n.bh * tq * n.tk * d, scratch, [&](int64_t bh, float* buf) {
    float* qbuf = buf;
    float* gbuf = qbuf + tq * dp;
    float* dq = gbuf + tq * dp;
    float* delta = dq + tq * dp;
    float* kbuf = delta + tq;
    float* dk = kbuf + kBlockK * dp;
    float* dv = dk + kBlockK * dp;
    float* kt = dv + kBlockK * dp;
    float* vt = kt + d * kBlockK;
    float* pb = vt + d * kBlockK;
    float* ds = pb + kBlockQ * kBlockK;
    float* conv = ds + kBlockQ * kBlockK;
    const float* lse = lp + bh * tq;
    const Rows q = padded_rows(qp + lq.row(bh, 0), lq.st, tq, d, dp, qbuf);
    const Rows g = padded_rows(gp + lg.row(bh, 0), lg.st, tq, d, dp, gbuf);
    uint32_t *qpairs = nullptr, *gpairs = nullptr, *kpairs = nullptr, *vpairs = nullptr,
             *prows = nullptr;
    if (dot) {
      qpairs = pair_scratch(size_t((2 * tq + 3 * kBlockK) * pairs)).data();
      gpairs = qpairs + tq * pairs;
      kpairs = gpairs + tq * pairs;
      vpairs = kpairs + pairs * kBlockK;
      prows = vpairs + pairs * kBlockK;
      pair_rows(qp + lq.row(bh, 0), lq.st, tq, d, qpairs);
      pair_rows(gp + lg.row(bh, 0), lg.st, tq, d, gpairs);
    }
    std::fill(dq, dq + tq * dp, 0.0f);
    // delta_i = rowsum(dO_i * O_i): the softmax backward's per-row term, summed as the tiles
    // sum dP = dO v^T (fused multiply-adds in e order), so that dP - delta is exactly 0 where
    // O is exactly a row of v (one visible key).
    // Four rows at a time: each sum is one chain of dependent multiply-adds, and a row alone
    // waited on its chain (an eighth of the backward at ViT's head dim 16).
    constexpr int64_t kChains = 4;
    for (int64_t i0 = 0; i0 < tq; i0 += kChains) {
      const int64_t rows = std::min(kChains, tq - i0);
      const float* o[kChains];
      for (int64_t r = 0; r < kChains; ++r) {
        const int64_t i = i0 + std::min(r, rows - 1);
        if constexpr (std::is_same_v<T, float>) {
          o[r] = op + lo.row(bh, i);
        } else {
          row_to_f32(op + lo.row(bh, i), conv + r * dp, d);
          o[r] = conv + r * dp;
        }
      }
      const float* gi = g.p + i0 * g.ld;
      const int64_t g1 = std::min<int64_t>(1, rows - 1) * g.ld,
                    g2 = std::min<int64_t>(2, rows - 1) * g.ld,
                    g3 = std::min<int64_t>(3, rows - 1) * g.ld;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (int64_t e = 0; e < d; ++e) {
        a0 = std::fma(gi[e], o[0][e], a0);
        a1 = std::fma(gi[g1 + e], o[1][e], a1);
        a2 = std::fma(gi[g2 + e], o[2][e], a2);
        a3 = std::fma(gi[g3 + e], o[3][e], a3);
      }
      const float acc[kChains] = {a0, a1, a2, a3};
      for (int64_t r = 0; r < rows; ++r)
        delta[i0 + r] = acc[r];
    }
    for (int64_t j0 = 0; j0 < n.tk; j0 += kBlockK) {
      const int64_t nk = std::min(kBlockK, n.tk - j0), nk16 = padded(nk);
      const Rows kb = padded_rows(kp + lk.row(bh, j0), lk.st, nk, d, dp, kbuf);
      if (dot) {
        pair_transposed(kp + lk.row(bh, j0), lk.st, nk, d, prows, kpairs);
        pair_transposed(vp + lv.row(bh, j0), lv.st, nk, d, prows, vpairs);
      } else {
        load_transposed(kp + lk.row(bh, j0), lk.st, nk, d, conv, kt);
        load_transposed(vp + lv.row(bh, j0), lv.st, nk, d, conv, vt);
      }
      std::fill(dk, dk + nk * dp, 0.0f);
      std::fill(dv, dv + nk * dp, 0.0f);
      // Causal: queries before j0 see none of these keys.
      const int64_t first_q = p.causal ? (std::min(j0, tq) / kBlockQ) * kBlockQ : 0;
      for (int64_t i0 = first_q; i0 < tq; i0 += kBlockQ) {
        const int64_t nq = std::min(kBlockQ, tq - i0);
        const float* qi = q.p + i0 * q.ld;
        const float* gi = g.p + i0 * g.ld;
        const bool causal = p.causal;
        const int64_t off = i0 - j0;  // query i sees key j where j <= i + off
        if (dot) {
          scores_dp(causal, nq, nk16, pairs, qpairs + i0 * pairs, pairs, kpairs, kBlockK, pb,
                    kBlockK, off);  // scores
          scores_dp(causal, nq, nk16, pairs, gpairs + i0 * pairs, pairs, vpairs, kBlockK, ds,
                    kBlockK, off);  // dP = dO v^T
        } else {
          block_product<false, Band::ColumnsUpTo>(wide, causal, nq, nk16, d, qi, q.ld, 1, kt,
                                                  kBlockK, pb, kBlockK, off);  // scores
          block_product<false, Band::ColumnsUpTo>(wide, causal, nq, nk16, d, gi, g.ld, 1, vt,
                                                  kBlockK, ds, kBlockK, off);  // dP = dO v^T
        }
        // p = e^(scale s - lse) (the scaled score rounded as in the forward) and
        // dS = p (dP - delta).
        if (wide) {
          probabilities_and_ds_wide(pb, ds, nq, nk, causal, i0, j0, scale, lse + i0, delta + i0);
        } else {
          probabilities_and_ds(pb, ds, nq, nk, causal, i0, j0, scale, lse + i0, delta + i0);
        }
        block_product<true, Band::KFrom>(wide, causal, nk, dp, nq, pb, 1, kBlockK, gi, g.ld, dv, dp,
                                         -off);  // dV += P^T dO
        block_product<true, Band::KFrom>(wide, causal, nk, dp, nq, ds, 1, kBlockK, qi, q.ld, dk, dp,
                                         -off);  // dK += dS^T q
        block_product<true, Band::KUpTo>(wide, causal, nq, dp, nk, ds, kBlockK, 1, kb.p, kb.ld,
                                         dq + i0 * dp, dp, off);  // dQ += dS k
      }
      store_rows(dk, nk, d, dp, scale, gkp + lkv.row(bh, j0), lkv.st);
      store_rows(dv, nk, d, dp, 1.0f, gvp + lkv.row(bh, j0), lkv.st);
    }
    store_rows(dq, tq, d, dp, scale, gqp + lgq.row(bh, 0), lgq.st);
  });
}

#define MT_ATTENTION_X86(T)                                                                   \
  template void forward_x86<T>(const T*, const Heads&, const T*, const Heads&, const T*,      \
                               const Heads&, T*, const Heads&, float*, const AttentionDims&,  \
                               const AttentionParams&);                                       \
  template void backward_x86<T>(const T*, const Heads&, const T*, const Heads&, const T*,     \
                                const Heads&, const T*, const Heads&, const T*, const Heads&, \
                                const float*, T*, const Heads&, T*, T*, const Heads&,         \
                                const AttentionDims&, const AttentionParams&);
MT_ATTENTION_X86(float)
MT_ATTENTION_X86(bfloat16)
MT_ATTENTION_X86(half)
MT_ATTENTION_X86(float8_e4m3)
MT_ATTENTION_X86(float8_e5m2)
#undef MT_ATTENTION_X86
#pragma GCC pop_options

}  // namespace mantissa::backend::cpu::fused_attention

#endif
