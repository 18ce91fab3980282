// CPU normalization, softmax and cross-entropy kernels and their gradients.
//
// Numerics: rows are loaded into the compute type (float for f32 and every half type, double
// for f64), statistics, exp and log are computed there, and each result is rounded once into
// its storage type. Per-channel and per-feature sums (batch-norm statistics, the weight and
// bias gradients of the norms) are built from per-row (or per-block) partials combined in a
// fixed order, so results do not depend on the number of OpenMP threads. Batch norm's
// statistics take one pass over memory: each row's (or pixel block's) mean and squared
// deviations, merged per channel by Chan et al.'s update in float64.
//
// The layer-norm, softmax, log_softmax and cross-entropy rows and batch norm's channels-last
// pixel blocks are compiled once per vector instruction set (norm_rows.inc), giving the same
// values on each; the blocks read and write f32 and bf16 storage in their loops (stored.h).
//
// Layouts: every input is made contiguous first (a no-op for the op layer's tensors); outputs
// arrive contiguous. Batch norm also runs channels-last inputs as they are (rows of C channels),
// its output and gradient then in the same layout. Per-channel tensors (weight, bias, running
// stats, saved statistics) may have any float dtype: they are read and written through copies in
// the compute type.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/stored.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/vector_isa.h"
#include "backend/shapes.h"

namespace mantissa::backend::cpu {
namespace {

// Rows [0, rows) of `len` elements, in tasks of consecutive rows of about kChunk elements:
// body(r0, r1, scratch), scratch holding `scratch_per_row` values per row of the task. Short rows
// are thus loaded and converted many at a time. The tasks depend on (rows, len) only and each
// row is computed by one task the same way, so results do not depend on the thread count.
template <typename S, typename F>
void parallel_row_blocks(int64_t rows, int64_t len, int64_t scratch_per_row, F body) {
  const int64_t per = std::max<int64_t>(1, kChunk / std::max<int64_t>(len, 1));
  const int64_t tasks = (rows + per - 1) / per;
  parallel_rows<S>(tasks, rows * std::max<int64_t>(len, 1), per * scratch_per_row,
                   [&](int64_t t, S* buf) { body(t * per, std::min(rows, (t + 1) * per), buf); });
}

template <typename C>
constexpr DType stats_dtype_of() {
  return std::is_same_v<C, double> ? DType::F64 : DType::F32;
}

// A contiguous row of storage type T in compute type C: the row itself when the types agree,
// else converted into buf.
template <typename T, typename C>
const C* row_as(const T* src, int64_t n, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    (void)n;
    (void)buf;
    return src;
  } else {
    load_contiguous<T, C>(src, buf, n);
    return buf;
  }
}

// Where a row of results is written: straight into the output when it has the compute type,
// else into buf (then stored with finish_row).
template <typename T, typename C>
C* out_row(T* dst, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    (void)buf;
    return dst;
  } else {
    (void)dst;
    return buf;
  }
}

template <typename T, typename C>
void finish_row(const C* row, T* dst, int64_t n) {
  if constexpr (!std::is_same_v<T, C>) store_contiguous<C, T>(row, dst, n);
}

template <typename A>
A sum_of(const A* x, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i)
    s += x[i];
  return s;
}

// A per-channel or per-feature tensor of any float dtype and layout, as A; `fill`-valued (size
// n) when absent.
template <typename A>
std::vector<A> read_vector(const Tensor* t, int64_t n, A fill) {
  if (t == nullptr || !t->defined()) return std::vector<A>(static_cast<size_t>(n), fill);
  MT_ASSERT(t->numel() == n, "a per-channel tensor has ", t->numel(), " elements, expected ", n);
  const std::vector<double> v = t->to_vector<double>();
  return std::vector<A>(v.begin(), v.end());
}

// dst (any float dtype and layout, v.size() elements) = v, rounded once.
template <typename A>
void write_vector(Backend& be, const std::vector<A>& v, Tensor& dst) {
  MT_ASSERT(dst.numel() == int64_t(v.size()), "writing ", v.size(), " values into a ",
            dst.describe());
  Tensor tmp = Tensor::empty(dst.shape(), stats_dtype_of<A>(), dst.device());
  if (!v.empty()) std::memcpy(tmp.data_ptr(), v.data(), v.size() * sizeof(A));
  be.copy(tmp, dst);
}

// Per-channel totals of per-(n, c)-row partials, added in n order.
template <typename A>
std::vector<A> channel_totals(const std::vector<A>& partial, const ChannelShape& cs) {
  std::vector<A> total(static_cast<size_t>(cs.c), A(0));
  for (int64_t n = 0; n < cs.n; ++n) {
    for (int64_t c = 0; c < cs.c; ++c)
      total[size_t(c)] += partial[size_t(n * cs.c + c)];
  }
  return total;
}

// Columns handled together when the softmax dim is not the innermost one.
constexpr int64_t kTile = 64;

// The row kernels, compiled once for the baseline, AVX2 and AVX-512 (vector_isa.h): on AVX2 the
// softmax and cross-entropy forward run 1.5-1.6x faster than on the baseline's 4-wide loops, and
// layer norm's backward 1.6-2.6x faster than its former scalar sums (bench_ops); every build
// gives the same values to the bit. Batch norm's channels-last blocks too: they ran on the
// baseline's 4-wide loops after a conversion pass per block and array.
#define MT_ISA_LOOPS "backend/cpu/norm_rows.inc"
#include "backend/cpu/isa_builds.inc"

// Whether batch norm's block kernels read storage T in their loops (stored.h), or a block
// converted into compute type C first (f16 and the fp8 types).
template <typename T, typename C>
inline constexpr bool kBlockReadsStorage = kStoredInLoop<T> || std::is_same_v<T, C>;

template <typename S, typename C>
void bn_block_moments(const S* x, int64_t np, int64_t c, C* mean, C* ss) {
  MT_ISA_CALL(bn_block_moments<S, C>(x, np, c, mean, ss));
}

template <typename S, typename C>
void bn_block_forward(const S* x, S* out, int64_t np, int64_t c, const C* mean, const C* scale,
                      const C* shift) {
  MT_ISA_CALL(bn_block_forward<S, C>(x, out, np, c, mean, scale, shift));
}

template <typename S, typename C>
void bn_block_grad_sums(const S* x, const S* g, int64_t np, int64_t c, const C* mean, C* a, C* d) {
  MT_ISA_CALL(bn_block_grad_sums<S, C>(x, g, np, c, mean, a, d));
}

template <typename S, typename C>
void bn_block_backward(const S* x, const S* g, S* gx, int64_t np, int64_t c, const C* mean,
                       const C* k, const C* mg, const C* q) {
  MT_ISA_CALL(bn_block_backward<S, C>(x, g, gx, np, c, mean, k, mg, q));
}

}  // namespace

// ---- batch norm ------------------------------------------------------------------------------

namespace {

// Count, mean and sum of squared deviations from the mean (M2) of a set of values; two sets
// merge by Chan et al.'s pairwise update. Each part's moments come from values in cache (its
// mean first, then the deviations from it), so the statistics take one pass over memory and
// have no cancellation for large means.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  void merge(const Moments& b) {
    if (b.n == 0) return;
    const double total = n + b.n, delta = b.mean - mean;
    mean += delta * (b.n / total);
    m2 += b.m2 + delta * delta * (n * b.n / total);
    n = total;
  }
};

// Per-channel moments of a row-major (N, C, S) input: each (n, c) row's, merged in n order.
template <typename T, typename C>
std::vector<Moments> moments_nchw(const T* xp, const ChannelShape& cs) {
  const int64_t s = cs.s;
  std::vector<Moments> row(static_cast<size_t>(cs.rows()));
  parallel_row_blocks<C>(cs.rows(), s, s, [&](int64_t r0, int64_t r1, C* buf) {
    const C* blk = row_as<T, C>(xp + r0 * s, (r1 - r0) * s, buf);
    for (int64_t r = r0; r < r1; ++r) {
      const C* x = blk + (r - r0) * s;
      const C m = sum_of(x, s) / C(s);
      C ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < s; ++i)
        ss += (x[i] - m) * (x[i] - m);
      row[size_t(r)] = {double(s), double(m), double(ss)};
    }
  });
  std::vector<Moments> ch(static_cast<size_t>(cs.c));
  for (int64_t n = 0; n < cs.n; ++n) {
    for (int64_t c = 0; c < cs.c; ++c)
      ch[size_t(c)].merge(row[size_t(n * cs.c + c)]);
  }
  return ch;
}

// A channels-last input's pixels (rows of C values) go in blocks of about kChunk values, fixed
// by the shape alone (so results do not depend on the thread count).
int64_t pixel_block_size(int64_t c) {
  return std::max<int64_t>(1, kChunk / std::max<int64_t>(c, 1));
}

int64_t pixel_block_count(int64_t pixels, int64_t c) {
  return (pixels + pixel_block_size(c) - 1) / pixel_block_size(c);
}

// body(block, first pixel, pixels, scratch) over the blocks, in parallel when large; scratch
// holds scratch_per_pixel values per pixel of a block and `extra` more.
template <typename C, typename F>
void pixel_blocks(int64_t pixels, int64_t c, int64_t scratch_per_pixel, int64_t extra, F body) {
  const int64_t per = pixel_block_size(c);
  parallel_rows<C>(pixel_block_count(pixels, c), pixels * c, per * scratch_per_pixel + extra,
                   [&](int64_t b, C* buf) {
                     const int64_t p0 = b * per;
                     body(b, p0, std::min(pixels, p0 + per) - p0, buf);
                   });
}

// Per-channel moments of a channels-last input: each pixel block's, merged in block order.
template <typename T, typename C>
std::vector<Moments> moments_nhwc(const T* xp, int64_t pixels, int64_t c) {
  const int64_t blocks = pixel_block_count(pixels, c);
  std::vector<Moments> part(static_cast<size_t>(blocks * c));
  pixel_blocks<C>(pixels, c, c, 2 * c, [&](int64_t b, int64_t p0, int64_t np, C* buf) {
    C* mean = buf + pixel_block_size(c) * c;  // past the block's values
    C* ss = mean + c;
    if constexpr (kBlockReadsStorage<T, C>) {
      bn_block_moments<T, C>(xp + p0 * c, np, c, mean, ss);
    } else {
      bn_block_moments<C, C>(row_as<T, C>(xp + p0 * c, np * c, buf), np, c, mean, ss);
    }
    for (int64_t k = 0; k < c; ++k)
      part[size_t(b * c + k)] = {double(np), double(mean[k]), double(ss[k])};
  });
  std::vector<Moments> ch(static_cast<size_t>(c));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t k = 0; k < c; ++k)
      ch[size_t(k)].merge(part[size_t(b * c + k)]);
  }
  return ch;
}

}  // namespace

void CpuBackend::batch_norm(const Tensor& x_in, const Tensor* weight, const Tensor* bias,
                            Tensor* running_mean, Tensor* running_var, bool training,
                            double momentum, double eps, Tensor& out, Tensor& save_mean,
                            Tensor& save_rstd) {
  const bool nhwc = channels_last_only(x_in);
  MT_ASSERT((nhwc ? out.strides() == x_in.strides() : out.is_contiguous()) &&
                out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "batch_norm output");
  const Tensor x = nhwc ? x_in.detach() : contiguous_input(x_in);
  const bool has_running =
      running_mean && running_mean->defined() && running_var && running_var->defined();
  const ChannelShape cs = check_batch_norm(x, training, has_running);
  const int64_t pixels = cs.n * cs.s;
  dispatch_float(x.dtype(), "batch_norm", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const int64_t s = cs.s;
    std::vector<C> mean(static_cast<size_t>(cs.c)), rstd(static_cast<size_t>(cs.c));
    if (training) {
      const double count = double(pixels);
      const std::vector<Moments> mo =
          nhwc ? moments_nhwc<T, C>(xp, pixels, cs.c) : moments_nchw<T, C>(xp, cs);
      std::vector<double> new_mean, new_var;
      if (has_running) {
        new_mean = read_vector<double>(running_mean, cs.c, 0.0);
        new_var = read_vector<double>(running_var, cs.c, 1.0);
      }
      for (int64_t c = 0; c < cs.c; ++c) {
        const Moments& m = mo[size_t(c)];
        mean[size_t(c)] = C(m.mean);
        // The biased variance normalizes the batch; the running one is unbiased, as in PyTorch.
        rstd[size_t(c)] = C(1.0 / std::sqrt(m.m2 / count + eps));
        if (has_running) {
          new_mean[size_t(c)] = (1 - momentum) * new_mean[size_t(c)] + momentum * m.mean;
          new_var[size_t(c)] = (1 - momentum) * new_var[size_t(c)] + momentum * m.m2 / (count - 1);
        }
      }
      if (has_running) {
        write_vector(*this, new_mean, *running_mean);
        write_vector(*this, new_var, *running_var);
      }
    } else {
      mean = read_vector<C>(running_mean, cs.c, C(0));
      const std::vector<C> var = read_vector<C>(running_var, cs.c, C(1));
      for (int64_t c = 0; c < cs.c; ++c) {
        rstd[size_t(c)] = C(1) / std::sqrt(var[size_t(c)] + C(eps));
      }
    }
    // In eval mode these are the running statistics: backward needs nothing else.
    write_vector(*this, mean, save_mean);
    write_vector(*this, rstd, save_rstd);

    const std::vector<C> w = read_vector<C>(weight, cs.c, C(1));
    const std::vector<C> b = read_vector<C>(bias, cs.c, C(0));
    std::vector<C> scale(static_cast<size_t>(cs.c));
    for (int64_t c = 0; c < cs.c; ++c)
      scale[size_t(c)] = rstd[size_t(c)] * w[size_t(c)];
    if (nhwc) {
      const int64_t c = cs.c;
      const C *m = mean.data(), *sc = scale.data(), *sh = b.data();
      pixel_blocks<C>(pixels, c, c, 0, [&](int64_t, int64_t p0, int64_t np, C* buf) {
        if constexpr (kBlockReadsStorage<T, C>) {
          bn_block_forward<T, C>(xp + p0 * c, op + p0 * c, np, c, m, sc, sh);
        } else {
          C* xb = buf;  // converted, then normalized in place
          load_contiguous<T, C>(xp + p0 * c, xb, np * c);
          bn_block_forward<C, C>(xb, xb, np, c, m, sc, sh);
          store_contiguous<C, T>(xb, op + p0 * c, np * c);
        }
      });
      return;
    }
    parallel_row_blocks<C>(cs.rows(), s, s, [&](int64_t r0, int64_t r1, C* buf) {
      const int64_t len = (r1 - r0) * s;
      const C* blk = row_as<T, C>(xp + r0 * s, len, buf);
      C* dst = out_row<T, C>(op + r0 * s, buf);  // may be blk: element i reads only blk[i]
      for (int64_t r = r0, ch = r0 % cs.c; r < r1; ++r, ch = ch + 1 == cs.c ? 0 : ch + 1) {
        const size_t c = size_t(ch);
        const C m = mean[c], sc = scale[c], shift = b[c];
        const C* row = blk + (r - r0) * s;
        C* o = dst + (r - r0) * s;
        for (int64_t i = 0; i < s; ++i)
          o[i] = (row[i] - m) * sc + shift;
      }
      finish_row<T, C>(dst, op + r0 * s, len);
    });
  });
}

namespace {

// Per channel, over a channels-last input: sum of g and sum of g * (x - mean), each pixel
// block's partial sums added in block order.
template <typename T, typename C>
void grad_sums_nhwc(const T* xp, const T* gp, int64_t pixels, int64_t c, const C* mean,
                    std::vector<C>& sum_g, std::vector<C>& sum_gd) {
  const int64_t blocks = pixel_block_count(pixels, c);
  std::vector<C> pg(static_cast<size_t>(blocks * c)), pgd(static_cast<size_t>(blocks * c));
  pixel_blocks<C>(pixels, c, 2 * c, 0, [&](int64_t b, int64_t p0, int64_t np, C* buf) {
    C* a = pg.data() + b * c;
    C* d = pgd.data() + b * c;
    if constexpr (kBlockReadsStorage<T, C>) {
      bn_block_grad_sums<T, C>(xp + p0 * c, gp + p0 * c, np, c, mean, a, d);
    } else {
      const int64_t len = np * c;
      bn_block_grad_sums<C, C>(row_as<T, C>(xp + p0 * c, len, buf),
                               row_as<T, C>(gp + p0 * c, len, buf + len), np, c, mean, a, d);
    }
  });
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t k = 0; k < c; ++k) {
      sum_g[size_t(k)] += pg[size_t(b * c + k)];
      sum_gd[size_t(k)] += pgd[size_t(b * c + k)];
    }
  }
}

}  // namespace

void CpuBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x_in,
                                     const Tensor* weight, const Tensor& save_mean,
                                     const Tensor& save_rstd, bool training, Tensor* grad_x,
                                     Tensor* grad_weight, Tensor* grad_bias) {
  const bool nhwc = channels_last_only(x_in);
  const Tensor x = nhwc ? x_in.detach() : contiguous_input(x_in);
  // The gradient in the input's layout (a copy only where it arrives in another).
  const Tensor g = !nhwc ? contiguous_input(grad_out)
                   : grad_out.strides() == x.strides()
                       ? grad_out.detach()
                       : grad_out.detach().contiguous(MemoryFormat::ChannelsLast);
  const ChannelShape cs = channel_shape(x);
  const auto [want_x, want_w, want_b] =
      wanted_grads("batch_norm_backward", g, x, grad_x, grad_weight, grad_bias);
  MT_ASSERT(!want_x || !nhwc || grad_x->strides() == x.strides(),
            "batch_norm_backward: grad_x in the input's layout");
  const int64_t pixels = cs.n * cs.s;
  dispatch_float(x.dtype(), "batch_norm_backward", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    const int64_t s = cs.s, count = pixels;
    const std::vector<C> mean = read_vector<C>(&save_mean, cs.c, C(0));
    const std::vector<C> rstd = read_vector<C>(&save_rstd, cs.c, C(1));
    const std::vector<C> w = read_vector<C>(weight, cs.c, C(1));

    // Per channel: sum of g and sum of g * (x - mean).
    std::vector<C> sum_g(static_cast<size_t>(cs.c), C(0)), sum_gd(static_cast<size_t>(cs.c), C(0));
    if ((want_w || want_b || (want_x && training)) && nhwc) {
      grad_sums_nhwc<T, C>(xp, gp, pixels, cs.c, mean.data(), sum_g, sum_gd);
    } else if (want_w || want_b || (want_x && training)) {
      std::vector<C> pg(static_cast<size_t>(cs.rows())), pgd(static_cast<size_t>(cs.rows()));
      parallel_row_blocks<C>(cs.rows(), s, 2 * s, [&](int64_t r0, int64_t r1, C* buf) {
        const int64_t len = (r1 - r0) * s;
        const C* xb = row_as<T, C>(xp + r0 * s, len, buf);
        const C* gb = row_as<T, C>(gp + r0 * s, len, buf + len);
        for (int64_t r = r0, ch = r0 % cs.c; r < r1; ++r, ch = ch + 1 == cs.c ? 0 : ch + 1) {
          const C* xr = xb + (r - r0) * s;
          const C* gr = gb + (r - r0) * s;
          const C m = mean[size_t(ch)];
          C a = 0, d = 0;
#pragma omp simd reduction(+ : a, d)
          for (int64_t i = 0; i < s; ++i) {
            a += gr[i];
            d += gr[i] * (xr[i] - m);
          }
          pg[size_t(r)] = a;
          pgd[size_t(r)] = d;
        }
      });
      sum_g = channel_totals(pg, cs);
      sum_gd = channel_totals(pgd, cs);
    }
    if (want_w) {
      std::vector<C> gw(static_cast<size_t>(cs.c));
      for (int64_t c = 0; c < cs.c; ++c)
        gw[size_t(c)] = sum_gd[size_t(c)] * rstd[size_t(c)];
      write_vector(*this, gw, *grad_weight);
    }
    if (want_b) write_vector(*this, sum_g, *grad_bias);
    if (!want_x) return;

    // Training: gx = w rstd (g - mean(g) - (x - mean) rstd^2 mean(g (x - mean))).
    // Eval (constant statistics): gx = w rstd g.
    std::vector<C> k(static_cast<size_t>(cs.c)), mg(static_cast<size_t>(cs.c), C(0)),
        q(static_cast<size_t>(cs.c), C(0));
    for (int64_t c = 0; c < cs.c; ++c) {
      const size_t i = size_t(c);
      k[i] = w[i] * rstd[i];
      if (training) {
        mg[i] = sum_g[i] / C(count);
        q[i] = sum_gd[i] * rstd[i] * rstd[i] / C(count);
      }
    }
    T* gxp = static_cast<T*>(grad_x->data_ptr());
    if (nhwc) {
      const int64_t c = cs.c;
      const C *m = mean.data(), *kc = k.data(), *mgc = mg.data(), *qc = q.data();
      pixel_blocks<C>(pixels, c, 2 * c, 0, [&](int64_t, int64_t p0, int64_t np, C* buf) {
        if constexpr (kBlockReadsStorage<T, C>) {
          bn_block_backward<T, C>(xp + p0 * c, gp + p0 * c, gxp + p0 * c, np, c, m, kc, mgc, qc);
        } else {
          const int64_t len = np * c;
          C *xb = buf, *gb = buf + len;  // converted; the result is written over xb
          load_contiguous<T, C>(xp + p0 * c, xb, len);
          load_contiguous<T, C>(gp + p0 * c, gb, len);
          bn_block_backward<C, C>(xb, gb, xb, np, c, m, kc, mgc, qc);
          store_contiguous<C, T>(xb, gxp + p0 * c, len);
        }
      });
      return;
    }
    parallel_row_blocks<C>(cs.rows(), s, 2 * s, [&](int64_t r0, int64_t r1, C* buf) {
      const int64_t len = (r1 - r0) * s;
      const C* xb = row_as<T, C>(xp + r0 * s, len, buf);
      const C* gb = row_as<T, C>(gp + r0 * s, len, buf + len);
      C* dst = out_row<T, C>(gxp + r0 * s, buf);  // may be xb: element i reads only xb[i]
      for (int64_t r = r0, ch = r0 % cs.c; r < r1; ++r, ch = ch + 1 == cs.c ? 0 : ch + 1) {
        const size_t c = size_t(ch);
        const C m = mean[c], kc = k[c], mgc = mg[c], qc = q[c];
        const C* xr = xb + (r - r0) * s;
        const C* gr = gb + (r - r0) * s;
        C* o = dst + (r - r0) * s;
        for (int64_t i = 0; i < s; ++i)
          o[i] = kc * (gr[i] - mgc - (xr[i] - m) * qc);
      }
      finish_row<T, C>(dst, gxp + r0 * s, len);
    });
  });
}

// ---- layer norm ------------------------------------------------------------------------------

namespace {

template <typename C>
void layer_norm_row(const C* row, const C* w, const C* b, C* dst, int64_t n, C eps, C& mu, C& rs) {
  MT_ISA_CALL(layer_norm_row<C>(row, w, b, dst, n, eps, mu, rs));
}

template <typename C>
void layer_norm_backward_row(const C* x, const C* g, const C* w, C mu, C rs, int64_t n, C* xh,
                             C* gw, C* gb, C* dst) {
  MT_ISA_CALL(layer_norm_backward_row<C>(x, g, w, mu, rs, n, xh, gw, gb, dst));
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x_in, const Tensor* weight, const Tensor* bias,
                            double eps, Tensor& out, Tensor& mean_out, Tensor& rstd_out) {
  MT_ASSERT(out.is_contiguous() && out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "layer_norm output");
  const Tensor x = contiguous_input(x_in);
  const int64_t m = mean_out.numel();
  if (m == 0 || x.numel() == 0) return;
  const int64_t n = x.numel() / m;
  dispatch_float(x.dtype(), "layer_norm", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const std::vector<C> w = read_vector<C>(weight, n, C(1));
    const std::vector<C> b = read_vector<C>(bias, n, C(0));
    std::vector<C> mean(static_cast<size_t>(m)), rstd(static_cast<size_t>(m));
    parallel_row_blocks<C>(m, n, n, [&](int64_t r0, int64_t r1, C* buf) {
      const int64_t len = (r1 - r0) * n;
      const C* blk = row_as<T, C>(xp + r0 * n, len, buf);
      C* dst = out_row<T, C>(op + r0 * n, buf);  // may be blk: a row is read before written
      for (int64_t r = r0; r < r1; ++r) {
        layer_norm_row<C>(blk + (r - r0) * n, w.data(), b.data(), dst + (r - r0) * n, n, C(eps),
                          mean[size_t(r)], rstd[size_t(r)]);
      }
      finish_row<T, C>(dst, op + r0 * n, len);
    });
    write_vector(*this, mean, mean_out);
    write_vector(*this, rstd, rstd_out);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x_in,
                                     const Tensor* weight, const Tensor& mean_in,
                                     const Tensor& rstd_in, Tensor* grad_x, Tensor* grad_weight,
                                     Tensor* grad_bias) {
  const Tensor x = contiguous_input(x_in);
  const Tensor g = contiguous_input(grad_out);
  const auto [want_x, want_w, want_b] =
      wanted_grads("layer_norm_backward", g, x, grad_x, grad_weight, grad_bias);
  const int64_t m = mean_in.numel();
  const int64_t n = m ? x.numel() / m : 0;
  dispatch_float(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* gxp = want_x ? static_cast<T*>(grad_x->data_ptr()) : nullptr;
    const std::vector<C> mean = read_vector<C>(&mean_in, m, C(0));
    const std::vector<C> rstd = read_vector<C>(&rstd_in, m, C(1));
    const std::vector<C> w = read_vector<C>(weight, n, C(1));
    // Rows go in fixed blocks (a function of m only); each block sums its own weight/bias
    // gradient partials, and the blocks are added in order: no dependence on the thread count.
    const int64_t rows_per_block = std::max<int64_t>(1, (m + 63) / 64);
    const int64_t blocks = m ? (m + rows_per_block - 1) / rows_per_block : 0;
    std::vector<C> pw(want_w ? size_t(blocks * n) : 0, C(0));
    std::vector<C> pb(want_b ? size_t(blocks * n) : 0, C(0));
    // Within a block, rows are loaded `per` at a time (short rows convert in bulk).
    const int64_t per =
        std::min(rows_per_block, std::max<int64_t>(1, kChunk / std::max<int64_t>(n, 1)));
    parallel_rows<C>(blocks, 2 * x.numel(), 3 * per * n, [&](int64_t blk, C* buf) {
      C* bw = want_w ? pw.data() + blk * n : nullptr;
      C* bb = want_b ? pb.data() + blk * n : nullptr;
      C* xhats = buf + 2 * per * n;  // the group's xhat rows, then its gx rows
      const int64_t end = std::min(m, (blk + 1) * rows_per_block);
      const C* xb = nullptr;
      const C* gb = nullptr;
      int64_t loaded = 0, group_end = 0;  // the loaded group's rows
      for (int64_t r = blk * rows_per_block; r < end; ++r) {
        if (r == blk * rows_per_block || r == group_end) {
          loaded = r;
          group_end = std::min(end, r + per);
          const int64_t len = (group_end - r) * n;
          xb = row_as<T, C>(xp + r * n, len, buf);
          gb = row_as<T, C>(gp + r * n, len, buf + per * n);
        }
        // gx goes straight into grad_x when that has the compute type, else over the row's
        // xhat (element i reads only xhat[i]), and the group's rows are stored together (a
        // conversion call per row of 64 took over a quarter of a bf16 backward).
        C* xhat = xhats + (r - loaded) * n;
        C* dst = want_x ? out_row<T, C>(gxp + r * n, xhat) : nullptr;
        layer_norm_backward_row<C>(xb + (r - loaded) * n, gb + (r - loaded) * n, w.data(),
                                   mean[size_t(r)], rstd[size_t(r)], n, xhat, bw, bb, dst);
        if (want_x && r + 1 == group_end) {
          finish_row<T, C>(xhats, gxp + loaded * n, (group_end - loaded) * n);
        }
      }
    });
    auto combine = [&](const std::vector<C>& partial, Tensor& dst) {
      std::vector<C> total(static_cast<size_t>(n), C(0));
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const C* p = partial.data() + blk * n;
        for (int64_t i = 0; i < n; ++i)
          total[size_t(i)] += p[i];
      }
      write_vector(*this, total, dst);
    };
    if (want_w) combine(pw, *grad_weight);
    if (want_b) combine(pb, *grad_bias);
  });
}

// ---- softmax ---------------------------------------------------------------------------------

namespace {

template <typename C>
void softmax_row(const C* row, C* dst, int64_t n, bool log) {
  MT_ISA_CALL(softmax_row<C>(row, dst, n, log));
}

template <typename C>
void softmax_backward_row(const C* y, const C* g, C* o, int64_t n, bool log) {
  MT_ISA_CALL(softmax_backward_row<C>(y, g, o, n, log));
}

template <typename C>
void cross_entropy_grad_row(const C* log_probs, C* o, int64_t n, int64_t target, C g, C off, C on) {
  MT_ISA_CALL(cross_entropy_grad_row<C>(log_probs, o, n, target, g, off, on));
}

}  // namespace

void CpuBackend::softmax(const Tensor& x_in, int dim, bool log, Tensor& out) {
  MT_ASSERT(out.is_contiguous() && out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "softmax output");
  const Tensor x = contiguous_input(x_in);
  if (x.numel() == 0) return;
  const DimSplit sp = split_around(x, dim);
  dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const int64_t n = sp.n;
    if (sp.inner == 1) {
      parallel_row_blocks<C>(sp.outer, n, n, [&](int64_t r0, int64_t r1, C* buf) {
        const int64_t len = (r1 - r0) * n;
        const C* blk = row_as<T, C>(xp + r0 * n, len, buf);
        C* dst = out_row<T, C>(op + r0 * n, buf);
        for (int64_t k = 0; k < r1 - r0; ++k)
          softmax_row(blk + k * n, dst + k * n, n, log);
        finish_row<T, C>(dst, op + r0 * n, len);
      });
      return;
    }
    // The softmax dim is strided: kTile neighbouring columns at a time, three passes over the
    // dim (max, sum of exp, output), each reading contiguous runs of the tile.
    const int64_t tiles = (sp.inner + kTile - 1) / kTile;
    parallel_rows<C>(sp.outer * tiles, x.numel(), 3 * kTile, [&](int64_t task, C* buf) {
      const int64_t o = task / tiles, t0 = (task % tiles) * kTile;
      const int64_t w = std::min(kTile, sp.inner - t0);
      C* mx = buf;
      C* acc = buf + kTile;
      C* v = buf + 2 * kTile;
      const int64_t base = o * n * sp.inner + t0;
      std::fill(mx, mx + w, -std::numeric_limits<C>::infinity());
      std::fill(acc, acc + w, C(0));
      for (int64_t j = 0; j < n; ++j) {
        load_contiguous<T, C>(xp + base + j * sp.inner, v, w);
#pragma omp simd
        for (int64_t i = 0; i < w; ++i)
          mx[i] = v[i] > mx[i] ? v[i] : mx[i];
      }
      for (int64_t j = 0; j < n; ++j) {
        load_contiguous<T, C>(xp + base + j * sp.inner, v, w);
#pragma omp simd
        for (int64_t i = 0; i < w; ++i)
          acc[i] += HostMath::exp(v[i] - mx[i]);
      }
      for (int64_t i = 0; i < w; ++i) {
        acc[i] = log ? std::log(acc[i]) : C(1) / acc[i];  // log(sum) or 1/sum
      }
      for (int64_t j = 0; j < n; ++j) {
        load_contiguous<T, C>(xp + base + j * sp.inner, v, w);
        if (log) {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            v[i] = (v[i] - mx[i]) - acc[i];
        } else {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            v[i] = HostMath::exp(v[i] - mx[i]) * acc[i];
        }
        store_contiguous<C, T>(v, op + base + j * sp.inner, w);
      }
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& grad_y, const Tensor& y_in, int dim, bool log,
                                  Tensor& grad_x) {
  MT_ASSERT(grad_x.is_contiguous() && grad_x.shape() == y_in.shape() &&
                grad_x.dtype() == y_in.dtype() && grad_y.dtype() == y_in.dtype() &&
                grad_y.shape() == y_in.shape(),
            "softmax_backward arguments");
  const Tensor y = contiguous_input(y_in);
  const Tensor g = contiguous_input(grad_y);
  if (y.numel() == 0) return;
  const DimSplit sp = split_around(y, dim);
  // softmax: gx = y (g - sum(g y));  log_softmax: gx = g - exp(y) sum(g).
  dispatch_float(y.dtype(), log ? "log_softmax backward" : "softmax backward", [&]<typename T>() {
    using C = compute_t<T>;
    const T* yp = static_cast<const T*>(y.data_ptr());
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* op = static_cast<T*>(grad_x.data_ptr());
    const int64_t n = sp.n;
    if (sp.inner == 1) {
      parallel_row_blocks<C>(sp.outer, n, 2 * n, [&](int64_t r0, int64_t r1, C* buf) {
        const int64_t len = (r1 - r0) * n;
        const C* yb = row_as<T, C>(yp + r0 * n, len, buf);
        const C* gb = row_as<T, C>(gp + r0 * n, len, buf + len);
        C* dst = out_row<T, C>(op + r0 * n, buf);  // may be yb: element i reads only yb[i]
        for (int64_t k = 0; k < r1 - r0; ++k)
          softmax_backward_row(yb + k * n, gb + k * n, dst + k * n, n, log);
        finish_row<T, C>(dst, op + r0 * n, len);
      });
      return;
    }
    const int64_t tiles = (sp.inner + kTile - 1) / kTile;
    parallel_rows<C>(sp.outer * tiles, 2 * y.numel(), 3 * kTile, [&](int64_t task, C* buf) {
      const int64_t o = task / tiles, t0 = (task % tiles) * kTile;
      const int64_t w = std::min(kTile, sp.inner - t0);
      C* acc = buf;
      C* yv = buf + kTile;
      C* gv = buf + 2 * kTile;
      const int64_t base = o * n * sp.inner + t0;
      std::fill(acc, acc + w, C(0));
      for (int64_t j = 0; j < n; ++j) {
        load_contiguous<T, C>(gp + base + j * sp.inner, gv, w);
        if (log) {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            acc[i] += gv[i];
        } else {
          load_contiguous<T, C>(yp + base + j * sp.inner, yv, w);
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            acc[i] += gv[i] * yv[i];
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        load_contiguous<T, C>(gp + base + j * sp.inner, gv, w);
        load_contiguous<T, C>(yp + base + j * sp.inner, yv, w);
        if (log) {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            gv[i] -= HostMath::exp(yv[i]) * acc[i];
        } else {
#pragma omp simd
          for (int64_t i = 0; i < w; ++i)
            gv[i] = yv[i] * (gv[i] - acc[i]);
        }
        store_contiguous<C, T>(gv, op + base + j * sp.inner, w);
      }
    });
  });
}

// ---- cross entropy ---------------------------------------------------------------------------

// log_probs are written in the compute type, F32 (F64 for f64 logits), not in the logits' half
// dtype: backward's softmax = exp(log p) then carries no half-precision rounding (a bf16 log p
// near -5 is rounded by up to 2^-6, i.e. 1.6% of p), and the loss stays fp32 end to end.
void CpuBackend::cross_entropy(const Tensor& logits_in, const Tensor& target_in,
                               int64_t ignore_index, double label_smoothing, Tensor& loss,
                               Tensor& log_probs) {
  const Tensor logits = contiguous_input(logits_in);
  const Tensor target = contiguous_input(target_in);
  MT_ASSERT(logits.dim() == 2 && target.dim() == 1 && target.dtype() == DType::I64 &&
                target.size(0) == logits.size(0),
            "cross_entropy kernel shapes: ", logits.describe(), ", ", target.describe());
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int64_t* tp = static_cast<const int64_t*>(target.data_ptr());
  // Checked before the parallel loop (nothing may throw inside it).
  for (int64_t r = 0; r < rows; ++r) {
    MT_CHECK(tp[r] == ignore_index || (tp[r] >= 0 && tp[r] < classes), "cross_entropy: target ",
             tp[r], " (sample ", r, ") is out of range for ", classes, " classes (valid: 0 .. ",
             classes - 1, ", or ignore_index ", ignore_index, ")");
  }
  dispatch_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using C = compute_t<T>;
    MT_ASSERT(loss.dtype() == stats_dtype_of<C>() && log_probs.dtype() == stats_dtype_of<C>() &&
                  loss.is_contiguous() && log_probs.is_contiguous() && loss.numel() == rows &&
                  log_probs.numel() == rows * classes,
              "cross_entropy outputs: loss ", loss.describe(), ", log_probs ",
              log_probs.describe());
    const T* lp_in = static_cast<const T*>(logits.data_ptr());
    C* lp = static_cast<C*>(log_probs.data_ptr());
    C* lo = static_cast<C*>(loss.data_ptr());
    const C ls = C(label_smoothing);
    parallel_row_blocks<C>(rows, classes, 0, [&](int64_t r0, int64_t r1, C*) {
      // Logits in the compute type are read in place; others are converted into the log-prob
      // rows first and overwritten there.
      const C* in = row_as<T, C>(lp_in + r0 * classes, (r1 - r0) * classes, lp + r0 * classes);
      for (int64_t r = r0; r < r1; ++r) {
        C* row = lp + r * classes;
        softmax_row(in + (r - r0) * classes, row, classes, /*log=*/true);
        const int64_t t = tp[r];
        if (t == ignore_index) {
          lo[r] = C(0);
          continue;
        }
        C l = -row[t];
        if (ls != C(0)) {
          // PyTorch's smoothing: (1 - ls) * nll + ls * mean over classes of -log p.
          l = (C(1) - ls) * l - ls * sum_of(row, classes) / C(classes);
        }
        lo[r] = l;
      }
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_loss_in, const Tensor& log_probs_in,
                                        const Tensor& target_in, int64_t ignore_index,
                                        double label_smoothing, Tensor& grad_logits) {
  const Tensor gl = contiguous_input(grad_loss_in);
  const Tensor log_probs = contiguous_input(log_probs_in);
  const Tensor target = contiguous_input(target_in);
  MT_ASSERT(log_probs.dim() == 2 && grad_logits.is_contiguous() &&
                grad_logits.shape() == log_probs.shape() && gl.numel() == log_probs.size(0) &&
                gl.dtype() == log_probs.dtype() && target.numel() == log_probs.size(0),
            "cross_entropy_backward arguments");
  const int64_t rows = log_probs.size(0), classes = log_probs.size(1);
  const int64_t* tp = static_cast<const int64_t*>(target.data_ptr());
  MT_ASSERT(log_probs.dtype() == DType::F32 || log_probs.dtype() == DType::F64,
            "cross_entropy_backward: log-probs are F32 or F64, got ", log_probs.describe());
  // C: the log-probs' type (their compute type); T: the logits' storage type.
  auto run = [&]<typename C>() {
    const C* lp = static_cast<const C*>(log_probs.data_ptr());
    const C* gp = static_cast<const C*>(gl.data_ptr());
    const C ls = C(label_smoothing);
    const C off = ls / C(classes), on = C(1) - ls + off;
    dispatch_float(grad_logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
      T* op = static_cast<T*>(grad_logits.data_ptr());
      parallel_row_blocks<C>(rows, classes, classes, [&](int64_t r0, int64_t r1, C* buf) {
        C* dst = out_row<T, C>(op + r0 * classes, buf);
        for (int64_t r = r0; r < r1; ++r) {
          C* o = dst + (r - r0) * classes;
          const int64_t t = tp[r];
          if (t == ignore_index) {
            std::fill(o, o + classes, C(0));
            continue;
          }
          cross_entropy_grad_row(lp + r * classes, o, classes, t, gp[r], off, on);
        }
        finish_row<T, C>(dst, op + r0 * classes, (r1 - r0) * classes);
      });
    });
  };
  if (log_probs.dtype() == DType::F64) {
    run.template operator()<double>();
  } else {
    run.template operator()<float>();
  }
}

}  // namespace mantissa::backend::cpu
