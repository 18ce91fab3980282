#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/warning.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

namespace fs = std::filesystem;

// The resumed run's losses (it started at epoch 2) are the straight run's second epoch, bit for
// bit.
void expect_second_epoch_bitwise(const Trainer& straight, const Trainer& resumed) {
  const int64_t per_epoch = straight.batches_per_epoch();
  ASSERT_GE(int64_t(straight.step_losses().size()), 2 * per_epoch);
  ASSERT_GE(int64_t(resumed.step_losses().size()), per_epoch);
  for (int64_t i = 0; i < per_epoch; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(resumed.step_losses()[size_t(i)]),
              std::bit_cast<uint32_t>(straight.step_losses()[size_t(per_epoch + i)]))
        << "step " << per_epoch + i;
  }
}

class TrainerTest : public testing::TempDirTest {
 protected:
  // A small, fast run: synthetic images, a CNN with dropout (so the generator state matters)
  // and batch norm (so running statistics matter).
  static TrainConfig small(const std::string& model = "cnn") {
    TrainConfig c;
    c.model = model;
    c.set("data", "synthetic");
    c.synthetic_size = 512;
    c.batch_size = 64;
    c.eval_batch_size = 128;
    c.epochs = 2;
    c.lr = 0.05;
    c.dropout = 0.25;
    c.seed = 7;
    c.threads = 2;
    c.workers = 2;
    c.progress = false;
    return c;
  }
};

TEST_F(TrainerTest, ResumeReproducesTheSecondEpochBitwise) {
  TrainConfig straight = small();
  Trainer a(straight);
  a.fit();
  const std::vector<float>& all = a.step_losses();
  const int64_t per_epoch = a.batches_per_epoch();
  ASSERT_EQ(int64_t(all.size()), 2 * per_epoch);

  // The same run, interrupted after its first epoch (its checkpoint is the last thing written).
  TrainConfig first = small();
  first.checkpoint_path = file("epoch1.safetensors");
  Trainer b(first);
  b.fit(/*max_epochs=*/1);
  ASSERT_TRUE(fs::exists(first.checkpoint_path));

  TrainConfig resumed = small();
  resumed.resume_path = first.checkpoint_path;
  Trainer c(resumed);
  EXPECT_EQ(c.state().epoch, 1);
  EXPECT_EQ(c.state().step, per_epoch);
  c.fit();
  const std::vector<float>& second = c.step_losses();
  ASSERT_EQ(int64_t(second.size()), per_epoch);
  for (int64_t i = 0; i < per_epoch; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(second[size_t(i)]),
              std::bit_cast<uint32_t>(all[size_t(per_epoch + i)]))
        << "step " << per_epoch + i << ": " << second[size_t(i)] << " vs "
        << all[size_t(per_epoch + i)];
  }
  // And the final weights agree bit for bit.
  const auto wa = a.model().state_dict(), wc = c.model().state_dict();
  ASSERT_EQ(wa.size(), wc.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].second.to_vector<double>(), wc[i].second.to_vector<double>()) << wa[i].first;
  }
}

// fp16 autocast with dynamic loss scaling: the scaler's state (scale, growth tracker) travels
// in the checkpoint, so the resumed run scales, skips and grows exactly as the straight one.
TEST_F(TrainerTest, Fp16ResumeKeepsTheLossScale) {
  TrainConfig straight = small("cnn");
  straight.set("precision", "fp16");
  straight.dropout = 0;
  Trainer a(straight);
  const TrainResult ra = a.fit();
  TrainConfig first = straight;
  first.checkpoint_path = file("fp16.safetensors");
  Trainer b(first);
  b.fit(1);
  TrainConfig resumed = straight;
  resumed.resume_path = first.checkpoint_path;
  resumed.metrics_path = file("fp16.jsonl");
  resumed.log_every = 1;
  Trainer c(resumed);
  EXPECT_EQ(c.scaler().get_scale(), b.scaler().get_scale());
  EXPECT_EQ(c.scaler().growth_tracker(), b.scaler().growth_tracker());
  EXPECT_GT(b.scaler().growth_tracker(), 0) << "clean steps were counted in epoch 1";
  const TrainResult rc = c.fit();
  const int64_t per_epoch = a.batches_per_epoch();
  for (int64_t i = 0; i < per_epoch; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(c.step_losses()[size_t(i)]),
              std::bit_cast<uint32_t>(a.step_losses()[size_t(per_epoch + i)]))
        << "step " << per_epoch + i;
  }
  EXPECT_EQ(rc.loss_scale, ra.loss_scale);
  std::ifstream in(resumed.metrics_path);
  std::string line;
  std::getline(in, line);  // the config record, then the first train record
  EXPECT_EQ(nlohmann::json::parse(line)["kind"], "config") << line;
  std::getline(in, line);
  const auto j = nlohmann::json::parse(line);
  EXPECT_TRUE(j.contains("loss_scale") && j.contains("skipped")) << line;
}

TEST_F(TrainerTest, TheRecordCallbackGetsWhatTheMetricsFileGets) {
  TrainConfig c = small("mlp");
  c.metrics_path = file("metrics.jsonl");
  c.log_every = 3;
  Trainer t(c);
  std::vector<std::string> seen;
  t.set_record_callback([&](const std::string& json) { seen.push_back(json); });
  t.fit();
  std::ifstream in(c.metrics_path);
  std::vector<std::string> written;
  for (std::string line; std::getline(in, line);)
    written.push_back(line);
  // The config record is written when fit() starts, so the callback gets it too.
  EXPECT_EQ(written, seen);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(nlohmann::json::parse(seen.front())["kind"], "config");
  EXPECT_EQ(nlohmann::json::parse(seen.back())["kind"], "summary");
}

TEST_F(TrainerTest, NextBatchFollowsTheRunsSeededLoader) {
  TrainConfig c = small("mlp");
  Trainer a(c), b(c);
  c.seed += 1;
  Trainer other(c);
  int64_t n = 0;
  bool differs = false;
  while (std::optional<data::Batch> x = a.next_batch()) {
    const std::optional<data::Batch> y = b.next_batch(), z = other.next_batch();
    ASSERT_TRUE(y && z);
    EXPECT_EQ(x->x().to_vector<float>(), y->x().to_vector<float>()) << "batch " << n;
    EXPECT_EQ(x->y().to_vector<int64_t>(), y->y().to_vector<int64_t>()) << "batch " << n;
    differs = differs || x->y().to_vector<int64_t>() != z->y().to_vector<int64_t>();
    ++n;
  }
  EXPECT_EQ(n, a.batches_per_epoch());  // then the epoch ends
  EXPECT_TRUE(differs) << "another seed shuffles otherwise";
}

TEST_F(TrainerTest, LearnsAndWritesMetrics) {
  TrainConfig c = small("mlp");
  c.dropout = 0;
  c.metrics_path = file("metrics.jsonl");
  c.log_every = 4;
  Trainer t(c);
  const TrainResult r = t.fit();
  EXPECT_GT(r.test.accuracy, 0.5) << "the synthetic classes are learnable";
  EXPECT_EQ(r.steps, 2 * t.batches_per_epoch());
  std::ifstream in(c.metrics_path);
  std::string line;
  int train = 0, eval = 0, summary = 0, config = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string kind = j.at("kind");
    if (kind == "config") {
      // The head: the whole configuration, as --config-from reads it.
      EXPECT_EQ(train + eval + summary, 0) << "the config record comes first";
      ++config;
      EXPECT_EQ(TrainConfig::from_json(j.at("config").dump()).to_json(), c.to_json());
    } else if (kind == "train") {
      ++train;
      for (const char* k : {"step", "epoch", "loss", "lr", "samples_per_s"})
        EXPECT_TRUE(j.contains(k)) << k;
      EXPECT_EQ(j["step"].get<int64_t>() % 4, 0);
    } else if (kind == "eval") {
      ++eval;
      for (const char* k : {"epoch", "test_loss", "test_accuracy"})
        EXPECT_TRUE(j.contains(k)) << k;
    } else {
      EXPECT_EQ(kind, "summary");
      ++summary;
      for (const char* k : {"test_accuracy", "train_seconds", "peak_memory_bytes", "dataset_bytes",
                            "steps", "opt_level", "skipped_steps", "loss_scale", "precision"}) {
        EXPECT_TRUE(j.contains(k)) << k;
      }
      EXPECT_EQ(j["steps"].get<int64_t>(), r.steps);
    }
  }
  EXPECT_EQ(config, 1);
  EXPECT_EQ(train, int(r.steps / 4));
  EXPECT_EQ(eval, 2);
  EXPECT_EQ(summary, 1);
}

TEST_F(TrainerTest, BadCheckpointsAreRefusedWithTheirName) {
  TrainConfig c = small("mlp");
  c.epochs = 1;
  c.checkpoint_path = file("ok.safetensors");
  Trainer(c).fit();
  std::ifstream in(c.checkpoint_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string truncated = file("truncated.safetensors");
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() / 2));
  for (const std::string& bad : {truncated, file("missing.safetensors")}) {
    TrainConfig r = small("mlp");
    r.resume_path = bad;
    try {
      Trainer t(r);
      FAIL() << "resuming from " << bad << " did not fail";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(bad), std::string::npos) << e.message();
    }
  }
  // A safetensors file that is not a checkpoint.
  const std::string plain = file("plain.safetensors");
  save_safetensors(plain, {{"w", Tensor::ones({2})}});
  EXPECT_THROW(load_checkpoint(plain), Error);
  // And the good one evaluates.
  const EvalResult e = evaluate_checkpoint(c.checkpoint_path);
  EXPECT_GT(e.samples, 0);
}

// Bytes changed inside the tensor data after the file was written: every single-bit flip is an
// error naming the tensor (CRC-32 catches every one), where it used to load a different model.
TEST_F(TrainerTest, DamagedTensorDataOrEditedMetadataIsRefused) {
  TrainConfig c = small("mlp");
  c.max_steps = 3;
  c.epochs = 0;
  c.checkpoint_path = file("ok.safetensors");
  c.set("optimizer", "adamw");
  c.set("precision", "fp16");
  c.set("opt-level", "O2");
  Trainer t(c);
  t.fit();
  t.save(c.checkpoint_path);
  std::ifstream in(c.checkpoint_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const size_t data_begin = 8 + size_t(header);
  ASSERT_LT(data_begin, bytes.size());
  const SafetensorsFile good = load_safetensors(c.checkpoint_path);
  // The tensor that holds a byte offset of the data, by its data_offsets in the header.
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, size_t(header)));
  auto tensor_at = [&](size_t offset) {
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const auto& o = it.value()["data_offsets"];
      if (offset >= o[0].get<size_t>() && offset < o[1].get<size_t>()) return it.key();
    }
    return std::string();
  };
  std::mt19937_64 rng(5);
  const std::string damaged = file("damaged.safetensors");
  int refused = 0;
  for (int trial = 0; trial < 100; ++trial) {
    std::string copy = bytes;
    const size_t at = data_begin + rng() % (bytes.size() - data_begin);
    copy[at] = char(copy[at] ^ char(1 << (rng() % 8)));
    std::ofstream(damaged, std::ios::binary | std::ios::trunc)
        .write(copy.data(), std::streamsize(copy.size()));
    try {
      load_checkpoint(damaged);
      ADD_FAILURE() << "a bit flipped at byte " << at << " loaded";
    } catch (const Error& e) {
      const std::string name = tensor_at(at - data_begin);
      EXPECT_NE(e.message().find("'" + name + "' is damaged"), std::string::npos) << e.message();
      ++refused;
    }
  }
  EXPECT_EQ(refused, 100);
  NamedTensors all;
  for (const auto& [name, tensor] : good.tensors)
    all.emplace_back(name, tensor);
  // The configuration and the training state are covered too: an edited learning rate, step or
  // generator offset is refused, not resumed with.
  const std::string edited = file("edited.safetensors");
  for (const auto& [key, from, to] :
       {std::tuple<std::string, std::string, std::string>{"mantissa.config", "\"lr\":", "\"lr\":9"},
        {"mantissa.state", "\"step\":", "\"step\":1"},
        {"mantissa.state", "\"generator_offset\":\"", "\"generator_offset\":\"7"}}) {
    SCOPED_TRACE(key + ": " + to);
    std::map<std::string, std::string> metadata = good.metadata;
    const size_t at = metadata[key].find(from);
    ASSERT_NE(at, std::string::npos) << metadata[key];
    metadata[key].replace(at, from.size(), to);
    save_safetensors(edited, all, metadata);
    try {
      load_checkpoint(edited);
      ADD_FAILURE() << "an edited " << key << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("configuration or training state was changed"), std::string::npos)
          << e.message();
    }
  }
  // A checkpoint written before checksums (the keys left out) loads, with one note for each.
  std::map<std::string, std::string> old_metadata = good.metadata;
  ASSERT_EQ(old_metadata.erase("mantissa.crc32"), 1u);
  ASSERT_EQ(old_metadata.erase("mantissa.meta_crc32"), 1u);
  const std::string old = file("old.safetensors");
  save_safetensors(old, all, old_metadata);
  reset_warnings();
  EXPECT_NO_THROW(load_checkpoint(old));
  EXPECT_EQ(warning_count("checkpoint:no-checksums"), 1);
  EXPECT_EQ(warning_count("checkpoint:no-meta-checksum"), 1);
}

TEST_F(TrainerTest, CheckpointLoadsInPythonSafetensors) {
  const std::string python = MANTISSA_PYTHON;
  if (python.empty() ||
      std::system((python + " -c 'import safetensors, numpy' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "skipped: no Python with safetensors and numpy (scripts/setup installs them)";
  }
  TrainConfig c = small("cnn");
  c.epochs = 1;
  c.checkpoint_path = file("cnn.safetensors");
  Trainer t(c);
  t.fit();
  const std::string out = file("names.json");
  const std::string script =
      "import json,sys\n"
      "from safetensors.numpy import load_file\n"
      "from safetensors import safe_open\n"
      "d = load_file(sys.argv[1])\n"
      "with safe_open(sys.argv[1], 'np') as f: meta = f.metadata()\n"
      "json.dump({'tensors': {k: [str(v.dtype), list(v.shape)] for k, v in d.items()},"
      " 'metadata': meta}, open(sys.argv[2], 'w'))\n";
  const std::string py = file("check.py");
  std::ofstream(py) << script;
  ASSERT_EQ(std::system((python + " " + py + " " + c.checkpoint_path + " " + out).c_str()), 0);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  const auto& tensors = j["tensors"];
  for (const auto& [name, tensor] : t.model().state_dict()) {
    ASSERT_TRUE(tensors.contains(name)) << name << " missing from the Python view";
    EXPECT_EQ(tensors[name][1].get<std::vector<int64_t>>(), tensor.shape().vec()) << name;
    EXPECT_EQ(tensors[name][0].get<std::string>(),
              tensor.dtype() == DType::I64 ? "int64" : "float32")
        << name;
  }
  EXPECT_EQ(j["metadata"]["format"], "pt");
  EXPECT_TRUE(j["metadata"].contains("mantissa.config"));
}

// Half weights (O2 with fp32 masters; bf16-pure with stochastic rounding): the masters and the
// rounding stream travel in the checkpoint, so a resumed run is bit-identical to a straight one,
// and batch norm stays fp32.
TEST_F(TrainerTest, HalfWeightRunsResumeBitwise) {
  struct Case {
    const char* precision;
    const char* opt_level;
    const char* rounding;
    const char* optim_state = "fp32";  // SGD's momentum
    const char* compensation = "none";
  };
  for (const Case& k :
       {Case{"fp16", "O2", ""}, Case{"bf16", "O2", "stochastic"}, Case{"bf16-pure", "", ""},
        Case{"bf16", "O2", "", "8bit"}, Case{"bf16-pure", "", "", "fp8", "kahan"}}) {
    SCOPED_TRACE(std::string(k.precision) + " " + k.opt_level + " " + k.rounding + " " +
                 k.optim_state + " " + k.compensation);
    TrainConfig straight = small("cnn");
    straight.synthetic_size = 256;
    straight.set("precision", k.precision);
    straight.set("opt-level", k.opt_level);
    straight.set("rounding", k.rounding);
    straight.set("optim-state", k.optim_state);
    straight.set("compensation", k.compensation);
    Trainer a(straight);
    a.fit();
    for (const auto& [name, t] : a.model().named_parameters()) {
      const bool bn = name.find("features.1.") == 0 || name.find("features.5.") == 0;
      EXPECT_EQ(
          t.dtype(),
          bn ? DType::F32 : (straight.precision == amp::Precision::FP16 ? DType::F16 : DType::BF16))
          << name;
    }
    EXPECT_EQ(a.optimizer().master_weights(), std::string(k.opt_level) == "O2");
    EXPECT_EQ(name_of(a.optimizer().compensation()), std::string(k.compensation));
    TrainConfig first = straight;
    first.checkpoint_path = file(std::string(k.precision) + k.rounding + k.optim_state +
                                 k.compensation + ".safetensors");
    Trainer b(first);
    b.fit(1);
    TrainConfig resumed = straight;
    resumed.resume_path = first.checkpoint_path;
    Trainer c(resumed);
    c.fit();
    expect_second_epoch_bitwise(a, c);
    const auto wa = a.model().state_dict(), wc = c.model().state_dict();
    for (size_t i = 0; i < wa.size(); ++i) {
      EXPECT_EQ(wa[i].second.to_vector<double>(), wc[i].second.to_vector<double>()) << wa[i].first;
    }
  }
}

// --zero-grad zeros (PyTorch's zero_grad(set_to_none=False)) trains the same steps as the default
// none, bit for bit (0 + g is g; an fp16 O2 gradient kept in fp32 by the unscale accumulates into
// it exactly), and holds the gradients' memory through the forward pass: a higher peak.
TEST_F(TrainerTest, ZeroedGradientsTrainTheSameStepsAndHoldMoreMemory) {
  struct Case {
    const char* precision;
    const char* opt_level;
  };
  for (const Case& k : {Case{"fp32", ""}, Case{"bf16", "O1"}, Case{"fp16", "O2"}}) {
    SCOPED_TRACE(std::string(k.precision) + " " + k.opt_level);
    TrainConfig none = small("mlp");
    none.synthetic_size = 256;
    none.set("precision", k.precision);
    none.set("opt-level", k.opt_level);
    TrainConfig zeros = none;
    zeros.set("zero-grad", "zeros");
    // One after the other: a Trainer seeds the default generator (dropout) when it is made.
    Trainer a(none);
    const TrainResult ra = a.fit();
    Trainer b(zeros);
    const TrainResult rb = b.fit();
    ASSERT_EQ(a.step_losses().size(), b.step_losses().size());
    for (size_t i = 0; i < a.step_losses().size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(a.step_losses()[i]),
                std::bit_cast<uint32_t>(b.step_losses()[i]))
          << "step " << i + 1;
    const auto wa = a.model().state_dict(), wb = b.model().state_dict();
    for (size_t i = 0; i < wa.size(); ++i)
      EXPECT_EQ(wa[i].second.to_vector<double>(), wb[i].second.to_vector<double>()) << wa[i].first;
    EXPECT_GT(rb.peak_memory_bytes, ra.peak_memory_bytes);
  }
  // A word of neither vocabulary is refused where it is set, and the option keeps its value.
  TrainConfig bad = small("mlp");
  EXPECT_HAS(testing::error_of([&] { bad.set("zero-grad", "false"); }),
             "unknown --zero-grad 'false'; use none: ");
  EXPECT_EQ(bad.zero_grad, config::ZeroGrad::None);
  EXPECT_HAS(testing::error_of([&] { bad.set("input-pipeline", "async"); }),
             "unknown --input-pipeline 'async'");
}

// --precision fp8: the inner Linear layers run in fp8, the delayed-scaling state (scales and amax
// histories) is in the checkpoint, and a resumed run continues bit for bit; every recipe trains,
// and so does the fast accumulator.
TEST_F(TrainerTest, Fp8RunsResumeBitwiseAndRecordTheirScales) {
  struct Variant {
    const char* recipe;
    const char* accumulate;
  };
  std::vector<Variant> variants;
  for (const amp::Fp8Recipe r : all_words<amp::Fp8Recipe>())
    variants.push_back({name_of(r).data(), "fp32"});
  variants.push_back({"rowwise", "fast:16"});
  variants.push_back({"current", "fast"});
  for (const Variant& v : variants) {
    const char* recipe = v.recipe;
    SCOPED_TRACE(std::string(recipe) + " " + v.accumulate);
    TrainConfig straight = small("mlp");
    straight.synthetic_size = 256;
    straight.dropout = 0;
    straight.set("precision", "fp8");
    straight.set("opt-level", "O2");
    straight.set("fp8-recipe", recipe);
    straight.set("fp8-accumulate", v.accumulate);
    straight.fp8_amax_history = 16;
    straight.log_every = 2;
    const std::string name = std::string(recipe) + "-" + std::string(v.accumulate).substr(0, 4);
    straight.metrics_path = file(name + ".jsonl");
    Trainer a(straight);
    const TrainResult ra = a.fit();
    ASSERT_NE(a.fp8(), nullptr);
    EXPECT_GE(a.fp8()->layers().size(), 1u);
    EXPECT_EQ(ra.skipped_steps, 0);
    EXPECT_NE(a.describe_precision().find(std::string("fp8 ") + recipe), std::string::npos);
    for (float l : a.step_losses())
      EXPECT_TRUE(std::isfinite(l));
    EXPECT_LT(a.step_losses().back(), a.step_losses().front());
    // The metrics carry the per-layer amax and scale table.
    std::ifstream in(straight.metrics_path);
    int fp8_records = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] != "fp8") continue;
      ++fp8_records;
      const auto& layer = j["layers"][0];
      EXPECT_GT(layer["weight"]["amax"].get<double>(), 0);
      EXPECT_GT(layer["grad_output"]["scale"].get<double>(), 0);
    }
    EXPECT_GT(fp8_records, 0);

    TrainConfig first = straight;
    first.metrics_path.clear();
    first.checkpoint_path = file(name + ".safetensors");
    Trainer b(first);
    b.fit(1);
    const SafetensorsFile ck = load_safetensors(first.checkpoint_path);
    bool has_fp8 = false;
    for (const auto& [key, t] : ck.tensors)
      has_fp8 = has_fp8 || key.find("scaler.fp8.") == 0;
    EXPECT_EQ(has_fp8, std::string(recipe) == "delayed");
    TrainConfig resumed = straight;
    resumed.metrics_path.clear();
    resumed.resume_path = first.checkpoint_path;
    Trainer c(resumed);
    c.fit();
    expect_second_epoch_bitwise(a, c);
  }
}

// --precision fp4: the FP4 recipes and their ablations train, write their records, keep each
// layer's stochastic-rounding draws in the checkpoint, and a resumed run continues bit for bit.
TEST_F(TrainerTest, Fp4RunsResumeBitwiseAndRecordTheirScales) {
  struct Variant {
    const char* recipe;
    const char* ablation;  // an option set to "off", or none
  };
  for (const Variant v : {Variant{"nvfp4", nullptr}, Variant{"nvfp4", "fp4-rht"},
                          Variant{"nvfp4", "fp4-sr"}, Variant{"mxfp4", nullptr}}) {
    const std::string name =
        std::string(v.recipe) + (v.ablation ? std::string("-no-") + v.ablation : "");
    SCOPED_TRACE(name);
    TrainConfig straight = small("mlp");
    straight.synthetic_size = 256;
    straight.dropout = 0;
    straight.set("precision", "fp4");
    straight.set("opt-level", "O2");
    straight.set("fp4-recipe", v.recipe);
    if (v.ablation) straight.set(v.ablation, "off");
    straight.log_every = 2;
    straight.metrics_path = file(name + ".jsonl");
    Trainer a(straight);
    const TrainResult ra = a.fit();
    ASSERT_NE(a.fp8(), nullptr);
    EXPECT_EQ(ra.skipped_steps, 0);
    EXPECT_NE(a.describe_precision().find(std::string("fp4 ") + v.recipe), std::string::npos);
    EXPECT_LT(a.step_losses().back(), a.step_losses().front());
    std::ifstream in(straight.metrics_path);
    int records = 0;
    bool summary = false;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "fp4") {
        ++records;
        EXPECT_GT(j["layers"][0]["grad_output"]["amax"].get<double>(), 0);
      }
      if (j["kind"] == "summary") summary = j["fp4"]["recipe"] == v.recipe;
    }
    EXPECT_GT(records, 0);
    EXPECT_TRUE(summary);

    TrainConfig first = straight;
    first.metrics_path.clear();
    first.checkpoint_path = file(name + ".safetensors");
    Trainer b(first);
    b.fit(1);
    const SafetensorsFile ck = load_safetensors(first.checkpoint_path);
    bool has_draws = false;
    for (const auto& [n, t] : ck.tensors)
      has_draws = has_draws || n.ends_with(".sr_draws");
    EXPECT_EQ(has_draws, v.ablation == nullptr || std::string(v.ablation) != "fp4-sr");
    TrainConfig resumed = straight;
    resumed.metrics_path.clear();
    resumed.resume_path = first.checkpoint_path;
    Trainer c(resumed);
    c.fit();
    expect_second_epoch_bitwise(a, c);
  }
  // The fp4 options belong to --precision fp4.
  TrainConfig bad = small("mlp");
  bad.set("fp4-rht", "off");
  EXPECT_HAS(testing::error_of([&] { Trainer t(bad); }),
             "the --fp4-* options apply to --precision fp4");
}

// --underflow-every: fp16 O1 with a static scale of 1 vs the dynamic scale. Scaling cannot make
// more values underflow, and the records and summary are written.
TEST_F(TrainerTest, UnderflowIsMeasuredAgainstFp32Gradients) {
  auto run = [&](const std::string& loss_scale) {
    TrainConfig c = small("mlp");
    c.dropout = 0;
    c.epochs = 1;
    c.set("precision", "fp16");
    c.set("loss-scale", loss_scale);
    c.underflow_every = 2;
    c.metrics_path = file("underflow-" + loss_scale + ".jsonl");
    Trainer t(c);
    const TrainResult r = t.fit();
    EXPECT_EQ(r.underflow.measurements, (t.batches_per_epoch() + 1) / 2);
    EXPECT_GT(r.underflow.nonzero, 0);
    std::ifstream in(c.metrics_path);
    std::string line;
    int records = 0;
    bool summary = false;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "underflow") ++records;
      if (j["kind"] == "summary") summary = j.contains("underflow");
    }
    EXPECT_EQ(records, r.underflow.measurements);
    EXPECT_TRUE(summary);
    // Per layer: every parameter once, in the model's order; the parts add up to the whole.
    const NamedTensors params = t.model().named_parameters();
    EXPECT_EQ(r.underflow.layers.size(), params.size());
    LayerUnderflow total;
    for (size_t i = 0; i < r.underflow.layers.size(); ++i) {
      const LayerUnderflow& l = r.underflow.layers[i];
      EXPECT_EQ(l.name, params[i].first);
      EXPECT_LE(l.observed, l.nonzero);
      // A row counted has at least one observed zero; 1-D parameters have no rows.
      EXPECT_LE(l.zero_rows, l.observed);
      if (params[i].second.dim() < 2) {
        EXPECT_EQ(l.zero_rows, 0);
      } else {
        EXPECT_LE(l.zero_rows, params[i].second.size(0));
      }
      total.zero_rows += l.zero_rows;
      total.nonzero += l.nonzero;
      total.cast_unscaled += l.cast_unscaled;
      total.cast_scaled += l.cast_scaled;
      total.observed += l.observed;
    }
    EXPECT_EQ(total.nonzero, r.underflow.nonzero);
    EXPECT_EQ(total.cast_unscaled, r.underflow.cast_unscaled);
    EXPECT_EQ(total.cast_scaled, r.underflow.cast_scaled);
    EXPECT_EQ(total.observed, r.underflow.observed);
    EXPECT_EQ(total.zero_rows, r.underflow.zero_rows);
    // worst(): the largest fractions first.
    const std::vector<LayerUnderflow> worst = r.underflow.worst(3);
    EXPECT_LE(worst.size(), 3u);
    for (size_t i = 1; i < worst.size(); ++i) {
      EXPECT_GE(double(worst[i - 1].observed) / double(worst[i - 1].nonzero),
                double(worst[i].observed) / double(worst[i].nonzero));
    }
    return r.underflow;
  };
  const UnderflowStats plain = run("1");
  const UnderflowStats scaled = run("dynamic");
  // Unscaled casts are what they are; at scale 65536 fewer (or equally few) values vanish.
  EXPECT_EQ(plain.cast_scaled, plain.cast_unscaled);  // the scale is 1
  EXPECT_LE(scaled.cast_scaled, scaled.cast_unscaled);
  EXPECT_LE(double(scaled.cast_scaled) / double(scaled.nonzero),
            double(plain.cast_scaled) / double(plain.nonzero));
}

// A hidden unit whose outgoing weights fp16 cannot hold (1e-9, below its smallest subnormal)
// gets no gradient in an fp16 run, loss scaling or not: the weights are cast, not scaled. fp32's
// gradient of that unit's incoming row is tiny but not zero, so the probe counts the row whole.
TEST_F(TrainerTest, UnderflowCountsRowsLeftWithoutGradient) {
  TrainConfig c = small("mlp");
  c.dropout = 0;
  c.epochs = 1;
  c.max_steps = 1;
  c.set("precision", "fp16");
  c.underflow_every = 1;
  Trainer t(c);
  constexpr int64_t kUnits = 3;
  {
    NoGrad ng;
    for (auto& [name, p] : t.model().named_parameters()) {
      if (name == "4.weight") p.narrow(1, 0, kUnits).fill_(1e-9);  // (128, 256): units' columns
    }
  }
  const TrainResult r = t.fit();
  ASSERT_EQ(r.underflow.measurements, 1);
  for (const LayerUnderflow& l : r.underflow.layers) {
    if (l.name == "1.weight") {
      EXPECT_EQ(l.zero_rows, kUnits);  // (256, 784): the three units' rows
      EXPECT_GE(l.observed, kUnits);
    } else if (l.name == "4.weight" || l.name == "7.weight") {
      EXPECT_EQ(l.zero_rows, 0) << l.name;
    }
  }
  EXPECT_EQ(r.underflow.zero_rows, kUnits);
}

}  // namespace
}  // namespace mantissa::train
