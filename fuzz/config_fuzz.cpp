// Fuzz target: a training configuration as JSON -- what a checkpoint stores and `--config-from`
// and resuming read back. One that is accepted and validated must survive a round trip.
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "mantissa/config/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_mantissa_errors([&] {
    const config::TrainConfig c = config::TrainConfig::from_json(text);
    c.validate();
    const std::string json = c.to_json();
    FUZZ_REQUIRE(config::TrainConfig::from_json(json).to_json() == json,
                 "a configuration does not survive to_json/from_json: %s", json.c_str());
  });
  return 0;
}
