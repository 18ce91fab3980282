// Bulk fp32 <-> bf16 / fp16 conversion throughput next to memcpy, single thread, on 64 MiB fp32
// arrays (far beyond the caches: this measures how well a kernel uses memory bandwidth).
//
// Every kernel and memcpy run interleaved, round after round, in one process; each row keeps its
// best round. GB/s counts bytes read + bytes written; "x memcpy" is that over memcpy's GB/s for
// a 64 MiB copy measured in the same rounds. Usage: bench_numerics [--rounds N] [--mib N]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "mantissa/core/cpu.h"
#include "mantissa/numerics/convert.h"
#include "numerics/kernels.h"

namespace {

using namespace mantissa;
using detail::Isa;

struct Aligned {
  void* p;
  explicit Aligned(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {
    std::memset(p, 0, bytes);  // fault the pages in before timing
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct Row {
  std::string name;
  std::string isa;
  size_t bytes_moved;
  std::function<void()> run;
  double best_s = 1e30;
};

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  size_t mib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mib")) mib = size_t(std::atoll(argv[i + 1]));
  }
  const size_t n = (mib << 20) / sizeof(float);
  Aligned src(n * 4), dst32(n * 4), dst16(n * 2);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i)
    src.as<float>()[i] = dist(rng);
  convert(src.as<float>(), dst16.as<bfloat16>(), n);

  std::vector<Row> rows;
  rows.push_back({"memcpy", "libc", 2 * n * 4, [&] { std::memcpy(dst32.p, src.p, n * 4); }});
  // Stochastic rounding through the public entry point (best ISA), in one call and in the
  // optimizer's pattern: chunks of 2048 elements, each its own call at index = chunk start.
  const RoundingOptions sr{.mode = RoundingMode::Stochastic, .seed = 42, .offset = 7, .index = 0};
  rows.push_back({"f32 -> bf16 (SR)", "best", n * 6,
                  [&] { convert(src.as<float>(), dst16.as<bfloat16>(), n, sr); }});
  rows.push_back({"f32 -> bf16 (SR, 2048-chunks)", "best", n * 6, [&] {
                    for (size_t i = 0; i < n; i += 2048) {
                      RoundingOptions o = sr;
                      o.index = (uint64_t(3) << 40) + i;
                      convert(src.as<float>() + i, dst16.as<bfloat16>() + i,
                              std::min<size_t>(2048, n - i), o);
                    }
                  }});
  rows.push_back({"f32 -> f16 (SR)", "best", n * 6,
                  [&] { convert(src.as<float>(), dst16.as<half>(), n, sr); }});
  for (Isa isa : detail::kAllIsas) {
    if (!detail::isa_supported(isa)) continue;
    const std::string name(detail::isa_name(isa));
    rows.push_back({"f32 -> bf16 (RNE)", name, n * 6, [&, isa] {
                      detail::f32_to_bf16(src.as<float>(), dst16.as<uint16_t>(), n,
                                          RoundingMode::NearestEven, isa);
                    }});
    rows.push_back({"f32 -> f16 (RNE)", name, n * 6, [&, isa] {
                      detail::f32_to_f16(src.as<float>(), dst16.as<uint16_t>(), n,
                                         RoundingMode::NearestEven, isa);
                    }});
    rows.push_back({"f32 -> bf16 (SR)", name, n * 6, [&, isa] {
                      detail::f32_to_bf16_stochastic(src.as<float>(), dst16.as<uint16_t>(), n, 42,
                                                     7, 0, isa);
                    }});
    rows.push_back({"f32 -> f16 (SR)", name, n * 6, [&, isa] {
                      detail::f32_to_f16_stochastic(src.as<float>(), dst16.as<uint16_t>(), n, 42, 7,
                                                    0, isa);
                    }});
    rows.push_back({"bf16 -> f32", name, n * 6, [&, isa] {
                      detail::bf16_to_f32(dst16.as<uint16_t>(), dst32.as<float>(), n, isa);
                    }});
    rows.push_back({"f16 -> f32", name, n * 6, [&, isa] {
                      detail::f16_to_f32(dst16.as<uint16_t>(), dst32.as<float>(), n, isa);
                    }});
    rows.push_back({"round f32 to bf16 grid, in place", name, n * 8, [&, isa] {
                      detail::round_in_place_fast(Format::BF16, dst32.as<float>(), n,
                                                  RoundingMode::NearestEven, isa);
                    }});
  }

  for (int r = 0; r < rounds; ++r) {
    for (Row& row : rows)
      row.best_s = std::min(row.best_s, seconds(row.run));
  }

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("bulk conversions, %zu MiB of fp32, 1 thread, best of %d interleaved rounds\n", mib,
              rounds);
  std::printf("cpu features: %s; peak RSS %.0f MiB (buffers %.0f MiB)\n",
              cpu_features().describe().c_str(), double(ru.ru_maxrss) / 1024.0,
              double(n * 10) / (1 << 20));
  std::printf("%-34s %-12s %9s %8s %9s\n", "kernel", "isa", "ms", "GB/s", "x memcpy");
  const double memcpy_gbps = double(rows[0].bytes_moved) / rows[0].best_s / 1e9;
  for (const Row& row : rows) {
    const double gbps = double(row.bytes_moved) / row.best_s / 1e9;
    std::printf("%-34s %-12s %9.2f %8.2f %8.2fx\n", row.name.c_str(), row.isa.c_str(),
                row.best_s * 1e3, gbps, gbps / memcpy_gbps);
  }
  return 0;
}
