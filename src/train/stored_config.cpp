// stored_run_config (train/checkpoint.h): the configuration a run left in its outputs.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mantissa/core/error.h"
#include "mantissa/train/checkpoint.h"

namespace mantissa::train {

TrainConfig stored_run_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "--config-from: cannot read '", path, "'");
  TrainConfig c;
  if (in.peek() == '{') {
    // A metrics file: its first record is the run's configuration.
    std::string line;
    std::getline(in, line);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    MT_CHECK(j.is_object() && j.value("kind", "") == "config" && j.contains("config") &&
                 j["config"].is_object(),
             "--config-from: '", path,
             "' is a metrics file without a configuration record at its head (written before "
             "metrics files began with one); give a checkpoint of the run instead");
    c = TrainConfig::from_json(j["config"].dump());
  } else {
    c = load_checkpoint(path).config;
  }
  // A rerun writes its own outputs: the stored run's are not overwritten or appended to.
  const TrainConfig defaults;
  using config::OptionInfo;
  for (const OptionInfo& o : config::options()) {
    if (o.resume == config::Resume::Output || o.field == config::Field::resume_path)
      config::set_value_json(c, o.field, config::value_json(defaults, o.field));
  }
  return c;
}

}  // namespace mantissa::train
