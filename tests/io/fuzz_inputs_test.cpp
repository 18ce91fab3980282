// The committed fuzz inputs through the library's own loaders, as the program calls them (with
// tensors, in this build: Release and ASan + UBSan): fuzz/corpus holds valid inputs of every kind,
// which must load; fuzz/regressions holds what the fuzzer found, which must be refused with a
// mantissa::Error and nothing else. scripts/fuzz replays the same files in the fuzz build.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "mantissa/config/run_config.h"
#include "mantissa/config/train_config.h"
#include "mantissa/core/error.h"
#include "mantissa/data/clicks.h"
#include "mantissa/data/images.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/data/tokens.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/numerics/inspect.h"

namespace mantissa {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(MANTISSA_SOURCE_DIR) / "fuzz";

std::string contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What each target's program reads, through the same entry point the program uses. Throws what
// the loader throws.
const std::map<std::string, std::function<void(const fs::path&)>>& loaders() {
  static const std::map<std::string, std::function<void(const fs::path&)>> m = {
      {"safetensors", [](const fs::path& p) { load_safetensors(p.string()); }},
      {"idx",
       [](const fs::path& p) {
         // Labels or images, as the name says; the corpus has both and other ranks.
         const std::string n = p.filename().string();
         const int dims = n.starts_with("labels")   ? 1
                          : n.starts_with("images") ? 3
                          : n.starts_with("dims")   ? n[4] - '0'
                                                    : 3;
         data::read_idx(p.string(), dims);
       }},
      {"token_shard",
       [](const fs::path& p) {
         if (p.filename().string().starts_with("flat"))
           data::load_tokens(p.string(), 0);
         else
           data::load_token_shard(p.string());
       }},
      {"tokenizer", [](const fs::path& p) { data::BpeTokenizer::load(p.string()); }},
      {"number",
       [](const fs::path& p) {
         const auto x = parse_number(contents(p));
         MT_CHECK(x.has_value(), "not a number");
         for (int f = 0; f < kNumFormats; ++f)
           inspect(Format(f), *x, RoundingMode::NearestEven);
       }},
      {"config", [](const fs::path& p) { config::TrainConfig::from_json(contents(p)).validate(); }},
      {"run_config",
       [](const fs::path& p) {
         config::resolve({.file = config::read_toml(contents(p), p.string())},
                         [](const std::string&) { return config::TrainConfig{}; });
       }},
      {"click_log",
       [](const fs::path& p) {
         // As the fuzz target reads it: the layout detected, with small tables; tab-separated
         // unless the file has no tab.
         data::ClickFileOptions o;
         o.hash_buckets = 97;
         o.delimiter = contents(p).find('\t') == std::string::npos ? ',' : '\t';
         data::read_click_log(p.string(), o);
       }},
  };
  return m;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir))
      out.push_back(e.path());
  }
  return out;
}

TEST(FuzzInputs, EverySeedLoads) {
  for (const auto& [target, load] : loaders()) {
    const std::vector<fs::path> seeds = files_in(kFuzzDir / "corpus" / target);
    EXPECT_GE(seeds.size(), 3u) << "fuzz/corpus/" << target << " (fuzz/make_seeds.py makes it)";
    for (const fs::path& p : seeds) {
      try {
        load(p);
      } catch (const Error& e) {
        ADD_FAILURE() << "seed " << p << " does not load: " << e.message();
      }
    }
  }
}

TEST(FuzzInputs, EveryFindingIsRefusedWithAMantissaError) {
  size_t findings = 0;
  for (const auto& [target, load] : loaders()) {
    for (const fs::path& p : files_in(kFuzzDir / "regressions" / target)) {
      ++findings;
      bool refused = false;
      try {
        load(p);
      } catch (const Error&) {
        refused = true;
      }
      EXPECT_TRUE(refused) << p << " was accepted";
    }
  }
  EXPECT_GE(findings, 3u);
  // Every regression folder belongs to a target.
  for (const fs::path& dir : files_in(kFuzzDir / "regressions"))
    EXPECT_TRUE(loaders().contains(dir.filename().string())) << dir;
}

}  // namespace
}  // namespace mantissa
