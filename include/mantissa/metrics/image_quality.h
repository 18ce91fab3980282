// Quality metrics of generated images (train::train_gan, docs/training.md "GANs"):
//
// - The Fréchet distance between Gaussian fits of two sets of feature vectors,
//   |mu1 - mu2|^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)), in float64. With Inception-v3 features this
//   is FID; train_gan uses the 128-d penultimate layer of Mantissa's own `cnn` classifier
//   instead, so its numbers are NOT FID values and compare only with each other.
// - MS-SSIM (Wang, Simoncelli and Bovik 2003) between two images, used as a diversity measure
//   over pairs of generated samples (lower mean = more diverse).
#pragma once

#include <cstdint>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::metrics {

// A Gaussian fit of N feature vectors of dimension D: their mean and (unbiased, N - 1)
// covariance, row-major D x D, in float64.
struct GaussianFit {
  int64_t dim = 0;
  std::vector<double> mean;
  std::vector<double> cov;
};
// features (N, D), N >= 2, any floating dtype and device.
GaussianFit gaussian_fit(const Tensor& features);

// The eigen-decomposition of a symmetric n x n matrix (row-major) by cyclic Jacobi rotations:
// `values` ascending, `vectors` row-major with eigenvector k in column k. Sweeps until the
// off-diagonal mass is below 1e-22 of the total (or 100 sweeps).
void symmetric_eigen(const std::vector<double>& a, int64_t n, std::vector<double>& values,
                     std::vector<double>& vectors);
// The symmetric positive semi-definite square root of a symmetric matrix (negative eigenvalues,
// rounding noise of a PSD matrix, taken as 0).
std::vector<double> sqrtm_psd(const std::vector<double>& a, int64_t n);

// Tr((S1 S2)^(1/2)) is computed as Tr((sqrt(S1) S2 sqrt(S1))^(1/2)): the same eigenvalues, of a
// symmetric PSD matrix, so two symmetric eigen-decompositions and no complex arithmetic.
double frechet_distance(const GaussianFit& a, const GaussianFit& b);

struct MsSsimOptions {
  // 3 scales with a 7-tap Gaussian window (sigma 1.5) fit 28x28 images (28, 14, 7 pixels per
  // side: the window must fit the coarsest scale). Wang et al.'s 5 scales with 11 taps need at
  // least 161 pixels per side.
  int scales = 3;
  int window = 7;
  double sigma = 1.5;
  double data_range = 2.0;  // images in [-1, 1]
  double k1 = 0.01, k2 = 0.03;
  // Per-scale exponents; empty: Wang et al.'s first `scales` weights (0.0448, 0.2856, 0.3001,
  // 0.2363, 0.1333) renormalized to sum to 1.
  std::vector<double> weights;
};
// MS-SSIM of two images of the same shape (H, W), (C, H, W) or (1, C, H, W) (the mean over
// channels). Each scale filters with the Gaussian window over valid positions only (no padding)
// and halves the image by 2x2 average pooling (an odd last row/column dropped). Result:
// prod_{j<M} cs_j^w_j * ssim_M^w_M with cs_j, ssim_M the means of the contrast-structure and
// SSIM maps, each clamped at 0 first (as pytorch_msssim does) so the powers stay real.
double ms_ssim(const Tensor& a, const Tensor& b, const MsSsimOptions& options = {});
// The mean MS-SSIM over the pairs (images[2k], images[2k + 1]), k < images.size(0) / 2, of a
// batch (N, C, H, W).
double mean_pairwise_ms_ssim(const Tensor& images, const MsSsimOptions& options = {});

}  // namespace mantissa::metrics
