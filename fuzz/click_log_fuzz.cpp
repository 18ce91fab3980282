// Fuzz target: click logs (TSV/CSV, data/clicks.h) -- the layout detected from the first line,
// and the Criteo layout given, as `mantissa train --data clicks` reads them.
#include <cstdint>

#include "fuzz_input.h"
#include "mantissa/data/clicks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string& path = fuzz::input_file(data, size);
  // Tab or comma (the input file has no extension to tell), the layout detected or Criteo's.
  for (const char delimiter : {'\t', ','}) {
    for (const int64_t dense : {int64_t(-1), int64_t(13)}) {
      fuzz::expect_only_mantissa_errors([&] {
        data::ClickFileOptions o;
        o.delimiter = delimiter;
        o.n_dense = dense;
        o.hash_buckets = 97;
        const data::ClickLog log = data::read_click_log(path, o);
        FUZZ_REQUIRE(log.size() > 0, "an empty log was accepted");
        FUZZ_REQUIRE(int64_t(log.dense.size()) == log.size() * log.n_dense &&
                         int64_t(log.categorical.size()) == log.size() * log.n_cat,
                     "arrays of %zu and %zu values for %lld examples", log.dense.size(),
                     log.categorical.size(), (long long)log.size());
        for (const int64_t id : log.categorical)
          FUZZ_REQUIRE(id >= 0 && id < 97, "id %lld outside a table of 97 rows", (long long)id);
        for (const float x : log.dense)
          FUZZ_REQUIRE(x >= 0 && x == x && x < 1e38f, "dense value %g", double(x));
        for (const float y : log.labels)
          FUZZ_REQUIRE(y == 0 || y == 1, "label %g", double(y));
      });
    }
  }
  return 0;
}
