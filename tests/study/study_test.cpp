#include "mantissa/study/study.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "harness/errors.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/cuda.h"

namespace mantissa::study {
namespace {

// The keys whose values differ between two configurations.
std::set<std::string> changed(const TrainConfig& a, const TrainConfig& b) {
  const nlohmann::json ja = nlohmann::json::parse(a.to_json());
  const nlohmann::json jb = nlohmann::json::parse(b.to_json());
  std::set<std::string> out;
  for (auto it = ja.begin(); it != ja.end(); ++it)
    if (jb.at(it.key()) != it.value()) out.insert(it.key());
  return out;
}

using testing::error_of;

// Each rung of the time/memory ladder changes exactly what it names and nothing else, so that
// the difference between two rungs' times is that thing's.
TEST(StudyLadderTest, EachRungAddsOneThingToTheOneBefore) {
  for (const char* device : {"cpu", "cuda:0"}) {
    SCOPED_TRACE(device);
    StudyConfig s;
    s.ladder_steps = 120;
    const auto& rungs = ladder_rungs();
    ASSERT_EQ(rungs.size(), 5u);
    std::vector<TrainConfig> c;
    for (size_t k = 0; k < rungs.size(); ++k) {
      c.push_back(ladder_cell_config(s, k, device));
      c.back().validate();
      EXPECT_EQ(c.back().model, "cnn");
      EXPECT_EQ(c.back().device, device);
      EXPECT_EQ(c.back().max_steps, 120);
    }
    EXPECT_EQ(config::value_text(c[0], config::Field::precision), "fp32");
    EXPECT_EQ(config::value_text(c[0], config::Field::zero_grad), "zeros");
    EXPECT_EQ(config::value_text(c[0], config::Field::input_pipeline), "pageable");
    // +AMP: bf16 on a GPU, and on a CPU with native bf16 dot products; fp16 O1 elsewhere.
    const bool bf16 = std::string(device) != "cpu" || cpu_features().avx512_bf16;
    EXPECT_EQ(config::value_text(c[1], config::Field::precision), bf16 ? "bf16" : "fp16");
    EXPECT_EQ(config::value_text(c[1], config::Field::opt_level), "O1");
    EXPECT_EQ(changed(c[0], c[1]), (std::set<std::string>{"precision", "opt_level"}));
    EXPECT_EQ(changed(c[1], c[2]), std::set<std::string>{"zero_grad"});
    EXPECT_EQ(config::value_text(c[2], config::Field::zero_grad), "none");
    EXPECT_EQ(changed(c[2], c[3]), std::set<std::string>{"input_pipeline"});
    EXPECT_EQ(config::value_text(c[3], config::Field::input_pipeline), "pinned");
    EXPECT_EQ(changed(c[3], c[4]), std::set<std::string>{"input_pipeline"});
    EXPECT_EQ(config::value_text(c[4], config::Field::input_pipeline), "prefetch");
    for (size_t k = 0; k < rungs.size(); ++k)
      EXPECT_EQ(rungs[k].copies, k >= 3) << rungs[k].name;
  }
}

TEST(StudyLadderTest, StepsDefaultToOneEpochAndQuickToThirty) {
  StudyConfig s;
  s.ladder_model = "mlp";
  TrainConfig c = ladder_cell_config(s, 0, "cpu");
  EXPECT_EQ(c.epochs, 1);
  EXPECT_EQ(c.max_steps, 0);
  EXPECT_EQ(c.batch_size, 128) << "the study's mlp hyper-parameters";
  s.quick = true;
  c = ladder_cell_config(s, 0, "cpu");
  EXPECT_EQ(c.max_steps, 30);
  EXPECT_GE(c.max_steps / c.log_every, 2) << "two train records time the steps between them";
}

TEST(StudyLadderTest, TheDeviceIsAGpuOnAutoAndMistakesSayWhatToDo) {
  StudyConfig s;
  s.ladder = "off";
  EXPECT_EQ(ladder_device(s), "");
  s.ladder = "cpu";
  EXPECT_EQ(ladder_device(s), "cpu");
  s.ladder = "auto";
  EXPECT_EQ(ladder_device(s), cuda::is_available() ? "cuda:0" : "");
  s.ladder = "tpu";
  EXPECT_HAS(error_of([&] { ladder_device(s); }), "--ladder takes auto, off or a device");
  if (!cuda::is_available()) {
    s.ladder = "cuda";
    const std::string m = error_of([&] { ladder_device(s); });
    EXPECT_HAS(m, "no CUDA device");
    EXPECT_HAS(m, "--ladder cpu");
  }
  s.ladder_model = "gpt2_tiny";
  EXPECT_HAS(error_of([&] { ladder_cell_config(s, 0, "cpu"); }), "mlp, cnn or resnet");
  s.ladder_model = "cnn";
  s.ladder_steps = -1;
  EXPECT_HAS(error_of([&] { ladder_cell_config(s, 0, "cpu"); }), "--ladder-steps");
}

}  // namespace
}  // namespace mantissa::study
