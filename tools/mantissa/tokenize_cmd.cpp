// `mantissa tokenize`: text files -> a BPE tokenizer (trained, byte-level or given) and token
// shards for language-model training: DIR/tokenizer.json, DIR/train.bin, DIR/val.bin.
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "commands.h"
#include "mantissa/core/clock.h"
#include "mantissa/core/error.h"
#include "mantissa/data/text_corpus.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/data/tokens.h"

namespace mantissa::cli {
namespace {

namespace fs = std::filesystem;
struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out = "out/tokens";
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;
  bool byte_level = false;
  double val_fraction = 0.05;
  uint64_t seed = 0;
  std::string separator = "%";
  std::string tokenizer;
  std::string decode;
  int64_t show = 0;
  bool json = false;
};

// A token's bytes as a readable, quoted string: printable ASCII as is, the rest escaped.
std::string quoted(std::string_view bytes) {
  std::string s = "\"";
  for (unsigned char c : bytes) {
    if (c == '\n')
      s += "\\n";
    else if (c == '\t')
      s += "\\t";
    else if (c == '"' || c == '\\')
      s += std::string("\\") + char(c);
    else if (c >= 0x20 && c < 0x7f)
      s += char(c);
    else
      s += fmt::format("\\x{:02x}", c);
  }
  return s + "\"";
}

void show_tokens(const data::BpeTokenizer& tok, std::span<const uint32_t> ids, int64_t n) {
  for (size_t i = 0; i < ids.size() && int64_t(i) < n; ++i)
    fmt::print("{:>8}  {:>6}  {}\n", i, ids[i], quoted(tok.token_bytes(ids[i])));
}

// `--decode SHARD`: the shard's text (exact bytes) on stdout, or its first tokens with --show.
int decode_shard(const TokenizeArgs& a) {
  MT_CHECK(fs::exists(a.decode), "--decode '", a.decode, "' does not exist");
  const std::string tok_path = !a.tokenizer.empty()
                                   ? a.tokenizer
                                   : (fs::path(a.decode).parent_path() / "tokenizer.json").string();
  MT_CHECK(fs::exists(tok_path), "--decode needs the tokenizer that wrote '", a.decode, "': '",
           tok_path, "' does not exist; give it with --tokenizer FILE");
  const data::BpeTokenizer tok = data::BpeTokenizer::load(tok_path);
  const data::TokenDataset ds =
      data::load_token_shard(a.decode, tok.vocab_size(), tok.fingerprint());
  if (a.show > 0) {
    show_tokens(tok, ds.tokens, a.show);
    return 0;
  }
  const std::string text = tok.decode(ds.tokens);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

std::string thousands(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "1 file", "2 files".
std::string count_of(int64_t n, const char* noun) {
  return thousands(n) + " " + noun + (n == 1 ? "" : "s");
}

int64_t bytes_of(const std::vector<std::string>& docs) {
  int64_t n = 0;
  for (const std::string& d : docs)
    n += int64_t(d.size());
  return n;
}

int run(const TokenizeArgs& a) {
  MT_CHECK(a.show >= 0, "--show must be >= 0 (the tokens to print), got ", a.show);
  if (!a.decode.empty()) return decode_shard(a);
  MT_CHECK(a.vocab_size >= 257, "--vocab-size must be at least 257 (256 bytes + ", data::kEndOfText,
           "), not ", a.vocab_size);
  MT_CHECK(a.val_fraction >= 0 && a.val_fraction < 1, "--val-fraction must be in [0, 1), not ",
           a.val_fraction);

  // ---- the corpus
  std::vector<std::string> inputs = a.inputs;
  if (inputs.empty()) {
    MT_CHECK(fs::exists(data::kFortunesDir), "the default corpus ", data::kFortunesDir,
             " is not installed: install it with 'apt-get install fortunes', or give "
             "--input FILE|DIR (any text files)");
    inputs.push_back(data::kFortunesDir);
  }
  data::TextCorpus corpus = data::read_text_corpus(inputs, {.separator = a.separator});
  const int64_t corpus_bytes = corpus.bytes();
  const size_t n_docs = corpus.documents.size();
  data::DocumentSplit split =
      data::split_train_val(std::move(corpus.documents), a.val_fraction, a.seed);

  // ---- the tokenizer: given, byte-level, or trained on the training documents only
  std::string kind;
  double train_seconds = 0;
  data::BpeTokenizer tok;
  if (!a.tokenizer.empty()) {
    tok = data::BpeTokenizer::load(a.tokenizer);
    kind = "loaded";
  } else if (a.byte_level) {
    kind = "byte-level";
  } else {
    const Clock::time_point t0 = Clock::now();
    tok = data::BpeTokenizer::train(split.train,
                                    {.vocab_size = a.vocab_size, .min_frequency = a.min_frequency});
    train_seconds = seconds_since(t0);
    kind = "trained";
  }

  // ---- encoding, on this one thread
  const Clock::time_point t0 = Clock::now();
  const std::vector<uint32_t> train_ids = tok.encode_documents(split.train);
  const std::vector<uint32_t> val_ids = tok.encode_documents(split.val);
  const double encode_seconds = seconds_since(t0);

  // ---- the files, each written whole or not at all
  std::error_code ec;
  fs::create_directories(a.out, ec);
  MT_CHECK(fs::is_directory(a.out), "cannot create the output directory '", a.out,
           "': ", ec ? ec.message() : "a file of that name exists");
  const std::string tok_path = (fs::path(a.out) / "tokenizer.json").string();
  const std::string train_path = (fs::path(a.out) / "train.bin").string();
  const std::string val_path = (fs::path(a.out) / "val.bin").string();
  tok.save(tok_path);
  data::write_token_shard(train_path, train_ids, tok.vocab_size(), tok.fingerprint());
  data::write_token_shard(val_path, val_ids, tok.vocab_size(), tok.fingerprint());

  // ---- the report
  const int64_t train_bytes = bytes_of(split.train), val_bytes = bytes_of(split.val);
  // Bytes per token of the text itself: the end-of-text tokens between documents not counted.
  auto per_token = [](int64_t bytes, size_t ids, size_t docs) {
    return ids > docs ? double(bytes) / double(ids - docs) : 0.0;
  };
  const double train_bpt = per_token(train_bytes, train_ids.size(), split.train.size());
  const double val_bpt = per_token(val_bytes, val_ids.size(), split.val.size());
  const double mb_per_s = encode_seconds > 0 ? double(corpus_bytes) / 1e6 / encode_seconds : 0;
  const char* width = tok.vocab_size() <= 65536 ? "uint16" : "uint32";
  const bool stopped_early = kind == "trained" && tok.vocab_size() < a.vocab_size;

  if (a.json) {
    nlohmann::ordered_json j = {{"inputs", inputs},
                                {"files", corpus.files.size()},
                                {"skipped", corpus.skipped.size()},
                                {"documents", n_docs},
                                {"bytes", corpus_bytes},
                                {"train_documents", split.train.size()},
                                {"val_documents", split.val.size()},
                                {"train_bytes", train_bytes},
                                {"val_bytes", val_bytes},
                                {"seed", a.seed},
                                {"tokenizer", kind},
                                {"vocab_size", tok.vocab_size()},
                                {"merges", tok.num_merges()},
                                {"eot_id", tok.eot_id()},
                                {"train_seconds", train_seconds},
                                {"train_tokens", train_ids.size()},
                                {"val_tokens", val_ids.size()},
                                {"train_bytes_per_token", train_bpt},
                                {"val_bytes_per_token", val_bpt},
                                {"encode_seconds", encode_seconds},
                                {"encode_mb_per_s", mb_per_s},
                                {"token_dtype", width},
                                {"tokenizer_path", tok_path},
                                {"train_path", train_path},
                                {"val_path", val_path}};
    fmt::print("{}\n", json_line(j));
  } else {
    const std::string where =
        inputs.size() == 1 ? inputs[0] : fmt::format("{} inputs", inputs.size());
    fmt::print(
        "corpus     {}: {}{}, {}, {}\n", where, count_of(int64_t(corpus.files.size()), "file"),
        corpus.skipped.empty()
            ? ""
            : fmt::format(" ({} skipped: links, binary and special files)", corpus.skipped.size()),
        count_of(int64_t(n_docs), "document"), count_of(corpus_bytes, "byte"));
    fmt::print("split      train {} ({}), val {} ({}), seed {}\n",
               count_of(int64_t(split.train.size()), "document"), count_of(train_bytes, "byte"),
               count_of(int64_t(split.val.size()), "document"), count_of(val_bytes, "byte"),
               a.seed);
    const std::string specials = count_of(int64_t(tok.special_tokens().size()), "special token");
    if (kind == "trained") {
      fmt::print("tokenizer  BPE, vocab {} ({} merges + {}) trained in {:.2f} s -> {}\n",
                 tok.vocab_size(), tok.num_merges(), specials, train_seconds, tok_path);
    } else if (kind == "byte-level") {
      fmt::print("tokenizer  byte-level, vocab {} (256 bytes + {}) -> {}\n", tok.vocab_size(),
                 specials, tok_path);
    } else {
      fmt::print("tokenizer  {}, vocab {} ({} merges + {}) -> {}\n", a.tokenizer, tok.vocab_size(),
                 tok.num_merges(), specials, tok_path);
    }
    fmt::print("train      {} tokens, {:.2f} bytes/token -> {} ({})\n",
               thousands(int64_t(train_ids.size())), train_bpt, train_path, width);
    fmt::print("val        {} tokens, {:.2f} bytes/token -> {} ({})\n",
               thousands(int64_t(val_ids.size())), val_bpt, val_path, width);
    fmt::print("encoding   {:.2f} MB in {:.3f} s on one core: {:.1f} MB/s\n",
               double(corpus_bytes) / 1e6, encode_seconds, mb_per_s);
  }
  if (stopped_early) {
    std::fprintf(stderr,
                 "note: training stopped at vocab %lld of the %lld asked for: no pair of adjacent "
                 "tokens occurs %lld times or more (a larger corpus, or --min-frequency 1)\n",
                 (long long)tok.vocab_size(), (long long)a.vocab_size, (long long)a.min_frequency);
  }
  if (a.val_fraction > 0 && split.val.empty()) {
    std::fprintf(stderr,
                 "note: the corpus is one document, so the validation shard is empty; `mantissa "
                 "train` holds out the last 5%% of train.bin instead (or split files into "
                 "documents with --doc-separator, or give several files)\n");
  }
  if (a.show > 0 && !a.json) show_tokens(tok, train_ids, a.show);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Train a byte-level BPE tokenizer on text files and encode them into token shards");
  auto* input = cmd->add_option("--input", a->inputs,
                                std::string("Text file or directory (repeatable; default ") +
                                    data::kFortunesDir + ", from 'apt-get install fortunes')");
  cmd->add_option("--out", a->out, "Output directory: tokenizer.json, train.bin, val.bin")
      ->capture_default_str();
  auto* vocab = cmd->add_option("--vocab-size", a->vocab_size,
                                "Vocabulary size: 256 bytes + merges + <|endoftext|>")
                    ->capture_default_str();
  cmd->add_option("--min-frequency", a->min_frequency, "Never merge a pair seen fewer times")
      ->capture_default_str();
  auto* byte_level = cmd->add_flag("--byte-level", a->byte_level,
                                   "No training: bytes + <|endoftext|> (vocab 257)");
  cmd->add_option("--val-fraction", a->val_fraction,
                  "Fraction of the documents held out for validation (whole documents, seeded)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the validation split")->capture_default_str();
  cmd->add_option("--doc-separator", a->separator,
                  "A line holding only this separates documents in a file (fortune files: %); "
                  "'' makes every file one document")
      ->capture_default_str();
  auto* tokenizer = cmd->add_option("--tokenizer", a->tokenizer,
                                    "Encode with this tokenizer.json instead of training one");
  auto* decode = cmd->add_option("--decode", a->decode,
                                 "Print the text of a token shard (its tokenizer: --tokenizer, "
                                 "else tokenizer.json beside it)");
  cmd->add_option("--show", a->show, "Also print the first N tokens (id and bytes)");
  cmd->add_flag("--json", a->json, "Print the summary as JSON");
  byte_level->excludes(tokenizer);
  byte_level->excludes(vocab);
  tokenizer->excludes(vocab);
  decode->excludes(byte_level);
  decode->excludes(input);
  return [a] { return run(*a); };
}

}  // namespace mantissa::cli
