// Loading a checkpoint written by `mantissa train --checkpoint FILE` (or train::Trainer) and
// evaluating it: the model rebuilt from the configuration stored in the file, its weights loaded,
// and the test set run through it by hand -- then the same through train::evaluate_checkpoint.
//
//   mantissa train --model mlp --data synthetic --synthetic-size 2000 --epochs 1
//                  --checkpoint mlp.safetensors        (one line)
//   ./eval_checkpoint mlp.safetensors
//
// Without an argument it first trains such a model itself (train::Trainer, one epoch, about a
// second) into the temporary directory. Image models only (mlp, cnn, resnet*, vit*).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <mantissa/mantissa.h>

namespace mt = mantissa;

int main(int argc, char** argv) try {
  std::string path;
  if (argc > 1) {
    path = argv[1];
  } else {
    path = (std::filesystem::temp_directory_path() / "mantissa-example-mlp.safetensors").string();
    mt::train::TrainConfig c;
    c.model = "mlp";
    c.data = mt::config::DataKind::Synthetic;
    c.synthetic_size = 2000;
    c.epochs = 1;
    c.checkpoint_path = path;
    c.progress = false;
    std::printf("no checkpoint given: training %s on %s data into %s\n", c.model.c_str(),
                std::string(mt::name_of(c.data)).c_str(), path.c_str());
    mt::train::Trainer(c).fit();
  }

  // What the file holds: the run's whole configuration, where it stopped, the weights.
  const mt::train::Checkpoint ckpt = mt::train::load_checkpoint(path);
  const mt::train::TrainConfig& config = ckpt.config;
  std::printf("%s: model %s, data %s, precision %s, step %lld, %zu tensors\n", path.c_str(),
              config.model.c_str(), std::string(mt::name_of(config.data)).c_str(),
              std::string(mt::name_of(config.precision)).c_str(),
              static_cast<long long>(ckpt.state.step), ckpt.model.size());
  if (mt::nn::model_input(config.model) != mt::nn::ModelInput::Image) {
    std::fprintf(stderr, "this example evaluates image models; see `mantissa eval` for others\n");
    return 2;
  }

  // The test set the run was evaluated on (as train::Trainer makes it).
  mt::data::ImageDataset test;
  if (config.data == mt::config::DataKind::Synthetic) {
    const int64_t n_test = std::max<int64_t>(config.synthetic_size / 5, 1);
    test = mt::data::synthetic_images(config.synthetic_size + n_test, 1, 28, 10, config.seed)
               .slice(config.synthetic_size, n_test);
  } else {
    test = mt::data::load_fashion_mnist(config.data_dir, /*train=*/false);
  }

  // The model, by name, with the data's shape; the checkpoint's weights copied into it.
  mt::nn::ModelConfig mc;
  mc.num_classes = test.num_classes();
  mc.in_channels = test.channels();
  mc.image_size = test.height();
  std::shared_ptr<mt::nn::Module> model = mt::nn::make_model(config.model, mc);
  model->load_state_dict(ckpt.model);  // strict: every name and shape must match
  model->eval();

  mt::NoGrad no_grad;
  double loss = 0, correct = 0;
  mt::data::DataLoader loader(test, {.batch_size = 256, .shuffle = false, .num_workers = 0});
  for (mt::data::Batch& b : loader) {
    const mt::Tensor logits = (*model)(b.x());
    const double n = double(b.y().numel());
    loss += mt::cross_entropy(logits, b.y()).item() * n;
    correct += mt::sum(mt::eq(mt::argmax(logits, 1), b.y()).to(mt::DType::F32)).item();
  }
  const double n = double(test.size());
  std::printf("by hand:             %lld images, loss %.4f, accuracy %.4f\n",
              static_cast<long long>(test.size()), loss / n, correct / n);

  const mt::train::EvalResult r = mt::train::evaluate_checkpoint(path);
  std::printf("evaluate_checkpoint: %lld images, loss %.4f, accuracy %.4f\n",
              static_cast<long long>(r.samples), r.loss, r.accuracy);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "eval_checkpoint: %s\n", e.what());
  return 1;
}
