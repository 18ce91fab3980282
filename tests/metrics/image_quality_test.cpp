// The Fréchet distance and MS-SSIM (metrics/image_quality.h) against numpy/scipy values written by
// tools/reference/make_gan_metrics_golden.py (tests/data/golden/gan_metrics.json), and the
// Jacobi eigen-decomposition on its own.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mantissa/metrics/image_quality.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::metrics {
namespace {

// The golden file, parsed once and kept for the whole run (a reference: a range-for over
// golden()[...] must not read a freed temporary).
const nlohmann::json& golden() {
  static const nlohmann::json parsed = [] {
    const std::string path = std::string(MANTISSA_GOLDEN_DIR) + "/gan_metrics.json";
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    return nlohmann::json::parse(f);
  }();
  return parsed;
}

Tensor matrix(const nlohmann::json& values, int64_t rows, int64_t cols) {
  return Tensor::from_vector(values.get<std::vector<double>>(), {rows, cols}, DType::F64);
}

TEST(FrechetDistance, MatchesScipy) {
  for (const auto& c : golden()["frechet"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t d = c["d"];
    const GaussianFit a = gaussian_fit(matrix(c["f1"], c["n1"], d));
    const GaussianFit b = gaussian_fit(matrix(c["f2"], c["n2"], d));
    const double want = c["distance"];
    // scipy's sqrtm (a Schur method on the non-symmetric S1 S2) is itself accurate to ~1e-9
    // relative here; ours goes through two symmetric eigen-decompositions.
    EXPECT_NEAR(frechet_distance(a, b), want, 1e-7 * std::abs(want));
    // A distribution against itself: 0 up to the square root's error on eigenvalues near zero
    // (the rank-deficient case: -1.6e-6 against a distance of 190, about sqrt(eps) relative).
    EXPECT_NEAR(frechet_distance(a, a), 0.0, 1e-7 * std::abs(want) + 1e-8 * std::abs(want) * d);
  }
}

TEST(FrechetDistance, SqrtmMatchesScipy) {
  for (const auto& c : golden()["sqrtm"]) {
    const int64_t n = c["n"];
    const std::vector<double> a = c["a"], want = c["sqrt"];
    const std::vector<double> got = sqrtm_psd(a, n);
    double scale = 0;
    for (double v : want)
      scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-10 * scale) << i;
  }
}

TEST(FrechetDistance, JacobiEigenDecomposes) {
  const int64_t n = 24;
  const Tensor r = Tensor::normal({n, n}, 0, 1, 5, DType::F64);
  const std::vector<double> a = add(matmul(r, r.t()), add(r, r.t())).to_vector<double>();
  std::vector<double> w, v;
  symmetric_eigen(a, n, w, v);
  for (int64_t i = 1; i < n; ++i)
    EXPECT_LE(w[size_t(i - 1)], w[size_t(i)]);
  // A v_k = w_k v_k and V^T V = I.
  double scale = 0;
  for (double x : a)
    scale = std::max(scale, std::abs(x));
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double av = 0;
      for (int64_t j = 0; j < n; ++j)
        av += a[size_t(i * n + j)] * v[size_t(j * n + k)];
      EXPECT_NEAR(av, w[size_t(k)] * v[size_t(i * n + k)], 1e-11 * scale * n);
    }
    for (int64_t l = 0; l < n; ++l) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i)
        dot += v[size_t(i * n + k)] * v[size_t(i * n + l)];
      EXPECT_NEAR(dot, k == l ? 1.0 : 0.0, 1e-12);
    }
  }
}

TEST(MsSsim, MatchesAnIndependentNumpyImplementation) {
  for (const auto& c : golden()["ms_ssim"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const Tensor x = matrix(c["x"], 28, 28), y = matrix(c["y"], 28, 28);
    const double want = c["value"];
    EXPECT_NEAR(ms_ssim(x, y), want, 1e-12);
    EXPECT_NEAR(
        ms_ssim(x.reshape({1, 1, 28, 28}).to(DType::F32), y.reshape({1, 1, 28, 28}).to(DType::F32)),
        want, 1e-6);
  }
}

TEST(MsSsim, PairsAndErrors) {
  const Tensor same = Tensor::uniform({1, 1, 28, 28}, -1, 1, 3).expand({4, 1, 28, 28});
  EXPECT_NEAR(mean_pairwise_ms_ssim(same.contiguous()), 1.0, 1e-12);
  EXPECT_LT(mean_pairwise_ms_ssim(Tensor::uniform({6, 1, 28, 28}, -1, 1, 4)), 0.2);
  try {
    ms_ssim(Tensor::zeros({16, 16}), Tensor::zeros({16, 16}));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mantissa::metrics
