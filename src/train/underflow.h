// The gradient-underflow picture of --underflow-every (docs/training.md, "Gradient underflow"):
// log2 histograms of the activation gradients, weight gradients, weights and weight updates of a
// measured step, and how many of each would be lost in fp16 or bf16.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/tensor/tensor.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {

class Trainee;

// Compares a step's fp32 reference gradients (same weights and batch, no autocast) with the
// trainee's own scaled gradients (call after backward, before unscale): how many non-zero
// reference values become zero in fp16, overall and per parameter.
UnderflowStats measure_underflow(const Trainee& trainee, const std::vector<Tensor>& reference);

// How many values have each binary exponent: bucket e counts the non-zero finite x with
// 2^e <= |x| < 2^(e+1) (fp32 subnormals by their true exponent, down to -149).
class Log2Counts {
 public:
  static constexpr int kMinExponent = -149, kMaxExponent = 127;
  void add(float x);
  void add(const Tensor& t);  // every element (any float dtype, any device)
  int64_t zeros() const { return zeros_; }
  int64_t nonfinite() const { return nonfinite_; }
  int64_t count(int exponent) const { return counts_[size_t(exponent - kMinExponent)]; }
  int64_t nonzero() const;  // finite and non-zero
  // {"zeros", "nonfinite", "min_exponent", "counts"}: counts[i] is exponent min_exponent + i,
  // from the smallest to the largest non-empty bucket.
  nlohmann::ordered_json to_json() const;

 private:
  int64_t zeros_ = 0, nonfinite_ = 0;
  std::array<int64_t, kMaxExponent - kMinExponent + 1> counts_{};
};

// The gradients of every layer's output (nn::OutputObserver) in an fp32 backward: their log2
// histogram and how many non-zero values become zero cast to fp16 as they are and after
// multiplying by the loss scale.
class ActivationGradients {
 public:
  explicit ActivationGradients(double loss_scale) : scale_(float(loss_scale)) {}
  void add(const Tensor& gradient);
  nlohmann::ordered_json to_json() const;  // nonzero, cast_unscaled, cast_scaled, log2

 private:
  float scale_;
  Log2Counts log2_;
  int64_t nonzero_ = 0, cast_unscaled_ = 0, cast_scaled_ = 0;
};

// What an optimizer step did to the weights: the log2 histogram of |w_new - w| / |w| over the
// weights that moved, and how many of those updates a weight stored in bf16 or fp16 without an
// fp32 master would lose (round(round(w) + update) == round(w), to nearest even): the failure
// master weights fix. `before` and `after` are the fp32 values, parameter by parameter.
nlohmann::ordered_json weight_updates(const std::vector<Tensor>& before,
                                      const std::vector<Tensor>& after);

}  // namespace mantissa::train
