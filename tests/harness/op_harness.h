// The per-op test harness: one op checked in every dtype against float64, and its gradients
// against central finite differences in float64.
//
// For a dtype d the inputs are first rounded to d; the float64 reference runs on exactly those
// rounded values, so the comparison measures the op's own error in d, not the inputs'. The
// tolerance is the dtype table's: |got - ref| <= k * eps(d) * (|ref| + scale), where scale is
// the mean magnitude of the reference (the atol that reductions and GEMMs need).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "mantissa/autograd/engine.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::testing {

// Machine epsilon of a dtype: the unit of every tolerance.
double eps_of(DType d);

// x as a value of dtype `dt` holds it after one store (f64 exact; f32 by the C++ cast; bf16 and
// f16 through float, as a kernel that computes in fp32 and rounds on store does).
double store_as(DType dt, double x);

// Uniform values in [lo, hi], as f64 (rounded to a dtype later by the harness).
Tensor random_f64(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0);

// The same values in a non-contiguous layout: stored transposed (last two dims swapped) or, for
// 1-D and scalars, every other element of a larger buffer.
Tensor strided_copy(const Tensor& t);

struct OpCase {
  std::string name;
  std::vector<Tensor> inputs;  // f64 values; undefined entries are passed through
  std::vector<bool> grad;      // which inputs to differentiate (default: all floating)
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  // An independent float64 implementation (plain loops), compared with fn's f64 result.
  std::function<Tensor(const std::vector<Tensor>&)> reference;
  double k_forward = 4;  // tolerance multipliers on eps(dtype)
  double k_backward = 8;
  bool check_strided = true;
  int fd_samples = 24;  // finite-difference elements checked per input
};

// Runs every check for `c` in each of `dtypes` (F64 always included for the gradient check).
void check_op(const OpCase& c,
              const std::vector<DType>& dtypes = {DType::F64, DType::F32, DType::BF16, DType::F16});

// Element-wise closeness with the harness's tolerance rule; reports the worst element.
::testing::AssertionResult all_close(const Tensor& got, const Tensor& ref, double eps, double k,
                                     const std::string& what);

}  // namespace mantissa::testing
