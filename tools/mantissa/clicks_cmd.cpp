// `mantissa clicks`: writes the synthetic click log (data::synthetic_clicks) as a TSV/CSV file,
// the same data `mantissa train --model dcn --data synthetic-clicks` trains on in memory.
#include <fmt/core.h>

#include <cmath>

#include "commands.h"
#include "mantissa/core/error.h"
#include "mantissa/data/clicks.h"

namespace mantissa::cli {

Command add_clicks_command(CLI::App& app) {
  auto o = std::make_shared<data::SyntheticClickOptions>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "clicks",
      "Write a synthetic click log with a planted model (Criteo layout: label, 13 dense, 26 "
      "categorical columns) and print its held-out Bayes log loss");
  cmd->add_option("--out", *out, "The file to write (.csv: comma-separated, else tab)")->required();
  cmd->add_option("--examples", o->examples, "Examples (lines)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the planted model and the draws")
      ->capture_default_str();
  cmd->add_option("--dense", o->n_dense, "Dense columns")->capture_default_str();
  cmd->add_option("--zipf", o->zipf, "Zipf exponent of the categorical values' frequencies")
      ->capture_default_str();
  cmd->add_option("--hash-buckets", o->hash_buckets,
                  "Rows per table, for the Bayes figure (train with the same --hash-buckets)")
      ->capture_default_str();
  return [o, out] {
    // The flags first, by name (the generator's own checks speak of its options).
    MT_CHECK(o->examples > 0, "--examples must be positive, got ", o->examples);
    MT_CHECK(o->n_dense >= 0, "--dense must be >= 0, got ", o->n_dense);
    MT_CHECK(std::isfinite(o->zipf) && o->zipf >= 0, "--zipf must be a number >= 0, got ", o->zipf);
    MT_CHECK(o->hash_buckets >= 2, "--hash-buckets must be at least 2, got ", o->hash_buckets);
    data::write_synthetic_clicks(*out, *o);
    const data::SyntheticClicks s = data::synthetic_clicks(*o);
    fmt::print(
        "wrote {} examples to {}: click rate {:.4f}; on the last {} (the held-out split) the "
        "planted model's log loss is {:.4f}, the constant predictor's {:.4f}\n",
        o->examples, *out, s.log.click_rate(), s.log.size() - s.train_size, s.bayes_log_loss,
        s.constant_log_loss);
    return 0;
  };
}

}  // namespace mantissa::cli
