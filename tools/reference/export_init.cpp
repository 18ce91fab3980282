// export_init: what tools/reference/make_train_golden.py needs from Mantissa to replay a short
// training run in PyTorch, written to one safetensors file:
//   init.<key>      the model's initial state_dict (make_model(model, {.seed = seed})), as is
//   batch_indices   I64 (batches, batch_size): the Fashion-MNIST training items of the first
//                   batches of epoch 0, as DataLoader{batch_size, shuffle, loader_seed} orders
//                   them (epoch_order(0))
//   batch_labels    I64 (batches, batch_size): their labels, to check the reader on the other side
//   pixel_table     F32 (256): the loader's normalized value of each pixel byte 0..255, read back
//                   from a batch of a 16x16 image holding every byte once
// and the metadata: model, seed, batch_size, batches, loader_seed, mean and std (the loader's
// normalization, printed with 9 significant digits: exact for float32), dataset, dataset_size.
//
//   export_init --model mlp --out init_mlp.safetensors [--seed 0] [--batch-size 32]
//               [--batches 10] [--loader-seed 0] [--data-dir /usr/share/datasets/fashion-mnist]
//
// For a token model (gpt2_tiny, lstm; tools/reference/make_lm_golden.py) only the initial
// state_dict and the metadata model, seed, vocab_size and context:
//
//   export_init --model gpt2_tiny --out init.safetensors [--seed 0] [--vocab-size 64]
//               [--context 32]
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/mantissa.h"
#include "mantissa/nn/models.h"

namespace {

using mantissa::Tensor;

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", double(v));
  return buf;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --model NAME --out FILE [--seed N] [--batch-size N] [--batches N]\n"
               "          [--loader-seed N] [--data-dir DIR] [--vocab-size N] [--context N]\n",
               argv0);
  return 2;
}

// The loader's normalization of every byte value, through the loader itself.
Tensor pixel_table(const mantissa::data::ImageOptions& like) {
  std::vector<int64_t> bytes(256);
  for (int64_t v = 0; v < 256; ++v)
    bytes[size_t(v)] = v;
  mantissa::data::ImageOptions io;
  io.mean = like.mean;
  io.std = like.std;
  io.dtype = mantissa::DType::F32;
  mantissa::data::ImageDataset all(
      Tensor::from_vector(bytes, {1, 1, 16, 16}).to(mantissa::DType::U8),
      Tensor::zeros({1}, mantissa::DType::I64), 1, "every byte", io);
  mantissa::data::LoaderOptions o;
  o.batch_size = 1;
  o.shuffle = false;
  o.num_workers = 0;
  const mantissa::data::DataLoader loader(std::move(all), o);
  return loader.make_batch(0, 0).x().reshape({256}).contiguous();
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args = {{"--seed", "0"},
                                             {"--batch-size", "32"},
                                             {"--batches", "10"},
                                             {"--loader-seed", "0"},
                                             {"--vocab-size", "64"},
                                             {"--context", "32"},
                                             {"--data-dir", mantissa::data::kFashionMnistDir}};
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (i + 1 >= argc || !(key == "--model" || key == "--out" || args.count(key))) {
      return usage(argv[0]);
    }
    args[key] = argv[i + 1];
  }
  if (!args.count("--model") || !args.count("--out")) return usage(argv[0]);
  const std::string model_name = args["--model"];
  const uint64_t seed = std::stoull(args["--seed"]);
  const int64_t batch_size = std::stoll(args["--batch-size"]);
  const int64_t batches = std::stoll(args["--batches"]);
  const uint64_t loader_seed = std::stoull(args["--loader-seed"]);

  mantissa::nn::ModelConfig config;
  config.seed = seed;
  const bool tokens = mantissa::nn::model_input(model_name) == mantissa::nn::ModelInput::Tokens;
  if (tokens) {
    config.vocab_size = std::stoll(args["--vocab-size"]);
    config.max_seq_len = std::stoll(args["--context"]);
  }
  const auto model = mantissa::nn::make_model(model_name, config);
  mantissa::NamedTensors out;
  for (const auto& [key, t] : model->state_dict())
    out.emplace_back("init." + key, t);
  if (tokens) {
    mantissa::save_safetensors(args["--out"], out,
                               {{"model", model_name},
                                {"seed", std::to_string(seed)},
                                {"vocab_size", std::to_string(config.vocab_size)},
                                {"context", std::to_string(config.max_seq_len)}});
    std::printf("%s: %s, %zu state_dict entries\n", args["--out"].c_str(), model_name.c_str(),
                model->state_dict().size());
    return 0;
  }

  mantissa::data::LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.seed = loader_seed;
  options.num_workers = 0;
  const mantissa::data::ImageDataset train =
      mantissa::data::load_fashion_mnist(args["--data-dir"], /*train=*/true);
  const mantissa::data::DataLoader loader(train, options);
  MT_CHECK(batches > 0 && batches <= loader.num_batches(), "export_init: --batches must be in [1, ",
           loader.num_batches(), "], got ", batches);
  const std::vector<int64_t> order = loader.epoch_order(0);
  const std::vector<int64_t> indices(order.begin(), order.begin() + batches * batch_size);
  const std::vector<int64_t> all_labels = train.labels().to_vector<int64_t>();
  std::vector<int64_t> labels;
  for (int64_t i : indices)
    labels.push_back(all_labels[size_t(i)]);
  out.emplace_back("batch_indices", Tensor::from_vector(indices, {batches, batch_size}));
  out.emplace_back("batch_labels", Tensor::from_vector(labels, {batches, batch_size}));
  out.emplace_back("pixel_table", pixel_table(train.options()));

  const std::map<std::string, std::string> metadata = {
      {"model", model_name},
      {"seed", std::to_string(seed)},
      {"batch_size", std::to_string(batch_size)},
      {"batches", std::to_string(batches)},
      {"loader_seed", std::to_string(loader_seed)},
      {"mean", float_text(train.options().mean)},
      {"std", float_text(train.options().std)},
      {"dataset", "fashion-mnist train"},
      {"dataset_size", std::to_string(train.size())},
  };
  mantissa::save_safetensors(args["--out"], out, metadata);
  std::printf("%s: %s, %zu state_dict entries, %lld x %lld batch indices\n", args["--out"].c_str(),
              model_name.c_str(), model->state_dict().size(), static_cast<long long>(batches),
              static_cast<long long>(batch_size));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_init: %s\n", e.what());
    return 1;
  }
}
