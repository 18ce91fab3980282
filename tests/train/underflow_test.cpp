// The gradient-underflow picture (src/train/underflow.h): its log2 histogram against numpy's on
// the same values, the activation gradients of a real step, and what a weight update loses.
#include "train/underflow.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/temp_dir.h"
#include "mantissa/nn/module.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

class UnderflowPictureTest : public mantissa::testing::TempDirTest {};

// Every binary exponent of fp32, subnormals included, with zeros, infinities and NaN among them.
std::vector<float> spread_values() {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v;
  for (int e = -149; e <= 127; ++e)
    for (int k = 0; k < 7; ++k)
      v.push_back(std::ldexp(n(rng), e));
  for (int k = 0; k < 50; ++k)
    v.push_back(0.0f);
  v.push_back(-0.0f);
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(-std::numeric_limits<float>::infinity());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(std::numeric_limits<float>::denorm_min());
  v.push_back(std::numeric_limits<float>::max());
  return v;
}

TEST_F(UnderflowPictureTest, Log2HistogramMatchesNumpy) {
  const std::string python = MANTISSA_PYTHON;
  if (python.empty() || std::system((python + " -c 'import numpy' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "skipped: no Python with numpy (scripts/setup installs it)";
  const std::vector<float> values = spread_values();
  Log2Counts counts;
  counts.add(Tensor::from_vector(values, {int64_t(values.size())}));
  const std::string raw = file("values.f32"), out = file("numpy.json");
  std::ofstream(raw, std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()),
             std::streamsize(values.size() * sizeof(float)));
  // numpy's frexp: x = m * 2^e with 0.5 <= |m| < 1, so floor(log2|x|) = e - 1 (subnormals too).
  const std::string script =
      "import json, sys\n"
      "import numpy as np\n"
      "x = np.fromfile(sys.argv[1], dtype='<f4')\n"
      "finite = np.isfinite(x)\n"
      "nz = x[finite & (x != 0)]\n"
      "e = np.frexp(nz)[1].astype(np.int64) - 1\n"
      "lo = int(e.min())\n"
      "json.dump({'zeros': int(np.sum(x[finite] == 0)), 'nonfinite': int(np.sum(~finite)),\n"
      "           'min_exponent': lo, 'counts': np.bincount(e - lo).tolist()}, open(sys.argv[2], "
      "'w'))\n";
  const std::string py = file("log2.py");
  std::ofstream(py) << script;
  ASSERT_EQ(std::system((python + " " + py + " " + raw + " " + out).c_str()), 0);
  const nlohmann::json want = nlohmann::json::parse(std::ifstream(out));
  const nlohmann::json got = nlohmann::json::parse(counts.to_json().dump());
  EXPECT_EQ(got["zeros"], want["zeros"]);
  EXPECT_EQ(got["nonfinite"], want["nonfinite"]);
  EXPECT_EQ(got["min_exponent"], want["min_exponent"]);
  EXPECT_EQ(got["min_exponent"], -149);
  EXPECT_EQ(got["counts"], want["counts"]);
}

TEST(UnderflowPicture, UpdatesLostWithoutAMasterAreCountedPerFormat) {
  // At w = 1: a bf16 ulp is 2^-7, an fp16 ulp 2^-10. 1e-4 is lost in both, 1e-3 in bf16 only,
  // 1e-2 in neither; a weight at zero or an update of zero is not a move.
  const Tensor before = Tensor::from_vector(std::vector<float>{1, 1, 1, 0, 1}, {5});
  const Tensor after =
      Tensor::from_vector(std::vector<float>{1.0001f, 1.001f, 1.01f, 0.5f, 1.0f}, {5});
  const nlohmann::ordered_json j = weight_updates({before}, {after});
  EXPECT_EQ(j["moved"], 3);
  EXPECT_EQ(j["lost_bf16"], 2);
  EXPECT_EQ(j["lost_fp16"], 1);
  // |update| / |w| of each move, by binary exponent: 1e-4 -> -14, 1e-3 -> -10, 1e-2 -> -7.
  EXPECT_EQ(j["log2_ratio"]["min_exponent"], -14);
  const std::vector<int64_t> counts = j["log2_ratio"]["counts"];
  std::vector<int64_t> want(8, 0);
  want[0] = want[4] = want[7] = 1;
  EXPECT_EQ(counts, want);
}

// A real fp16 step of the mlp: the hook sees the gradient of every layer's output once, and its
// fp16 casts match a direct count on the same values.
TEST(UnderflowPicture, ActivationGradientsOfEveryLayerOnce) {
  TrainConfig c;
  c.model = "mlp";
  c.set("data", "synthetic");
  c.synthetic_size = 256;
  c.batch_size = 64;
  c.eval_batch_size = 128;
  c.max_steps = 1;
  c.set("precision", "fp16");
  c.underflow_every = 1;
  c.threads = 2;
  c.progress = false;
  Trainer t(c);
  std::vector<nlohmann::json> records;
  t.set_record_callback([&](const std::string& s) {
    const nlohmann::json r = nlohmann::json::parse(s);
    if (r["kind"] == "underflow") records.push_back(r);
  });
  t.fit();
  ASSERT_EQ(records.size(), 1u);
  const nlohmann::json& a = records[0]["activations"];
  // The mlp's layers with a gradient and their outputs per example: linear 256, relu 256, linear
  // 128, relu 128, linear 10 (flatten's output is the input's: no gradient; dropout at p = 0
  // returns relu's output, which is counted once).
  int64_t outputs = 0;
  {
    std::set<const void*> seen;
    nn::OutputObserver count([&](const nn::Module&, const Tensor& y) {
      if (y.requires_grad() && seen.insert(y.grad_fn().get()).second) outputs += y.numel();
    });
    (void)t.model()(Tensor::zeros({64, 1, 28, 28}));
  }
  EXPECT_EQ(outputs, 64 * (256 + 256 + 128 + 128 + 10));
  int64_t histogram = a["log2"]["zeros"].get<int64_t>();
  for (const int64_t n : a["log2"]["counts"].get<std::vector<int64_t>>())
    histogram += n;
  EXPECT_EQ(histogram, outputs);
  EXPECT_EQ(a["nonzero"].get<int64_t>() + a["log2"]["zeros"].get<int64_t>(), outputs);
  // Unscaled, the smallest gradients flush in fp16 (below 2^-25); at 65536 none of these do.
  EXPECT_GT(a["cast_unscaled"].get<int64_t>(), 0);
  EXPECT_LT(a["cast_scaled"].get<int64_t>(), a["cast_unscaled"].get<int64_t>());
  const nlohmann::json& u = records[0]["updates"];
  EXPECT_GT(u["moved"].get<int64_t>(), 0);
  EXPECT_GE(u["lost_bf16"].get<int64_t>(), u["lost_fp16"].get<int64_t>());
}

}  // namespace
}  // namespace mantissa::train
