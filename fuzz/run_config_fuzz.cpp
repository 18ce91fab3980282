// Fuzz target: a TOML run config, as `mantissa train --config FILE` reads it. One that is
// accepted must print (to_toml) as a file that reads back to the same configuration.
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "mantissa/config/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_mantissa_errors([&] {
    const auto defaults = [](const std::string&) { return config::TrainConfig{}; };
    const config::TrainConfig c =
        config::resolve({.file = config::read_toml(text, "fuzz.toml")}, defaults);
    const std::string printed = config::to_toml(c);
    const config::TrainConfig back =
        config::resolve({.file = config::read_toml(printed, "printed.toml")}, defaults);
    FUZZ_REQUIRE(back.to_json() == c.to_json(),
                 "a run config does not survive to_toml and back:\n%s", printed.c_str());
  });
  return 0;
}
