// `mantissa generate`: text from a language model's checkpoint — the prompt encoded with the run's
// tokenizer, sampled token by token through the model's decode cache (nn::generate: a KV cache
// for GPT, the carried state for the LSTM), streamed as it comes, in the run's precision.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "mantissa/amp/precision.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/core/error.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/nn/generate.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/checkpoint.h"
#include "mantissa/train/trainer.h"

namespace mantissa::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint, tokenizer, prompt, device = "cpu";
  int64_t max_tokens = 64;
  double temperature = 0.8;
  int64_t top_k = 40;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t samples = 1;
  int threads = 0;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

// The low-precision dtype the run trained in (autocast for generation), or F32: its recipe's
// half dtype (fp8's non-GEMM part is bf16, and generation runs its Linear layers in bf16 too).
DType run_dtype(const train::TrainConfig& c) {
  return amp::precision_info(amp::resolve(c.precision)).dtype;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Sample text from a language model's checkpoint (gpt2_tiny, gpt2, lstm)");
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint written by mantissa train")
      ->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "The tokenizer JSON (default: the one the run trained with)");
  cmd->add_option("--prompt", args->prompt, "The text to continue (empty: from <|endoftext|>)");
  cmd->add_option("--max-tokens", args->max_tokens,
                  "New tokens at most (past the model's context length, the window slides)")
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Sample from the k most likely tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling: the smallest set of probability p")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the draws (the same seed, the same text)")
      ->capture_default_str();
  cmd->add_option("--samples", args->samples, "Independent samples (seeds seed, seed + 1, ...)")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON line per sample instead of streaming");
  return [args] {
    const GenerateArgs& a = *args;
    // Every flag is checked before anything is printed.
    MT_CHECK(a.max_tokens > 0, "--max-tokens must be positive, got ", a.max_tokens);
    MT_CHECK(a.samples > 0, "--samples must be positive, got ", a.samples);
    MT_CHECK(std::isfinite(a.temperature) && a.temperature >= 0,
             "--temperature must be a number >= 0 (0: always the most likely token), got ",
             a.temperature);
    MT_CHECK(a.top_k >= 0, "--top-k must be >= 0 (0: every token), got ", a.top_k);
    MT_CHECK(a.top_p > 0 && a.top_p <= 1, "--top-p must be in (0, 1] (1: every token), got ",
             a.top_p);
    MT_CHECK(a.threads >= 0, "--threads must be >= 0 (0: every core), got ", a.threads);
    if (a.threads > 0) set_num_threads(a.threads);
    const Device device = train::require_device(a.device);
    const train::Checkpoint ckpt = train::load_checkpoint(a.checkpoint);
    const train::TrainConfig& c = ckpt.config;
    MT_CHECK(nn::model_input(c.model) == nn::ModelInput::Tokens, "'", a.checkpoint, "' holds a ",
             c.model,
             ", an image model; generate takes a language model's checkpoint (gpt2_tiny, "
             "gpt2, lstm)");
    const std::string tok_path = a.tokenizer.empty() ? c.tokenizer : a.tokenizer;
    MT_CHECK(!tok_path.empty(), "'", a.checkpoint,
             "' was trained without a tokenizer file (synthetic tokens?); give --tokenizer");
    MT_CHECK(!a.tokenizer.empty() || std::filesystem::exists(tok_path),
             "the tokenizer the run "
             "trained with, '",
             tok_path, "', does not exist (moved?); give it with --tokenizer");
    const data::BpeTokenizer tokenizer = data::BpeTokenizer::load(tok_path);
    MT_CHECK(c.vocab_size == 0 || tokenizer.vocab_size() == c.vocab_size, "the tokenizer '",
             tok_path, "' has a vocabulary of ", tokenizer.vocab_size(), " but the model ",
             c.vocab_size, "; give the tokenizer the run trained with");

    nn::ModelConfig mc;
    mc.vocab_size = tokenizer.vocab_size();
    mc.max_seq_len = c.seq_len;
    mc.seed = c.seed;
    std::shared_ptr<nn::Module> model;
    {
      nn::init::NoInit skip;  // the values come from the checkpoint
      model = nn::make_model(c.model, mc);
    }
    model->load_state_dict(ckpt.model);
    model->to(device);
    model->eval();

    std::vector<int64_t> prompt;
    if (a.prompt.empty()) {
      prompt.push_back(int64_t(tokenizer.eot_id()));
    } else {
      for (uint32_t id : tokenizer.encode(a.prompt))
        prompt.push_back(int64_t(id));
    }
    const DType dtype = run_dtype(c);
    for (int64_t s = 0; s < a.samples; ++s) {
      nn::GenerateOptions o;
      o.max_new_tokens = a.max_tokens;
      o.temperature = a.temperature;
      o.top_k = a.top_k;
      o.top_p = a.top_p;
      o.seed = a.seed + uint64_t(s);
      o.stop_token = int64_t(tokenizer.eot_id());
      if (!a.json) {
        o.on_token = [&](int64_t id) {
          const std::string_view bytes = tokenizer.token_bytes(uint32_t(id));
          std::fwrite(bytes.data(), 1, bytes.size(), stdout);
          std::fflush(stdout);
          return true;
        };
        if (a.samples > 1) fmt::print("--- sample {} (seed {})\n", s + 1, *o.seed);
        std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
        std::fflush(stdout);
      }
      const auto t0 = Clock::now();
      nn::Generation g;
      {
        // The run's precision: its autocast dtype (weights are as the checkpoint holds them).
        amp::Autocast ac(device, dtype == DType::F32 ? DType::BF16 : dtype,
                         /*enabled=*/dtype != DType::F32);
        g = nn::generate(*model, prompt, o);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      std::vector<uint32_t> ids(g.tokens.begin(), g.tokens.end());
      if (a.json) {
        nlohmann::ordered_json j;
        j["seed"] = *o.seed;
        j["prompt"] = a.prompt;
        j["completion"] = tokenizer.decode(ids);
        j["tokens"] = g.tokens.size();
        j["stopped"] = g.reason == nn::StopReason::StopToken ? "endoftext" : "max_tokens";
        j["tokens_per_s"] = seconds > 0 ? double(g.tokens.size()) / seconds : 0.0;
        fmt::print("{}\n", json_line(j));  // (a completion cut inside a character: U+FFFD)
      } else {
        fmt::print("\n");
        std::fprintf(stderr, "(%zu tokens, %.0f tokens/s%s)\n", g.tokens.size(),
                     seconds > 0 ? double(g.tokens.size()) / seconds : 0.0,
                     g.reason == nn::StopReason::StopToken ? ", stopped at <|endoftext|>" : "");
      }
    }
    return 0;
  };
}

}  // namespace mantissa::cli
