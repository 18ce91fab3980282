// fp8 quantization on the CPU (backend fp8_quantize, what fp8_linear runs for each operand): a
// bf16 matrix quantized to E4M3 with each recipe's blocks, writing the codes and their values or
// the values only (what the CPU's GEMMs read), one thread, in the vector build the CPU backend
// runs (MANTISSA_ISA=avx2 or MANTISSA_CPU_ISA=baseline runs another).
//
// Every row runs interleaved with the others, round after round, in one process; each keeps its
// best round. ns/value is that round's time over the matrix's values; "values only" is the
// codes-and-values row's time over the values-only row's, measured in the same rounds.
//   build/bench/bench_fp8 [--rounds 15] [--rows 2048] [--cols 512]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace {

using namespace mantissa;
using backend::Fp8QuantizeParams;
using backend::Fp8ScaleRule;

struct Row {
  const char* blocks;
  Fp8QuantizeParams p;
  double best_s[2] = {1e30, 1e30};  // codes and values; values only
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
  Tensor dtype_only = Tensor::empty({0}, DType::FP8_E4M3);  // values only: names the format
  Tensor values = Tensor::empty({R, C}, DType::BF16);
  // Enough scales and amaxes for the finest blocks (a scale per 32 values).
  Tensor scale_inv = Tensor::empty({R * C / 32}, DType::F32);
  Tensor amax = Tensor::empty({R * C / 32}, DType::F32);

  const Tensor given = Tensor::full({1}, 30.0, DType::F32);
  std::vector<Row> rows = {
      {"per tensor, given", {0, 0, Fp8ScaleRule::Given, &given}},
      {"per tensor, current", {0, 0, Fp8ScaleRule::Amax, nullptr}},
      {"mxfp8 1x32", {1, 32, Fp8ScaleRule::AmaxPow2, nullptr}},
      {"mxfp8 32x1", {32, 1, Fp8ScaleRule::AmaxPow2, nullptr}},
      {"blockwise 1x128", {1, 128, Fp8ScaleRule::Amax, nullptr}},
      {"blockwise 128x1", {128, 1, Fp8ScaleRule::Amax, nullptr}},
      {"blockwise 128x128", {128, 128, Fp8ScaleRule::Amax, nullptr}},
  };
  for (int round = 0; round < rounds; ++round) {
    for (Row& r : rows) {
      for (const int values_only : {0, 1}) {
        Fp8QuantizeParams p = r.p;
        p.values_only = values_only == 1;
        const int64_t br = p.block_rows ? p.block_rows : R;
        const int64_t bc = p.block_cols ? p.block_cols : C;
        const int64_t n = (R / br) * (C / bc);
        Tensor si = scale_inv.narrow(0, 0, n), am = amax.narrow(0, 0, n);
        const auto t0 = std::chrono::steady_clock::now();
        cpu.fp8_quantize(x, p, values_only ? dtype_only : codes, si, am, &values);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.best_s[values_only] = std::min(r.best_s[values_only], s);
      }
    }
  }

  std::printf(
      "fp8 quantization of a %lld x %lld bf16 matrix to e4m3, 1 thread, %s build, best of "
      "%d interleaved rounds\n",
      static_cast<long long>(R), static_cast<long long>(C), backend::cpu_vector_build(), rounds);
  std::printf("%-20s %22s %22s %12s\n", "blocks", "codes+values ms (ns/v)", "values ms (ns/v)",
              "values only");
  const double nvalues = double(R * C);
  for (const Row& r : rows) {
    std::printf("%-20s %12.3f (%6.3f) %12.3f (%6.3f) %11.2fx\n", r.blocks, r.best_s[0] * 1e3,
                r.best_s[0] * 1e9 / nvalues, r.best_s[1] * 1e3, r.best_s[1] * 1e9 / nvalues,
                r.best_s[0] / r.best_s[1]);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS %.0f MiB (the matrix, its codes and values: %.0f MiB)\n",
              double(ru.ru_maxrss) / 1024.0, nvalues * (2 + 1 + 2) / (1024.0 * 1024.0));
  return 0;
}
