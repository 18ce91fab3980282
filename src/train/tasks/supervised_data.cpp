// The data of the supervised tasks (supervised.h) and how their results read.
#include <fmt/format.h>

#include <filesystem>
#include <tuple>

#include "mantissa/core/warning.h"
#include "mantissa/data/images.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/data/tokens.h"
#include "mantissa/train/report.h"
#include "train/run.h"
#include "train/tasks/supervised.h"

namespace mantissa::train {
namespace {

namespace fs = std::filesystem;

// A path as stored in the run's configuration: absolute, so that `mantissa eval` and `generate`
// find it from any directory.
std::string absolute(const fs::path& p) {
  return p.empty() ? std::string() : fs::absolute(p).lexically_normal().string();
}

// The token streams of --data text: DIR/train.bin and DIR/val.bin (`mantissa tokenize --out
// DIR`), or a training shard with --val-path, or a lone shard whose last 5% is held out. The
// tokenizer (--tokenizer, or DIR/tokenizer.json) is checked against the shards when there is one,
// and its path recorded in the config (checkpoints carry it to `mantissa generate`).
std::pair<data::TokenDataset, data::TokenDataset> load_text_data(TrainConfig& c) {
  const fs::path path(c.data_path);
  MT_CHECK(fs::exists(path), "--data-path '", c.data_path,
           "' does not exist; make one with `mantissa tokenize --out DIR` and pass DIR (for a "
           "checkpoint whose data moved: `mantissa eval --data-path DIR`)");
  fs::path train = path, val = c.val_path;
  if (fs::is_directory(path)) {
    train = path / "train.bin";
    MT_CHECK(fs::exists(train), "--data-path '", c.data_path,
             "' has no train.bin; it should be a directory written by `mantissa tokenize --out "
             "DIR`, or a token shard");
    if (val.empty() && fs::exists(path / "val.bin")) val = path / "val.bin";
    if (c.tokenizer.empty() && fs::exists(path / "tokenizer.json")) {
      c.tokenizer = (path / "tokenizer.json").string();
    }
  }
  int64_t vocab = 0;
  uint64_t fingerprint = 0;
  if (!c.tokenizer.empty()) {
    const data::BpeTokenizer tok = data::BpeTokenizer::load(c.tokenizer);
    vocab = tok.vocab_size();
    fingerprint = tok.fingerprint();
  }
  c.data_path = absolute(c.data_path);
  c.tokenizer = absolute(c.tokenizer);
  data::TokenDataset tr = data::load_token_shard(train.string(), vocab, fingerprint);
  if (val.empty()) return data::split_tokens(tr, 0.05);
  MT_CHECK(fs::exists(val), "--val-path '", val.string(), "' does not exist");
  if (!c.val_path.empty()) c.val_path = absolute(c.val_path);
  data::TokenDataset va = data::load_token_shard(
      val.string(), tr.vocab_size, fingerprint ? fingerprint : tr.tokenizer_fingerprint);
  if (va.size() == 0) {
    // `mantissa tokenize` of a corpus too small to hold a whole document out writes an empty
    // val.bin; the directory's fallback is the lone shard's: hold out the training stream's end.
    MT_CHECK(c.val_path.empty(), "--val-path '", c.val_path,
             "' holds no tokens; pass a validation shard with text in it, or drop --val-path to "
             "hold out the last 5% of the training stream");
    warn("data:empty-val",
         fmt::format("{} holds no tokens (the corpus had too few documents to hold one out); the "
                     "last 5% of {} is the validation stream",
                     val.string(), train.string()));
    return data::split_tokens(tr, 0.05);
  }
  return {std::move(tr), std::move(va)};
}

std::string scaling_text(const TrainResult& r, const Run& run) {
  if (run.main().scaler().options().mode == amp::ScaleMode::Disabled) return "";
  return fmt::format(", loss scale {:g}, {} skipped steps", r.loss_scale, r.skipped_steps);
}

std::string where(const Run& run) {
  return run.device.is_cpu() ? "" : " on " + run.device.str();
}

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * double(part) / double(whole) : 0.0;
}

}  // namespace

void ImageClassifierTask::load_data(Run& run, nn::ModelConfig& mc) {
  const TrainConfig& c = run.config;
  data::ImageDataset train, test;
  if (c.data == config::DataKind::FashionMnist) {
    train = data::load_fashion_mnist(c.data_dir, true);
    test = data::load_fashion_mnist(c.data_dir, false);
  } else {
    // One draw (the class patterns depend on the seed), split 5:1 into train and test.
    const int64_t n_train = c.synthetic_size;
    const int64_t n_test = std::max<int64_t>(n_train / 5, 1);
    const data::ImageDataset all = data::synthetic_images(n_train + n_test, 1, 28, 10, c.seed);
    train = all.slice(0, n_train);
    test = all.slice(n_train, n_test);
  }
  mc.num_classes = train.num_classes();
  mc.in_channels = train.channels();
  mc.image_size = train.height();
  for (const data::ImageDataset* d : {&train, &test})
    data_bytes_ += int64_t(d->images().nbytes() + d->labels().nbytes());
  train_data_ = std::make_shared<const data::ImageDataset>(std::move(train));
  eval_data_ = std::make_shared<const data::ImageDataset>(std::move(test));
}

void LanguageModelTask::load_data(Run& run, nn::ModelConfig& mc) {
  TrainConfig& c = run.config;
  data::TokenDataset train, val;
  if (c.data == config::DataKind::SyntheticText) {
    const int64_t vocab = c.vocab_size > 0 ? c.vocab_size : 256;
    std::tie(train, val) =
        data::split_tokens(data::synthetic_tokens(c.synthetic_size, vocab, c.seed), 0.05);
  } else {
    std::tie(train, val) = load_text_data(c);
    MT_CHECK(c.vocab_size == 0 || c.vocab_size == train.vocab_size, "--vocab-size ", c.vocab_size,
             " does not match the shards' vocabulary of ", train.vocab_size,
             "; drop --vocab-size (--data text takes it from the tokenizer)");
  }
  const int64_t vocab = train.vocab_size;
  c.vocab_size = vocab;  // the model's: checkpoints carry it to generate and eval
  const int64_t t = c.seq_len;
  MT_CHECK(train.size() > t && val.size() > t, "--seq-len ", t,
           " is longer than the training stream (", train.size(),
           " tokens) or the validation stream (", val.size(),
           " tokens); use a shorter --seq-len or more text");
  if (c.model == "gpt2") {
    MT_CHECK(vocab <= 50257 && t <= 1024,
             "gpt2 has a vocabulary of 50257 and a context of 1024; the data's vocabulary is ",
             vocab, " and --seq-len ", t);
  }
  mc.vocab_size = vocab;
  mc.max_seq_len = t;
  data_bytes_ = int64_t((train.tokens.size() + val.tokens.size()) * sizeof(train.tokens[0]));
  train_data_ = std::make_shared<const data::TokenWindows>(std::move(train), t, 1);
  // Evaluation walks the validation stream once, in non-overlapping windows.
  eval_data_ = std::make_shared<const data::TokenWindows>(std::move(val), t, t);
}

std::string ImageClassifierTask::describe(const EvalResult& e) const {
  return fmt::format("test loss {:.4f} acc {:.2f}%", e.loss, 100 * e.accuracy);
}

std::string LanguageModelTask::describe(const EvalResult& e) const {
  return fmt::format("val loss {:.4f} perplexity {:.2f} next-token acc {:.2f}%", e.loss,
                     e.perplexity(), 100 * e.accuracy);
}

std::string ImageClassifierTask::result_line(const TrainResult& r, const Run& run) const {
  const TrainConfig& c = run.config;
  const double per_epoch = r.epochs.empty() ? 0 : r.train_seconds / double(r.epochs.size());
  std::string out = fmt::format(
      "{} on {} ({}){}: test accuracy {:.2f}%, test loss {:.4f}, {} steps, {:.1f} s training "
      "({:.1f} s/epoch), peak memory {} (the dataset {} of it){}",
      c.model, name_of(c.data), run.main().amp().describe(), where(run), 100 * r.test.accuracy,
      r.test.loss, r.steps, r.train_seconds, per_epoch, format_bytes(r.peak_memory_bytes),
      format_bytes(r.dataset_bytes), scaling_text(r, run));
  const UnderflowStats& u = r.underflow;
  if (u.measurements == 0) return out;
  out += fmt::format(
      "\nfp16 gradient underflow over {} measured steps, of {} non-zero fp32 gradient values: "
      "{:.3f}% become zero cast to fp16 unscaled, {:.3f}% at the loss scale, {:.3f}% are zero in "
      "this run's gradients",
      u.measurements, u.nonzero, percent(u.cast_unscaled, u.nonzero),
      percent(u.cast_scaled, u.nonzero), percent(u.observed, u.nonzero));
  std::string worst;
  for (const LayerUnderflow& l : u.worst(3)) {
    worst += fmt::format("{}{} {:.3f}% (unscaled {:.3f}%)", worst.empty() ? "" : ", ", l.name,
                         percent(l.observed, l.nonzero), percent(l.cast_unscaled, l.nonzero));
  }
  if (!worst.empty()) out += "\nthe layers that lose the most: " + worst;
  return out;
}

std::string LanguageModelTask::result_line(const TrainResult& r, const Run& run) const {
  const TrainConfig& c = run.config;
  const double tokens_per_s =
      r.train_seconds > 0
          ? double(r.steps * c.batch_size * c.grad_accum * c.seq_len) / r.train_seconds
          : 0;
  return fmt::format(
      "{} on {} ({}){}: validation loss {:.4f}, perplexity {:.2f}, next-token accuracy {:.2f}%, "
      "{} steps, {:.1f} s training ({:.0f} tokens/s), peak memory {} (the tokens {} of it){}",
      c.model, name_of(c.data), run.main().amp().describe(), where(run), r.test.loss,
      r.test.perplexity(), 100 * r.test.accuracy, r.steps, r.train_seconds, tokens_per_s,
      format_bytes(r.peak_memory_bytes), format_bytes(r.dataset_bytes), scaling_text(r, run));
}

}  // namespace mantissa::train
