// The Fréchet distance of Gaussian fits and MS-SSIM (metrics/image_quality.h), in float64 on the
// host.
#include "mantissa/metrics/image_quality.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mantissa/core/error.h"

namespace mantissa::metrics {

GaussianFit gaussian_fit(const Tensor& features) {
  MT_CHECK(features.defined() && features.dim() == 2 && features.size(0) >= 2,
           "gaussian_fit: features must be (N, D) with N >= 2, got ",
           features.defined() ? features.describe() : std::string("an undefined tensor"));
  const int64_t n = features.size(0), d = features.size(1);
  const std::vector<double> x = features.to_vector<double>();
  GaussianFit g;
  g.dim = d;
  g.mean.assign(size_t(d), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      g.mean[size_t(j)] += x[size_t(i * d + j)];
  for (double& m : g.mean)
    m /= double(n);
  std::vector<double> c(size_t(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      c[size_t(i * d + j)] = x[size_t(i * d + j)] - g.mean[size_t(j)];
  g.cov.assign(size_t(d * d), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double* row = &c[size_t(i * d)];
    for (int64_t j = 0; j < d; ++j) {
      const double rj = row[j];
      double* out = &g.cov[size_t(j * d)];
      for (int64_t k = j; k < d; ++k)
        out[k] += rj * row[k];
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    for (int64_t k = j; k < d; ++k) {
      const double v = g.cov[size_t(j * d + k)] / double(n - 1);
      g.cov[size_t(j * d + k)] = v;
      g.cov[size_t(k * d + j)] = v;
    }
  }
  return g;
}

void symmetric_eigen(const std::vector<double>& a_in, int64_t n, std::vector<double>& values,
                     std::vector<double>& vectors) {
  MT_CHECK(n >= 1 && int64_t(a_in.size()) == n * n, "symmetric_eigen: expected ", n * n,
           " values for a ", n, " x ", n, " matrix, got ", a_in.size());
  std::vector<double> a = a_in;
  auto A = [&](int64_t i, int64_t j) -> double& { return a[size_t(i * n + j)]; };
  vectors.assign(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    vectors[size_t(i * n + i)] = 1.0;
  auto V = [&](int64_t i, int64_t j) -> double& { return vectors[size_t(i * n + j)]; };
  double total = 0;
  for (double v : a)
    total += v * v;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j)
        off += 2 * A(i, j) * A(i, j);
    if (off <= 1e-22 * total || off == 0) break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = A(p, q);
        if (apq == 0) continue;
        // The rotation that zeroes a[p][q] (Golub and Van Loan, Algorithm 8.4.1).
        const double theta = (A(q, q) - A(p, p)) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = A(k, p), akq = A(k, q);
          A(k, p) = c * akp - s * akq;
          A(k, q) = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = A(p, k), aqk = A(q, k);
          A(p, k) = c * apk - s * aqk;
          A(q, k) = s * apk + c * aqk;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double vkp = V(k, p), vkq = V(k, q);
          V(k, p) = c * vkp - s * vkq;
          V(k, q) = s * vkp + c * vkq;
        }
      }
    }
  }
  // Ascending order, eigenvectors permuted along.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return A(x, x) < A(y, y); });
  values.resize(size_t(n));
  std::vector<double> sorted(size_t(n * n));
  for (int64_t k = 0; k < n; ++k) {
    values[size_t(k)] = A(order[size_t(k)], order[size_t(k)]);
    for (int64_t i = 0; i < n; ++i)
      sorted[size_t(i * n + k)] = V(i, order[size_t(k)]);
  }
  vectors = std::move(sorted);
}

std::vector<double> sqrtm_psd(const std::vector<double>& a, int64_t n) {
  std::vector<double> w, v;
  symmetric_eigen(a, n, w, v);
  std::vector<double> out(size_t(n * n), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const double r = std::sqrt(std::max(w[size_t(k)], 0.0));
    if (r == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      const double vik = v[size_t(i * n + k)] * r;
      for (int64_t j = 0; j < n; ++j)
        out[size_t(i * n + j)] += vik * v[size_t(j * n + k)];
    }
  }
  return out;
}

namespace {

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t n) {
  std::vector<double> c(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < n; ++k) {
      const double aik = a[size_t(i * n + k)];
      for (int64_t j = 0; j < n; ++j)
        c[size_t(i * n + j)] += aik * b[size_t(k * n + j)];
    }
  return c;
}

}  // namespace

double frechet_distance(const GaussianFit& a, const GaussianFit& b) {
  MT_CHECK(a.dim == b.dim && a.dim > 0, "frechet_distance: the fits have dimensions ", a.dim,
           " and ", b.dim);
  const int64_t n = a.dim;
  double diff = 0, trace = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = a.mean[size_t(i)] - b.mean[size_t(i)];
    diff += d * d;
    trace += a.cov[size_t(i * n + i)] + b.cov[size_t(i * n + i)];
  }
  const std::vector<double> r = sqrtm_psd(a.cov, n);
  std::vector<double> m = matmul(matmul(r, b.cov, n), r, n);
  for (int64_t i = 0; i < n; ++i)  // symmetric up to rounding: make it exactly so
    for (int64_t j = i + 1; j < n; ++j) {
      const double s = 0.5 * (m[size_t(i * n + j)] + m[size_t(j * n + i)]);
      m[size_t(i * n + j)] = m[size_t(j * n + i)] = s;
    }
  std::vector<double> w, v;
  symmetric_eigen(m, n, w, v);
  double tr_sqrt = 0;
  for (double x : w)
    tr_sqrt += std::sqrt(std::max(x, 0.0));
  return diff + trace - 2 * tr_sqrt;
}

// ---- MS-SSIM ------------------------------------------------------------------------------------

namespace {

struct Image {
  int64_t h = 0, w = 0;
  std::vector<double> v;
  double at(int64_t i, int64_t j) const { return v[size_t(i * w + j)]; }
};

// Valid-position separable filtering with the 1-D window g.
Image filter(const Image& x, const std::vector<double>& g) {
  const int64_t k = int64_t(g.size());
  Image rows{x.h, x.w - k + 1, {}};
  rows.v.assign(size_t(rows.h * rows.w), 0.0);
  for (int64_t i = 0; i < rows.h; ++i)
    for (int64_t j = 0; j < rows.w; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t)
        s += g[size_t(t)] * x.at(i, j + t);
      rows.v[size_t(i * rows.w + j)] = s;
    }
  Image out{x.h - k + 1, rows.w, {}};
  out.v.assign(size_t(out.h * out.w), 0.0);
  for (int64_t i = 0; i < out.h; ++i)
    for (int64_t j = 0; j < out.w; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t)
        s += g[size_t(t)] * rows.at(i + t, j);
      out.v[size_t(i * out.w + j)] = s;
    }
  return out;
}

Image product(const Image& a, const Image& b) {
  Image p{a.h, a.w, a.v};
  for (size_t i = 0; i < p.v.size(); ++i)
    p.v[i] *= b.v[i];
  return p;
}

Image avg_pool2(const Image& x) {
  Image out{x.h / 2, x.w / 2, {}};
  out.v.resize(size_t(out.h * out.w));
  for (int64_t i = 0; i < out.h; ++i)
    for (int64_t j = 0; j < out.w; ++j)
      out.v[size_t(i * out.w + j)] = 0.25 * (x.at(2 * i, 2 * j) + x.at(2 * i, 2 * j + 1) +
                                             x.at(2 * i + 1, 2 * j) + x.at(2 * i + 1, 2 * j + 1));
  return out;
}

// The means of the SSIM and contrast-structure maps of one channel at one scale.
std::pair<double, double> ssim_cs(const Image& x, const Image& y, const std::vector<double>& g,
                                  double c1, double c2) {
  const Image mx = filter(x, g), my = filter(y, g);
  const Image sxx = filter(product(x, x), g), syy = filter(product(y, y), g);
  const Image sxy = filter(product(x, y), g);
  double ssim = 0, cs = 0;
  const size_t n = mx.v.size();
  for (size_t i = 0; i < n; ++i) {
    const double ux = mx.v[i], uy = my.v[i];
    const double vx = sxx.v[i] - ux * ux, vy = syy.v[i] - uy * uy, cxy = sxy.v[i] - ux * uy;
    const double csv = (2 * cxy + c2) / (vx + vy + c2);
    cs += csv;
    ssim += (2 * ux * uy + c1) / (ux * ux + uy * uy + c1) * csv;
  }
  return {ssim / double(n), cs / double(n)};
}

}  // namespace

double ms_ssim(const Tensor& a, const Tensor& b, const MsSsimOptions& o) {
  MT_CHECK(a.defined() && b.defined() && a.shape() == b.shape(),
           "ms_ssim: the two images must have the same shape, got ",
           a.defined() ? a.describe() : "undefined", " and ",
           b.defined() ? b.describe() : "undefined");
  MT_CHECK(a.dim() >= 2 && a.dim() <= 4 && (a.dim() < 4 || a.size(0) == 1),
           "ms_ssim: images must be (H, W), (C, H, W) or (1, C, H, W), got ", a.describe());
  MT_CHECK(o.scales >= 1 && o.window >= 1 && o.sigma > 0 && o.data_range > 0,
           "ms_ssim: scales, window, sigma and data_range must be positive");
  std::vector<double> weights = o.weights;
  if (weights.empty()) {
    static const double kWang[] = {0.0448, 0.2856, 0.3001, 0.2363, 0.1333};
    MT_CHECK(o.scales <= 5, "ms_ssim: give weights for more than 5 scales");
    weights.assign(kWang, kWang + o.scales);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    for (double& w : weights)
      w /= total;
  }
  MT_CHECK(int64_t(weights.size()) == o.scales, "ms_ssim: ", weights.size(), " weights for ",
           o.scales, " scales");
  const int64_t h = a.size(-2), w = a.size(-1);
  const int64_t channels = a.numel() / (h * w);
  const int64_t coarsest = std::min(h, w) >> (o.scales - 1);
  MT_CHECK(coarsest >= o.window, "ms_ssim: ", h, "x", w, " images are too small for ", o.scales,
           " scales with a ", o.window, "-pixel window (the coarsest scale is ", coarsest,
           " pixels); use fewer scales or a smaller window");
  std::vector<double> g(size_t(o.window));
  for (int t = 0; t < o.window; ++t) {
    const double d = t - (o.window - 1) / 2.0;
    g[size_t(t)] = std::exp(-d * d / (2 * o.sigma * o.sigma));
  }
  const double gs = std::accumulate(g.begin(), g.end(), 0.0);
  for (double& v : g)
    v /= gs;
  const double c1 = (o.k1 * o.data_range) * (o.k1 * o.data_range);
  const double c2 = (o.k2 * o.data_range) * (o.k2 * o.data_range);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  double total = 0;
  for (int64_t c = 0; c < channels; ++c) {
    Image x{h, w, std::vector<double>(av.begin() + c * h * w, av.begin() + (c + 1) * h * w)};
    Image y{h, w, std::vector<double>(bv.begin() + c * h * w, bv.begin() + (c + 1) * h * w)};
    double value = 1;
    for (int s = 0; s < o.scales; ++s) {
      const auto [ssim, cs] = ssim_cs(x, y, g, c1, c2);
      const double term = s + 1 == o.scales ? ssim : cs;
      value *= std::pow(std::max(term, 0.0), weights[size_t(s)]);
      if (s + 1 < o.scales) {
        x = avg_pool2(x);
        y = avg_pool2(y);
      }
    }
    total += value;
  }
  return total / double(channels);
}

double mean_pairwise_ms_ssim(const Tensor& images, const MsSsimOptions& options) {
  MT_CHECK(images.defined() && images.dim() == 4 && images.size(0) >= 2,
           "mean_pairwise_ms_ssim: expected a batch (N, C, H, W) with N >= 2, got ",
           images.defined() ? images.describe() : "an undefined tensor");
  const Tensor cpu = images.to(Device::cpu()).to(DType::F64).contiguous();
  const int64_t pairs = cpu.size(0) / 2;
  double sum = 0;
  for (int64_t k = 0; k < pairs; ++k)
    sum += ms_ssim(cpu.select(0, 2 * k), cpu.select(0, 2 * k + 1), options);
  return sum / double(pairs);
}

}  // namespace mantissa::metrics
