// Rounding your own float buffer to the narrow formats with Mantissa's conversions: the error
// each format makes on the same data, what under- and overflows, and stochastic rounding keeping
// the mean where rounding to nearest loses it.
//
//   ./formats
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <mantissa/numerics/convert.h>
#include <mantissa/numerics/format.h>
#include <mantissa/numerics/types.h>

namespace mt = mantissa;

int main() {
  // A user buffer: log-normal magnitudes over many decades, random signs (like gradients).
  std::mt19937 rng(7);
  std::lognormal_distribution<float> magnitude(-4.0f, 4.0f);
  std::vector<float> data(1 << 16);
  for (float& v : data)
    v = (rng() & 1 ? 1.0f : -1.0f) * magnitude(rng);

  std::printf("%-9s %12s %14s %10s %10s\n", "format", "max finite", "mean rel err", "to zero",
              "saturated");
  for (mt::Format f : {mt::Format::TF32, mt::Format::BF16, mt::Format::FP16, mt::Format::FP8_E4M3,
                       mt::Format::FP8_E5M2}) {
    const mt::FormatInfo& info = mt::format_info(f);
    std::vector<float> r = data;  // round a copy in place: the values stay floats
    mt::round_in_place(f, r.data(), r.size(), {.overflow = mt::Overflow::Saturate});
    double rel = 0;
    long zeros = 0, saturated = 0, counted = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i] == 0.0f) {
        ++zeros;
      } else if (std::fabs(r[i]) == float(info.max_finite) &&
                 std::fabs(data[i]) > info.max_finite) {
        ++saturated;
      } else {
        rel += std::fabs(double(r[i]) - data[i]) / std::fabs(data[i]);
        ++counted;
      }
    }
    std::printf("%-9s %12.4g %14.3g %9.2f%% %9.2f%%\n", std::string(info.name).c_str(),
                info.max_finite, rel / double(std::max(counted, 1L)),
                100.0 * double(zeros) / double(r.size()),
                100.0 * double(saturated) / double(r.size()));
  }

  // Typed storage: convert into bf16 / fp8 arrays (2 and 1 bytes a value) and back.
  std::vector<mt::bfloat16> b(data.size());
  std::vector<mt::float8_e4m3> e(data.size());
  mt::convert(data.data(), b.data(), data.size());
  mt::convert(data.data(), e.data(), data.size(), {.overflow = mt::Overflow::Saturate});
  std::vector<float> back(data.size());
  mt::convert(b.data(), back.data(), back.size());
  std::printf("bf16 storage: %zu bytes for %zu floats; first value %.6g -> %.6g\n",
              b.size() * sizeof(mt::bfloat16), data.size(), data[0], back[0]);

  // Many tiny updates to a bf16 weight of 1.0: nearest-even drops every one of them, stochastic
  // rounding keeps them in expectation.
  const float update = 1e-4f;
  for (mt::RoundingMode mode : {mt::RoundingMode::NearestEven, mt::RoundingMode::Stochastic}) {
    std::vector<float> w(4096, 1.0f);
    for (uint64_t step = 0; step < 20; ++step) {
      for (float& v : w)
        v -= update;
      mt::round_in_place(mt::Format::BF16, w.data(), w.size(),
                         {.mode = mode, .seed = 42, .offset = step});
    }
    double mean = 0;
    for (float v : w)
      mean += v;
    std::printf("20 updates of -1e-4 to bf16 1.0, %s: mean %.5f (exact %.5f)\n",
                mode == mt::RoundingMode::Stochastic ? "stochastic  " : "nearest even",
                mean / double(w.size()), 1.0 - 20 * double(update));
  }
  return 0;
}
