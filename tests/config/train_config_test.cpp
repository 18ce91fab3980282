// The training configuration (config/train_config.h): each value's checks, the rules between
// options, and the stored JSON.
#include "mantissa/config/train_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/errors.h"
#include "mantissa/core/error.h"

namespace mantissa::config {
namespace {

TEST(TrainConfigTest, PrecisionFlagsAreCheckedTogether) {
  struct Refused {
    const char* precision;
    const char* opt_level;
    const char* rounding;
    const char* loss_scale;
    int64_t underflow_every;
    const char* needle;  // in the error message
  };
  const Refused cases[] = {
      {"fp6", "", "", "dynamic", 0, "unknown --precision 'fp6'"},
      {"fp8", "O3", "", "dynamic", 0, "bf16 O1 or O2"},
      {"fp4", "O3", "", "dynamic", 0, "runs the Linear GEMMs in fp4 and the rest as bf16 O1 or O2"},
      {"fp32", "O2", "", "dynamic", 0, "needs a half precision"},
      {"bf16", "O4", "", "dynamic", 0, "unknown --opt-level 'O4'"},
      {"bf16", "", "stochastic", "dynamic", 0, "half weights"},
      {"bf16-pure", "O2", "", "dynamic", 0, "its own level"},
      {"bf16-pure", "", "nearest", "dynamic", 0, "stochastic"},
      {"fp16", "", "up", "dynamic", 0, "unknown --rounding 'up'"},
      {"fp32", "", "", "1024", 0, "applies to --precision fp16 or bf16"},
      {"fp16", "O2", "", "dynamic", 10, "O1"},
  };
  for (const Refused& r : cases) {
    TrainConfig c;
    try {
      // A word of no vocabulary is refused where it is set, a bad combination by validate().
      c.set("precision", r.precision);
      c.set("opt-level", r.opt_level);
      c.set("rounding", r.rounding);
      c.set("loss-scale", r.loss_scale);
      c.underflow_every = r.underflow_every;
      c.validate();
      ADD_FAILURE() << "accepted; expected an error mentioning '" << r.needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(r.needle), std::string::npos) << e.message();
    }
  }
  TrainConfig ok;
  ok.set("precision", "bf16");
  ok.set("opt-level", "O3");
  ok.set("rounding", "stochastic");
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(amp::resolve(amp::Precision::FP32), amp::Precision::FP32);
  const amp::Precision a = amp::resolve(amp::Precision::Auto);
  EXPECT_TRUE(a == amp::Precision::BF16 || a == amp::Precision::FP16) << name_of(a);
}

TEST(TrainConfigTest, JsonRoundTripAndValidation) {
  TrainConfig c;
  c.model = "mlp";
  c.lr = 0.125;
  c.seed = 0xffffffffffffull;
  const TrainConfig back = TrainConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_THROW(TrainConfig::from_json("{\"modle\": \"cnn\"}"), Error);
  TrainConfig bad;
  EXPECT_HAS(testing::error_of([&] { bad.set("optimizer", "lion"); }),
             "unknown --optimizer 'lion'");
  EXPECT_HAS(testing::error_of([&] { bad.set("batch-size", "0"); }),
             "--batch-size must be positive, got 0");
  EXPECT_EQ(bad.batch_size, TrainConfig{}.batch_size) << "a refused value leaves the option be";
  bad.epochs = 0;
  EXPECT_HAS(testing::error_of([&] { bad.validate(); }), "give a positive --epochs or --steps");
}

// Found by fuzz/config_fuzz.cpp (fuzz/regressions/config/integer-field-given-1e25): an integer
// field given a number it cannot hold was converted anyway (1e25 to int64: undefined behaviour).
TEST(TrainConfigTest, EachKeyTakesExactlyItsType) {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"fp8_amax_history": 7.7e25})", "'fp8_amax_history' must be an integer in ["},
           {R"({"batch_size": 3.5})", "'batch_size' must be an integer"},
           {R"({"threads": 4294967296})", "'threads' must be an integer in [-2147483648, "},
           {R"({"seed": -1})", "'seed' must be an integer in [0, 18446744073709551615]"},
           {R"({"lr": "0.1"})", "'lr' must be a number, not \"0.1\""},
           {R"({"nesterov": 1})", "'nesterov' must be true or false"},
           {R"({"model": 5})", "'model' must be a string"},
           {R"({"threads": -3})", "'threads' must be in [0, 4096], got -3"},
           {R"({"precision": "fp12"})", "'precision' unknown --precision 'fp12'"}}) {
    try {
      TrainConfig::from_json(c.json);
      ADD_FAILURE() << c.json << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(c.message), std::string::npos) << e.message();
    }
  }
  const TrainConfig ok =
      TrainConfig::from_json(R"({"seed": 18446744073709551615, "lr": 1, "threads": 3})");
  EXPECT_EQ(ok.seed, 18446744073709551615ull);
  EXPECT_EQ(ok.lr, 1.0);
  EXPECT_EQ(ok.threads, 3);
}

}  // namespace
}  // namespace mantissa::config
