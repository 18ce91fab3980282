// fp8 quantization on the CPU (backend fp8_quantize, what fp8_linear runs for each operand): a
// bf16 matrix quantized to E4M3 with each recipe's blocks, writing codes and values or the values
// only, in every vector build this CPU runs (baseline, AVX2, AVX-512), one thread.
//
// Every row runs interleaved with the others, round after round, in one process; each keeps its
// best round. ns/value is that round's time over the matrix's values; "x baseline" is the
// baseline build's time for the same row over this build's, measured in the same rounds.
//   build/bench/bench_fp8 [--rounds 15] [--rows 2048] [--cols 512]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vector_isa.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace {

using namespace mantissa;
using backend::Fp8QuantizeParams;
using backend::Fp8ScaleRule;
using backend::cpu::VectorIsa;

struct Blocks {
  const char* name;
  Fp8QuantizeParams p;
};

struct Row {
  std::string blocks;
  bool values_only;
  VectorIsa isa;
  Fp8QuantizeParams p;
  double best_s = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  int64_t R = 2048, C = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (k == "--rows" && i + 1 < argc) {
      R = std::atoll(argv[++i]);
    } else if (k == "--cols" && i + 1 < argc) {
      C = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "bench_fp8: unknown argument %s (use --rounds N, --rows N, --cols N)\n",
                   argv[i]);
      return 2;
    }
  }
  if (rounds < 1 || R < 128 || C < 128 || R % 128 != 0 || C % 128 != 0) {
    std::fprintf(stderr, "bench_fp8: --rounds must be >= 1, --rows and --cols multiples of 128\n");
    return 2;
  }
  set_num_threads(1);
  backend::Backend& cpu = backend::cpu_backend();
  const Tensor x = Tensor::uniform({R, C}, -3.0, 3.0, 1, DType::BF16);
  Tensor codes = Tensor::empty({R, C}, DType::FP8_E4M3);
  Tensor dtype_only = Tensor::empty({0}, DType::FP8_E4M3);
  Tensor values = Tensor::empty({R, C}, DType::BF16);
  // Enough scales and amaxes for the finest blocks (a scale per 32 values).
  Tensor scale_inv = Tensor::empty({R * C / 32}, DType::F32);
  Tensor amax = Tensor::empty({R * C / 32}, DType::F32);

  const Blocks blocks[] = {
      {"per tensor, given", {0, 0, Fp8ScaleRule::Given, 30.0f}},
      {"per tensor, current", {0, 0, Fp8ScaleRule::Amax, 1}},
      {"mxfp8 1x32", {1, 32, Fp8ScaleRule::AmaxPow2, 1}},
      {"mxfp8 32x1", {32, 1, Fp8ScaleRule::AmaxPow2, 1}},
      {"blockwise 1x128", {1, 128, Fp8ScaleRule::Amax, 1}},
      {"blockwise 128x1", {128, 1, Fp8ScaleRule::Amax, 1}},
      {"blockwise 128x128", {128, 128, Fp8ScaleRule::Amax, 1}},
  };
  std::vector<VectorIsa> isas{VectorIsa::Baseline};
  for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512})
    if (backend::cpu::vector_isa_supported(isa)) isas.push_back(isa);
  std::vector<Row> rows;
  for (const Blocks& b : blocks)
    for (const bool values_only : {false, true})
      for (const VectorIsa isa : isas) {
        Fp8QuantizeParams p = b.p;
        p.values_only = values_only;
        rows.push_back({b.name, values_only, isa, p});
      }

  for (int round = 0; round < rounds; ++round) {
    for (Row& r : rows) {
      backend::cpu::force_vector_isa(r.isa);
      const int64_t br = r.p.block_rows ? r.p.block_rows : R;
      const int64_t bc = r.p.block_cols ? r.p.block_cols : C;
      const int64_t n = (R / br) * (C / bc);
      Tensor si = scale_inv.narrow(0, 0, n), am = amax.narrow(0, 0, n);
      Tensor& out = r.values_only ? dtype_only : codes;
      const auto t0 = std::chrono::steady_clock::now();
      cpu.fp8_quantize(x, r.p, out, si, am, &values);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.best_s = std::min(r.best_s, s);
    }
  }
  backend::cpu::force_vector_isa(std::nullopt);

  std::printf(
      "fp8 quantization of a %lld x %lld bf16 matrix to e4m3, 1 thread, best of %d "
      "interleaved rounds\n",
      static_cast<long long>(R), static_cast<long long>(C), rounds);
  std::printf("%-20s %-14s %-20s %9s %9s %11s\n", "blocks", "writes", "build", "ms", "ns/value",
              "x baseline");
  const double nvalues = double(R * C);
  for (const Row& r : rows) {
    double base = r.best_s;
    for (const Row& o : rows)
      if (o.blocks == r.blocks && o.values_only == r.values_only && o.isa == VectorIsa::Baseline)
        base = o.best_s;
    std::printf("%-20s %-14s %-20s %9.3f %9.3f %10.2fx\n", r.blocks.c_str(),
                r.values_only ? "values" : "codes+values", backend::cpu::vector_isa_name(r.isa),
                r.best_s * 1e3, r.best_s * 1e9 / nvalues, base / r.best_s);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS %.0f MiB (the matrix, its codes and values: %.0f MiB)\n",
              double(ru.ru_maxrss) / 1024.0, nvalues * (2 + 1 + 2) / (1024.0 * 1024.0));
  return 0;
}
